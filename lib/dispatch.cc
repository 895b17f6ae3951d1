// Dispatch table over Highway's compiled targets, target names, and the
// SetMaxTarget / SIMDATTN_MAX_TARGET cap (like ONEDNN_MAX_CPU_ISA).

#include "lib/dispatch.h"

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "hwy/highway.h"
#include "hwy/targets.h"

#if HWY_ARCH_X86
#include <cpuid.h>
#endif
#if HWY_ARCH_X86 && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace simdattn {
namespace {

// Every target name this architecture knows, in Highway's order of
// preference (its bit order), after our own entries. A cap may name any of
// them, compiled or not.
struct KnownTarget {
  const char* name;
  int64_t bit;  // Highway's target bit; kNativeBf16 for our own entry
};

// AVX3_BF16: Highway's AVX3 kernels with the bf16 products on vdpbf16ps
// (AVX512_BF16, which Highway 1.0.3 has no target for), ranked above
// AVX3_DL so that SIMDATTN_MAX_TARGET=AVX3_DL caps it off.
constexpr int64_t kNativeBf16 = 0;
// AVX3_AMX: AVX3's kernels with bf16 Q, K and V on AMX tiles, ranked above
// AVX3_BF16.
constexpr int64_t kAmx = -1;

#if HWY_ARCH_X86
constexpr KnownTarget kKnown[] = {
    {"AVX3_AMX", kAmx},
    {"AVX3_BF16", kNativeBf16},
    {"AVX3_DL", HWY_AVX3_DL}, {"AVX3", HWY_AVX3},     {"AVX2", HWY_AVX2},
    {"SSE4", HWY_SSE4},       {"SSSE3", HWY_SSSE3},   {"EMU128", HWY_EMU128},
    {"SCALAR", HWY_SCALAR}};
#elif HWY_ARCH_ARM_A64
constexpr KnownTarget kKnown[] = {
    {"SVE2_128", HWY_SVE2_128}, {"SVE_256", HWY_SVE_256}, {"SVE2", HWY_SVE2},
    {"SVE", HWY_SVE},           {"NEON", HWY_NEON},       {"EMU128", HWY_EMU128},
    {"SCALAR", HWY_SCALAR}};
#else
constexpr KnownTarget kKnown[] = {{"EMU128", HWY_EMU128},
                                  {"SCALAR", HWY_SCALAR}};
#endif
constexpr int kNumKnown = static_cast<int>(sizeof(kKnown) / sizeof(kKnown[0]));

bool EqualsIgnoreCase(const char* a, const char* b) {
  for (; *a != '\0' && *b != '\0'; ++a, ++b) {
    if (std::toupper(static_cast<unsigned char>(*a)) !=
        std::toupper(static_cast<unsigned char>(*b))) {
      return false;
    }
  }
  return *a == *b;
}

// Rank of a target name, or -1.
int RankOf(const char* name) {
  for (int i = 0; i < kNumKnown; ++i) {
    if (EqualsIgnoreCase(name, kKnown[i].name)) return i;
  }
  return -1;
}

std::string KnownNames() {
  std::string s;
  for (int i = 0; i < kNumKnown; ++i) {
    if (i) s += ", ";
    s += kKnown[i].name;
  }
  return s;
}

// CPUID.(EAX=7, ECX=1):EAX bit 5: AVX512_BF16. The OS's saving of the
// AVX-512 state is part of Highway's AVX3 check, required with it.
bool CpuHasAvx512Bf16() {
#if HWY_ARCH_X86
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (eax >> 5) & 1u;
#else
  return false;
#endif
}

// Whether vdpbf16ps beats the f32 FMAs of the widening path on this CPU:
// on AMD Zen 5 it does twice their flops; on an Intel Emerald Rapids core
// half (roofline/dot_bf16 79 GFLOP/s against roofline/fma_f32 165), so on
// Intel AVX3_BF16 runs only when named (SetMaxTarget / SIMDATTN_MAX_TARGET).
bool CpuPrefersNativeBf16() {
#if HWY_ARCH_X86
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) == 0) return false;
  // "AuthenticAMD" in EBX, EDX, ECX.
  return ebx == 0x68747541u && edx == 0x69746E65u && ecx == 0x444D4163u;
#else
  return false;
#endif
}

// CPUID.(EAX=7, ECX=0):EDX bits 22 (AMX-BF16) and 24 (AMX-TILE), the OS
// saving the tile state (XCR0 bits 17 and 18), and Linux's permission to use
// it in this process (ARCH_REQ_XCOMP_PERM for XTILEDATA, asked once); a
// refusal leaves the entry unavailable.
bool CpuRunsAmx() {
#if HWY_ARCH_X86 && defined(__linux__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  if (((edx >> 22) & 1u) == 0 || ((edx >> 24) & 1u) == 0) return false;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || ((ecx >> 27) & 1u) == 0) {
    return false;  // no OSXSAVE: XGETBV would fault
  }
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  asm volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if (((xcr0_lo >> 17) & 3u) != 3u) return false;
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

// Cap set through SetMaxTarget: -1 = none (use the environment).
std::atomic<int> g_api_cap{-1};

// Set by SetAmxEmulation (tests, before any call).
bool g_amx_emulation = false;

std::vector<TargetEntry> BuildTable() {
  // SupportedTargets() lists SVE_256 / SVE2_128 only when the vector length
  // matches. In Highway 1.0.3 it also refreshes the global ChosenTarget
  // without them; DeInit() makes a host program's own HWY_DYNAMIC_DISPATCH
  // choose again. Our dispatch never uses ChosenTarget.
  const int64_t supported = hwy::SupportedTargets();
  hwy::GetChosenTarget().DeInit();
  std::vector<TargetEntry> table;
  for (int i = 0; i < kNumKnown; ++i) {
    const int64_t bit = kKnown[i].bit;
    const bool native = bit == kNativeBf16;
    const TargetKernels* kernels = bit == kAmx  ? AmxKernels(g_amx_emulation)
                                   : native     ? NativeBf16Kernels()
                                                : KernelsForTarget(bit);
    if (kernels == nullptr) continue;
    const bool avx3 = (supported & HWY_AVX3) != 0;
    const bool runs = bit == kAmx ? avx3 && (g_amx_emulation ||
                                             (CpuRunsAmx() && CpuHasAvx512Bf16()))
                      : native    ? avx3 && CpuHasAvx512Bf16()
                                  : (supported & bit) != 0;
    const bool preferred = !native || CpuPrefersNativeBf16();
    table.push_back({kKnown[i].name, i, runs, preferred, kernels});
  }
  return table;
}

std::vector<TargetEntry>& MutableTable() {
  static std::vector<TargetEntry> table = BuildTable();
  return table;
}

}  // namespace

const std::vector<TargetEntry>& TargetTable() { return MutableTable(); }

// The table is rebuilt in place: callers hold references into it, so this
// runs only while no call is in flight (dispatch.h).
void SetAmxEmulation(bool on) {
  g_amx_emulation = on;
  MutableTable() = BuildTable();
}

namespace {

// The best supported entry at or below rank `cap` (-1: no cap).
Status EntryAtCap(int cap, const TargetEntry** entry) {
  for (const TargetEntry& e : TargetTable()) {
    if (e.supported && e.rank >= (cap < 0 ? 0 : cap) &&
        (e.preferred || e.rank == cap)) {
      *entry = &e;
      return Status::Ok();
    }
  }
  Status s;
  s.code = StatusCode::kInvalidArgument;
  s.message = std::string("no compiled target at or below the cap ") +
              kKnown[cap < 0 ? 0 : cap].name + " runs on this CPU";
  return s;
}

Status UnknownTarget(const std::string& what, const char* name) {
  Status s;
  s.code = StatusCode::kInvalidArgument;
  s.message = what + " = '" + name +
              "' names no target of this architecture; known: " + KnownNames();
  return s;
}

// The SIMDATTN_MAX_TARGET value that names no target and was last reported
// by a call; calls with the same value ignore it.
std::mutex g_env_mutex;
char g_env_reported[128] = "";

// Whether a call should report the bad SIMDATTN_MAX_TARGET value `env` (the
// first to see it does); values too long to remember are always reported.
bool FirstReportOf(const char* env) {
  std::lock_guard<std::mutex> lock(g_env_mutex);
  if (std::strcmp(env, g_env_reported) == 0) return false;
  if (std::strlen(env) < sizeof(g_env_reported)) {
    std::strcpy(g_env_reported, env);
  }
  return true;
}

// The rank a call is capped at (-1: none): the call's own cap, else
// SetMaxTarget's, else SIMDATTN_MAX_TARGET's. A bad environment value is
// an error always, or (report_env_once) only for the first call to see it.
Status CapRank(const char* call_cap, bool report_env_once, int* cap) {
  *cap = -1;
  if (call_cap != nullptr && call_cap[0] != '\0') {
    *cap = RankOf(call_cap);
    return *cap < 0 ? UnknownTarget("max_target", call_cap) : Status::Ok();
  }
  *cap = g_api_cap.load(std::memory_order_relaxed);
  if (*cap >= 0) return Status::Ok();
  const char* env = std::getenv("SIMDATTN_MAX_TARGET");
  if (env == nullptr || env[0] == '\0') return Status::Ok();
  *cap = RankOf(env);
  if (*cap >= 0) return Status::Ok();
  if (report_env_once && !FirstReportOf(env)) return Status::Ok();
  Status s = UnknownTarget("SIMDATTN_MAX_TARGET", env);
  s.message += report_env_once
                   ? " (reported once; later calls ignore it)"
                   : " (the first call reports it; later calls ignore it)";
  return s;
}

}  // namespace

Status ChooseTarget(const char* call_cap, const TargetEntry** entry) {
  int cap = -1;
  Status s = CapRank(call_cap, /*report_env_once=*/true, &cap);
  if (!s.ok()) return s;
  return EntryAtCap(cap, entry);
}

std::vector<std::string> AvailableTargets() {
  std::vector<std::string> out;
  for (const TargetEntry& e : TargetTable()) {
    if (e.supported) out.push_back(e.name);
  }
  return out;
}

std::vector<std::string> CompiledTargets() {
  std::vector<std::string> out;
  for (const TargetEntry& e : TargetTable()) out.push_back(e.name);
  return out;
}

Status SetMaxTarget(const char* name) {
  if (name == nullptr || name[0] == '\0') {
    g_api_cap.store(-1);
    return Status::Ok();
  }
  const int rank = RankOf(name);
  if (rank < 0) return UnknownTarget("target", name);
  g_api_cap.store(rank);
  return Status::Ok();
}

Status SelectedTarget(std::string* name) {
  int cap = -1;
  const Status env = CapRank(nullptr, /*report_env_once=*/false, &cap);
  const TargetEntry* e = nullptr;
  const Status s = EntryAtCap(env.ok() ? cap : -1, &e);
  if (s.ok() && name != nullptr) *name = e->name;
  return env.ok() ? s : env;
}

}  // namespace simdattn
