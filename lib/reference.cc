// Scalar double-precision reference of docs/SEMANTICS.md. Written for
// readability, not speed: one query row at a time, every rule spelled out.
// (K and V are widened to double once per KV head, and each exp is taken
// once: the tests run it under qemu, where it would dominate their time.)

#include "lib/reference.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "lib/dtype.h"
#include "lib/philox.h"
#include "lib/quant.h"
#include "lib/validate.h"

namespace simdattn {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Reads element `index` (in elements, may be negative) of a buffer of `dtype`
// exactly as stored, widened to double.
double LoadAsDouble(const void* data, DType dtype, int64_t index) {
  const char* base = static_cast<const char*>(data);
  switch (dtype) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, base + index * 4, 4);
      return f;
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, base + index * 2, 2);
      return F16ToF32(h);
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, base + index * 2, 2);
      return BF16ToF32(h);
    }
    case DType::kBool:
      return base[index] != 0 ? 1.0 : 0.0;
    case DType::kInt8:  // the stored q; its scale is applied by the caller
      return static_cast<int8_t>(base[index]);
    case DType::kFp8E4M3:
      return E4M3ToF32(static_cast<uint8_t>(base[index]));
    case DType::kFp8E5M2:
      return E5M2ToF32(static_cast<uint8_t>(base[index]));
    case DType::kQ8_0:  // element `index` of a row starting at data
      return Q8_0Value(reinterpret_cast<const uint8_t*>(base), index);
  }
  return 0.0;
}

// Element offset of logical index (i0, i1, i2, i3) under `strides`.
int64_t Offset(const int64_t strides[4], int64_t i0, int64_t i1, int64_t i2,
               int64_t i3) {
  return i0 * strides[0] + i1 * strides[1] + i2 * strides[2] + i3 * strides[3];
}

// Widens `rows` rows of `n` elements (row r, element d at index
// base + r * row_stride + d * elem_stride) into out[r * n + d].
void LoadRowsAsDouble(const void* data, DType dtype, int64_t base,
                      int64_t row_stride, int64_t elem_stride, int64_t rows,
                      int64_t n, double* out) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t d = 0; d < n; ++d) {
      out[r * n + d] = LoadAsDouble(data, dtype, base + r * row_stride + d * elem_stride);
    }
  }
}

// Rows [0, rows) of K or V (`t`) of batch b and KV head h, dequantized
// exactly (SEMANTICS.md "Quantized KV caches": x = scale * q in double)
// into out[j * n + d]. `scales` and `scale` are the view's int8 per-token
// scales and fp8 per-tensor scale (AttentionOptions).
void LoadKvRowsAsDouble(const TensorView& t, const TensorView& scales,
                        float scale, int64_t b, int64_t h, int64_t rows,
                        int64_t n, double* out) {
  if (t.dtype != DType::kQ8_0) {
    LoadRowsAsDouble(t.data, t.dtype, Offset(t.strides, b, h, 0, 0), t.strides[2],
                     t.strides[3], rows, n, out);
  } else {
    const char* base = static_cast<const char*>(t.data);
    for (int64_t j = 0; j < rows; ++j) {
      const char* row = base + b * t.strides[0] + h * t.strides[1] + j * t.strides[2];
      for (int64_t d = 0; d < n; ++d) out[j * n + d] = LoadAsDouble(row, DType::kQ8_0, d);
    }
  }
  for (int64_t j = 0; j < rows; ++j) {
    double f = 1.0;
    if (t.dtype == DType::kInt8) {
      f = LoadAsDouble(scales.data, DType::kF32, Offset(scales.strides, b, h, j, 0));
    } else if (t.dtype == DType::kFp8E4M3 || t.dtype == DType::kFp8E5M2) {
      f = scale;
    } else {
      continue;
    }
    for (int64_t d = 0; d < n; ++d) out[j * n + d] *= f;
  }
}

// The parts of one call that every row needs.
struct Context {
  const AttentionOptions* options;
  const Problem* problem;
  double scale;
};

// Computes O[b, h, i, :] into `out` (Dv values) and returns LSE[b, h, i].
// q: the row's Dk query values; k, v: the Lk rows of K and V of its KV head
// (row j at k + j * Dk, v + j * Dv), all widened to double. `scores` and
// `visible` are scratch of Lk entries.
double ComputeRow(const Context& c, int64_t b, int64_t h, int64_t i,
                  const double* q, const double* k, const double* v,
                  std::vector<double>* scores, std::vector<char>* visible,
                  double* out) {
  const Problem& pr = *c.problem;
  const AttentionOptions& opt = *c.options;
  const int64_t lk_b = KvLength(opt, b, pr.kv_len);
  // p(i): where query row i sits on the key axis.
  const int64_t pos =
      opt.alignment == Alignment::kBottomRight ? i + lk_b - pr.q_len : i;

  for (int64_t j = 0; j < pr.kv_len; ++j) {
    // Structural visibility: kv_lengths, causal, sliding window.
    bool vis = j < lk_b;
    if (opt.causal && j > pos) vis = false;
    if (opt.window_left >= 0 && j < pos - opt.window_left) vis = false;
    if (opt.window_right >= 0 && j > pos + opt.window_right) vis = false;

    double s = 0.0;
    if (vis) {
      const double* k_row = k + j * pr.head_dim_qk;
      double dot = 0.0;
      for (int64_t d = 0; d < pr.head_dim_qk; ++d) dot += q[d] * k_row[d];
      s = c.scale * dot;
      if (opt.softcap > 0.0f) {
        const double cap = opt.softcap;
        s = cap * std::tanh(s / cap);
      }
      if (opt.alibi_slopes != nullptr) {
        const double distance = std::fabs(static_cast<double>(pos - j));
        s -= static_cast<double>(opt.alibi_slopes[h]) * distance;
      }
      if (pr.has_mask) {
        const double m = LoadAsDouble(opt.mask.data, opt.mask.dtype,
                                      Offset(pr.mask_strides, b, h, i, j));
        if (opt.mask.dtype == DType::kBool) {
          if (m == 0.0) vis = false;
        } else if (m == -kInf) {
          // Checked before adding: a -inf mask hides the key even when the
          // score is +inf (which would otherwise give NaN).
          vis = false;
        } else {
          s += m;
        }
      }
    }
    (*scores)[j] = s;
    (*visible)[j] = vis ? 1 : 0;
  }

  // M: the largest visible score and the sink. NaN is made sticky on purpose:
  // `s > m` skips NaN, and a row whose only visible score is NaN would
  // otherwise look empty (M = -inf) and output zeros instead of NaN.
  double m = -kInf;
  bool saw_nan = false;
  for (int64_t j = 0; j < pr.kv_len; ++j) {
    if (!(*visible)[j]) continue;
    const double s = (*scores)[j];
    if (std::isnan(s)) saw_nan = true;
    else if (s > m) m = s;
  }
  const bool has_sink = opt.sinks != nullptr;
  const double sink = has_sink ? static_cast<double>(opt.sinks[h]) : -kInf;
  if (sink > m) m = sink;
  if (saw_nan) m = std::numeric_limits<double>::quiet_NaN();

  const int64_t dv = pr.head_dim_v;
  for (int64_t d = 0; d < dv; ++d) out[d] = 0.0;
  if (m == -kInf) {
    // No visible key and no sink: zeros and LSE = -inf, never NaN. This also
    // covers visible keys whose scores are all -inf (e.g. -inf in K), where
    // exp(-inf - M) would be exp(NaN); such keys have weight 0 anyway.
    return -kInf;
  }

  // The scores become exp(s - M), summed into z.
  double z = 0.0;
  for (int64_t j = 0; j < pr.kv_len; ++j) {
    if (!(*visible)[j]) continue;
    (*scores)[j] = std::exp((*scores)[j] - m);
    z += (*scores)[j];
  }
  if (has_sink) z += std::exp(sink - m);

  const double p_drop = opt.dropout_p;
  for (int64_t j = 0; j < pr.kv_len; ++j) {
    if (!(*visible)[j]) continue;
    double weight = (*scores)[j] / z;
    if (p_drop > 0.0) {
      // Dropped keys keep weight 0 (not skipped): 0 * NaN in V still yields
      // NaN, as a kernel that zeroes P before P.V does.
      const bool keep = DropoutKeep(opt.dropout_seed, opt.dropout_p, b, h, i, j);
      weight = keep ? weight / (1.0 - p_drop) : 0.0;
    }
    const double* v_row = v + j * dv;
    for (int64_t d = 0; d < dv; ++d) out[d] += weight * v_row[d];
  }
  return m + std::log(z);
}

}  // namespace

bool DropoutKeep(uint64_t seed, float p, int64_t b, int64_t h, int64_t i,
                 int64_t j) {
  const Philox4x32Key key = {{static_cast<uint32_t>(seed),
                              static_cast<uint32_t>(seed >> 32)}};
  const Philox4x32Counter out =
      Philox4x32_10(DropoutCounter(b, h, i, j / kDropoutKeysPerCall), key);
  return DropoutDraw(out, j) >= DropoutThreshold(p);
}

Status ReferenceAttention(const TensorView& q, const TensorView& k,
                          const TensorView& v, const AttentionOptions& options,
                          std::vector<double>* o, std::vector<double>* lse) {
  Problem problem;
  Status status = ValidateInputs(q, k, v, options, &problem);
  if (!status.ok()) return status;
  if (o == nullptr) {
    status.code = StatusCode::kInvalidArgument;
    status.message = "o = nullptr: the reference needs an output vector";
    return status;
  }
  try {
    const Problem& pr = problem;
    // The unrounded default 1/sqrt(Dk): the reference computes the math of
    // SEMANTICS.md, not the f32 value kernels use (they differ by < 1 ulp f32).
    const double scale =
        options.scale.has_value()
            ? static_cast<double>(*options.scale)
            : 1.0 / std::sqrt(static_cast<double>(pr.head_dim_qk));
    const Context ctx{&options, &problem, scale};

    // Computed into locals first so that nothing is written on failure.
    std::vector<double> o_out(static_cast<size_t>(
        pr.batch * pr.q_heads * pr.q_len * pr.head_dim_v));
    std::vector<double> lse_out(
        static_cast<size_t>(pr.batch * pr.q_heads * pr.q_len));
    std::vector<double> scores(static_cast<size_t>(pr.kv_len));
    std::vector<char> visible(static_cast<size_t>(pr.kv_len));
    const int64_t dk = pr.head_dim_qk, dv = pr.head_dim_v;
    // K and V of one KV head, widened once for the rows of its query heads.
    std::vector<double> k_rows(static_cast<size_t>(pr.kv_len * dk));
    std::vector<double> v_rows(static_cast<size_t>(pr.kv_len * dv));
    std::vector<double> q_row(static_cast<size_t>(dk));
    for (int64_t b = 0; b < pr.batch; ++b) {
      for (int64_t h = 0; h < pr.q_heads; ++h) {
        if (h % pr.group == 0) {
          const int64_t hkv = h / pr.group;
          LoadKvRowsAsDouble(k, options.k_scales, options.k_scale, b, hkv, pr.kv_len,
                             dk, k_rows.data());
          LoadKvRowsAsDouble(v, options.v_scales, options.v_scale, b, hkv, pr.kv_len,
                             dv, v_rows.data());
        }
        for (int64_t i = 0; i < pr.q_len; ++i) {
          LoadRowsAsDouble(q.data, q.dtype, Offset(q.strides, b, h, i, 0), 0,
                           q.strides[3], 1, dk, q_row.data());
          const int64_t row = (b * pr.q_heads + h) * pr.q_len + i;
          lse_out[static_cast<size_t>(row)] =
              ComputeRow(ctx, b, h, i, q_row.data(), k_rows.data(), v_rows.data(),
                         &scores, &visible, o_out.data() + row * dv);
        }
      }
    }
    o->swap(o_out);
    if (lse != nullptr) lse->swap(lse_out);
  } catch (const std::bad_alloc&) {
    return Status{StatusCode::kOutOfMemory, "out of memory in ReferenceAttention"};
  } catch (const std::exception& e) {
    return Status{StatusCode::kInternal,
                  std::string("ReferenceAttention failed: ") + e.what()};
  }
  return Status::Ok();
}

}  // namespace simdattn
