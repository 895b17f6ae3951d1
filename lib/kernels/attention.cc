// Compiles the kernels once per Highway target and exports one
// TargetKernels table per target (the dispatch layer picks among them).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "lib/kernels/attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "lib/kernels/attention-inl.h"
#include "lib/kernels/kernels.h"

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {

int64_t QueryBlockRows() { return QueryBlockRowsImpl(); }

size_t ScratchFloats(int64_t head_dim_qk, int64_t head_dim_v) {
  return ScratchFloatsImpl(head_dim_qk, head_dim_v);
}

void AttentionTaskF32(const AttentionArgsF32& args, int64_t task,
                      float* scratch) {
  AttentionTaskF32Impl<false>(args, task, scratch);
}

void CombineTaskF32(const AttentionArgsF32& args, int64_t task) {
  CombineTaskF32Impl(args, task);
}

void PackKv(const AttentionArgsF32& args, int64_t group, float* dst,
            float* scratch) {
  PackKvImpl<false>(args, group, dst, scratch);
}

const TargetKernels* GetTargetKernels() {
  static const TargetKernels kKernels = {&QueryBlockRows, &ScratchFloats,
                                         &AttentionTaskF32, &CombineTaskF32,
                                         &PackKv};
  return &kKernels;
}

#if SIMDATTN_NATIVE_BF16
// The AVX3_BF16 entry: AVX3's kernels with the native bf16 products.
void AttentionTaskNativeBf16(const AttentionArgsF32& args, int64_t task,
                             float* scratch) {
  AttentionTaskF32Impl<true>(args, task, scratch);
}

void PackKvNativeBf16(const AttentionArgsF32& args, int64_t group, float* dst,
                      float* scratch) {
  PackKvImpl<true>(args, group, dst, scratch);
}

const TargetKernels* GetNativeBf16Kernels() {
  static const TargetKernels kKernels = {&QueryBlockRows, &ScratchFloats,
                                         &AttentionTaskNativeBf16,
                                         &CombineTaskF32, &PackKvNativeBf16};
  return &kKernels;
}
#endif

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace simdattn {

HWY_EXPORT(GetTargetKernels);

const TargetKernels* KernelsForTarget(int64_t target_bit) {
  if ((target_bit & HWY_TARGETS) == 0) return nullptr;
  // Highway's export table: entry 0 is its own lazy chooser (unused here),
  // entries 1..HWY_MAX_DYNAMIC_TARGETS are the dynamic targets in the
  // ChosenTarget bit order, the last one is SCALAR/EMU128.
  size_t index;
  if (target_bit == HWY_SCALAR || target_bit == HWY_EMU128) {
    index = HWY_MAX_DYNAMIC_TARGETS + 1;
  } else {
    const int64_t shifted = HWY_CHOSEN_TARGET_SHIFT(target_bit);
    if (shifted == 0) return nullptr;
    index = hwy::Num0BitsBelowLS1Bit_Nonzero64(static_cast<uint64_t>(shifted));
  }
  const auto fn = HWY_DISPATCH_TABLE(GetTargetKernels)[index];
  return fn == nullptr ? nullptr : fn();
}

const TargetKernels* NativeBf16Kernels() {
#if SIMDATTN_NATIVE_BF16_COMPILER && (HWY_TARGETS & HWY_AVX3)
  return N_AVX3::GetNativeBf16Kernels();
#else
  return nullptr;
#endif
}

}  // namespace simdattn
#endif  // HWY_ONCE
