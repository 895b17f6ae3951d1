// Interface between the GEMM driver (lib/gemm/gemm.cc) and its per-target
// kernels (lib/gemm/gemm_kernels.cc): plain data and function pointers, the
// same for every target.

#ifndef SIMDATTN_LIB_GEMM_GEMM_KERNELS_H_
#define SIMDATTN_LIB_GEMM_GEMM_KERNELS_H_

#include <cstdint>

#include "simdattn/attention.h"

namespace simdattn {

// One GEMM call as a task sees it: C[m, cols] = A[m, k] · W^T + bias over
// the packed panels [panel_first, panel_end) of W. Panel p holds
// panel_cols columns of W stored [k][panel_cols] (vector-aligned, zero
// past the last valid column); its columns go to C's columns
// [panel_col[p] - col_base, + panel_valid[p]).
struct GemmArgs {
  // lda 0: A widened to f32 and packed by row groups (gemm.cc PackRows):
  // group g of row_tile rows at a + g * row_tile * k, stored [k][row_tile];
  // the m % row_tile last rows after the groups, stored [k][rem].
  // lda > 0: a is A itself (f32), rows lda elements apart.
  const float* a;
  int64_t m, k, lda;
  const float* packed;  // panel p at packed + p * k * panel_cols
  const float* bias;    // [panels * panel_cols] or null
  const int64_t* panel_col;
  const int64_t* panel_valid;
  int64_t panel_first, panel_end, col_base;
  void* c;
  DType c_type;  // kF32, kF16 or kBF16
  int64_t ldc;
  // Blocking (GemmPlan): rows per task, panels per task, reduction chunk.
  int64_t mc, nc_panels, kc, m_blocks;
};

struct GemmKernels {
  // Columns per packed panel: kGemmCols vectors of this target.
  int64_t (*panel_cols)();
  // Rows per register tile (the row groups of packed A).
  int64_t (*row_tile)();
  // Task t of the call: row block t % m_blocks, panel block t / m_blocks.
  // acc: mc * panel_cols floats, aligned to 256 bytes.
  void (*task)(const GemmArgs& args, int64_t task, float* acc);
};

// The kernels compiled for a Highway target bit, or null.
const GemmKernels* GemmKernelsForTarget(int64_t target_bit);

}  // namespace simdattn

#endif  // SIMDATTN_LIB_GEMM_GEMM_KERNELS_H_
