// roofline/...: the machine's limits at each thread count, measured in the
// same process as the attention entries that are divided by them.
//   fma_f32    register-resident f32 FMAs on the widest vectors (GFLOP/s)
//   dot_bf16   the same with vdpbf16ps, where the CPU has AVX512_BF16
//   read_bw    a streaming read of 1 GiB (the "FLOPS" column holds bytes/s)

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "bench/common.h"
#include "bench/entries.h"
#include "bench/roofline.h"

namespace simdattn {
namespace bench {
namespace {

// A register-resident peak loop (flops returned per call) on every thread
// of the pool, counted as one FLOPS rate.
void BenchPeakLoop(benchmark::State& state, int threads,
                   double (*loop)(int64_t iterations, float* sink), const char* label) {
  ThreadPool pool(threads);
  struct Job {
    double (*loop)(int64_t, float*);
    std::vector<float> sinks;
    std::vector<double> flops;
  } job{loop, std::vector<float>(size_t(threads) * 16), std::vector<double>(size_t(threads))};
  double flops = 0.0;
  for (auto _ : state) {
    pool.ParallelFor(
        threads,
        [](void* arg, int64_t i) {
          constexpr int64_t kIterations = 4 << 20;
          Job* j = static_cast<Job*>(arg);
          j->flops[size_t(i)] = j->loop(kIterations, j->sinks.data() + i * 16);
        },
        &job);
    for (double f : job.flops) flops += f;
  }
  benchmark::DoNotOptimize(job.sinks.data());
  state.SetLabel(label);
  state.counters["FLOPS"] = benchmark::Counter(flops, benchmark::Counter::kIsRate);
}

void BenchFmaPeak(benchmark::State& state, int threads) {
  BenchPeakLoop(state, threads, &FmaPeakLoop, RooflineTarget());
}

// Where the library's AVX3_BF16 target is available (the CPU has
// AVX512_BF16); an error entry elsewhere.
void BenchDotBf16Peak(benchmark::State& state, int threads) {
  const std::vector<std::string> avail = AvailableTargets();
  if (std::find(avail.begin(), avail.end(), "AVX3_BF16") == avail.end()) {
    state.SkipWithError("no AVX512_BF16 on this CPU (or not compiled)");
    return;
  }
  BenchPeakLoop(state, threads, &DotBf16PeakLoop, "AVX3_BF16");
}

void BenchReadBandwidth(benchmark::State& state, int threads) {
  const float* buffer = ReadBuffer();
  if (buffer == nullptr) {
    state.SkipWithError("cannot allocate 1 GiB");
    return;
  }
  ThreadPool pool(threads);
  for (auto _ : state) {
    StreamReadThreads(pool, threads, buffer, kReadBufferBytes / sizeof(float));
  }
  state.counters["bytes"] = benchmark::Counter(
      double(kReadBufferBytes) * double(state.iterations()), benchmark::Counter::kIsRate);
}

}  // namespace

const float* ReadBuffer() {
  static float* buffer = [] {
    void* p = AllocHugePages(kReadBufferBytes);
    if (p != nullptr) std::memset(p, 0, kReadBufferBytes);
    return static_cast<float*>(p);
  }();
  return buffer;
}

void StreamReadThreads(ThreadPool& pool, int threads, const float* data, size_t n) {
  struct Job {
    const float* data;
    size_t per_thread;
    std::vector<float> sums;
  } job{data, n / size_t(threads), std::vector<float>(size_t(threads))};
  pool.ParallelFor(
      threads,
      [](void* arg, int64_t i) {
        Job* j = static_cast<Job*>(arg);
        j->sums[size_t(i)] = StreamRead(j->data + size_t(i) * j->per_thread, j->per_thread);
      },
      &job);
  benchmark::DoNotOptimize(job.sums.data());
}

void RegisterRooflineEntries(const BenchConfig& config) {
  for (int threads : config.threads) {
    const std::string t = ThreadsField(threads);
    Register("roofline/fma_f32" + t,
             [threads](benchmark::State& st) { BenchFmaPeak(st, threads); });
    Register("roofline/dot_bf16" + t,
             [threads](benchmark::State& st) { BenchDotBf16Peak(st, threads); });
    Register("roofline/read_bw" + t,
             [threads](benchmark::State& st) { BenchReadBandwidth(st, threads); });
  }
}

}  // namespace bench
}  // namespace simdattn
