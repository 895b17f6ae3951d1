#include "bench/common.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <utility>

#include "lib/dtype.h"

namespace simdattn {
namespace bench {

std::string Shape::Name() const {
  return "B" + std::to_string(batch) + "_Hq" + std::to_string(q_heads) + "_Hkv" +
         std::to_string(kv_heads) + "_Lq" + std::to_string(q_len) + "_Lk" + std::to_string(kv_len) +
         "_D" + std::to_string(head_dim);
}

double VisiblePairs(const Shape& s, bool causal, int64_t window_left) {
  if (!causal) return double(s.q_len) * double(s.kv_len);
  double pairs = 0;
  for (int64_t i = 0; i < s.q_len; ++i) {
    int64_t n = std::min<int64_t>(s.kv_len, i + 1);
    if (window_left >= 0) n = std::min<int64_t>(n, window_left + 1);
    pairs += double(n);
  }
  return pairs;
}

Problem::Problem(const Shape& s) : shape(s) {
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

TensorView Problem::Q() const {
  return MakeBHSD(q.data(), DType::kF32, shape.batch, shape.q_heads, shape.q_len, shape.head_dim);
}
TensorView Problem::K() const {
  return MakeBHSD(k.data(), DType::kF32, shape.batch, shape.kv_heads, shape.kv_len, shape.head_dim);
}
TensorView Problem::V() const {
  return MakeBHSD(v.data(), DType::kF32, shape.batch, shape.kv_heads, shape.kv_len, shape.head_dim);
}
MutableTensorView Problem::O() {
  return MakeBHSD(o.data(), DType::kF32, shape.batch, shape.q_heads, shape.q_len, shape.head_dim);
}

Problem& CachedProblem(const Shape& s) {
  static std::map<std::string, std::unique_ptr<Problem>> problems;
  std::unique_ptr<Problem>& slot = problems[s.Name()];
  if (!slot) slot.reset(new Problem(s));
  return *slot;
}

std::vector<uint16_t> RoundTo16(const AlignedFloats& x, DType dtype) {
  std::vector<uint16_t> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    r[i] = dtype == DType::kF16 ? F32ToF16(x[i]) : F32ToBF16(x[i]);
  }
  return r;
}

void SetCounters(benchmark::State& state, const Shape& s, bool causal, int64_t window_left,
                 double elem_bytes) {
  const double flops =
      4.0 * double(s.batch * s.q_heads) * VisiblePairs(s, causal, window_left) * double(s.head_dim);
  const double bytes =
      elem_bytes * double(s.head_dim) *
      double(2 * s.batch * s.q_heads * s.q_len + 2 * s.batch * s.kv_heads * s.kv_len);
  state.counters["FLOPS"] =
      benchmark::Counter(flops * double(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["bytes"] =
      benchmark::Counter(bytes * double(state.iterations()), benchmark::Counter::kIsRate);
}

const std::vector<Variant>& OptionVariants() {
  static const std::vector<Variant> variants = [] {
    std::vector<Variant> v(7);
    v[0].name = "softcap", v[0].softcap = 30.0f;
    v[1].name = "alibi", v[1].alibi = true;
    v[2].name = "sinks", v[2].sinks = true;
    v[3].name = "mask_bool", v[3].mask_bool = true;
    v[4].name = "mask_add", v[4].mask_add = true;
    v[5].name = "kv_lengths", v[5].kv_lengths = true;
    v[6].name = "dropout", v[6].dropout = 0.1f;
    return v;
  }();
  return variants;
}

AttentionOptions MakeOptions(const Shape& s, const Variant& v, VariantData* data) {
  AttentionOptions o;
  o.causal = v.causal;
  // Named always: decode shapes (Lq != Lk) with ALiBi or a window need it.
  o.alignment = v.bottom_right ? Alignment::kBottomRight : Alignment::kTopLeft;
  o.window_left = v.window_left;
  o.softcap = v.softcap;
  if (v.alibi) {
    for (int64_t h = 0; h < s.q_heads; ++h) data->slopes.push_back(std::ldexp(1.0f, -int(h + 1)));
    o.alibi_slopes = data->slopes.data();
  }
  if (v.sinks) {
    data->sinks.assign(size_t(s.q_heads), 0.0f);
    o.sinks = data->sinks.data();
  }
  // Masks that hide nothing, broadcast as one [Lq, Lk] for every head.
  if (v.mask_bool) {
    data->mask_u8.assign(size_t(s.q_len * s.kv_len), 1);
    o.mask = MakeBHSD(data->mask_u8.data(), DType::kBool, 1, 1, s.q_len, s.kv_len);
  }
  if (v.mask_add) {
    // A general additive bias (finite, not all zero), so the entry measures
    // the full apply and not the all-zero shortcut.
    data->mask_f32.resize(size_t(s.q_len * s.kv_len));
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> dist(-1.0f, 0.0f);
    for (float& x : data->mask_f32) x = dist(rng);
    o.mask = MakeBHSD(data->mask_f32.data(), DType::kF32, 1, 1, s.q_len, s.kv_len);
  }
  if (v.kv_lengths) {
    data->lens.assign(size_t(s.batch), s.kv_len);
    o.kv_lengths = data->lens.data();
  }
  o.dropout_p = v.dropout;
  o.dropout_seed = 1;
  return o;
}

bool TimeAttention(benchmark::State& state, const TensorView& q, const TensorView& k,
                   const TensorView& v, const MutableTensorView& o, const AttentionOptions& options,
                   const ExecutionOptions& exec) {
  RunInfo info;
  for (auto _ : state) {
    const Status st = Attention(q, k, v, o, options, {}, exec, &info);
    if (!st.ok()) {
      state.SkipWithError(st.message.c_str());
      return false;
    }
    benchmark::DoNotOptimize(o.data);
  }
  state.SetLabel(info.target);
  return true;
}

void* AllocHugePages(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
  void* p = nullptr;
  if (posix_memalign(&p, kHuge, rounded == 0 ? kHuge : rounded) != 0) return nullptr;
  madvise(p, rounded, MADV_HUGEPAGE);  // advice only: 4 KiB pages if refused
  return p;
}

int HardwareThreads() { return std::max(1, int(std::thread::hardware_concurrency())); }

void Register(const std::string& name, std::function<void(benchmark::State&)> run, double min_time,
              int repetitions) {
  benchmark::internal::Benchmark* b = benchmark::RegisterBenchmark(name.c_str(), std::move(run));
  b->UseRealTime()->Unit(benchmark::kMillisecond);
  if (min_time > 0.0) b->MinTime(min_time);
  if (repetitions > 0) b->Repetitions(repetitions);
}

std::string ThreadsField(int threads) { return "/threads:" + std::to_string(threads); }

double Median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const size_t n = x.size();
  return n % 2 == 1 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

void TimePairs(benchmark::State& state, const std::function<bool()>& a,
               const std::function<bool()>& b, const std::function<void()>& before_a) {
  std::vector<double> ratios, times_a, times_b;
  bool b_first = false;
  for (auto _ : state) {
    double seconds[2] = {0.0, 0.0};  // A, B
    for (int k = 0; k < 2; ++k) {
      const bool run_b = (k == 0) == b_first;
      if (!run_b && before_a) before_a();
      const auto t0 = std::chrono::steady_clock::now();
      if (!(run_b ? b() : a())) return;
      seconds[run_b ? 1 : 0] =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    ratios.push_back(seconds[1] / seconds[0]);
    times_a.push_back(seconds[0]);
    times_b.push_back(seconds[1]);
    b_first = !b_first;
  }
  if (ratios.empty()) return;
  state.counters["ratio"] = Median(ratios);
  state.counters["a_ms"] = 1e3 * Median(times_a);
  state.counters["b_ms"] = 1e3 * Median(times_b);
}

}  // namespace bench
}  // namespace simdattn
