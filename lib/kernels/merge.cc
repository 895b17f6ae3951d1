// The per-target loops of MergeStates (merge_kernels.h): widen a part's row
// and add it, weighted, to an f32 accumulator; store the accumulator in the
// output's type. Compiled once per Highway target.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "lib/kernels/merge.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <cstdint>
#include <cstring>

#include "hwy/highway.h"
#include "lib/export_index.h"
#include "lib/dtype.h"
#include "lib/kernels/convert-inl.h"
#include "lib/kernels/merge_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Lanes(d) elements of a 16-bit row widened exactly (convert-inl.h's rules:
// hardware f16 where the target has it, LoadF16Soft elsewhere).
template <class D>
HWY_INLINE hn::VFromD<D> LoadWide16(D d, const uint16_t* HWY_RESTRICT p,
                                    Storage type) {
  if (type == Storage::kBF16) {
    const hn::Rebind<hwy::bfloat16_t, D> dbf;
    return hn::PromoteTo(d, hn::LoadU(dbf, reinterpret_cast<const hwy::bfloat16_t*>(p)));
  }
#if SIMDATTN_HW_F16
  const hn::Rebind<hwy::float16_t, D> dh;
  return hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
#else
  return LoadF16Soft(d, p);
#endif
}

// acc = w * x or acc += w * x over whole vectors, then the tail in scalar.
// The merge reads each part's row once and writes O once: it is bound by
// memory, and one FMA per element leaves the loads as the limit.
void Accumulate(float* HWY_RESTRICT acc, const void* row, Storage type,
                float weight, int64_t n, bool first) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto vw = hn::Set(d, weight);
  int64_t i = 0;
  if (type == Storage::kF32) {
    const float* x = static_cast<const float*>(row);
    for (; i + N <= n; i += N) {
      const auto vx = hn::LoadU(d, x + i);
      hn::StoreU(first ? hn::Mul(vw, vx) : hn::MulAdd(vw, vx, hn::LoadU(d, acc + i)),
                 d, acc + i);
    }
    for (; i < n; ++i) acc[i] = first ? weight * x[i] : acc[i] + weight * x[i];
    return;
  }
  const uint16_t* x = static_cast<const uint16_t*>(row);
#if HWY_TARGET != HWY_SCALAR
  for (; i + N <= n; i += N) {
    const auto vx = LoadWide16(d, x + i, type);
    hn::StoreU(first ? hn::Mul(vw, vx) : hn::MulAdd(vw, vx, hn::LoadU(d, acc + i)),
               d, acc + i);
  }
#endif
  for (; i < n; ++i) {
    const float xi = type == Storage::kBF16 ? BF16ToF32(x[i]) : F16ToF32(x[i]);
    acc[i] = first ? weight * xi : acc[i] + weight * xi;
  }
}

// dst = acc in `type`: f32 copied, f16 demoted in hardware where the target
// converts it, the rest rounded to nearest even one at a time (lib/dtype.h).
void Store(const float* HWY_RESTRICT acc, int64_t n, void* dst, Storage type) {
  if (type == Storage::kF32) {
    std::memcpy(dst, acc, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  uint16_t* out = static_cast<uint16_t*>(dst);
  int64_t i = 0;
#if SIMDATTN_HW_F16
  if (type == Storage::kF16) {
    const hn::ScalableTag<float> d;
    const hn::Rebind<hwy::float16_t, decltype(d)> dh;
    const int64_t N = static_cast<int64_t>(hn::Lanes(d));
    for (; i + N <= n; i += N) {
      hn::StoreU(hn::DemoteTo(dh, hn::LoadU(d, acc + i)), dh,
                 reinterpret_cast<hwy::float16_t*>(out + i));
    }
  }
#endif
  for (; i < n; ++i) {
    out[i] = type == Storage::kF16 ? F32ToF16(acc[i]) : F32ToBF16(acc[i]);
  }
}

const MergeKernels* GetMergeKernels() {
  static const MergeKernels kKernels = {&Accumulate, &Store};
  return &kKernels;
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace simdattn {

HWY_EXPORT(GetMergeKernels);

const MergeKernels* MergeKernelsFor(const char* target_name) {
  if (std::strcmp(target_name, "AVX3_BF16") == 0 ||
      std::strcmp(target_name, "AVX3_AMX") == 0) {
    target_name = "AVX3";
  }
  for (uint64_t rest = HWY_TARGETS; rest != 0; rest &= rest - 1) {
    const int64_t bit = static_cast<int64_t>(rest & (~rest + 1));
    if (std::strcmp(hwy::TargetName(bit), target_name) != 0) continue;
    const int64_t index = ExportTableIndex(bit);
    if (index < 0) return nullptr;
    const auto fn = HWY_DISPATCH_TABLE(GetMergeKernels)[index];
    return fn == nullptr ? nullptr : fn();
  }
  return nullptr;
}

}  // namespace simdattn
#endif  // HWY_ONCE
