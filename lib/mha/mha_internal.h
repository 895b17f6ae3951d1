// The multi-head attention layer's state (MultiHeadAttention::Impl) and the
// helpers its calls share: lib/mha/*.cc.

#ifndef SIMDATTN_LIB_MHA_MHA_INTERNAL_H_
#define SIMDATTN_LIB_MHA_MHA_INTERNAL_H_

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "lib/gemm/gemm.h"
#include "lib/status.h"
#include "simdattn/mha.h"

namespace simdattn {

// Where one projection's weights lie: segment `seg` of in_packs[pack].
struct ProjRef {
  int pack = 0, seg = 0;
};

struct MultiHeadAttention::Impl {
  MhaConfig config;  // defaults resolved
  int64_t nq = 0;    // Hq * D: columns of the Q projection
  int64_t nkv = 0;   // Hkv * D: columns of K's and V's
  bool loaded = false;
  // fused: one pack of three segments Q, K, V (kdim = vdim = E);
  // otherwise three packs of one segment each.
  bool fused = false;
  std::vector<PackedWeights> in_packs;
  ProjRef q_ref, k_ref, v_ref;
  PackedWeights out_pack;
  std::vector<float> bias_k, bias_v;  // [nkv] with add_bias_kv
  // The buffers of a call, grown as needed and kept (a first touch of a
  // fresh page costs ~11 us here: docs/PERF-NOTES.md).
  std::mutex mutex;
  std::vector<unsigned char> qkv, kv, kv_ext, o, mask, lse;
  // StepPaged's: slots and positions per token row, kv_lens and
  // cu_seqlens_q per entry, and the RoPE tables built from a theta
  // (rope_positions rows of rope_dim / 2).
  std::vector<int32_t> slots, positions, kv_lens, cu_q;
  std::vector<float> rope_cos, rope_sin;
  int64_t rope_dim = 0, rope_positions = 0;
  double rope_theta = 0.0;
};

// Element offset of row (b, i) of a [B, L, dim] or [L, B, dim] tensor's rows.
inline int64_t MhaRow(bool batch_first, int64_t batch, int64_t len, int64_t b,
                      int64_t i) {
  return batch_first ? b * len + i : i * batch + b;
}

// The view [B, heads, L, d] of columns [col, col + heads * d) of a matrix
// of rows ld elements apart, whose row (b, i) is MhaRow(...).
TensorView MhaHeadsView(const void* data, DType dtype, int64_t ld, int64_t col,
                        bool batch_first, int64_t batch, int64_t heads,
                        int64_t len, int64_t d);

// Resizes a kept buffer (kOutOfMemory instead of throwing).
Status MhaReserve(std::vector<unsigned char>* buffer, size_t bytes, const char* what);

// The SEMANTICS.md mask equivalent to the PyTorch masks of `options` (with
// a visible column for the bias key when add_bias_kv): none, a view of the
// caller's f32 attn_mask, or f32 additive [B or 1, Hq or 1, Lq, Lk'] built
// in *buffer. Validates the masks' shapes and dtypes.
Status MhaBuildMask(const MhaForwardOptions& options, int64_t batch,
                    int64_t heads, int64_t q_len, int64_t kv_len, bool bias_kv,
                    std::vector<unsigned char>* buffer, TensorView* mask);

// weights[b, h, i, j] = exp(s_bhij - lse[b, h, i]) with the scores of
// SEMANTICS.md, recomputed from q and k (or their mean over heads), split
// over exec's threads.
Status MhaSoftmaxWeights(const TensorView& q, const TensorView& k,
                         const AttentionOptions& options, const float* lse,
                         bool average, float* weights,
                         const ExecutionOptions& exec);

}  // namespace simdattn

#endif  // SIMDATTN_LIB_MHA_MHA_INTERNAL_H_
