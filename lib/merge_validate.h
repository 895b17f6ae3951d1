// Argument checking of MergeStates (serving.h): every error names the
// argument and the offending value (SEMANTICS.md "Bad input").

#ifndef SIMDATTN_LIB_MERGE_VALIDATE_H_
#define SIMDATTN_LIB_MERGE_VALIDATE_H_

#include <cstdint>

#include "simdattn/attention.h"

namespace simdattn {

// Extents of a validated merge: every part and the output are
// [batch, heads, len, head_dim]; the LSEs [batch, heads, len, 1].
struct MergeProblem {
  int64_t batch = 0, heads = 0, len = 0, head_dim = 0;
};

// Checks the parts, the outputs and their overlaps: outs and lses non-null
// arrays of num_parts >= 1 views; outs[i] f32/f16/bf16 of one shape with
// positive extents and a unit last stride; lses[i] f32 [B, H, L, 1]; out
// like a part; lse absent (null data, all extents 0) or like an LSE; no
// offset overflows int64; neither output writes an address twice, overlaps
// the other or overlaps an input, except that out may be outs[0] and lse
// lses[0] exactly (same data, dtype and strides). Fills *p.
Status ValidateMerge(const TensorView* outs, const TensorView* lses,
                     int64_t num_parts, const MutableTensorView& out,
                     const MutableTensorView& lse, MergeProblem* p);

}  // namespace simdattn

#endif  // SIMDATTN_LIB_MERGE_VALIDATE_H_
