// Scalar double-precision oracle of docs/SEMANTICS.md: every option, plain
// loops, no SIMD. Tests compare every fast path against it.

#ifndef SIMDATTN_LIB_REFERENCE_H_
#define SIMDATTN_LIB_REFERENCE_H_

#include <vector>

#include "simdattn/attention.h"

namespace simdattn {

// Computes attention exactly as SEMANTICS.md defines it, in double precision
// on the values as stored (f16/bf16 inputs are widened exactly).
// Outputs are dense: o is [B, Hq, Lq, Dv], lse is [B, Hq, Lq] (may be null).
// Validates its inputs like Attention() (output checks aside) and returns the
// same kInvalidArgument errors; never kUnimplemented.
SIMDATTN_API Status ReferenceAttention(const TensorView& q, const TensorView& k,
                                       const TensorView& v,
                                       const AttentionOptions& options,
                                       std::vector<double>* o,
                                       std::vector<double>* lse);

// The dropout keep decision of SEMANTICS.md: Philox4x32-10 keyed by the seed,
// counter (j / 8, i, h, b), 16-bit half j % 8 of the output (lib/philox.h);
// kept when that draw >= floor(p * 2^16).
SIMDATTN_API bool DropoutKeep(uint64_t seed, float p, int64_t b, int64_t h,
                              int64_t i, int64_t j);

}  // namespace simdattn

#endif  // SIMDATTN_LIB_REFERENCE_H_
