// Interface between the target-independent driver (lib/api.cc, lib/plan.cc,
// lib/run.cc) and the per-target kernels (lib/kernels/*): plain data and
// function pointers, no vector types, so it is the same for every target.

#ifndef SIMDATTN_LIB_KERNELS_KERNELS_H_
#define SIMDATTN_LIB_KERNELS_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "lib/kernels/types.h"

namespace simdattn {

// One validated call, as the kernels see it; never changed while it runs.
// Strides are in elements (q8_0 K/V: bytes) for the (batch, head, sequence)
// dimensions; the head dimension is contiguous.
struct AttentionArgs {
  int64_t batch, q_heads, kv_heads, group, q_len, kv_len;
  int64_t head_dim_qk, head_dim_v;
  Storage q_type, o_type;
  // K's and V's storage, each its own; kv_type is their common type, or
  // kMixed when they differ.
  Storage k_type, v_type, kv_type;
  const void* q;
  int64_t q_strides[3];
  const void* k;
  int64_t k_strides[3];
  const void* v;
  int64_t v_strides[3];
  void* o;
  int64_t o_strides[3];
  float* lse;  // null: no LSE
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
  MaskKind mask_kind;
  const void* mask;
  int64_t mask_strides[4];     // 0 on broadcast dimensions
  // Quantized K/V (SEMANTICS.md "Quantized KV caches"): int8's per-row f32
  // scales (null otherwise), strides in floats for (batch, head, row), or
  // (page, head, row) when paged; fp8's per-tensor scale (1 otherwise).
  // q8_0 rows carry their own scales, and their strides are in bytes.
  const float* k_scales = nullptr;
  int64_t k_scale_strides[3] = {0, 0, 0};
  const float* v_scales = nullptr;
  int64_t v_scale_strides[3] = {0, 0, 0};
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  // Paged K/V (PagedAttention; batch is then 1): key j lies in page
  // block_table[j / block_size] at row j % block_size, pages k_strides[0]
  // (v_strides[0]) elements apart. Null: dense K/V.
  const int32_t* block_table = nullptr;
  int64_t block_size = 0;
  // The dropout keep mask of batch entry b is that of entry dropout_batch + b
  // (PagedAttention: the sequence's index).
  int64_t dropout_batch = 0;
  // Q, K and V of any storage type may be rounded to bf16 for the products
  // (ExecutionOptions::allow_bf16_compute).
  bool bf16_compute = false;
};

// The kernel a call's tasks run (RunInfo::path).
enum class KernelPath : int {
  kTiled,        // queries along the lanes, K/V tiles (prefill)
  kDecode,       // head dims along the lanes, every option (few queries)
  kDecodeFused,  // kDecode's fused 16-bit loop: no options, whole vectors
};

// How a call is split into tasks (lib/plan.cc, MakePlan). The rows of one
// group (batch b, KV head hkv) are its group * q_len queries, head-major:
// row g is query g % q_len of head hkv * group + g / q_len. They go in
// num_blocks blocks of block_rows; each block sees the keys in num_chunks
// chunks of chunk_keys. A task is one (group, block, chunk); with several
// chunks, each task writes a partial result and combine tasks merge them.
// Nothing here depends on the thread count, so results do not either.
struct Plan {
  KernelPath path;
  int64_t block_rows;
  int64_t num_blocks;  // per group
  int64_t num_chunks;  // per block
  int64_t chunk_keys;
  // f32 O written with streaming stores where a whole cache line goes at
  // once (outputs of at least kStreamOutputBytes).
  bool stream_output;
  // K/V of each group packed once (pack_kv) for the tiles to read, in
  // packed_group_floats floats per group.
  bool pack_kv;
  int64_t packed_group_floats;
  int64_t groups;  // batch * kv_heads
};

// Buffers of one wave of tasks (lib/run.cc): the partial results of a
// split call, and the packed K/V of groups [packed_first_group, ...).
struct Wave {
  float* partials = nullptr;
  float* packed = nullptr;  // null: tiles read K/V from storage
  int64_t packed_first_group = 0;
};

// f32 O tensors of at least this many bytes are written with streaming
// stores: more than a server core's L2 (1-2 MiB), so O would leave it before
// anyone reads it. B1 H8 L2048 D128 f32 (8 MiB of O), 1 thread: 1.025x.
constexpr int64_t kStreamOutputBytes = int64_t{4} << 20;

// Vectors of queries in a full query block (TargetKernels::query_block_rows
// is this many vectors). The register tile covers two of them at a time; the
// decode path takes blocks of at most two.
constexpr int64_t kQueryBlockVectors = 4;

// Split (decode) calls keep at most this many key chunks per block.
constexpr int64_t kMaxSplitChunks = 256;

// Task `task` as (group, block, chunk). Tasks of one group are consecutive
// (its K/V stay in cache), heaviest block first (the last one when causal),
// so a dynamic scheduler ends on light tasks.
struct TaskIndex {
  int64_t group, block, chunk;
};
inline TaskIndex TaskAt(const Plan& plan, int64_t task) {
  const int64_t per_group = plan.num_blocks * plan.num_chunks;
  return {task / per_group,
          plan.num_blocks - 1 - (task % per_group) / plan.num_chunks,
          task % plan.num_chunks};
}
inline int64_t TaskOf(const Plan& plan, const TaskIndex& t) {
  return (t.group * plan.num_blocks + (plan.num_blocks - 1 - t.block)) *
             plan.num_chunks + t.chunk;
}
inline int64_t CombineTaskCount(const Plan& plan) {
  return plan.groups * plan.num_blocks;
}
inline int64_t AttentionTaskCount(const Plan& plan) {
  return CombineTaskCount(plan) * plan.num_chunks;
}

// A split call's partial result of one task: m and l of each row
// (block_rows each), then its unnormalized O: O^T [Dv][block_rows] from the
// tiled kernel, rows [rows][Dv] from the decode path.
inline int64_t PartialSlotFloats(const Plan& plan, int64_t head_dim_v) {
  return plan.block_rows * (head_dim_v + 2);
}
inline int64_t PartialFloats(const Plan& plan, int64_t head_dim_v) {
  return AttentionTaskCount(plan) * PartialSlotFloats(plan, head_dim_v);
}
inline float* PartialSlot(const Plan& plan, const Wave& wave,
                          int64_t head_dim_v, int64_t task) {
  return wave.partials + task * PartialSlotFloats(plan, head_dim_v);
}

// Packed K/V of one group: K's kv_len x Dk floats, then V's kv_len x Dv,
// each region rounded up to 64 floats (256 bytes).
inline int64_t PackedKFloats(const AttentionArgs& a) {
  return (a.kv_len * a.head_dim_qk + 63) / 64 * 64;
}
inline int64_t PackedGroupFloats(const AttentionArgs& a) {
  return PackedKFloats(a) + (a.kv_len * a.head_dim_v + 63) / 64 * 64;
}

// Whether the AVX3_AMX entry's decode runs a call's keys on the tiles
// (decode_amx-inl.h, for tasks of 5 to 32 rows without options): bf16 K and
// V read in place (dense, or in pages of a multiple of 16 keys), bf16 Q or
// Q of another type the caller lets round (allow_bf16_compute), head dims
// multiples of 32 up to 1024.
inline bool AmxDecodeInputs(const AttentionArgs& a) {
  const bool q = a.q_type == Storage::kBF16 || (a.bf16_compute && IsWideStorage(a.q_type));
  return q && a.k_type == Storage::kBF16 && a.v_type == Storage::kBF16 &&
         (a.block_table == nullptr || a.block_size % 16 == 0) && a.head_dim_qk % 32 == 0 &&
         a.head_dim_v % 32 == 0 && a.head_dim_qk <= 1024;
}

// The AVX3_AMX entry's packed K/V of one group (amx-inl.h): K as
// [keys][Dk rounded up to 32] bf16, then Vᵀ as [Dv rounded up to 32][keys],
// keys = Lk rounded up to 32, plus 32 (a 32-key tile from any valid key).
inline int64_t AmxPackedKeys(const AttentionArgs& a) {
  return (a.kv_len + 31) / 32 * 32 + 32;
}
inline int64_t AmxPackedGroupFloats(const AttentionArgs& a) {
  const int64_t elems = AmxPackedKeys(a) * ((a.head_dim_qk + 31) / 32 * 32 +
                                            (a.head_dim_v + 31) / 32 * 32);
  return (elems / 2 + 63) / 64 * 64;
}

// What a target's kernels can do, for the plan.
struct TargetCaps {
  int64_t lanes;          // f32 lanes of a full vector
  bool fused_decode;      // compiled with the fused 16-bit decode loop
  bool f16_in_registers;  // widens f16 in registers (hardware conversion)
  int64_t fused_max_dk;   // largest Dk the fused loop takes
  bool amx;               // bf16 Q, K, V run on AMX tiles (packed K/V)
};

// What one target offers. Every function is sequential: the driver splits
// work into tasks and hands them to threads.
struct TargetKernels {
  TargetCaps (*caps)();
  // Query rows one prefill task covers (a multiple of the vector length).
  int64_t (*query_block_rows)();
  // Floats of per-thread scratch one task needs (aligned by the callee).
  size_t (*scratch_floats)(int64_t head_dim_qk, int64_t head_dim_v);
  // Computes task `task` of AttentionTaskCount(plan): one block of rows
  // against one chunk of keys. Unsplit, it writes the block's rows of O (and
  // LSE); split, its PartialSlot. scratch holds scratch_floats() floats,
  // 256-byte aligned.
  void (*attention)(const AttentionArgs& args, const Plan& plan,
                    const Wave& wave, int64_t task, float* scratch);
  // Split calls only: merges the chunks of block `task` (of
  // CombineTaskCount()) exactly through their log-sum-exp and writes O/LSE.
  void (*combine)(const AttentionArgs& args, const Plan& plan,
                  const Wave& wave, int64_t task);
  // Packs the K/V of group `group` (b * kv_heads + hkv) into `dst`
  // (PackedGroupFloats() floats, 256-byte aligned) in the layout the tiles
  // read when Wave::packed is set. scratch as for attention.
  void (*pack_kv)(const AttentionArgs& args, const Plan& plan, int64_t group,
                  float* dst, float* scratch);
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

// The AVX3 kernels with bf16 Q, K and V on AMX tiles (the AVX3_AMX entry),
// with the tile instructions or (emulated) their emulator; null if not
// compiled in. The caller checks the CPU and the tile state permission.
const TargetKernels* AmxKernels(bool emulated);

}  // namespace simdattn

#endif  // SIMDATTN_LIB_KERNELS_KERNELS_H_
