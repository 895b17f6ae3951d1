// simdattn_bench: Google Benchmark entries for the fused kernel and the
// baselines it is compared with, measured in one process, plus a summary
// table of the medians (GFLOP/s and speed-up over each baseline).
//
// Entry names: attention/<impl>/<dtype>/<shape>/<mask>/threads:<n>, with the
// counters FLOPS (4·B·Hq·Lq·Lk·D, causal: visible pairs only) and bytes
// (Q, K, V and O as stored), both as rates over wall-clock time.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "simdattn/attention.h"

namespace {

struct Shape {
  int64_t batch, q_heads, kv_heads, q_len, kv_len, head_dim;

  std::string Name() const {
    return "B" + std::to_string(batch) + "_Hq" + std::to_string(q_heads) +
           "_Hkv" + std::to_string(kv_heads) + "_Lq" + std::to_string(q_len) +
           "_Lk" + std::to_string(kv_len) + "_D" + std::to_string(head_dim);
  }
};

// Query-key pairs that take part (causal top-left: row i sees i + 1 keys).
double VisiblePairs(const Shape& s, bool causal) {
  if (!causal) return double(s.q_len) * double(s.kv_len);
  double pairs = 0;
  for (int64_t i = 0; i < s.q_len; ++i) {
    pairs += double(std::min<int64_t>(s.kv_len, i + 1));
  }
  return pairs;
}

// Inputs allocated and touched once per shape, outside the timed loops.
struct Problem {
  Shape shape;
  std::vector<float> q, k, v, o;

  explicit Problem(const Shape& s) : shape(s) {
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    q.resize(size_t(s.batch * s.q_heads * s.q_len * s.head_dim));
    k.resize(size_t(s.batch * s.kv_heads * s.kv_len * s.head_dim));
    v.resize(k.size());
    o.assign(q.size(), 0.0f);
    for (float& x : q) x = dist(rng);
    for (float& x : k) x = dist(rng);
    for (float& x : v) x = dist(rng);
  }
};

// The plain unfused loop a user would write without a library: S = Q·Kᵀ
// materialized per head, a three-pass softmax, then P·V. Single-threaded.
void NaiveAttention(const Problem& p, bool causal, std::vector<float>* scores) {
  const Shape& s = p.shape;
  const int64_t group = s.q_heads / s.kv_heads;
  const float scale = 1.0f / std::sqrt(float(s.head_dim));
  const int64_t D = s.head_dim;
  scores->resize(size_t(s.q_len * s.kv_len));
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.q_heads; ++h) {
      const int64_t hk = h / group;
      const float* q = p.q.data() + (b * s.q_heads + h) * s.q_len * D;
      const float* k = p.k.data() + (b * s.kv_heads + hk) * s.kv_len * D;
      const float* v = p.v.data() + (b * s.kv_heads + hk) * s.kv_len * D;
      float* o = const_cast<float*>(p.o.data()) + (b * s.q_heads + h) * s.q_len * D;
      for (int64_t i = 0; i < s.q_len; ++i) {
        float* srow = scores->data() + i * s.kv_len;
        const int64_t n = causal ? std::min(s.kv_len, i + 1) : s.kv_len;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < n; ++j) {
          float dot = 0.0f;
          for (int64_t d = 0; d < D; ++d) dot += q[i * D + d] * k[j * D + d];
          srow[j] = dot * scale;
          mx = std::max(mx, srow[j]);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < n; ++j) {
          srow[j] = std::exp(srow[j] - mx);
          sum += srow[j];
        }
        float* orow = o + i * D;
        std::fill(orow, orow + D, 0.0f);
        for (int64_t j = 0; j < n; ++j) {
          const float w = srow[j] / sum;
          for (int64_t d = 0; d < D; ++d) orow[d] += w * v[j * D + d];
        }
      }
    }
  }
}

void SetCounters(benchmark::State& state, const Shape& s, bool causal) {
  const double flops = 4.0 * double(s.batch * s.q_heads) * VisiblePairs(s, causal) *
                       double(s.head_dim);
  const double bytes =
      4.0 * double(s.head_dim) *
      double(2 * s.batch * s.q_heads * s.q_len + 2 * s.batch * s.kv_heads * s.kv_len);
  state.counters["FLOPS"] = benchmark::Counter(
      flops * double(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["bytes"] = benchmark::Counter(
      bytes * double(state.iterations()), benchmark::Counter::kIsRate);
}

void BenchSimdattn(benchmark::State& state, const Shape& s, bool causal,
                   int threads) {
  static std::map<std::string, std::unique_ptr<Problem>> problems;
  auto& slot = problems[s.Name()];
  if (!slot) slot.reset(new Problem(s));
  Problem& p = *slot;
  simdattn::ThreadPool pool(threads);
  simdattn::ExecutionOptions exec;
  exec.pool = &pool;
  simdattn::AttentionOptions options;
  options.causal = causal;
  const auto q = simdattn::MakeBHSD(p.q.data(), simdattn::DType::kF32, s.batch,
                                    s.q_heads, s.q_len, s.head_dim);
  const auto k = simdattn::MakeBHSD(p.k.data(), simdattn::DType::kF32, s.batch,
                                    s.kv_heads, s.kv_len, s.head_dim);
  const auto v = simdattn::MakeBHSD(p.v.data(), simdattn::DType::kF32, s.batch,
                                    s.kv_heads, s.kv_len, s.head_dim);
  const auto o = simdattn::MakeBHSD(p.o.data(), simdattn::DType::kF32, s.batch,
                                    s.q_heads, s.q_len, s.head_dim);
  simdattn::RunInfo info;
  for (auto _ : state) {
    const simdattn::Status st =
        simdattn::Attention(q, k, v, o, options, {}, exec, &info);
    if (!st.ok()) {
      state.SkipWithError(st.message.c_str());
      return;
    }
    benchmark::DoNotOptimize(p.o.data());
  }
  state.SetLabel(info.target);
  SetCounters(state, s, causal);
}

void BenchNaive(benchmark::State& state, const Shape& s, bool causal) {
  Problem p(s);
  std::vector<float> scores;
  for (auto _ : state) {
    NaiveAttention(p, causal, &scores);
    benchmark::DoNotOptimize(p.o.data());
  }
  SetCounters(state, s, causal);
}

// Keeps the median of each entry for the summary table.
class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      const bool median = r.aggregate_name == "median";
      if (r.run_type == Run::RT_Aggregate && !median) continue;
      auto it = r.counters.find("FLOPS");
      if (it == r.counters.end() || r.error_occurred) continue;
      // Without repetitions the single run stands for the median.
      std::string name = r.run_name.str();
      const size_t rt = name.find("/real_time");
      if (rt != std::string::npos) name.erase(rt);
      if (median || medians_.count(name) == 0) medians_[name] = {double(it->second), r.report_label};
    }
  }

  void PrintSummary() const {
    std::printf("\n%-10s %-52s %-8s %10s %10s\n", "impl", "shape/mask/threads",
                "target", "GFLOP/s", "vs naive");
    for (const auto& [name, m] : medians_) {
      // name = attention/<impl>/<dtype>/<shape>/<mask>/threads:<n>
      const size_t a = name.find('/') + 1, b = name.find('/', a);
      const std::string impl = name.substr(a, b - a);
      const size_t c = name.find('/', b + 1);
      const std::string rest = name.substr(c + 1);
      std::string speedup = "";
      if (impl == "simdattn") {
        std::string naive = name;
        naive.replace(a, b - a, "naive");
        naive = naive.substr(0, naive.rfind("/threads:")) + "/threads:1";
        auto it = medians_.find(naive);
        if (it != medians_.end()) {
          char buf[32];
          std::snprintf(buf, sizeof(buf), "%.1fx", m.flops / it->second.flops);
          speedup = buf;
        }
      }
      std::printf("%-10s %-52s %-8s %10.1f %10s\n", impl.c_str(), rest.c_str(),
                  m.label.c_str(), m.flops * 1e-9, speedup.c_str());
    }
  }

 private:
  struct Median {
    double flops;
    std::string label;
  };
  std::map<std::string, Median> medians_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;

  const Shape shapes[] = {{1, 8, 8, 512, 512, 64},   {1, 8, 8, 2048, 2048, 64},
                          {1, 8, 8, 2048, 2048, 128}, {4, 16, 16, 256, 256, 64},
                          {1, 32, 8, 1024, 1024, 128}};
  for (const Shape& s : shapes) {
    for (bool causal : {false, true}) {
      const std::string mask = causal ? "causal" : "none";
      for (int threads : {1, 2}) {
        benchmark::RegisterBenchmark(
            ("attention/simdattn/f32/" + s.Name() + "/" + mask +
             "/threads:" + std::to_string(threads)).c_str(),
            [s, causal, threads](benchmark::State& st) {
              BenchSimdattn(st, s, causal, threads);
            })
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
      benchmark::RegisterBenchmark(
          ("attention/naive/f32/" + s.Name() + "/" + mask + "/threads:1").c_str(),
          [s, causal](benchmark::State& st) { BenchNaive(st, s, causal); })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }

  SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.PrintSummary();
  benchmark::Shutdown();
  return 0;
}
