// Quantized K/V for the tests (see quant_util.h).

#include "tests/quant_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "lib/quant.h"

namespace simdattn {
namespace test {

bool KvTensor::quantized() const {
  return dtype == DType::kInt8 || dtype == DType::kQ8_0 ||
         dtype == DType::kFp8E4M3 || dtype == DType::kFp8E5M2;
}

int64_t KvTensor::RowBytes() const {
  return dtype == DType::kQ8_0 ? Q8_0RowBytes(shape[3]) : shape[3];
}

uint8_t* KvTensor::Row(int64_t i0, int64_t i1, int64_t i2) {
  return bytes.data() + i0 * strides[0] + i1 * strides[1] + i2 * strides[2];
}
const uint8_t* KvTensor::Row(int64_t i0, int64_t i1, int64_t i2) const {
  return bytes.data() + i0 * strides[0] + i1 * strides[1] + i2 * strides[2];
}

TensorView KvTensor::View() const {
  if (!quantized()) return wide.View();
  TensorView v;
  v.data = bytes.data();
  v.dtype = dtype;
  for (int i = 0; i < 4; ++i) {
    v.shape[i] = shape[i];
    v.strides[i] = strides[i];
  }
  return v;
}

TensorView KvTensor::ScalesView() const {
  TensorView v;
  if (dtype != DType::kInt8) return v;
  v.data = scales.data();
  v.dtype = DType::kF32;
  for (int i = 0; i < 4; ++i) {
    v.shape[i] = i < 3 ? shape[i] : 1;
    v.strides[i] = scale_strides[i];
  }
  return v;
}

double KvTensor::MaxAbs() const {
  if (!quantized()) return test::MaxAbs(wide);
  double m = 0.0;
  for (int64_t a = 0; a < shape[0]; ++a)
    for (int64_t b = 0; b < shape[1]; ++b)
      for (int64_t s = 0; s < shape[2]; ++s) {
        const uint8_t* row = Row(a, b, s);
        const double f = dtype == DType::kInt8
                             ? scales[a * scale_strides[0] + b * scale_strides[1] +
                                      s * scale_strides[2]]
                             : scale;
        for (int64_t d = 0; d < shape[3]; ++d) {
          double x = dtype == DType::kQ8_0   ? Q8_0Value(row, d)
                     : dtype == DType::kInt8 ? static_cast<int8_t>(row[d])
                     : dtype == DType::kFp8E4M3 ? E4M3ToF32(row[d])
                                                : E5M2ToF32(row[d]);
          x *= f;
          if (std::isfinite(x)) m = std::max(m, std::fabs(x));
        }
      }
  return m;
}

KvTensor StoreKv(const Tensor& src, DType dtype, Layout layout, float fp8_scale,
                 int64_t pad) {
  KvTensor t;
  t.dtype = dtype;
  for (int i = 0; i < 4; ++i) t.shape[i] = src.shape[i];
  const int64_t n0 = t.shape[0], n1 = t.shape[1], n2 = t.shape[2], d = t.shape[3];
  if (!t.quantized()) {
    t.wide = Tensor(dtype, n0, n1, n2, d, layout, pad);
    for (int64_t a = 0; a < n0; ++a)
      for (int64_t b = 0; b < n1; ++b)
        for (int64_t s = 0; s < n2; ++s)
          for (int64_t e = 0; e < d; ++e) t.wide.Set(a, b, s, e, src.Get(a, b, s, e));
    return t;
  }
  const int64_t row = t.RowBytes() + pad;
  t.strides[3] = 1;
  if (layout == Layout::kBHSD) {
    t.strides[2] = row;
    t.strides[1] = n2 * row;
    t.strides[0] = n1 * t.strides[1];
  } else {
    t.strides[1] = row;
    t.strides[2] = n1 * row;
    t.strides[0] = n2 * t.strides[2];
  }
  t.bytes.assign(static_cast<size_t>(n0 * t.strides[0]), 0xEE);
  t.scale = fp8_scale;
  t.scale_strides[2] = 1;
  t.scale_strides[1] = n2;
  t.scale_strides[0] = n1 * n2;
  if (dtype == DType::kInt8) t.scales.assign(static_cast<size_t>(n0 * n1 * n2), 0.0f);
  std::vector<float> x(static_cast<size_t>(d));
  for (int64_t a = 0; a < n0; ++a)
    for (int64_t b = 0; b < n1; ++b)
      for (int64_t s = 0; s < n2; ++s) {
        for (int64_t e = 0; e < d; ++e) x[e] = src.Get(a, b, s, e);
        uint8_t* out = t.Row(a, b, s);
        if (dtype == DType::kInt8) {
          t.scales[a * t.scale_strides[0] + b * t.scale_strides[1] + s] =
              QuantizeRowInt8(x.data(), d, reinterpret_cast<int8_t*>(out));
        } else if (dtype == DType::kQ8_0) {
          QuantizeRowQ8_0(x.data(), d, out);
        } else {
          for (int64_t e = 0; e < d; ++e) {
            const float y = x[e] / fp8_scale;
            out[e] = dtype == DType::kFp8E4M3 ? F32ToE4M3(y) : F32ToE5M2(y);
          }
        }
      }
  return t;
}

void SetScales(const KvTensor& t, bool is_k, AttentionOptions* options) {
  const bool fp8 = t.dtype == DType::kFp8E4M3 || t.dtype == DType::kFp8E5M2;
  (is_k ? options->k_scales : options->v_scales) = t.ScalesView();
  (is_k ? options->k_scale : options->v_scale) = fp8 ? t.scale : 1.0f;
}

}  // namespace test
}  // namespace simdattn
