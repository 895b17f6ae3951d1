// The projections' GEMM, compiled once per Highway target: one task of
// C = A · W^T + bias over weights packed in panels (lib/gemm/gemm.h), on
// the register tile of gemm_tile-inl.h.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "lib/gemm/gemm_kernels.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>

#include "hwy/highway.h"
#include "lib/export_index.h"
#include "lib/dtype.h"
#include "lib/gemm/gemm_kernels.h"
#include "lib/gemm/gemm_tile-inl.h"

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {

int64_t GemmPanelCols() {
  const hn::ScalableTag<float> d;
  return kGemmCols * static_cast<int64_t>(hn::Lanes(d));
}

// Writes rows x valid columns of acc (rows panel_cols floats apart) plus
// bias to C, rounded to C's type.
void StorePanel(const GemmArgs& g, const float* HWY_RESTRICT acc, int64_t rows,
                int64_t nr, const float* HWY_RESTRICT bias, int64_t valid,
                int64_t row0, int64_t col) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = acc + r * nr;
    const int64_t offset = (row0 + r) * g.ldc + col;
    if (g.c_type == DType::kF32) {
      float* dst = static_cast<float*>(g.c) + offset;
      int64_t j = 0;
      for (; j + N <= valid; j += N) {
        auto v = hn::Load(d, src + j);
        if (bias != nullptr) v = hn::Add(v, hn::Load(d, bias + j));
        hn::StoreU(v, d, dst + j);
      }
      for (; j < valid; ++j) dst[j] = src[j] + (bias != nullptr ? bias[j] : 0.0f);
      continue;
    }
    uint16_t* dst = static_cast<uint16_t*>(g.c) + offset;
    for (int64_t j = 0; j < valid; ++j) {
      const float x = src[j] + (bias != nullptr ? bias[j] : 0.0f);
      dst[j] = g.c_type == DType::kBF16 ? F32ToBF16(x) : F32ToF16(x);
    }
  }
}

// Blocking: the panel's chunk of kc reduction steps (kc x panel_cols
// floats: 32 KiB) stays in L1 while every row tile of
// the block streams past it; the block's packed rows of A (mc x kc floats)
// come from L2 in the order the broadcasts read them. Each output element
// is one FMA chain over k in order, whatever the tiles and the task split:
// the same bits for any thread count.
void GemmTask(const GemmArgs& g, int64_t task, float* acc) {
  const hn::ScalableTag<float> d;
  const int64_t nr = GemmPanelCols();
  const int64_t mb = task % g.m_blocks, nb = task / g.m_blocks;
  const int64_t row0 = mb * g.mc;
  const int64_t rows = std::min(g.mc, g.m - row0);
  const int64_t p0 = g.panel_first + nb * g.nc_panels;
  const int64_t p1 = std::min(g.panel_end, p0 + g.nc_panels);
  // A's rows (GemmArgs::a): packed, groups of kGemmRows rows [k][kGemmRows]
  // then the m % kGemmRows last rows [k][rem]; or A itself, rows lda apart.
  const int64_t full = g.m / kGemmRows, rem = g.m % kGemmRows;
  GemmRowsOfA ra;
  if (g.lda == 0) {
    ra = {g.a + row0 * g.k, kGemmRows * g.k, kGemmRows, 1, g.a + full * kGemmRows * g.k, rem, 1};
  } else {
    ra = {g.a + row0 * g.lda, kGemmRows * g.lda, 1, g.lda, g.a + full * kGemmRows * g.lda, 1,
          g.lda};
  }
  for (int64_t p = p0; p < p1; ++p) {
    const float* panel = g.packed + p * g.k * nr;
    for (int64_t k0 = 0; k0 < g.k; k0 += g.kc) {
      const int64_t kn = std::min(g.kc, g.k - k0);
      if (k0 == 0) {
        GemmRows<false>(d, rows, ra, 0, panel, kn, acc);
      } else {
        GemmRows<true>(d, rows, ra, k0, panel + k0 * nr, kn, acc);
      }
    }
    StorePanel(g, acc, rows, nr, g.bias != nullptr ? g.bias + p * nr : nullptr,
               g.panel_valid[p], row0, g.panel_col[p] - g.col_base);
  }
}

int64_t GemmRowTile() { return kGemmRows; }

const GemmKernels* GetGemmKernels() {
  static const GemmKernels kKernels = {&GemmPanelCols, &GemmRowTile, &GemmTask};
  return &kKernels;
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace simdattn {

HWY_EXPORT(GetGemmKernels);

const GemmKernels* GemmKernelsForTarget(int64_t target_bit) {
  const int64_t index = ExportTableIndex(target_bit);
  if (index < 0) return nullptr;
  const auto fn = HWY_DISPATCH_TABLE(GetGemmKernels)[index];
  return fn == nullptr ? nullptr : fn();
}

}  // namespace simdattn
#endif  // HWY_ONCE
