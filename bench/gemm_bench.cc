// gemm/{simdattn,onednn}/f32/M<m>_N<n>_K<k>/threads:<n>: the projections of
// the MHA entries (fused QKV and output of B1 L2048 E1024 H16; QKV and
// output of one decode token at E4096 H32 KV8), simdattn's packed GEMM
// against oneDNN's matmul, both with bias and weights packed once outside
// the timed loop. The M = 1 entries read their weights cold: each
// iteration takes the next of enough packed copies to exceed twice the
// last-level cache (as bench/decode_entries.cc rotates K/V). Counters:
// FLOPS = 2·M·N·K, bytes = A, W, bias and C once.
// paired/gemm/f32/<shape>/onednn_vs_simdattn/threads:1 times both in
// alternation (bench/common.h TimePairs): ratio = simdattn / oneDNN time.

#include <unistd.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/common.h"
#include "bench/entries.h"
#include "bench/mha_entries.h"
#include "bench/onednn_attention.h"
#include "bench/onednn_matmul.h"
#include "lib/gemm/gemm.h"

namespace simdattn {
namespace bench {
namespace {

struct GemmShape {
  int64_t m, n, k;
  std::string Name() const {
    return "M" + std::to_string(m) + "_N" + std::to_string(n) + "_K" + std::to_string(k);
  }
};

const GemmShape kGemmShapes[] = {
    {2048, 3072, 1024}, {2048, 1024, 1024}, {1, 6144, 4096}, {1, 4096, 4096}};

// Inputs of one shape, made once per run (W on 2 MiB pages: the M = 1
// entries stream it).
struct GemmProblem {
  AlignedFloats a, bias, c;
  float* w = nullptr;
  explicit GemmProblem(const GemmShape& s) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    a.resize(size_t(s.m * s.k));
    bias.resize(size_t(s.n));
    c.assign(size_t(s.m * s.n), 0.0f);
    w = static_cast<float*>(AllocHugePages(size_t(s.n * s.k) * 4));
    for (float& x : a) x = u(rng);
    for (float& x : bias) x = u(rng);
    for (int64_t i = 0; i < s.n * s.k; ++i) w[i] = u(rng);
  }
  ~GemmProblem() { std::free(w); }
};

GemmProblem& CachedGemmProblem(const GemmShape& s) {
  static std::map<std::string, std::unique_ptr<GemmProblem>> problems;
  std::unique_ptr<GemmProblem>& slot = problems[s.Name()];
  if (!slot) slot.reset(new GemmProblem(s));
  return *slot;
}

void SetGemmCounters(benchmark::State& state, const GemmShape& s) {
  const double it = double(state.iterations());
  const double bytes = 4.0 * double(s.m * s.k + s.n * s.k + s.n + s.m * s.n);
  state.counters["FLOPS"] =
      benchmark::Counter(2.0 * double(s.m * s.n * s.k) * it, benchmark::Counter::kIsRate);
  state.counters["bytes"] = benchmark::Counter(bytes * it, benchmark::Counter::kIsRate);
}

// Copies of the weights each implementation rotates through: 1 for the
// M > 1 shapes (their weights are read again by every row block anyway),
// else enough to exceed twice the last-level cache.
size_t WeightCopies(const GemmShape& s) {
  if (s.m > 1) return 1;
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  const double llc = l3 > 0 ? double(l3) : double(int64_t{64} << 20);
  return size_t(2.0 * llc / (4.0 * double(s.n * s.k))) + 1;
}

// simdattn's side of an entry: the packed copies and the pool.
struct SimdattnGemm {
  ThreadPool pool;
  ExecutionOptions exec;
  std::vector<PackedWeights> packed;
  Status status;
  size_t next = 0;
  SimdattnGemm(const GemmShape& s, GemmProblem& p, int threads) : pool(threads) {
    exec.pool = &pool;
    const WeightMatrix w{p.w, DType::kF32, s.n, s.k, p.bias.data(), DType::kF32};
    packed.resize(WeightCopies(s));
    for (PackedWeights& pw : packed) {
      if (status.ok()) status = PackWeights(&w, 1, s.k, exec, &pw);
    }
  }
  // One product on the next copy; false after marking the entry as failed.
  bool Run(benchmark::State& state, const GemmShape& s, GemmProblem& p) {
    const GemmInput a{p.a.data(), DType::kF32, s.m, s.k};
    if (status.ok()) {
      status = Gemm(a, packed[next], 0, 1, p.c.data(), DType::kF32, s.n, exec);
    }
    next = (next + 1) % packed.size();
    if (!status.ok()) state.SkipWithError(status.message.c_str());
    benchmark::DoNotOptimize(p.c.data());
    return status.ok();
  }
};

// oneDNN's side: one primitive (with its reordered weights) per copy.
struct OneDnnGemm {
  std::vector<std::unique_ptr<OneDnnMatmul>> mm;
  size_t next = 0;
  // False after marking the entry as failed.
  bool Make(benchmark::State& state, const GemmShape& s, GemmProblem& p, int threads) {
    SetOneDnnThreads(threads);
    for (size_t i = WeightCopies(s); i > 0; --i) {
      mm.emplace_back(new OneDnnMatmul(s.m, s.n, s.k, p.w, p.bias.data()));
      if (!mm.back()->error().empty()) {
        state.SkipWithError(mm.back()->error().c_str());
        return false;
      }
    }
    return true;
  }
  void Run(GemmProblem& p, int threads) {
    mm[next]->Run(p.a.data(), p.c.data(), threads);
    next = (next + 1) % mm.size();
    benchmark::DoNotOptimize(p.c.data());
  }
};

void BenchGemmSimdattn(benchmark::State& state, const GemmShape& s, int threads) {
  GemmProblem& p = CachedGemmProblem(s);
  SimdattnGemm g(s, p, threads);
  for (auto _ : state) {
    if (!g.Run(state, s, p)) return;
  }
  if (g.status.ok()) state.SetLabel(g.packed[0].target);
  SetGemmCounters(state, s);
}

void BenchGemmOneDnn(benchmark::State& state, const GemmShape& s, int threads) {
  GemmProblem& p = CachedGemmProblem(s);
  OneDnnGemm g;
  if (!g.Make(state, s, p, threads)) return;
  for (auto _ : state) g.Run(p, threads);
  state.SetLabel(g.mm[0]->implementation());
  SetGemmCounters(state, s);
}

// ratio = simdattn's time / oneDNN's, the calls alternating.
void BenchGemmPaired(benchmark::State& state, const GemmShape& s, int threads) {
  GemmProblem& p = CachedGemmProblem(s);
  OneDnnGemm dnn;
  if (!dnn.Make(state, s, p, threads)) return;
  SimdattnGemm g(s, p, threads);
  TimePairs(
      state,
      [&] {
        dnn.Run(p, threads);
        return true;
      },
      [&] { return g.Run(state, s, p); });
}

}  // namespace

void RegisterGemmEntries(const BenchConfig& config) {
  if (config.headline) return;
  for (const GemmShape& s : kGemmShapes) {
    for (int threads : config.threads) {
      const std::string tail = "/f32/" + s.Name() + ThreadsField(threads);
      Register("gemm/simdattn" + tail,
               [s, threads](benchmark::State& st) { BenchGemmSimdattn(st, s, threads); });
      Register("gemm/onednn" + tail,
               [s, threads](benchmark::State& st) { BenchGemmOneDnn(st, s, threads); });
      if (PairableWithOneDnn(threads)) {
        Register("paired/gemm/f32/" + s.Name() + "/onednn_vs_simdattn" + ThreadsField(threads),
                 [s, threads](benchmark::State& st) { BenchGemmPaired(st, s, threads); }, 3.0);
      }
    }
  }
}

}  // namespace bench
}  // namespace simdattn
