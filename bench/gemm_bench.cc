// gemm/{simdattn,onednn}/f32/M<m>_N<n>_K<k>/threads:<n>: the projections of
// the MHA entries (fused QKV and output of B1 L2048 E1024 H16; QKV and
// output of one decode token at E4096 H32 KV8), simdattn's packed GEMM
// against oneDNN's matmul, both with bias and weights packed once outside
// the timed loop. Counters: FLOPS = 2·M·N·K, bytes = A, W, bias and C once.

#include <map>
#include <memory>
#include <random>
#include <string>

#include "bench/common.h"
#include "bench/mha_entries.h"
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

void BenchGemmSimdattn(benchmark::State& state, const GemmShape& s, int threads) {
  GemmProblem& p = CachedGemmProblem(s);
  ThreadPool pool(threads);
  ExecutionOptions exec;
  exec.pool = &pool;
  const WeightMatrix w{p.w, DType::kF32, s.n, s.k, p.bias.data(), DType::kF32};
  PackedWeights packed;
  Status st = PackWeights(&w, 1, s.k, exec, &packed);
  const GemmInput a{p.a.data(), DType::kF32, s.m, s.k};
  for (auto _ : state) {
    if (st.ok()) st = Gemm(a, packed, 0, 1, p.c.data(), DType::kF32, s.n, exec);
    if (!st.ok()) {
      state.SkipWithError(st.message.c_str());
      return;
    }
    benchmark::DoNotOptimize(p.c.data());
  }
  state.SetLabel(packed.target);
  SetGemmCounters(state, s);
}

void BenchGemmOneDnn(benchmark::State& state, const GemmShape& s, int threads) {
  GemmProblem& p = CachedGemmProblem(s);
  OneDnnMatmul mm(s.m, s.n, s.k, p.w, p.bias.data());
  if (!mm.error().empty()) {
    state.SkipWithError(mm.error().c_str());
    return;
  }
  for (auto _ : state) {
    mm.Run(p.a.data(), p.c.data(), threads);
    benchmark::DoNotOptimize(p.c.data());
  }
  state.SetLabel(mm.implementation());
  SetGemmCounters(state, s);
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
    }
  }
}

}  // namespace bench
}  // namespace simdattn
