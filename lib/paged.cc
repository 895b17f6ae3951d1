// PagedAttention (serving.h): validation of a ragged batch against a paged
// cache, one AttentionArgs and Plan per sequence, and their tasks run
// together (run.cc, RunSequences).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include "lib/dispatch.h"
#include "lib/kernels/kernels.h"
#include "lib/plan.h"
#include "lib/run.h"
#include "lib/status.h"
#include "lib/validate.h"
#include "simdattn/serving.h"

namespace simdattn {
namespace {

std::string Str(int64_t x) { return std::to_string(x); }

// What validation learns about a paged call.
struct PagedProblem {
  Problem p;  // batch 1, Lq = total_q, Lk = the longest sequence's
  int64_t num_seqs = 0;
  int64_t total_q = 0;
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  int64_t table_stride = 0;
  bool bottom_right = true;
};

// The queries of sequence s: [begin, end) of the rows.
struct SeqRows {
  int64_t begin, end;
};
SeqRows RowsOf(const int32_t* cu, int64_t s) {
  if (cu == nullptr) return {s, s + 1};
  return {cu[s], cu[s + 1]};
}

Status CheckTable(const PagedKvCache& c, int64_t num_seqs, PagedProblem* pp) {
  if (c.block_table == nullptr) return Invalid("cache.block_table is null");
  if (c.kv_lens == nullptr) return Invalid("cache.kv_lens is null");
  if (c.max_blocks_per_seq < 1) {
    return Invalid("cache.max_blocks_per_seq = " + Str(c.max_blocks_per_seq) +
                   ": must be >= 1");
  }
  pp->table_stride = c.block_table_stride == 0 ? c.max_blocks_per_seq
                                               : c.block_table_stride;
  if (pp->table_stride < c.max_blocks_per_seq) {
    return Invalid("cache.block_table_stride = " + Str(c.block_table_stride) +
                   ": must be 0 or >= max_blocks_per_seq = " +
                   Str(c.max_blocks_per_seq));
  }
  int64_t table_elems;
  if (__builtin_mul_overflow(num_seqs, pp->table_stride, &table_elems) ||
      table_elems > (int64_t{1} << 60)) {
    return Invalid("block_table: num_seqs x block_table_stride overflows");
  }
  // Past int64 (max_blocks_per_seq near 2^60), every length fits.
  int64_t capacity;
  if (__builtin_mul_overflow(c.max_blocks_per_seq, pp->block_size, &capacity)) {
    capacity = std::numeric_limits<int64_t>::max();
  }
  int64_t longest = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t len = c.kv_lens[s];
    if (len < 0 || len > capacity) {
      return Invalid("cache.kv_lens[" + Str(s) + "] = " + Str(len) +
                     ": must be in [0, max_blocks_per_seq x block_size = " +
                     Str(capacity) + "]");
    }
    longest = std::max(longest, len);
    const int32_t* row = c.block_table + s * pp->table_stride;
    for (int64_t n = 0; n < (len + pp->block_size - 1) / pp->block_size; ++n) {
      if (row[n] < 0 || row[n] >= pp->num_blocks) {
        return Invalid("cache.block_table[" + Str(s) + "][" + Str(n) + "] = " +
                       Str(row[n]) + ": must be a page in [0, num_blocks = " +
                       Str(pp->num_blocks) + ")");
      }
    }
  }
  pp->p.kv_len = std::max<int64_t>(longest, 1);
  return Status::Ok();
}

Status CheckQueries(const TensorView& q, int64_t num_seqs, const int32_t* cu,
                    PagedProblem* pp) {
  if (num_seqs < 1) return Invalid("num_seqs = " + Str(num_seqs) + ": must be >= 1");
  if (q.shape[0] != 1) {
    return Invalid("q.shape[0] = " + Str(q.shape[0]) +
                   ": must be 1 (q is [1, Hq, total_q, Dk], MakeTokenMajor)");
  }
  pp->total_q = q.shape[2];
  if (cu == nullptr) {
    if (pp->total_q != num_seqs) {
      return Invalid("q.shape[2] = " + Str(pp->total_q) +
                     ": without cu_seqlens_q, one query per sequence (num_seqs = " +
                     Str(num_seqs) + ")");
    }
    return Status::Ok();
  }
  if (cu[0] != 0) return Invalid("cu_seqlens_q[0] = " + Str(cu[0]) + ": must be 0");
  for (int64_t s = 0; s < num_seqs; ++s) {
    if (cu[s + 1] < cu[s]) {
      return Invalid("cu_seqlens_q[" + Str(s + 1) + "] = " + Str(cu[s + 1]) +
                     ": must be >= cu_seqlens_q[" + Str(s) + "] = " + Str(cu[s]));
    }
  }
  if (cu[num_seqs] != pp->total_q) {
    return Invalid("cu_seqlens_q[num_seqs] = " + Str(cu[num_seqs]) +
                   ": must equal q.shape[2] = " + Str(pp->total_q));
  }
  return Status::Ok();
}

// Q, K and V as Attention() checks them: K and V are the cache's pages
// (Lk = block_size), Q broadcast over the pages.
Status CheckViews(const TensorView& q, const PagedKvCache& c,
                  const AttentionOptions& options, PagedProblem* pp) {
  if (c.k.shape[0] < 1 || c.k.shape[2] < 1) {
    return Invalid("cache.k.shape " + std::string("[") + Str(c.k.shape[0]) + ", " +
                   Str(c.k.shape[1]) + ", " + Str(c.k.shape[2]) + ", " +
                   Str(c.k.shape[3]) + "]: must be [num_blocks, Hkv, block_size, Dk]");
  }
  pp->num_blocks = c.k.shape[0];
  pp->block_size = c.k.shape[2];
  if (pp->block_size % 8 != 0) {
    return Invalid("cache block_size (k.shape[2]) = " + Str(pp->block_size) +
                   ": must be a multiple of 8");
  }
  TensorView qb = q;
  qb.shape[0] = pp->num_blocks;
  qb.strides[0] = 0;
  AttentionOptions plain = options;
  plain.mask = {};
  plain.kv_lengths = nullptr;
  plain.kv_lengths_i32 = nullptr;
  plain.alignment = pp->bottom_right ? Alignment::kBottomRight : Alignment::kTopLeft;
  Problem p;
  const Status s = ValidateInputs(qb, c.k, c.v, plain, &p);
  if (!s.ok()) return s;
  pp->p = p;
  pp->p.batch = 1;
  pp->p.q_len = pp->total_q;
  return Status::Ok();
}

// The mask against [1, Hq, total_q, Lk_mask]: Attention()'s check with a
// stand-in K of Lk_mask keys.
Status CheckPagedMask(const TensorView& q, const PagedKvCache& c,
                      const AttentionOptions& options, PagedProblem* pp) {
  const TensorView& m = options.mask;
  if (m.data == nullptr && m.shape[0] == 0 && m.shape[1] == 0 &&
      m.shape[2] == 0 && m.shape[3] == 0) {
    return Status::Ok();
  }
  const int64_t lk = m.shape[3] == 1 ? pp->p.kv_len : m.shape[3];
  if (lk < pp->p.kv_len && m.data != nullptr) {
    return Invalid("mask.shape[3] = " + Str(m.shape[3]) +
                   ": must be 1 or at least the longest kv_lens = " + Str(pp->p.kv_len));
  }
  // f32 stand-ins (the mask does not depend on K/V's format or scales).
  TensorView k = c.k, v = c.v;
  k.dtype = v.dtype = DType::kF32;
  k.shape[0] = v.shape[0] = 1;
  k.shape[2] = v.shape[2] = lk;
  for (int i = 0; i < 3; ++i) k.strides[i] = v.strides[i] = 0;
  AttentionOptions mask_only;
  mask_only.mask = m;
  mask_only.alignment = Alignment::kBottomRight;
  Problem p;
  const Status s = ValidateInputs(q, k, v, mask_only, &p);
  if (!s.ok()) return s;
  pp->p.has_mask = true;
  for (int i = 0; i < 4; ++i) pp->p.mask_strides[i] = p.mask_strides[i];
  return Status::Ok();
}

// The arrays the call reads must not lie under O or LSE.
Status CheckArraysApart(const PagedProblem& pp, const PagedKvCache& c,
                        const int32_t* cu, const MutableTensorView& o,
                        const MutableTensorView& lse) {
  struct Array {
    const char* name;
    const void* p;
    int64_t bytes;
  };
  const Array arrays[3] = {
      {"cache.block_table", c.block_table, pp.num_seqs * pp.table_stride * 4},
      {"cache.kv_lens", c.kv_lens, pp.num_seqs * 4},
      {"cu_seqlens_q", cu, (pp.num_seqs + 1) * 4}};
  const MutableTensorView* outs[2] = {&o, &lse};
  const char* out_names[2] = {"o", "lse"};
  for (int i = 0; i < 2; ++i) {
    const MutableTensorView& t = *outs[i];
    if (t.data == nullptr) continue;
    const char* base = static_cast<const char*>(t.data);
    int64_t last = 0;  // element offsets of O and LSE are >= 0 once validated
    for (int d = 0; d < 4; ++d) last += (t.shape[d] - 1) * std::max<int64_t>(t.strides[d], 0);
    const char* end = base + (last + 1) * DTypeSize(t.dtype);
    for (const Array& a : arrays) {
      const char* p = static_cast<const char*>(a.p);
      if (p != nullptr && p < end && base < p + a.bytes) {
        return Invalid(std::string(out_names[i]) + " overlaps input " + a.name +
                       ": outputs must not alias inputs");
      }
    }
  }
  return Status::Ok();
}

// What the kernels cover, as Attention() checks it (api.cc).
Status CheckPagedCovered(const PagedProblem& pp, const AttentionOptions& options) {
  constexpr int64_t kMaxHeadDim = 1024;
  Status s;
  s.code = StatusCode::kUnimplemented;
  if (pp.p.head_dim_qk > kMaxHeadDim || pp.p.head_dim_v > kMaxHeadDim) {
    s.message = "a head dimension above 1024 is not implemented in the fast path yet";
    return s;
  }
  constexpr int64_t kMaxAlibiLen = int64_t{1} << 24;
  if (options.alibi_slopes != nullptr &&
      (pp.total_q > kMaxAlibiLen || pp.p.kv_len > kMaxAlibiLen)) {
    s.message = "ALiBi with a sequence longer than 2^24 is not implemented in the fast path yet";
    return s;
  }
  return Status::Ok();
}

Status ValidatePaged(const TensorView& q, const PagedKvCache& c,
                     int64_t num_seqs, const int32_t* cu,
                     const MutableTensorView& o, const AttentionOptions& options,
                     const MutableTensorView& lse, const ExecutionOptions& exec,
                     PagedProblem* pp) {
  if (options.kv_lengths != nullptr || options.kv_lengths_i32 != nullptr) {
    return Invalid("options.kv_lengths must be null in PagedAttention: "
                   "cache.kv_lens holds each sequence's length");
  }
  if (exec.workspace != nullptr) {
    return Invalid("exec.workspace is not taken by PagedAttention: leave it null");
  }
  pp->num_seqs = num_seqs;
  pp->bottom_right = options.alignment.value_or(Alignment::kBottomRight) ==
                     Alignment::kBottomRight;
  Status s = CheckQueries(q, num_seqs, cu, pp);
  if (!s.ok()) return s;
  s = CheckViews(q, c, options, pp);
  if (!s.ok()) return s;
  s = CheckTable(c, num_seqs, pp);
  if (!s.ok()) return s;
  s = CheckPagedMask(q, c, options, pp);
  if (!s.ok()) return s;
  AttentionOptions checked = options;  // the mask as validated above
  if (!pp->p.has_mask) checked.mask = {};
  s = ValidateOutputs(pp->p, q, c.k, c.v, checked, o, lse);
  if (!s.ok()) return s;
  s = CheckArraysApart(*pp, c, cu, o, lse);
  if (!s.ok()) return s;
  return CheckPagedCovered(*pp, options);
}

// A view's data moved `rows` along dimension 2.
template <class View>
View AtRow(View v, int64_t rows, int64_t len) {
  if (v.data != nullptr) {
    using Byte = typename std::conditional<std::is_const<typename std::remove_pointer<
                                               decltype(v.data)>::type>::value,
                                           const char, char>::type;
    v.data = static_cast<Byte*>(v.data) + rows * v.strides[2] * DTypeSize(v.dtype);
    v.shape[2] = len;
  }
  return v;
}

// Sequence s as a batch-1 call of its own.
AttentionArgs SequenceArgs(const PagedProblem& pp, const TensorView& q,
                           const PagedKvCache& c, const int32_t* cu, int64_t s,
                           const MutableTensorView& o,
                           const AttentionOptions& options,
                           const MutableTensorView& lse) {
  const SeqRows rows = RowsOf(cu, s);
  const int64_t lq = rows.end - rows.begin;
  Problem p = pp.p;
  p.q_len = lq;
  p.kv_len = c.kv_lens[s];
  AttentionOptions seq = options;
  if (pp.p.has_mask) {
    seq.mask = AtRow(options.mask, options.mask.shape[2] == 1 ? 0 : rows.begin,
                     options.mask.shape[2] == 1 ? 1 : lq);
  }
  AttentionArgs a = MakeArgs(p, AtRow(q, rows.begin, lq), c.k, c.v,
                             AtRow(o, rows.begin, lq), seq,
                             AtRow(lse, rows.begin, lq));
  a.mask = pp.p.has_mask ? seq.mask.data : nullptr;
  a.bottom_right = pp.bottom_right;
  a.block_table = c.block_table + s * pp.table_stride;
  a.block_size = pp.block_size;
  a.dropout_batch = s;
  return a;
}

}  // namespace

Status PagedAttention(const TensorView& q, const PagedKvCache& cache,
                      int64_t num_seqs, const int32_t* cu_seqlens_q,
                      const MutableTensorView& o, const AttentionOptions& options,
                      const MutableTensorView& lse, const ExecutionOptions& exec,
                      RunInfo* info) {
  try {
    PagedProblem pp;
    Status s = ValidatePaged(q, cache, num_seqs, cu_seqlens_q, o, options, lse,
                             exec, &pp);
    if (!s.ok()) return s;
    const TargetEntry* target = nullptr;
    s = ChooseTarget(exec.max_target, &target);
    if (!s.ok()) return s;
    const TargetKernels& kernels = *target->kernels;
    std::vector<SequenceCall> calls;
    calls.reserve(static_cast<size_t>(num_seqs));
    for (int64_t seq = 0; seq < num_seqs; ++seq) {
      const SeqRows rows = RowsOf(cu_seqlens_q, seq);
      if (rows.end == rows.begin) continue;
      SequenceCall call;
      call.args = SequenceArgs(pp, q, cache, cu_seqlens_q, seq, o, options, lse);
      call.args.bf16_compute = exec.allow_bf16_compute;
      calls.push_back(call);
    }
    // Each sequence's key chunks count the others' groups, which run in the
    // same round.
    const int64_t others = (static_cast<int64_t>(calls.size()) - 1) * pp.p.kv_heads;
    for (SequenceCall& call : calls) {
      if (call.args.kv_len > 0) call.plan = MakePlan(call.args, kernels.caps(), others);
    }
    int64_t tasks = 0;
    MemoryReport memory;
    s = RunSequences(exec, kernels, calls, &tasks, &memory);
    if (!s.ok()) return s;
    if (info != nullptr) {
      info->target = target->name;
      info->path = "decode";
      for (const SequenceCall& c : calls) {
        if (c.args.kv_len > 0) info->path = KernelPathName(c.plan.path);
      }
      info->num_tasks = tasks;
      info->scratch_bytes = memory.bytes;
      info->bytes_allocated = memory.allocated;
    }
    return Status::Ok();
  } catch (const std::bad_alloc&) {
    Status s;
    s.code = StatusCode::kOutOfMemory;
    s.message = "out of memory";
    return s;
  } catch (...) {
    Status s;
    s.code = StatusCode::kInternal;
    s.message = "unexpected exception";
    return s;
  }
}

}  // namespace simdattn
