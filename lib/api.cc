// Public entry points: validation -> Status, fast-path coverage check, one
// target choice per call, the plan (plan.cc), then its tasks (run.cc).

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <utility>

#include "lib/dispatch.h"
#include "lib/kernels/kernels.h"
#include "lib/plan.h"
#include "lib/run.h"
#include "lib/validate.h"
#include "simdattn/attention.h"

namespace simdattn {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kUnimplemented:
      return "unimplemented";
    case StatusCode::kOutOfMemory:
      return "out of memory";
    case StatusCode::kInternal:
      return "internal";
  }
  return "unknown";
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kBool:
      return "bool";
    case DType::kInt8:
      return "int8";
    case DType::kQ8_0:
      return "q8_0";
    case DType::kFp8E4M3:
      return "fp8_e4m3";
    case DType::kFp8E5M2:
      return "fp8_e5m2";
  }
  return "unknown";
}

int64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kBool:
    case DType::kInt8:
    case DType::kFp8E4M3:
    case DType::kFp8E5M2:
      return 1;
    case DType::kQ8_0:
      return 34;  // one block: f16 scale and 32 int8
  }
  return 1;
}

namespace {

template <class View, class Ptr>
View MakeView(Ptr data, DType dtype, int64_t b, int64_t h, int64_t s,
              int64_t d, bool bshd) {
  View v;
  v.data = data;
  v.dtype = dtype;
  v.shape[0] = b;
  v.shape[1] = h;
  v.shape[2] = s;
  v.shape[3] = d;
  v.strides[3] = 1;
  if (bshd) {
    v.strides[1] = d;
    v.strides[2] = h * d;
    v.strides[0] = s * h * d;
  } else {
    v.strides[2] = d;
    v.strides[1] = s * d;
    v.strides[0] = h * s * d;
  }
  return v;
}

Status Failure(StatusCode code, const std::string& message) {
  Status s;
  s.code = code;
  s.message = message;
  return s;
}

Status Unimplemented(const std::string& what) {
  Status s;
  s.code = StatusCode::kUnimplemented;
  s.message = what + " is not implemented in the fast path yet";
  return s;
}

// Largest head dimension the kernel accepts: its per-thread scratch holds a
// transposed query block of head_dim x 2 vectors and one K/V tile.
constexpr int64_t kMaxHeadDim = 1024;

// What the fast path covers today; anything else is kUnimplemented.
Status CheckCovered(const Problem& p, const AttentionOptions& options) {
  if (options.alibi_slopes != nullptr &&
      (p.q_len > (int64_t{1} << 24) || p.kv_len > (int64_t{1} << 24))) {
    return Unimplemented("ALiBi with a sequence longer than 2^24");
  }
  constexpr int64_t kMaxIndex = int64_t{1} << 32;  // Philox counter words
  if (options.dropout_p > 0.0f &&
      (p.batch > kMaxIndex || p.q_heads > kMaxIndex || p.q_len > kMaxIndex)) {
    return Unimplemented("dropout with an index of 2^32 or more");
  }
  if (p.head_dim_qk > kMaxHeadDim || p.head_dim_v > kMaxHeadDim) {
    return Unimplemented("a head dimension above " +
                         std::to_string(kMaxHeadDim));
  }
  constexpr int64_t kMaxLen = std::numeric_limits<int32_t>::max() - 1;
  if (p.q_len > kMaxLen || p.kv_len > kMaxLen) {
    return Unimplemented("a sequence length of 2^31 - 1 or more");
  }
  return Status::Ok();
}

// What the fast path covers and the executor's settings.
Status CheckCall(const Problem& p, const AttentionOptions& options,
                 const ExecutionOptions& exec) {
  if (exec.parallel_for_threads < 0) {
    return Failure(StatusCode::kInvalidArgument,
                   "exec.parallel_for_threads = " +
                       std::to_string(exec.parallel_for_threads) +
                       ": must be >= 0 (0 = hardware_concurrency())");
  }
  return CheckCovered(p, options);
}

}  // namespace

TensorView MakeBHSD(const void* data, DType dtype, int64_t b, int64_t h,
                    int64_t s, int64_t d) {
  return MakeView<TensorView>(data, dtype, b, h, s, d, false);
}
MutableTensorView MakeBHSD(void* data, DType dtype, int64_t b, int64_t h,
                           int64_t s, int64_t d) {
  return MakeView<MutableTensorView>(data, dtype, b, h, s, d, false);
}
TensorView MakeBSHD(const void* data, DType dtype, int64_t b, int64_t h,
                    int64_t s, int64_t d) {
  return MakeView<TensorView>(data, dtype, b, h, s, d, true);
}
MutableTensorView MakeBSHD(void* data, DType dtype, int64_t b, int64_t h,
                           int64_t s, int64_t d) {
  return MakeView<MutableTensorView>(data, dtype, b, h, s, d, true);
}

Status Attention(const TensorView& q, const TensorView& k, const TensorView& v,
                 const MutableTensorView& o, const AttentionOptions& options,
                 const MutableTensorView& lse, const ExecutionOptions& exec,
                 RunInfo* info) {
  try {
    Problem p;
    Status s = ValidateInputs(q, k, v, options, &p);
    if (!s.ok()) return s;
    s = ValidateOutputs(p, q, k, v, options, o, lse);
    if (!s.ok()) return s;
    s = CheckCall(p, options, exec);
    if (!s.ok()) return s;
    const TargetEntry* target = nullptr;
    s = ChooseTarget(exec.max_target, &target);
    if (!s.ok()) return s;
    const TargetKernels& kernels = *target->kernels;
    AttentionArgs args = MakeArgs(p, q, k, v, o, options, lse);
    args.bf16_compute = exec.allow_bf16_compute;
    const Plan plan = MakePlan(args, kernels.caps());
    MemoryReport memory;
    s = RunPlan(exec, kernels, args, plan, options.kv_lengths_i32, &memory);
    if (!s.ok()) return s;
    if (info != nullptr) {
      info->target = target->name;
      info->path = KernelPathName(plan.path);
      info->num_tasks = AttentionTaskCount(plan);
      info->scratch_bytes = memory.bytes;
      info->bytes_allocated = memory.allocated;
    }
    return Status::Ok();
  } catch (const std::bad_alloc&) {
    return Failure(StatusCode::kOutOfMemory, "out of memory");
  } catch (...) {
    return Failure(StatusCode::kInternal, "unexpected exception");
  }
}

Status WorkspaceSize(const TensorView& q, const TensorView& k,
                     const TensorView& v, const AttentionOptions& options,
                     const ExecutionOptions& exec, size_t* bytes) {
  try {
    if (bytes == nullptr) {
      return Failure(StatusCode::kInvalidArgument, "bytes is null");
    }
    Problem p;
    Status s = ValidateInputs(q, k, v, options, &p);
    if (!s.ok()) return s;
    s = CheckCall(p, options, exec);
    if (!s.ok()) return s;
    const TargetEntry* target = nullptr;
    s = ChooseTarget(exec.max_target, &target);
    if (!s.ok()) return s;
    // O does not change the buffers: an f32 view stands in for it.
    const MutableTensorView o = MakeBHSD(static_cast<void*>(nullptr), DType::kF32,
                                         p.batch, p.q_heads, p.q_len, p.head_dim_v);
    AttentionArgs args = MakeArgs(p, q, k, v, o, options, {});
    args.bf16_compute = exec.allow_bf16_compute;
    const TargetKernels& kernels = *target->kernels;
    *bytes = WorkspaceBytes(exec, kernels, args, MakePlan(args, kernels.caps()),
                            options.kv_lengths_i32 != nullptr);
    return Status::Ok();
  } catch (const std::bad_alloc&) {
    return Failure(StatusCode::kOutOfMemory, "out of memory");
  } catch (...) {
    return Failure(StatusCode::kInternal, "unexpected exception");
  }
}

}  // namespace simdattn
