// Interface between MergeStates (lib/merge.cc) and its per-target loops
// (lib/kernels/merge.cc): function pointers over plain data, the same for
// every target.

#ifndef SIMDATTN_LIB_KERNELS_MERGE_KERNELS_H_
#define SIMDATTN_LIB_KERNELS_MERGE_KERNELS_H_

#include <cstdint>

#include "lib/kernels/types.h"

namespace simdattn {

// The loops that build one merged row: a weighted sum of the parts' rows,
// accumulated in f32. Both are sequential and never allocate.
struct MergeKernels {
  // acc[0..n) = weight * x (first) or acc[0..n) += weight * x (else), x the
  // n elements at `row` in storage `type`, widened exactly (f16 Inf and NaN
  // kept on every target). acc never overlaps row.
  void (*accumulate)(float* acc, const void* row, Storage type, float weight,
                     int64_t n, bool first);
  // dst[0..n) = acc[0..n) in storage `type` (16-bit: round to nearest
  // even). dst may be the row that an earlier accumulate read.
  void (*store)(const float* acc, int64_t n, void* dst, Storage type);
};

// The loops compiled for a name of the dispatch table (lib/dispatch.h):
// Highway's target names, and AVX3's loops for our AVX3_BF16 and AVX3_AMX
// entries, which differ from AVX3 only in attention's bf16 products. Null
// for a name that is not compiled in.
const MergeKernels* MergeKernelsFor(const char* target_name);

}  // namespace simdattn

#endif  // SIMDATTN_LIB_KERNELS_MERGE_KERNELS_H_
