// simdattn serving API: what continuous-batching engines need around the
// attention call. Paged KV caches with ragged batches of sequences in one
// call, writing new tokens into the pages (with rotary embedding), and the
// exact merge of partial results. The contract is docs/SEMANTICS.md
// ("Paged attention", "Appending to a paged cache", "Merging partial
// results"); the plain call and its options are attention.h.

#ifndef SIMDATTN_SERVING_H_
#define SIMDATTN_SERVING_H_

#include <cstdint>

#include "simdattn/attention.h"

namespace simdattn {

// ---------------------------------------------------------------- Views

// Token-major [tokens, heads, d] storage (the rows of a ragged batch, the
// new tokens of an append) as the logical 4-D view [1, heads, tokens, d]
// that the calls below take.
SIMDATTN_API TensorView MakeTokenMajor(const void* data, DType dtype,
                                       int64_t tokens, int64_t heads,
                                       int64_t d);
SIMDATTN_API MutableTensorView MakeTokenMajor(void* data, DType dtype,
                                              int64_t tokens, int64_t heads,
                                              int64_t d);

// A paged cache of K or V is the logical view [num_blocks, heads,
// block_size, d]: page n holds block_size consecutive tokens of every KV
// head. vLLM's and FlashAttention's layout [num_blocks, block_size, heads,
// d] ("NHD") and the head-major [num_blocks, heads, block_size, d] ("HND")
// are both strided views of it.
SIMDATTN_API TensorView MakePagedNHD(const void* data, DType dtype,
                                     int64_t num_blocks, int64_t block_size,
                                     int64_t heads, int64_t d);
SIMDATTN_API MutableTensorView MakePagedNHD(void* data, DType dtype,
                                            int64_t num_blocks,
                                            int64_t block_size, int64_t heads,
                                            int64_t d);
SIMDATTN_API TensorView MakePagedHND(const void* data, DType dtype,
                                     int64_t num_blocks, int64_t block_size,
                                     int64_t heads, int64_t d);
SIMDATTN_API MutableTensorView MakePagedHND(void* data, DType dtype,
                                            int64_t num_blocks,
                                            int64_t block_size, int64_t heads,
                                            int64_t d);

// ---------------------------------------------------------------- Paged

// The KV cache of a batch of sequences. Sequence s has kv_lens[s] keys; its
// key j lies in page block_table[s * block_table_stride + j / block_size],
// row j % block_size. block_size (the views' extent 2) is a multiple of 8.
// Entries of block_table past a sequence's last page are never read.
struct PagedKvCache {
  TensorView k;  // [num_blocks, Hkv, block_size, Dk]
  TensorView v;  // [num_blocks, Hkv, block_size, Dv], any K/V dtype
  // Quantized pages: int8's scales are AttentionOptions::k_scales and
  // v_scales of shape [num_blocks, Hkv, block_size, 1] (a scale per slot),
  // fp8's k_scale / v_scale; q8_0 pages have byte strides.
  const int32_t* block_table = nullptr;  // [num_seqs, max_blocks_per_seq]
  int64_t max_blocks_per_seq = 0;
  int64_t block_table_stride = 0;  // elements between rows; 0: max_blocks_per_seq
  const int32_t* kv_lens = nullptr;  // [num_seqs], each in [0, max_blocks_per_seq * block_size]
};

// Attention of a ragged batch against a paged cache, in one call. Sequence
// s has the queries [cu_seqlens_q[s], cu_seqlens_q[s + 1]) of q (its last
// tokens: a decode step has one, a chunk of prefill several);
// cu_seqlens_q = nullptr means one query per sequence (q has num_seqs
// rows). q [1, Hq, total_q, Dk], o [1, Hq, total_q, Dv] and lse
// [1, Hq, total_q, 1] are views of token-major storage (MakeTokenMajor) or
// any other strides.
//
// Every option of AttentionOptions applies to each sequence as to a batch
// entry of Attention(), with b = s (dropout's keep mask) and these rules:
//   - alignment: unset means kBottomRight (a sequence's queries are its
//     last tokens), so causal hides keys j > i + kv_lens[s] - Lq_s.
//   - kv_lengths / kv_lengths_i32 must be null: cache.kv_lens is the length.
//   - a mask is [1, Hq or 1, total_q or 1, Lk_mask] with Lk_mask >= every
//     kv_lens[s] (or 1): row t of the mask belongs to query row t.
// A sequence without keys gives O = 0 and LSE = -inf (its sink, where it
// has one), as a row that sees no key in Attention(). Work is split over
// sequences, heads and key chunks, so one long sequence among short ones
// uses every thread; results are bit-identical for any thread count.
// ExecutionOptions::workspace is not taken here (kInvalidArgument).
// Returns as Attention(); RunInfo::path is the path of the last sequence
// with queries and num_tasks counts every sequence's tasks.
SIMDATTN_API Status PagedAttention(const TensorView& q,
                                   const PagedKvCache& cache,
                                   int64_t num_seqs,
                                   const int32_t* cu_seqlens_q,
                                   const MutableTensorView& o,
                                   const AttentionOptions& options = {},
                                   const MutableTensorView& lse = {},
                                   const ExecutionOptions& exec = {},
                                   RunInfo* info = nullptr);

// ---------------------------------------------------------------- Append

// Rotary position embedding (RoPE) applied by AppendKv. Token t at position
// p = positions[t] rotates the pairs of its first rotary_dim dims by the
// angle whose cos and sin are cos[p * rotary_dim / 2 + i] and
// sin[p * rotary_dim / 2 + i] (tables [max_position, rotary_dim / 2], f32):
// pair i is dims (2i, 2i + 1) when interleaved (GPT-J), (i, i + rotary_dim
// / 2) otherwise (GPT-NeoX, Llama). (x, y) becomes (x cos - y sin,
// y cos + x sin). Dims from rotary_dim on are copied unchanged.
struct RotaryEmbedding {
  const int32_t* positions = nullptr;  // [tokens]; null: no rotation
  const float* cos = nullptr;
  const float* sin = nullptr;
  int64_t max_position = 0;
  int64_t rotary_dim = 0;  // even, in [2, Dk]; 0: Dk
  bool interleaved = false;
};

// Writes the K and V of `tokens` new tokens into paged caches: token t goes
// to page slot_mapping[t] / block_size, row slot_mapping[t] % block_size
// (vLLM's convention); a negative slot skips the token (padding). k_new
// [1, Hkv, tokens, Dk] and v_new [1, Hkv, tokens, Dv] (MakeTokenMajor) are
// converted to the caches' dtype (f32, f16 or bf16 here; quantized caches
// take the overload below) with round to nearest even. With
// rotary.positions set, K is rotated before it is stored, and so is q
// ([1, Hq, tokens, Dk], in place) when q.data is not null. Two tokens may
// not map to one slot. Bad input: kInvalidArgument and nothing written.
//
// Rotation is computed in f32 from the stored values and rounded once (to
// the cache's dtype, or back to q's). q is rotated for every token, those
// with a negative slot too; q without rotary.positions is kInvalidArgument.
// k_new, v_new and q may have 0 tokens (a no-op; data may then be null).
// The K and V caches may differ in dtype. Of exec only the executor is
// used: the call keeps no scratch but a per-thread copy of the slots (for
// the duplicate check) and has no per-target code. Results do not depend
// on the thread count. Returns kOk, kInvalidArgument (the message names
// the argument and value: a slot >= num_blocks * block_size, a position
// outside [0, max_position), mismatched extents, block_size not a multiple
// of 8, an output overlapping an input or the other cache, ...),
// kOutOfMemory or kInternal; nothing is written unless kOk.
SIMDATTN_API Status AppendKv(const TensorView& k_new, const TensorView& v_new,
                             const MutableTensorView& k_cache,
                             const MutableTensorView& v_cache,
                             const int32_t* slot_mapping,
                             const RotaryEmbedding& rotary = {},
                             const MutableTensorView& q = {},
                             const ExecutionOptions& exec = {});

// The scales AppendKv needs for quantized caches (SEMANTICS.md "Quantized
// KV caches"). An int8 cache has a scale cache beside it, f32
// [num_blocks, Hkv, block_size, 1] (a scale per slot, the view that
// PagedAttention takes as AttentionOptions::k_scales / v_scales), into
// which AppendKv writes each written row's scale; it stays empty ({}) for
// other caches. An fp8 cache has the caller's per-tensor scale (finite,
// > 0); it stays 1 for other caches.
struct QuantizedCacheScales {
  MutableTensorView k_scales;  // int8 k_cache only
  MutableTensorView v_scales;  // int8 v_cache only
  float k_scale = 1.0f;        // fp8 k_cache only
  float v_scale = 1.0f;        // fp8 v_cache only
};

// AppendKv into caches of any K/V dtype, quantized ones included (the
// call above is this one with scales = {}). A quantized cache's rows are
// computed in f32 (converted, K rotated) and stored as QuantizeKv stores
// them, with the same rounding code: int8 with scale max|x| / 127 of the
// row (written to the scale cache at the token's slot), q8_0 per block of
// 32 values with its f16 scale, fp8 as x / scale saturating at the largest
// finite value (NaN stays NaN). q8_0 caches need D % 32 == 0 and byte
// strides[0..2]. Missing, misshaped or superfluous scales are
// kInvalidArgument naming k_scales, v_scales, k_scale or v_scale.
SIMDATTN_API Status AppendKv(const TensorView& k_new, const TensorView& v_new,
                             const MutableTensorView& k_cache,
                             const MutableTensorView& v_cache,
                             const int32_t* slot_mapping,
                             const RotaryEmbedding& rotary,
                             const MutableTensorView& q,
                             const ExecutionOptions& exec,
                             const QuantizedCacheScales& scales);

// ---------------------------------------------------------------- Quantize

// Stores x (f32, f16 or bf16, logical [d0, d1, d2, D], any strides with a
// contiguous last dimension) in out's quantized format (kInt8, kQ8_0,
// kFp8E4M3 or kFp8E5M2; the same logical shape, q8_0 with D % 32 == 0 and
// byte strides) as SEMANTICS.md "Quantized KV caches" says, round to
// nearest even: int8 rows with scale max|x| / 127 written to scales (f32
// [d0, d1, d2, 1]), q8_0 blocks with their f16 scales inside, fp8 values
// x / scale (scale finite and > 0) saturating at the largest finite value.
// scales stays empty ({}) except for int8; scale stays 1 except for fp8.
// Sequential (no threads). Returns kOk or kInvalidArgument naming the
// argument (dtypes, shapes, strides, scale, outputs overlapping x or each
// other); nothing is written unless kOk.
SIMDATTN_API Status QuantizeKv(const TensorView& x, const MutableTensorView& out,
                               const MutableTensorView& scales = {},
                               float scale = 1.0f);

// ---------------------------------------------------------------- Merge

// Merges the results of attention over disjoint sets of keys: outs[i]
// [B, H, L, Dv] (f32, f16 or bf16) with lses[i] [B, H, L, 1] (f32, natural
// log, as Attention() writes them) into exactly what one call over the
// union of the keys gives, up to rounding: lse = log(sum_i exp(lses[i])),
// out = sum_i exp(lses[i] - lse) * outs[i]. A part whose row saw no key
// (LSE -inf) adds nothing; a row no part saw gives out 0 and lse -inf. A
// sink belongs in one part only. out may alias outs[0] exactly (same data
// and strides); lse may alias lses[0] likewise. The parts' dtypes may differ
// from each other and from out's. lse.data null (the default {}) asks for
// no LSE. A NaN in a row's LSEs makes that row NaN (out and lse); a +inf
// (a part whose scores overflowed) makes out NaN and lse +inf. Each row is
// merged in f32 (weights and lse in double) in the order of the parts, in
// one task: the same bits for any thread count. exec.workspace is not used
// (the call allocates nothing).
// Returns kOk, or kInvalidArgument naming the argument (SEMANTICS.md "Bad
// input": num_parts < 1, null arrays, shapes, dtypes, strides, int64
// offsets, outputs that overlap each other or an input other than their
// alias) with nothing written, or kInternal.
SIMDATTN_API Status MergeStates(const TensorView* outs, const TensorView* lses,
                                int64_t num_parts,
                                const MutableTensorView& out,
                                const MutableTensorView& lse,
                                const ExecutionOptions& exec = {});

}  // namespace simdattn

#endif  // SIMDATTN_SERVING_H_
