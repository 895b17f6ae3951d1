// Interface between the target-independent driver (lib/api.cc) and the
// per-target kernels (lib/kernels/*): plain data and function pointers, no
// vector types, so it is the same for every Highway target.

#ifndef SIMDATTN_LIB_KERNELS_KERNELS_H_
#define SIMDATTN_LIB_KERNELS_KERNELS_H_

#include <cstddef>
#include <cstdint>

namespace simdattn {

// One validated f32 attention call as the fused kernel sees it. Strides are
// in elements for the (batch, head, sequence) dimensions; the head dimension
// is contiguous. lse may be null.
struct AttentionArgsF32 {
  int64_t batch, q_heads, kv_heads, group, q_len, kv_len;
  int64_t head_dim_qk, head_dim_v;
  // Storage types (0 = f32, 1 = f16, 2 = bf16) of Q and O; math is f32.
  int q_type;
  int o_type;
  const void* q;
  int64_t q_strides[3];
  // K and V share one storage type: kv_type 0 = f32, 1 = f16, 2 = bf16
  // (16-bit ones are widened to f32 tile by tile).
  int kv_type;
  const void* k;
  int64_t k_strides[3];
  const void* v;
  int64_t v_strides[3];
  void* o;
  int64_t o_strides[3];
  float* lse;
  int64_t lse_strides[3];
  float scale;
  bool causal;
  bool bottom_right;
  // SEMANTICS.md options; null / negative / 0 = off.
  const int64_t* kv_lengths;   // [batch]
  int64_t window_left;         // < 0: unbounded
  int64_t window_right;        // < 0: unbounded
  float softcap;               // 0: off
  const float* alibi_slopes;   // [q_heads]
  const float* sinks;          // [q_heads]
  float dropout_p;             // 0: off
  uint64_t dropout_seed;
  // Explicit mask: kind 0 = none, 1 = bool (uint8, 0 hides), 2 = additive
  // f32, 3 = additive f16; strides in elements, 0 on broadcast dimensions.
  int mask_kind;
  const void* mask;
  int64_t mask_strides[4];
  // Work split, set by the driver. The rows of one (batch, KV head) group are
  // its group * q_len queries, head-major (query head hkv * group + r / q_len,
  // query r % q_len); they go in blocks of block_rows
  // (TargetKernels::query_block_rows). Each block sees the keys in num_chunks
  // chunks of chunk_keys (1 chunk of all keys unless split): a split call
  // writes partial results to `partials` and combine_f32 merges them.
  int64_t block_rows;
  int64_t num_blocks;   // per group
  int64_t num_chunks;   // per block
  int64_t chunk_keys;
  float* partials;      // PartialFloats() floats when num_chunks > 1
  // Lq = 1: the head-dim-vectorized decode micro-path (decode-inl.h, every
  // option included) instead of the queries-along-lanes tiles.
  bool decode_path;
  // Packed K/V (prefill with several blocks per group): when not null, the
  // driver has run pack_kv for groups [packed_first_group, ...) and group g
  // of them is at packed + (g - packed_first_group) * PackedGroupFloats();
  // the tiles then read it instead of K/V's storage. Null: tile by tile from
  // storage.
  float* packed;
  int64_t packed_first_group;
  // Write O with non-temporal (streaming) stores where a whole cache line
  // of f32 goes at once: set by the driver for outputs of at least
  // kStreamOutputBytes, which leave L2 long before anyone reads them.
  bool stream_output;
};

// f32 O tensors of at least this many bytes are written with streaming
// stores (AttentionArgsF32::stream_output): each line is then written whole
// without first being read from memory. 4 MiB is more than the L2 of a
// current server core (1-2 MiB), so such an O would not stay there anyway.
// On an AVX-512 Xeon VM (2 MiB L2), paired in one process, 1 thread: B4 H16
// L256 D64 (4 MiB of O) 1.024x, B1 H8 L2048 D128 (8 MiB) 1.025x; 2 threads
// B4 H16 L256 D64 1.021x.
constexpr int64_t kStreamOutputBytes = int64_t{4} << 20;

// Packed K/V of one (batch, KV head) group: K's kv_len x Dk floats, then
// V's kv_len x Dv, each region rounded up to 64 floats (256 bytes).
inline int64_t PackedKFloats(const AttentionArgsF32& a) {
  return (a.kv_len * a.head_dim_qk + 63) / 64 * 64;
}
inline int64_t PackedGroupFloats(const AttentionArgsF32& a) {
  return PackedKFloats(a) + (a.kv_len * a.head_dim_v + 63) / 64 * 64;
}

// What one target offers. Every function is sequential: the driver splits
// work into tasks and hands them to threads.
struct TargetKernels {
  // Query rows one prefill task covers (a multiple of the vector length).
  int64_t (*query_block_rows)();
  // Floats of per-thread scratch one task needs (aligned by the callee).
  size_t (*scratch_floats)(int64_t head_dim_qk, int64_t head_dim_v);
  // Computes task `task` of AttentionTaskCount(): one block of rows against
  // one chunk of keys. Unsplit, it writes the block's rows of O (and LSE);
  // split, its partial (m, l, unnormalized O) in args.partials. scratch holds
  // scratch_floats() floats, 256-byte aligned.
  void (*attention_f32)(const AttentionArgsF32& args, int64_t task,
                        float* scratch);
  // Split calls only: merges the chunks of block `task` (of
  // CombineTaskCount()) exactly through their log-sum-exp and writes O/LSE.
  void (*combine_f32)(const AttentionArgsF32& args, int64_t task);
  // Packs the K/V of group `group` (b * kv_heads + hkv) into `dst`
  // (PackedGroupFloats() floats, 256-byte aligned) in the layout the tiles
  // read when args.packed is set. scratch as for attention_f32.
  void (*pack_kv)(const AttentionArgsF32& args, int64_t group, float* dst,
                  float* scratch);
};

// Kernels compiled for the Highway target `target_bit` (one bit of
// HWY_TARGETS), or null if that target is not compiled in.
const TargetKernels* KernelsForTarget(int64_t target_bit);

// Whether this compiler builds the native bf16 products (vdpbf16ps, see
// bf16_dot-inl.h): x86-64 with GCC >= 10 or Clang >= 9.
#if defined(__x86_64__) &&                                   \
    ((defined(__clang__) && __clang_major__ >= 9) ||         \
     (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 10))
#define SIMDATTN_NATIVE_BF16_COMPILER 1
#else
#define SIMDATTN_NATIVE_BF16_COMPILER 0
#endif

// The AVX3 kernels with the native bf16 products for bf16 Q, K and V (the
// AVX3_BF16 entry of the dispatch table), or null if not compiled in. The
// caller checks that the CPU has AVX512_BF16.
const TargetKernels* NativeBf16Kernels();

// Split (decode) calls keep at most this many key chunks per block.
constexpr int64_t kMaxSplitChunks = 256;

// Vectors of queries in a full query block (TargetKernels::query_block_rows
// is this many vectors). The register tile covers two of them at a time; the
// decode micro-path takes blocks of at most two.
constexpr int64_t kQueryBlockVectors = 4;

inline int64_t CombineTaskCount(const AttentionArgsF32& a) {
  return a.batch * a.kv_heads * a.num_blocks;
}
inline int64_t AttentionTaskCount(const AttentionArgsF32& a) {
  return CombineTaskCount(a) * a.num_chunks;
}
// Floats of the partial results of a split call: per task, m and l of each
// row and its unnormalized O^T ([head_dim_v][block_rows]).
inline int64_t PartialFloats(const AttentionArgsF32& a) {
  return AttentionTaskCount(a) * a.block_rows * (a.head_dim_v + 2);
}

}  // namespace simdattn

#endif  // SIMDATTN_LIB_KERNELS_KERNELS_H_
