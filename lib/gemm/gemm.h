// The projections' GEMM of the multi-head attention layer:
// C[m, n] = A[m, k] · W^T + bias with W [n, k] (PyTorch's Linear layout)
// packed once into panels for the register tile, f32 accumulation, split
// over the executor with the same bits for any thread count.

#ifndef SIMDATTN_LIB_GEMM_GEMM_H_
#define SIMDATTN_LIB_GEMM_GEMM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lib/gemm/gemm_kernels.h"
#include "simdattn/attention.h"

namespace simdattn {

// One matrix of a packed set: W [n, k] row-major, rows ld elements apart
// (ld >= k), f32, f16 or bf16; bias [n] of the same choice of types, or
// null.
struct WeightMatrix {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t n = 0;
  int64_t ld = 0;
  const void* bias = nullptr;
  DType bias_dtype = DType::kF32;
};

// Frees memory from AllocPacked.
struct FreeDeleter {
  void operator()(float* p) const;
};

// Weights packed for one target: segments (the matrices given to
// PackWeights, in order) of panels of panel_cols columns, each panel
// [k][panel_cols] f32, zero-padded past a segment's last column, so that a
// segment starts on a panel. 16-bit weights are widened to f32 here (the
// products then read 4 bytes per weight).
struct PackedWeights {
  struct Segment {
    int64_t n, first_panel, panels, first_col;  // first_col: over all segments
  };
  int64_t k = 0;
  int64_t panel_cols = 0;
  std::string target;  // the dispatch entry it was packed for
  const GemmKernels* kernels = nullptr;
  std::vector<Segment> segments;
  std::unique_ptr<float, FreeDeleter> data;  // panels * k * panel_cols
  std::unique_ptr<float, FreeDeleter> bias;  // panels * panel_cols, or null
  std::vector<int64_t> panel_col, panel_valid;

  int64_t panels() const {
    return segments.empty() ? 0
                            : segments.back().first_panel + segments.back().panels;
  }
  // Columns of segments [first, end) together.
  int64_t Cols(int first, int end) const;
};

// Packs num matrices sharing k into *out for the target a call with exec
// would choose now (exec.max_target, SetMaxTarget, SIMDATTN_MAX_TARGET).
// The packing is split over exec's threads. kInvalidArgument (naming the
// matrix and value) for null data, extents < 1, ld < k, a dtype that is not
// f32, f16 or bf16; kOutOfMemory when the panels cannot be allocated.
Status PackWeights(const WeightMatrix* matrices, int num, int64_t k,
                   const ExecutionOptions& exec, PackedWeights* out);

// A [m, k] row-major, rows lda elements apart, f32, f16 or bf16.
struct GemmInput {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t m = 0;
  int64_t lda = 0;
};

// C[m, Cols(first, end)] = A · W_seg^T + bias_seg for the segments
// [first, end) side by side, C rows ldc elements apart (f32, f16 or bf16,
// rounded once from the f32 sum). Runs on the target w was packed for, with
// exec's executor. Each element is one f32 FMA chain over k in order, so
// the result is bit-identical for any thread count (and for any m: a row
// does not depend on the others). f32 A is read in place; 16-bit A is
// first widened to f32 and packed by row tiles into a buffer of m x k
// floats that the calling thread keeps. kInvalidArgument naming the argument
// and value for m < 1, lda < k, ldc < the columns, null pointers, dtypes,
// a segment range outside w; kOutOfMemory.
Status Gemm(const GemmInput& a, const PackedWeights& w, int first, int end,
            void* c, DType c_type, int64_t ldc, const ExecutionOptions& exec);

}  // namespace simdattn

#endif  // SIMDATTN_LIB_GEMM_GEMM_H_
