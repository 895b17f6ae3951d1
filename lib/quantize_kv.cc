// QuantizeKv (serving.h): validation, then every row of x widened to f32
// and stored in the quantized format with lib/quant.h's quantizers.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "lib/dtype.h"
#include "lib/quant.h"
#include "lib/status.h"
#include "lib/validate.h"
#include "simdattn/serving.h"

namespace simdattn {
namespace {

// One view: positive extents, data, unit last stride, offsets in range.
Status CheckQuantView(const char* name, const TensorView& v, ByteRange* r) {
  for (int i = 0; i < 4; ++i) {
    if (v.shape[i] <= 0) {
      return Invalid(std::string(name) + ".shape[" + std::to_string(i) + "] = " +
                     std::to_string(v.shape[i]) + ": extents must be positive");
    }
  }
  if (v.data == nullptr) return Invalid(std::string(name) + ".data is null");
  if (v.strides[3] != 1) {
    return Invalid(std::string(name) + ".strides[3] = " + std::to_string(v.strides[3]) +
                   ": the last dimension must be contiguous (stride 1)");
  }
  if (!ComputeRange(v.data, v.dtype, v.shape, v.strides, r)) {
    return Invalid(std::string(name) + ": offsets of shape " + ShapeString(v.shape) +
                   " with its strides overflow int64");
  }
  return Status::Ok();
}

Status Validate(const TensorView& x, const MutableTensorView& out,
                const MutableTensorView& scales, float scale) {
  if (!IsStorageType(x.dtype)) {
    return Invalid(std::string("x.dtype = ") + (KnownDType(x.dtype) ? DTypeName(x.dtype) : "unknown") +
                   ": must be f32, f16 or bf16");
  }
  if (!IsQuantizedType(out.dtype)) {
    return Invalid(std::string("out.dtype = ") +
                   (KnownDType(out.dtype) ? DTypeName(out.dtype) : "unknown") +
                   ": must be int8, q8_0, fp8_e4m3 or fp8_e5m2");
  }
  ByteRange rx, ro, rs;
  Status s = CheckQuantView("x", x, &rx);
  if (!s.ok()) return s;
  s = CheckQuantView("out", out, &ro);
  if (!s.ok()) return s;
  for (int i = 0; i < 4; ++i) {
    if (out.shape[i] != x.shape[i]) {
      return Invalid("out.shape " + ShapeString(out.shape) + " must equal x.shape " +
                     ShapeString(x.shape));
    }
  }
  if (out.dtype == DType::kQ8_0 && x.shape[3] % kQ8Block != 0) {
    return Invalid("x.shape[3] = " + std::to_string(x.shape[3]) +
                   ": q8_0 needs a multiple of 32 (its blocks of 32 values)");
  }
  if (Overlap(ro, rx)) return Invalid("out overlaps x");
  const bool int8 = out.dtype == DType::kInt8;
  if (!int8 && (scales.data != nullptr || scales.shape[0] != 0)) {
    return Invalid(std::string("scales is set but out.dtype = ") + DTypeName(out.dtype) +
                   ": only int8 writes per-row scales (leave it empty)");
  }
  if (int8) {
    if (scales.data == nullptr) {
      return Invalid("scales.data is null: int8 writes one f32 scale per row, "
                     "[d0, d1, d2, 1]");
    }
    if (scales.dtype != DType::kF32) return Invalid("scales.dtype: must be f32");
    TensorView sv = scales;
    s = CheckQuantView("scales", sv, &rs);
    if (!s.ok()) return s;
    const int64_t want[4] = {x.shape[0], x.shape[1], x.shape[2], 1};
    for (int i = 0; i < 4; ++i) {
      if (scales.shape[i] != want[i]) {
        return Invalid("scales.shape " + ShapeString(scales.shape) + " must be " +
                       ShapeString(want));
      }
    }
    if (Overlap(rs, rx) || Overlap(rs, ro)) return Invalid("scales overlaps x or out");
    if (SelfOverlaps(scales.shape, scales.strides)) {
      return Invalid("scales.strides make distinct rows share a scale");
    }
  }
  const bool fp8 = out.dtype == DType::kFp8E4M3 || out.dtype == DType::kFp8E5M2;
  if (fp8 && !(std::isfinite(scale) && scale > 0.0f)) {
    return Invalid("scale = " + std::to_string(scale) + ": must be finite and > 0");
  }
  if (!fp8 && scale != 1.0f) {
    return Invalid("scale = " + std::to_string(scale) + ": only fp8 takes a scale (leave it 1)");
  }
  TensorView ov = out;
  if (SelfOverlaps(ov.shape, ov.strides) && ov.dtype != DType::kQ8_0) {
    return Invalid("out.strides make distinct elements share memory");
  }
  return Status::Ok();
}

// Row (a, b, c) of x widened to f32.
void LoadRow(const TensorView& x, int64_t a, int64_t b, int64_t c, float* row) {
  const int64_t size = DTypeSize(x.dtype);
  const char* p = static_cast<const char*>(x.data) +
                  (a * x.strides[0] + b * x.strides[1] + c * x.strides[2]) * size;
  for (int64_t i = 0; i < x.shape[3]; ++i) {
    if (x.dtype == DType::kF32) {
      std::memcpy(&row[i], p + i * 4, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, p + i * 2, 2);
      row[i] = x.dtype == DType::kF16 ? F16ToF32(h) : BF16ToF32(h);
    }
  }
}

}  // namespace

Status QuantizeKv(const TensorView& x, const MutableTensorView& out,
                  const MutableTensorView& scales, float scale) {
  try {
    const Status s = Validate(x, out, scales, scale);
    if (!s.ok()) return s;
    const int64_t d = x.shape[3];
    const int64_t unit = out.dtype == DType::kQ8_0 ? 1 : DTypeSize(out.dtype);
    std::vector<float> row(static_cast<size_t>(d));
    for (int64_t a = 0; a < x.shape[0]; ++a)
      for (int64_t b = 0; b < x.shape[1]; ++b)
        for (int64_t c = 0; c < x.shape[2]; ++c) {
          LoadRow(x, a, b, c, row.data());
          uint8_t* q = static_cast<uint8_t*>(out.data) +
                       (a * out.strides[0] + b * out.strides[1] + c * out.strides[2]) * unit;
          if (out.dtype == DType::kInt8) {
            const float sc = QuantizeRowInt8(row.data(), d, reinterpret_cast<int8_t*>(q));
            static_cast<float*>(scales.data)[a * scales.strides[0] + b * scales.strides[1] +
                                             c * scales.strides[2]] = sc;
          } else if (out.dtype == DType::kQ8_0) {
            QuantizeRowQ8_0(row.data(), d, q);
          } else {
            QuantizeRowFp8(row.data(), d, scale, out.dtype == DType::kFp8E4M3, q);
          }
        }
    return Status::Ok();
  } catch (const std::bad_alloc&) {
    return Status{StatusCode::kOutOfMemory, "out of memory"};
  } catch (...) {
    return Status{StatusCode::kInternal, "unexpected exception"};
  }
}

}  // namespace simdattn
