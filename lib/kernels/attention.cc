// Compiles the kernels once per Highway target and exports one
// TargetKernels table per target (the dispatch layer picks among them).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "lib/kernels/attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "lib/export_index.h"
#include "lib/kernels/combine-inl.h"
#include "lib/kernels/prefill-inl.h"
#include "lib/kernels/kernels.h"

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {

TargetCaps Caps() {
  const hn::ScalableTag<float> d;
  TargetCaps caps;
  caps.lanes = static_cast<int64_t>(hn::Lanes(d));
  caps.f16_in_registers = kKvF16InRegisters;
  caps.amx = false;
#if SIMDATTN_HAVE_DECODE_FUSED
  caps.fused_decode = true;
  caps.fused_max_dk = kFusedMaxDk;
#else
  caps.fused_decode = false;
  caps.fused_max_dk = 0;
#endif
  return caps;
}

int64_t QueryBlockRows() { return QueryBlockRowsImpl(); }

size_t ScratchFloats(int64_t head_dim_qk, int64_t head_dim_v) {
  return ScratchFloatsImpl(head_dim_qk, head_dim_v);
}

template <Bf16Path kPath>
void AttentionTask(const AttentionArgs& args, const Plan& plan,
                   const Wave& wave, int64_t task, float* scratch) {
  AttentionTaskImpl<kPath>(args, plan, wave, task, scratch);
}

void CombineTask(const AttentionArgs& args, const Plan& plan, const Wave& wave,
                 int64_t task) {
  CombineTaskImpl(args, plan, wave, task);
}

template <Bf16Path kPath>
void PackKvTask(const AttentionArgs& args, const Plan& plan, int64_t group,
                float* dst, float* scratch) {
  PackKv<kPath>(args, plan, group, dst, scratch);
}

const TargetKernels* GetTargetKernels() {
  static const TargetKernels kKernels = {
      &Caps, &QueryBlockRows, &ScratchFloats, &AttentionTask<Bf16Path::kWidened>,
      &CombineTask, &PackKvTask<Bf16Path::kWidened>};
  return &kKernels;
}

#if SIMDATTN_NATIVE_BF16
// The AVX3_BF16 entry: AVX3's kernels with the native bf16 products.
const TargetKernels* GetNativeBf16Kernels() {
  static const TargetKernels kKernels = {
      &Caps, &QueryBlockRows, &ScratchFloats, &AttentionTask<Bf16Path::kNative>,
      &CombineTask, &PackKvTask<Bf16Path::kNative>};
  return &kKernels;
}
#endif

#if SIMDATTN_AMX
// The AVX3_AMX entry: AVX3's kernels with bf16 Q, K, V on AMX tiles.
TargetCaps AmxCaps() {
  TargetCaps caps = Caps();
  caps.amx = true;
  return caps;
}

const TargetKernels* GetAmxKernels(bool emulated) {
  static const TargetKernels kHardware = {
      &AmxCaps, &QueryBlockRows, &ScratchFloats, &AttentionTask<Bf16Path::kAmx>,
      &CombineTask, &PackKvTask<Bf16Path::kAmx>};
  static const TargetKernels kEmulated = {
      &AmxCaps, &QueryBlockRows, &ScratchFloats,
      &AttentionTask<Bf16Path::kAmxEmulated>, &CombineTask,
      &PackKvTask<Bf16Path::kAmxEmulated>};
  return emulated ? &kEmulated : &kHardware;
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
  const int64_t index = ExportTableIndex(target_bit);
  if (index < 0) return nullptr;
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

const TargetKernels* AmxKernels(bool emulated) {
#if SIMDATTN_NATIVE_BF16_COMPILER && (HWY_TARGETS & HWY_AVX3) && defined(__x86_64__)
  return N_AVX3::GetAmxKernels(emulated);
#else
  (void)emulated;
  return nullptr;
#endif
}

}  // namespace simdattn
#endif  // HWY_ONCE
