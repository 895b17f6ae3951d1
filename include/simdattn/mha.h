// simdattn multi-head attention layer: learned Q, K, V and output
// projections around the fused attention of attention.h, with weights
// loaded under PyTorch nn.MultiheadAttention or Llama names and packed once
// for the library's GEMM. The attention options are SEMANTICS.md's; the
// masks of this layer follow PyTorch (docs/SEMANTICS.md, "Multi-head
// attention layer").

#ifndef SIMDATTN_MHA_H_
#define SIMDATTN_MHA_H_

#include <cstdint>

#include "simdattn/attention.h"

namespace simdattn {

// The layer's shape. Q has num_heads heads, K and V num_kv_heads (GQA/MQA:
// a divisor of num_heads), each of head_dim values.
struct MhaConfig {
  int64_t embed_dim = 0;     // E: width of the query input and the output
  int64_t num_heads = 0;     // Hq
  int64_t num_kv_heads = 0;  // Hkv; 0: num_heads
  int64_t head_dim = 0;      // D; 0: embed_dim / num_heads (must divide)
  int64_t kdim = 0;          // width of the key input; 0: embed_dim
  int64_t vdim = 0;          // width of the value input; 0: embed_dim
  bool bias = true;          // projections have biases
  bool add_bias_kv = false;  // learned bias_k / bias_v appended as one more key
  // Storage of the projected Q, K, V and of the attention's output inside
  // the layer (f32, f16 or bf16); products always accumulate in f32.
  DType dtype = DType::kF32;
};

// A dense row-major tensor handed to LoadWeights by name.
struct NamedTensor {
  const char* name = nullptr;
  const void* data = nullptr;
  DType dtype = DType::kF32;  // f32, f16 or bf16
  int64_t ndim = 0;           // 1 to 4
  int64_t shape[4] = {0, 0, 0, 0};
};

// Activations: dense [batch, len, dim] (batch_first) or [len, batch, dim].
struct MhaTensor {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t batch = 0, len = 0, dim = 0;
  bool batch_first = true;
};
struct MutableMhaTensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t batch = 0, len = 0, dim = 0;
  bool batch_first = true;
};

// A PyTorch-convention mask: kBool (non-zero = masked OUT, the opposite of
// SEMANTICS.md's boolean masks) or additive kF32, dense row-major.
struct MhaMask {
  const void* data = nullptr;  // null: none
  DType dtype = DType::kBool;
  int64_t ndim = 0;
  int64_t shape[3] = {0, 0, 0};
};

// Rotary position embedding (RoPE, Llama's) of StepPaged: the new tokens'
// Q and K are rotated at their positions before K is cached and the
// attention runs, as serving.h's RotaryEmbedding says (pairs (i, i +
// rotary_dim / 2), GPT-NeoX / Llama, or (2i, 2i + 1) when interleaved,
// GPT-J; dims from rotary_dim on unchanged).
struct MhaRotary {
  bool enabled = false;
  int64_t rotary_dim = 0;  // even, in [2, head_dim]; 0: head_dim
  bool interleaved = false;
  // f32 tables [max_position, rotary_dim / 2] of the angles' cos and sin.
  // Null: the layer builds them (and keeps them) from theta, angle(p, i) =
  // p * theta^(-2i / rotary_dim), computed in double and rounded to f32.
  const float* cos = nullptr;
  const float* sin = nullptr;
  int64_t max_position = 0;
  double theta = 10000.0;
};

struct MhaForwardOptions {
  // [B, Lk]: key j of batch entry b is masked out (bool) or gets the value
  // added (f32).
  MhaMask key_padding_mask;
  // [Lq, Lk] or [B * Hq, Lq, Lk] (row b * Hq + h), as PyTorch.
  MhaMask attn_mask;
  // Every SEMANTICS.md option (causal, alignment, windows, softcap, ALiBi,
  // sinks, kv_lengths, dropout, scale). attention.mask may not be combined
  // with the masks above (kInvalidArgument). With add_bias_kv the bias key
  // is key Lk, visible through both masks above.
  AttentionOptions attention;
  // Optional f32 softmax weights, computed after the attention from its LSE
  // (never inside the fused kernel): [B, Hq, Lq, Lk'] per head, or
  // [B, Lq, Lk'] averaged over heads when average_weights; Lk' = Lk (+1 with
  // add_bias_kv). Null: not computed. Not with dropout (kUnimplemented).
  float* weights = nullptr;
  bool average_weights = true;
  // RoPE of the new tokens: StepPaged only (kUnimplemented elsewhere).
  MhaRotary rotary;
};

// A dense KV cache for Step: k and v [B, Hkv, capacity, D] (any strides,
// f32/f16/bf16), `length` tokens already in it.
struct MhaKvCache {
  MutableTensorView k, v;
  int64_t length = 0;
};

// A paged KV cache for StepPaged, laid out as serving.h's PagedKvCache:
// k and v [num_blocks, Hkv, block_size, D] (MakePagedNHD or MakePagedHND,
// f32, f16 or bf16, block_size a multiple of 8); batch entry b's token j
// lies in page block_table[b * block_table_stride + j / block_size], row
// j % block_size. seq_lens[b] tokens of entry b are cached already.
struct MhaPagedKvCache {
  MutableTensorView k, v;
  const int32_t* block_table = nullptr;  // [batch, max_blocks_per_seq]
  int64_t max_blocks_per_seq = 0;
  int64_t block_table_stride = 0;  // 0: max_blocks_per_seq
  int32_t* seq_lens = nullptr;     // [batch], advanced by StepPaged
};

class SIMDATTN_API MultiHeadAttention {
 public:
  // Validates the config and makes a layer without weights. kInvalidArgument
  // naming the field (non-positive sizes, heads that do not divide, a dtype
  // that is not f32/f16/bf16); kOutOfMemory. *out is set only on success.
  static Status Create(const MhaConfig& config, MultiHeadAttention** out);
  ~MultiHeadAttention();
  MultiHeadAttention(const MultiHeadAttention&) = delete;
  MultiHeadAttention& operator=(const MultiHeadAttention&) = delete;

  // Loads and packs every weight, under one naming:
  //   PyTorch: in_proj_weight [Hq*D + 2*Hkv*D, E] (kdim = vdim = E), or
  //            q_proj_weight [Hq*D, E], k_proj_weight [Hkv*D, kdim],
  //            v_proj_weight [Hkv*D, vdim]; in_proj_bias; out_proj.weight
  //            [E, Hq*D]; out_proj.bias [E]; bias_k, bias_v [1, 1, Hkv*D].
  //   Llama:   q_proj.weight, k_proj.weight, v_proj.weight, o_proj.weight
  //            (and q_proj.bias ... o_proj.bias when config.bias).
  // A name also matches with any prefix ending in '.' (a layer of a model's
  // state dict). kInvalidArgument naming the tensor: missing, unexpected or
  // duplicate names, wrong shapes, dtypes; nothing changes on error.
  // Packs for the target exec would choose; the layer's projections then
  // run on that target.
  Status LoadWeights(const NamedTensor* tensors, int64_t num,
                     const ExecutionOptions& exec = {});

  // out = concat_heads(attention(X_q Wq^T + bq, X_k Wk^T + bk,
  // X_v Wv^T + bv)) Wo^T + bo. key and value null: self-attention (both
  // are query), with Q, K and V from one fused GEMM. query [B, Lq, E],
  // key [B, Lk, kdim], value [B, Lk, vdim], out [B, Lq, E] in query's
  // batch_first layout. One call at a time per layer (calls are
  // serialized: the layer keeps its buffers). Returns kOk,
  // kInvalidArgument naming the argument, kUnimplemented, kOutOfMemory,
  // or the attention's own errors.
  Status Forward(const MhaTensor& query, const MhaTensor* key,
                 const MhaTensor* value, const MutableMhaTensor& out,
                 const MhaForwardOptions& options = {},
                 const ExecutionOptions& exec = {}, RunInfo* info = nullptr);

  // One decoding step, as an engine's decoder layer: projects the T new
  // tokens x [B, T, E], writes their K and V into cache rows [length,
  // length + T), attends over the length + T cached keys with causal
  // bottom-right alignment (plus options.attention), projects out and
  // advances cache->length. Masks of this layer and need_weights are
  // kUnimplemented here; so is add_bias_kv.
  Status Step(const MhaTensor& x, MhaKvCache* cache,
              const MutableMhaTensor& out,
              const MhaForwardOptions& options = {},
              const ExecutionOptions& exec = {}, RunInfo* info = nullptr);

  // Step against a paged cache, as a serving engine's decoder layer: the T
  // new tokens x [B, T, E] of entry b take positions [seq_lens[b],
  // seq_lens[b] + T); their K and V (rotated by options.rotary when
  // enabled, Q too) are written into their pages by AppendKv, then
  // PagedAttention attends each entry's T queries over its seq_lens[b] + T
  // keys with causal bottom-right alignment (plus options.attention), the
  // output is projected and seq_lens advances by T. Entries may have
  // different seq_lens. With batch_first = false, T must be 1. Masks of
  // this layer, need_weights and add_bias_kv are kUnimplemented. Errors:
  // kInvalidArgument naming the argument (AppendKv's and PagedAttention's
  // own checks of the views included); seq_lens is unchanged on error,
  // though pages past seq_lens may have been written.
  Status StepPaged(const MhaTensor& x, MhaPagedKvCache* cache,
                   const MutableMhaTensor& out,
                   const MhaForwardOptions& options = {},
                   const ExecutionOptions& exec = {}, RunInfo* info = nullptr);
  const MhaConfig& config() const;
  bool loaded() const;

  struct Impl;

 private:
  explicit MultiHeadAttention(Impl* impl);
  Impl* impl_;
};

}  // namespace simdattn

#endif  // SIMDATTN_MHA_H_
