// Split calls: merges the chunk partials of one query block exactly
// through their log-sum-exp and writes O and LSE. Per-target code.

#if defined(SIMDATTN_LIB_KERNELS_COMBINE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SIMDATTN_LIB_KERNELS_COMBINE_INL_H_
#undef SIMDATTN_LIB_KERNELS_COMBINE_INL_H_
#else
#define SIMDATTN_LIB_KERNELS_COMBINE_INL_H_
#endif

#include <cmath>
#include <cstdint>
#include <limits>

#include "hwy/highway.h"
#include "lib/kernels/block-inl.h"
#include "lib/kernels/online_softmax-inl.h"
#include "lib/kernels/output-inl.h"

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Split calls merge the chunks of one block. With M = max_c m_c (and the
// sink), L = sum_c l_c exp(m_c - M) (+ exp(sink - M)) and
// O = sum_c acc_c exp(m_c - M) / L, which is exactly the unsplit softmax.
// Chunks are merged in order, so the result does not depend on threads.

// The partial results of one block's chunks: chunk c's slot at
// first + c * stride (PartialSlot: m and l, block_rows each, then O).
struct ChunkSlots {
  const float* first;
  int64_t stride;
  int64_t num_chunks;
  int64_t mq;
  const float* slot(int64_t c) const { return first + c * stride; }
};

// Row r's merged max (into *m) and sum (into *l), and each chunk's weight
// exp(m_c - M): MergePartials (online_softmax-inl.h) over the chunks' slots.
inline void MergeRow(const ChunkSlots& c, int64_t r, float sink, float* m,
                     float* l, float* weight) {
  const MergedPartials merged = MergePartials(
      c.num_chunks, c.first + r, c.first + c.mq + r, c.stride, sink, weight);
  *m = merged.m;
  *l = merged.l;
}

// Row r of O from the decode path's slots ([rows][Dv]), merged into `out`.
inline void MergeOutputRow(const ChunkSlots& c, int64_t r, int64_t dv,
                           const float* weight, float* out) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const float* first = c.first + 2 * c.mq + r * dv;
  int64_t e = 0;
  for (; e + N <= dv; e += N) {
    auto sum = hn::Zero(d);
    for (int64_t i = 0; i < c.num_chunks; ++i) {
      sum = hn::MulAdd(hn::Set(d, weight[i]), hn::LoadU(d, first + i * c.stride + e), sum);
    }
    hn::StoreU(sum, d, out + e);
  }
  for (; e < dv; ++e) {
    float sum = 0.0f;
    for (int64_t i = 0; i < c.num_chunks; ++i) sum += weight[i] * first[i * c.stride + e];
    out[e] = sum;
  }
}

// Merges the chunks of block `task` (of CombineTaskCount()) and writes its
// rows of O and LSE. The first chunk's slot holds the merged O (this task
// owns it): rows from the decode path, O^T [Dv][mq] from the tiled kernel.
inline void CombineTaskImpl(const AttentionArgs& a, const Plan& plan,
                            const Wave& wave, int64_t task) {
  const int64_t mq = plan.block_rows;
  const int64_t dv = a.head_dim_v;
  const TaskIndex first_chunk{task / plan.num_blocks, task % plan.num_blocks, 0};
  const int64_t b = first_chunk.group / a.kv_heads;
  const int64_t hkv = first_chunk.group % a.kv_heads;
  const int64_t kv_valid = a.kv_lengths != nullptr ? a.kv_lengths[b] : a.kv_len;
  const int64_t offset = a.bottom_right ? kv_valid - a.q_len : 0;
  float table[RowTable::Floats(kMaxBlockRows)];
  RowTable rt(table, mq);
  const int64_t rows = FillRowTable(a, first_chunk.block, hkv, offset, mq, &rt);
  float* slot0 = PartialSlot(plan, wave, dv, TaskOf(plan, first_chunk));
  const ChunkSlots chunks{slot0, PartialSlotFloats(plan, dv), plan.num_chunks, mq};
  const bool rows_layout = plan.path != KernelPath::kTiled;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  float m[kMaxBlockRows], l[kMaxBlockRows], weight[kMaxSplitChunks];
  float* merged = slot0 + 2 * mq;
  for (int64_t r = 0; r < rows; ++r) {
    const float sink = a.sinks != nullptr ? a.sinks[rt.head[r]] : neg_inf;
    MergeRow(chunks, r, sink, &m[r], &l[r], weight);
    if (rows_layout) {
      MergeOutputRow(chunks, r, dv, weight, merged + r * dv);
      continue;
    }
    for (int64_t e = 0; e < dv; ++e) {
      float sum = 0.0f;
      for (int64_t i = 0; i < plan.num_chunks; ++i) {
        sum += weight[i] * chunks.slot(i)[2 * mq + e * mq + r];
      }
      merged[e * mq + r] = sum;
    }
  }
  if (rows_layout) {
    WriteRows(a, plan, b, rt, rows, m, l, merged, 1, dv);
  } else {
    WriteRows(a, plan, b, rt, rows, m, l, merged, mq, 1);
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_COMBINE_INL_H_
