// need_weights: the layer's softmax weights, recomputed after the fused
// attention from its LSE (the kernel never materializes them).

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "lib/dtype.h"
#include "lib/mha/mha_internal.h"
#include "lib/parallel.h"

namespace simdattn {
namespace {

double At(const TensorView& t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  const int64_t i = i0 * t.strides[0] + i1 * t.strides[1] + i2 * t.strides[2] + i3 * t.strides[3];
  switch (t.dtype) {
    case DType::kF32: return static_cast<const float*>(t.data)[i];
    case DType::kBF16: return BF16ToF32(static_cast<const uint16_t*>(t.data)[i]);
    case DType::kF16: return F16ToF32(static_cast<const uint16_t*>(t.data)[i]);
    case DType::kBool: return static_cast<const uint8_t*>(t.data)[i] != 0 ? 1.0 : 0.0;
    default: break;  // the layer's activations and masks have none of the 8-bit types
  }
  return 0.0;
}

struct WeightsJob {
  TensorView q, k;
  const AttentionOptions* options;
  const float* lse;
  bool average;
  float* weights;
  double scale;
};

// The score of SEMANTICS.md for (b, h, i, j) with its visibility; double
// products of the stored values.
bool Score(const WeightsJob& w, int64_t b, int64_t h, int64_t i, int64_t j, double* s) {
  const AttentionOptions& o = *w.options;
  const int64_t lq = w.q.shape[2], lk = w.k.shape[2];
  int64_t lk_b = lk;
  if (o.kv_lengths != nullptr) lk_b = o.kv_lengths[b];
  if (o.kv_lengths_i32 != nullptr) lk_b = o.kv_lengths_i32[b];
  const bool br = o.alignment.has_value() && *o.alignment == Alignment::kBottomRight;
  const int64_t pos = br ? i + lk_b - lq : i;
  if (j >= lk_b || (o.causal && j > pos)) return false;
  if (o.window_left >= 0 && j < pos - o.window_left) return false;
  if (o.window_right >= 0 && j > pos + o.window_right) return false;
  const int64_t hk = h / (w.q.shape[1] / w.k.shape[1]);
  double dot = 0.0;
  for (int64_t d = 0; d < w.q.shape[3]; ++d) dot += At(w.q, b, h, i, d) * At(w.k, b, hk, j, d);
  double x = w.scale * dot;
  if (o.softcap > 0.0f) x = o.softcap * std::tanh(x / o.softcap);
  if (o.alibi_slopes != nullptr) x -= o.alibi_slopes[h] * std::fabs(double(pos - j));
  if (o.mask.data != nullptr) {
    const TensorView& m = o.mask;
    const double v = At(m, m.shape[0] == 1 ? 0 : b, m.shape[1] == 1 ? 0 : h,
                        m.shape[2] == 1 ? 0 : i, m.shape[3] == 1 ? 0 : j);
    if (m.dtype == DType::kBool ? v == 0.0 : v == -std::numeric_limits<double>::infinity()) {
      return false;
    }
    if (m.dtype != DType::kBool) x += v;
  }
  *s = x;
  return true;
}

// Row (b, i) of every head: weights = exp(s - lse), summed over heads in
// order when averaged (the same bits for any thread count).
void WeightsRow(void* arg, int64_t task) {
  const WeightsJob& w = *static_cast<const WeightsJob*>(arg);
  const int64_t heads = w.q.shape[1], lq = w.q.shape[2], lk = w.k.shape[2];
  const int64_t b = task / lq, i = task % lq;
  float* avg = w.weights + (b * lq + i) * lk;
  if (w.average) std::memset(avg, 0, static_cast<size_t>(lk) * 4);
  for (int64_t h = 0; h < heads; ++h) {
    const double lse = w.lse[(b * heads + h) * lq + i];
    float* row = w.average ? nullptr : w.weights + ((b * heads + h) * lq + i) * lk;
    for (int64_t j = 0; j < lk; ++j) {
      double s = 0.0;
      const bool vis = lse != -std::numeric_limits<double>::infinity() && Score(w, b, h, i, j, &s);
      const float p = vis ? static_cast<float>(std::exp(s - lse)) : 0.0f;
      if (w.average) {
        avg[j] += p / static_cast<float>(heads);
      } else {
        row[j] = p;
      }
    }
  }
}

}  // namespace

Status MhaSoftmaxWeights(const TensorView& q, const TensorView& k,
                         const AttentionOptions& options, const float* lse, bool average,
                         float* weights, const ExecutionOptions& exec) {
  if (options.dropout_p > 0.0f) {
    return Unimplemented("need_weights with dropout_p = " + std::to_string(options.dropout_p));
  }
  WeightsJob job{q, k, &options, lse, average, weights, 0.0};
  job.scale = options.scale.has_value() ? double(*options.scale) : 1.0 / std::sqrt(double(q.shape[3]));
  RunTasks(exec, q.shape[0] * q.shape[2], &WeightsRow, &job);
  return Status::Ok();
}

}  // namespace simdattn
