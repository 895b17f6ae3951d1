// Planning a call (see plan.h): the kernels' arguments, the choice of kernel
// path, the blocks of query rows, the key chunks of split calls and whether
// K/V are packed.

#include "lib/plan.h"

#include <algorithm>
#include <atomic>

namespace simdattn {
namespace {

// Calls with at most this many queries per head split the keys into
// chunks (flash-decoding), so that every thread streams even when
// B x Hkv is small.
constexpr int64_t kDecodeMaxQueries = 16;
// Lq > 1 takes the decode path (rows along the head dims) up to this many
// rows per group, the tiled kernel (rows along the lanes) beyond: it wins
// where a group fills a vector poorly. f16 K/V, 1 thread, AVX-512: 8 rows
// 3.8 -> 7.8 GB/s, 32 rows 2.7 -> 2.3 (decode against tiled, Hq32 Lk16384).
constexpr int64_t kDecodeMaxRows = 16;
// Keys per chunk: kDecodeChunkKeys, doubled up to kDecodeMaxChunkKeys while
// the call keeps at least kDecodeMinTasks tasks (a few per thread on 16-32
// threads). 2048 against 512 keys: -2% to +11% (decode entries, Lk 4096 to
// 65536, 1 and 2 threads).
constexpr int64_t kDecodeChunkKeys = 512;
constexpr int64_t kDecodeMaxChunkKeys = 2048;
constexpr int64_t kDecodeMinTasks = 64;
// f32 K/V that one query block reads below this size stay in L2 while the
// group's blocks run and are read in place as fast as a packed copy; 16-bit
// K/V are always packed (widened once per group instead of once per block).
constexpr int64_t kPackMinF32BlockBytes = int64_t{1} << 20;

std::atomic<PackPolicy> g_pack_policy{PackPolicy::kAuto};

void CopyStrides3(const int64_t* strides, int64_t* out) {
  out[0] = strides[0];
  out[1] = strides[1];
  out[2] = strides[2];
}

Storage StorageOf(DType t) {
  switch (t) {
    case DType::kF32: return Storage::kF32;
    case DType::kF16: return Storage::kF16;
    case DType::kInt8: return Storage::kI8;
    case DType::kQ8_0: return Storage::kQ8_0;
    case DType::kFp8E4M3: return Storage::kE4M3;
    case DType::kFp8E5M2: return Storage::kE5M2;
    default: return Storage::kBF16;
  }
}

bool Quantized(const AttentionArgs& a) {
  return !IsWideStorage(a.k_type) || !IsWideStorage(a.v_type);
}

MaskKind MaskKindOf(const Problem& p, DType t) {
  if (!p.has_mask) return MaskKind::kNone;
  return t == DType::kBool  ? MaskKind::kBool
         : t == DType::kF32 ? MaskKind::kAddF32
                            : MaskKind::kAddF16;
}

// Keys one query block can see: all of them, or a window's span.
int64_t BlockKeySpan(const AttentionArgs& a, int64_t block_rows) {
  const int64_t right = a.causal ? 0 : a.window_right;
  if (a.window_left < 0 || right < 0) return a.kv_len;
  return std::min(a.kv_len, a.window_left + right + block_rows);
}

bool HasOptions(const AttentionArgs& a) {
  return a.mask_kind != MaskKind::kNone || a.softcap > 0.0f ||
         a.alibi_slopes != nullptr || a.dropout_p > 0.0f;
}

// The decode path's fused loop (decode_fused-inl.h, DecodeFused) takes a
// group of up to 4 rows of one query each (or rows whose key ranges agree)
// without options, K/V widened in registers (16-bit, or int8/fp8/q8_0 with
// K and V of one type) and head dims of whole vectors.
bool FusedDecode(const AttentionArgs& a, const TargetCaps& caps) {
  const bool row_cuts = a.q_len > 1 && (a.causal || a.window_right >= 0 ||
                                        a.window_left >= 0);
  const bool in_registers = a.kv_type == Storage::kBF16 ||
                            (a.kv_type == Storage::kF16 && caps.f16_in_registers) ||
                            a.kv_type == Storage::kI8 || a.kv_type == Storage::kE4M3 ||
                            a.kv_type == Storage::kE5M2 || a.kv_type == Storage::kQ8_0;
  return caps.fused_decode && in_registers && !HasOptions(a) && !row_cuts &&
         a.group * a.q_len <= 4 && a.head_dim_qk % caps.lanes == 0 &&
         a.head_dim_v % caps.lanes == 0 && a.head_dim_qk <= caps.fused_max_dk;
}

// Key chunks of a call with few queries: kDecodeChunkKeys doubled while
// the round (this call's groups and other_groups) keeps kDecodeMinTasks
// tasks, at most kMaxSplitChunks chunks.
void SplitKeys(const AttentionArgs& a, int64_t other_groups, Plan* plan) {
  plan->num_chunks = 1;
  plan->chunk_keys = a.kv_len;
  if (a.q_len > kDecodeMaxQueries || a.kv_len <= kDecodeChunkKeys) return;
  // (groups <= the rows of Q, so the product does not overflow.)
  const int64_t groups = plan->groups * plan->num_blocks + other_groups;
  int64_t chunk = kDecodeChunkKeys;
  while (chunk < kDecodeMaxChunkKeys) {
    const int64_t longer = (a.kv_len + 2 * chunk - 1) / (2 * chunk);
    if (groups < kDecodeMinTasks && longer < (kDecodeMinTasks + groups - 1) / groups) break;
    chunk *= 2;
  }
  const int64_t min_chunk = (a.kv_len + kMaxSplitChunks - 1) / kMaxSplitChunks;
  plan->chunk_keys = std::max(chunk, (min_chunk + 63) / 64 * 64);
  plan->num_chunks = (a.kv_len + plan->chunk_keys - 1) / plan->chunk_keys;
}

// Whether the AMX tiles take the call's inputs: bf16 Q, K and V, or f32,
// f16 and bf16 ones the caller lets round to bf16 (quantized K/V never).
bool AmxInputs(const AttentionArgs& a) {
  const bool wide = IsWideStorage(a.q_type) && IsWideStorage(a.k_type) &&
                    IsWideStorage(a.v_type);
  return (a.bf16_compute && wide) ||
         (a.q_type == Storage::kBF16 && a.kv_type == Storage::kBF16);
}

bool PackKv(const AttentionArgs& a, const Plan& plan, bool amx) {
  const PackPolicy policy = g_pack_policy.load(std::memory_order_relaxed);
  const int64_t group_bytes = plan.packed_group_floats * int64_t{sizeof(float)};
  // Paged K/V: the tiles read packed K/V only (a tile may span pages), the
  // decode path reads the pages in place.
  if (a.block_table != nullptr) return plan.path == KernelPath::kTiled;
  // Quantized K/V are dequantized once per group into the packed f32
  // layout (in place, every tile of every block would dequantize again);
  // PackPolicy::kNever (tests) still reads them in place.
  if (Quantized(a)) {
    return plan.path == KernelPath::kTiled && policy != PackPolicy::kNever &&
           group_bytes > 0 &&
           group_bytes <= kPackedGroupMaxBytes;
  }
  if (amx) {  // the tiles read packed K/V only; in place they are widened
    return plan.path == KernelPath::kTiled && policy != PackPolicy::kNever &&
           group_bytes <= kPackedGroupMaxBytes;
  }
  const bool worth_it =
      policy == PackPolicy::kAlways ||
      (policy == PackPolicy::kAuto &&
       (a.kv_type != Storage::kF32 ||
        BlockKeySpan(a, plan.block_rows) * (a.head_dim_qk + a.head_dim_v) *
                int64_t{sizeof(float)} >= kPackMinF32BlockBytes));
  return plan.path == KernelPath::kTiled && plan.num_blocks >= 2 && worth_it &&
         group_bytes > 0 && group_bytes <= kPackedGroupMaxBytes;
}

}  // namespace

void SetPackPolicy(PackPolicy policy) {
  g_pack_policy.store(policy, std::memory_order_relaxed);
}

AttentionArgs MakeArgs(const Problem& p, const TensorView& q,
                       const TensorView& k, const TensorView& v,
                       const MutableTensorView& o,
                       const AttentionOptions& options,
                       const MutableTensorView& lse) {
  AttentionArgs a;
  a.batch = p.batch;
  a.q_heads = p.q_heads;
  a.kv_heads = p.kv_heads;
  a.group = p.group;
  a.q_len = p.q_len;
  a.kv_len = p.kv_len;
  a.head_dim_qk = p.head_dim_qk;
  a.head_dim_v = p.head_dim_v;
  a.q_type = StorageOf(q.dtype);
  a.k_type = StorageOf(k.dtype);
  a.v_type = StorageOf(v.dtype);
  a.kv_type = a.k_type == a.v_type ? a.k_type : Storage::kMixed;
  a.k_scales = static_cast<const float*>(options.k_scales.data);
  a.v_scales = static_cast<const float*>(options.v_scales.data);
  if (a.k_scales != nullptr) CopyStrides3(options.k_scales.strides, a.k_scale_strides);
  if (a.v_scales != nullptr) CopyStrides3(options.v_scales.strides, a.v_scale_strides);
  a.k_scale = options.k_scale;
  a.v_scale = options.v_scale;
  a.o_type = StorageOf(o.dtype);
  a.q = q.data;
  CopyStrides3(q.strides, a.q_strides);
  a.k = k.data;
  CopyStrides3(k.strides, a.k_strides);
  a.v = v.data;
  CopyStrides3(v.strides, a.v_strides);
  a.o = o.data;
  CopyStrides3(o.strides, a.o_strides);
  a.lse = static_cast<float*>(lse.data);
  CopyStrides3(lse.strides, a.lse_strides);
  a.scale = p.scale;
  a.causal = options.causal;
  a.bottom_right = options.alignment == Alignment::kBottomRight;
  a.kv_lengths = options.kv_lengths;
  // A window wider than both lengths cuts nothing: treat it as unbounded,
  // which also keeps the kernel's index arithmetic far from overflow.
  const int64_t span = p.q_len + p.kv_len;
  a.window_left = options.window_left > span ? -1 : options.window_left;
  a.window_right = options.window_right > span ? -1 : options.window_right;
  a.softcap = options.softcap;
  a.alibi_slopes = options.alibi_slopes;
  a.sinks = options.sinks;
  a.dropout_p = options.dropout_p;
  a.dropout_seed = options.dropout_seed;
  a.mask_kind = MaskKindOf(p, options.mask.dtype);
  a.mask = p.has_mask ? options.mask.data : nullptr;
  for (int i = 0; i < 4; ++i) a.mask_strides[i] = p.mask_strides[i];
  return a;
}

Plan MakePlan(const AttentionArgs& a, const TargetCaps& caps, int64_t other_groups) {
  Plan plan;
  plan.groups = a.batch * a.kv_heads;
  // Blocks of kQueryBlockVectors vectors of queries; a group with at most
  // half a block of rows (decode) takes half as many vectors, down to one:
  // the others would only compute padding.
  const int64_t group_rows = a.group * a.q_len;
  plan.block_rows = kQueryBlockVectors * caps.lanes;
  while (group_rows * 2 <= plan.block_rows && plan.block_rows / 2 >= caps.lanes) {
    plan.block_rows /= 2;
  }
  plan.num_blocks = (group_rows + plan.block_rows - 1) / plan.block_rows;
  // The decode path (every option runs on it): Lq = 1, or a few queries per
  // head (speculative decoding) while the group has at most kDecodeMaxRows
  // rows, or any that fit where the AMX tiles take the decode's keys (no
  // options); all of a group's rows in one block of at most two vectors.
  const bool decode = group_rows <= plan.block_rows &&
                      plan.block_rows <= 2 * caps.lanes &&
                      (a.q_len == 1 || group_rows <= kDecodeMaxRows ||
                       (caps.amx && AmxDecodeInputs(a) && !HasOptions(a)));
  plan.path = !decode                ? KernelPath::kTiled
              : FusedDecode(a, caps) ? KernelPath::kDecodeFused
                                     : KernelPath::kDecode;
  SplitKeys(a, other_groups, &plan);
  const double o_bytes = 4.0 * static_cast<double>(a.batch) *
                         static_cast<double>(a.q_heads) *
                         static_cast<double>(a.q_len) *
                         static_cast<double>(a.head_dim_v);
  plan.stream_output = a.o_type == Storage::kF32 &&
                       o_bytes >= static_cast<double>(kStreamOutputBytes);
  const bool amx = caps.amx && AmxInputs(a);
  plan.packed_group_floats = amx ? AmxPackedGroupFloats(a) : PackedGroupFloats(a);
  plan.pack_kv = PackKv(a, plan, amx);
  return plan;
}

Status PlanCall(const TensorView& q, const TensorView& k, const TensorView& v,
                const MutableTensorView& o, const AttentionOptions& options,
                const MutableTensorView& lse, const TargetCaps& caps,
                Plan* plan) {
  Problem p;
  Status s = ValidateInputs(q, k, v, options, &p);
  if (!s.ok()) return s;
  s = ValidateOutputs(p, q, k, v, options, o, lse);
  if (!s.ok()) return s;
  *plan = MakePlan(MakeArgs(p, q, k, v, o, options, lse), caps);
  return Status::Ok();
}

const char* KernelPathName(KernelPath path) {
  switch (path) {
    case KernelPath::kTiled:
      return "tiled";
    case KernelPath::kDecode:
      return "decode";
    case KernelPath::kDecodeFused:
      return "fused decode";
  }
  return "unknown";
}

}  // namespace simdattn
