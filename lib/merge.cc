// MergeStates (serving.h): validation, one target choice per call, and the
// rows of the merged result split into tasks over the executor. The merge
// of one row is written out once, here; the loops over its elements are
// lib/kernels/merge.cc.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <new>
#include <string>

#include "lib/dispatch.h"
#include "lib/kernels/merge_kernels.h"
#include "lib/merge_validate.h"
#include "lib/parallel.h"
#include "simdattn/serving.h"

namespace simdattn {
namespace {

Status Failure(StatusCode code, const std::string& message) {
  Status s;
  s.code = code;
  s.message = message;
  return s;
}

Storage ToStorage(DType t) {
  return t == DType::kF16 ? Storage::kF16 : t == DType::kBF16 ? Storage::kBF16 : Storage::kF32;
}

// Elements a row is merged in: the f32 accumulator of one chunk lives on
// the stack (2 KiB, in L1 with the chunk of each part it reads).
constexpr int64_t kChunk = 512;
// Elements (rows x Dv x parts) read per task: 64 KiB of f32 parts, so
// that handing out a task costs little next to its work (not tuned by
// measurement), while a merge of L = 64, H = 8, Dv = 128 from 2 parts
// still makes 8 tasks.
constexpr int64_t kTaskElements = int64_t{1} << 14;

// One validated call as the tasks read it.
struct MergeCall {
  const TensorView* outs;
  const TensorView* lses;
  int64_t num_parts;
  MutableTensorView out;
  MutableTensorView lse;  // data null: not wanted
  MergeProblem p;
  const MergeKernels* kernels;
  int64_t rows_per_task;
};

// Byte offset of element [b, h, l, 0] of a view (validated: fits int64).
template <class View>
int64_t Offset(const View& v, int64_t b, int64_t h, int64_t l) {
  return (b * v.strides[0] + h * v.strides[1] + l * v.strides[2]) * DTypeSize(v.dtype);
}

const char* RowOf(const TensorView& v, int64_t b, int64_t h, int64_t l) {
  return static_cast<const char*>(v.data) + Offset(v, b, h, l);
}

char* RowOf(const MutableTensorView& v, int64_t b, int64_t h, int64_t l) {
  return static_cast<char*>(v.data) + Offset(v, b, h, l);
}

float LseOf(const MergeCall& c, int64_t i, int64_t b, int64_t h, int64_t l) {
  return *reinterpret_cast<const float*>(RowOf(c.lses[i], b, h, l));
}

// Writes `value` to every element of O's row (zeros for a row no part saw,
// NaN for one whose LSE is undefined).
void FillRow(const MergeCall& c, char* dst, float value) {
  float acc[kChunk];
  std::fill(acc, acc + std::min(kChunk, c.p.head_dim), value);
  const int64_t size = DTypeSize(c.out.dtype);
  for (int64_t e = 0; e < c.p.head_dim; e += kChunk) {
    c.kernels->store(acc, std::min(kChunk, c.p.head_dim - e), dst + e * size,
                     ToStorage(c.out.dtype));
  }
}

// Row [b, h, l] of the result (SEMANTICS.md "Merging partial results"):
// with M the largest finite lses[i], lse = M + log(sum_i exp(lses[i] - M))
// in double, and O = sum_i exp(lses[i] - lse) * outs[i] in f32, parts with
// LSE -inf skipped (their rows are never read). Every LSE is read before O
// and LSE are written, and each chunk of O after the chunks of the parts it
// comes from, so O may be outs[0] and LSE lses[0].
void MergeRow(const MergeCall& c, int64_t b, int64_t h, int64_t l) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  float m = -kInf;
  bool nan = false, pos_inf = false;
  for (int64_t i = 0; i < c.num_parts; ++i) {
    const float x = LseOf(c, i, b, h, l);
    nan |= std::isnan(x);
    pos_inf |= x == kInf;
    if (x > m && x < kInf) m = x;
  }
  char* dst = RowOf(c.out, b, h, l);
  float lse;
  if (nan || pos_inf || m == -kInf) {
    // No part saw a key: zeros and -inf. A NaN LSE, or +inf (a part whose
    // scores overflowed, its weight undefined): NaN in O, and NaN or +inf.
    const float qnan = std::numeric_limits<float>::quiet_NaN();
    lse = nan ? qnan : pos_inf ? kInf : -kInf;
    FillRow(c, dst, nan || pos_inf ? qnan : 0.0f);
  } else {
    double sum = 0.0;
    for (int64_t i = 0; i < c.num_parts; ++i) {
      const float x = LseOf(c, i, b, h, l);
      if (x != -kInf) sum += std::exp(static_cast<double>(x) - m);
    }
    const double lse_d = m + std::log(sum);  // sum >= 1: the max's own term
    float acc[kChunk];
    const int64_t out_size = DTypeSize(c.out.dtype);
    for (int64_t e = 0; e < c.p.head_dim; e += kChunk) {
      const int64_t n = std::min(kChunk, c.p.head_dim - e);
      bool first = true;
      for (int64_t i = 0; i < c.num_parts; ++i) {
        const float x = LseOf(c, i, b, h, l);
        if (x == -kInf) continue;
        const float w = static_cast<float>(std::exp(static_cast<double>(x) - lse_d));
        const TensorView& part = c.outs[i];
        c.kernels->accumulate(acc, RowOf(part, b, h, l) + e * DTypeSize(part.dtype),
                              ToStorage(part.dtype), w, n, first);
        first = false;
      }
      c.kernels->store(acc, n, dst + e * out_size, ToStorage(c.out.dtype));
    }
    lse = static_cast<float>(lse_d);
  }
  if (c.lse.data != nullptr) *reinterpret_cast<float*>(RowOf(c.lse, b, h, l)) = lse;
}

// Task t: rows [t * rows_per_task, ...) in (b, h, l) order.
void MergeTask(void* arg, int64_t t) {
  const MergeCall& c = *static_cast<const MergeCall*>(arg);
  const int64_t rows = c.p.batch * c.p.heads * c.p.len;
  const int64_t end = std::min(rows, (t + 1) * c.rows_per_task);
  for (int64_t r = t * c.rows_per_task; r < end; ++r) {
    MergeRow(c, r / (c.p.heads * c.p.len), r / c.p.len % c.p.heads, r % c.p.len);
  }
}

Status RunMerge(const TensorView* outs, const TensorView* lses,
                int64_t num_parts, const MutableTensorView& out,
                const MutableTensorView& lse, const ExecutionOptions& exec) {
  MergeCall c{outs, lses, num_parts, out, lse, {}, nullptr, 0};
  Status s = ValidateMerge(outs, lses, num_parts, out, lse, &c.p);
  if (!s.ok()) return s;
  if (exec.parallel_for_threads < 0) {
    return Failure(StatusCode::kInvalidArgument,
                   "exec.parallel_for_threads = " +
                       std::to_string(exec.parallel_for_threads) +
                       ": must be >= 0 (0 = hardware_concurrency())");
  }
  const TargetEntry* target = nullptr;
  s = ChooseTarget(exec.max_target, &target);
  if (!s.ok()) return s;
  c.kernels = MergeKernelsFor(target->name);
  if (c.kernels == nullptr) {
    return Failure(StatusCode::kInternal,
                   std::string("no merge loops compiled for target ") + target->name);
  }
  // The split depends on the shape only; a row is merged by one task, the
  // same way wherever it falls, so no thread count changes a bit.
  c.rows_per_task = std::max<int64_t>(1, kTaskElements / num_parts / c.p.head_dim);
  const int64_t rows = c.p.batch * c.p.heads * c.p.len;
  RunTasks(exec, (rows + c.rows_per_task - 1) / c.rows_per_task, &MergeTask, &c);
  return Status::Ok();
}

}  // namespace

Status MergeStates(const TensorView* outs, const TensorView* lses,
                   int64_t num_parts, const MutableTensorView& out,
                   const MutableTensorView& lse, const ExecutionOptions& exec) {
  try {
    return RunMerge(outs, lses, num_parts, out, lse, exec);
  } catch (const std::bad_alloc&) {
    return Failure(StatusCode::kOutOfMemory, "out of memory");
  } catch (...) {
    return Failure(StatusCode::kInternal, "unexpected exception");
  }
}

}  // namespace simdattn
