// simdattn_bench: Google Benchmark entries for the fused kernel and the
// baselines it is compared with, measured in one process, plus a summary
// table of the medians (GFLOP/s and speed-up over each baseline).
//
// Entry names: attention/<impl>/<dtype>/<shape>/<mask>/threads:<n>, with the
// counters FLOPS (4·B·Hq·Lq·Lk·D, causal: visible pairs only) and bytes
// (Q, K, V and O as stored), both as rates over wall-clock time.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/onednn_attention.h"
#include "bench/roofline.h"
#include "lib/cache_line_allocator.h"
#include "lib/dtype.h"
#include "lib/reference.h"
#include "simdattn/attention.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace {

struct Shape {
  int64_t batch, q_heads, kv_heads, q_len, kv_len, head_dim;

  std::string Name() const {
    return "B" + std::to_string(batch) + "_Hq" + std::to_string(q_heads) +
           "_Hkv" + std::to_string(kv_heads) + "_Lq" + std::to_string(q_len) +
           "_Lk" + std::to_string(kv_len) + "_D" + std::to_string(head_dim);
  }
};

// Query-key pairs that take part (causal top-left: row i sees i + 1 keys;
// a left window keeps at most window_left + 1 of them).
double VisiblePairs(const Shape& s, bool causal, int64_t window_left = -1) {
  if (!causal) return double(s.q_len) * double(s.kv_len);
  double pairs = 0;
  for (int64_t i = 0; i < s.q_len; ++i) {
    int64_t n = std::min<int64_t>(s.kv_len, i + 1);
    if (window_left >= 0) n = std::min<int64_t>(n, window_left + 1);
    pairs += double(n);
  }
  return pairs;
}

// Tensors start on a cache line, as an engine's buffers do (the library
// writes whole lines of O with streaming stores only when they are aligned).
using AlignedFloats = std::vector<float, simdattn::CacheLineAllocator<float>>;

// Inputs allocated and touched once per shape, outside the timed loops.
struct Problem {
  Shape shape;
  AlignedFloats q, k, v, o;

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

  // f32 views of the tensors, BHSD.
  simdattn::TensorView Q() const {
    return simdattn::MakeBHSD(q.data(), simdattn::DType::kF32, shape.batch,
                              shape.q_heads, shape.q_len, shape.head_dim);
  }
  simdattn::TensorView K() const {
    return simdattn::MakeBHSD(k.data(), simdattn::DType::kF32, shape.batch,
                              shape.kv_heads, shape.kv_len, shape.head_dim);
  }
  simdattn::TensorView V() const {
    return simdattn::MakeBHSD(v.data(), simdattn::DType::kF32, shape.batch,
                              shape.kv_heads, shape.kv_len, shape.head_dim);
  }
  simdattn::MutableTensorView O() {
    return simdattn::MakeBHSD(o.data(), simdattn::DType::kF32, shape.batch,
                              shape.q_heads, shape.q_len, shape.head_dim);
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

void SetCounters(benchmark::State& state, const Shape& s, bool causal,
                 int64_t window_left = -1, double elem_bytes = 4.0) {
  const double flops = 4.0 * double(s.batch * s.q_heads) *
                       VisiblePairs(s, causal, window_left) * double(s.head_dim);
  const double bytes =
      elem_bytes * double(s.head_dim) *
      double(2 * s.batch * s.q_heads * s.q_len + 2 * s.batch * s.kv_heads * s.kv_len);
  state.counters["FLOPS"] = benchmark::Counter(
      flops * double(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["bytes"] = benchmark::Counter(
      bytes * double(state.iterations()), benchmark::Counter::kIsRate);
}

// An option of SEMANTICS.md applied on top of plain or causal attention, for
// the per-option cost entries. Arrays live as long as the benchmark.
struct Variant {
  std::string name = "none";  // entry's mask field: none, causal, softcap...
  bool causal = false;
  int64_t window_left = -1;
  float softcap = 0.0f;
  bool alibi = false, sinks = false, mask_bool = false, mask_add = false;
  bool kv_lengths = false;
  float dropout = 0.0f;
  bool bottom_right = false;  // causal/window alignment (speculative decoding)
};

struct VariantData {
  std::vector<float> slopes, sinks, mask_f32;
  std::vector<uint8_t> mask_u8;
  std::vector<int64_t> lens;
};

simdattn::AttentionOptions MakeOptions(const Shape& s, const Variant& v,
                                       VariantData* data) {
  simdattn::AttentionOptions o;
  o.causal = v.causal;
  if (v.bottom_right) o.alignment = simdattn::Alignment::kBottomRight;
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
    o.mask = simdattn::MakeBHSD(data->mask_u8.data(), simdattn::DType::kBool, 1, 1, s.q_len, s.kv_len);
  }
  if (v.mask_add) {
    // A general additive bias (finite, not all zero), so the entry measures
    // the full apply and not the all-zero shortcut.
    data->mask_f32.resize(size_t(s.q_len * s.kv_len));
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> dist(-1.0f, 0.0f);
    for (float& x : data->mask_f32) x = dist(rng);
    o.mask = simdattn::MakeBHSD(data->mask_f32.data(), simdattn::DType::kF32, 1, 1, s.q_len, s.kv_len);
  }
  if (v.kv_lengths) {
    data->lens.assign(size_t(s.batch), s.kv_len);
    o.kv_lengths = data->lens.data();
  }
  o.dropout_p = v.dropout;
  o.dropout_seed = 1;
  return o;
}

// The options of two variants of one shape (a paired entry's A and B),
// with the data they point into.
struct OptionPair {
  VariantData data_a, data_b;
  simdattn::AttentionOptions a, b;
  OptionPair(const Shape& s, const Variant& va, const Variant& vb)
      : a(MakeOptions(s, va, &data_a)), b(MakeOptions(s, vb, &data_b)) {}
  OptionPair(const OptionPair&) = delete;  // a and b point into the data
  OptionPair& operator=(const OptionPair&) = delete;
};

// The timed loop of the simdattn entries: one Attention() call per
// iteration; labels the entry with the target that ran. False (and the
// entry marked as an error) if a call fails.
bool TimeAttention(benchmark::State& state, const simdattn::TensorView& q,
                   const simdattn::TensorView& k, const simdattn::TensorView& v,
                   const simdattn::MutableTensorView& o,
                   const simdattn::AttentionOptions& options,
                   const simdattn::ExecutionOptions& exec) {
  simdattn::RunInfo info;
  for (auto _ : state) {
    const simdattn::Status st = simdattn::Attention(q, k, v, o, options, {}, exec, &info);
    if (!st.ok()) {
      state.SkipWithError(st.message.c_str());
      return false;
    }
    benchmark::DoNotOptimize(o.data);
  }
  state.SetLabel(info.target);
  return true;
}

void BenchSimdattn(benchmark::State& state, const Shape& s, const Variant& var,
                   int threads) {
  static std::map<std::string, std::unique_ptr<Problem>> problems;
  auto& slot = problems[s.Name()];
  if (!slot) slot.reset(new Problem(s));
  Problem& p = *slot;
  simdattn::ThreadPool pool(threads);
  simdattn::ExecutionOptions exec;
  exec.pool = &pool;
  VariantData data;
  const simdattn::AttentionOptions options = MakeOptions(s, var, &data);
  const auto q = p.Q(), k = p.K(), v = p.V();
  const auto o = p.O();
  if (TimeAttention(state, q, k, v, o, options, exec)) {
    SetCounters(state, s, var.causal, var.window_left);
  }
}

// Q, K, V and O all stored in 16 bits (f16 or bf16), rounded from the f32
// problem; math in f32 inside the kernel.
void BenchSimdattn16(benchmark::State& state, const Shape& s, bool causal,
                     simdattn::DType dtype, int threads) {
  Problem p(s);
  auto round = [dtype](const AlignedFloats& x) {
    std::vector<uint16_t> r(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      r[i] = dtype == simdattn::DType::kF16 ? simdattn::F32ToF16(x[i])
                                            : simdattn::F32ToBF16(x[i]);
    }
    return r;
  };
  const std::vector<uint16_t> q16 = round(p.q), k16 = round(p.k), v16 = round(p.v);
  std::vector<uint16_t> o16(q16.size());
  simdattn::ThreadPool pool(threads);
  simdattn::ExecutionOptions exec;
  exec.pool = &pool;
  simdattn::AttentionOptions options;
  options.causal = causal;
  const auto q = simdattn::MakeBHSD(q16.data(), dtype, s.batch, s.q_heads, s.q_len, s.head_dim);
  const auto k = simdattn::MakeBHSD(k16.data(), dtype, s.batch, s.kv_heads, s.kv_len, s.head_dim);
  const auto v = simdattn::MakeBHSD(v16.data(), dtype, s.batch, s.kv_heads, s.kv_len, s.head_dim);
  const auto o = simdattn::MakeBHSD(o16.data(), dtype, s.batch, s.q_heads, s.q_len, s.head_dim);
  if (TimeAttention(state, q, k, v, o, options, exec)) {
    SetCounters(state, s, causal, -1, 2.0);
  }
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

void BenchOneDnn(benchmark::State& state, const Shape& s, bool causal,
                 int threads, bool bf16 = false) {
  Problem p(s);
  // bf16: Q, K and V rounded to bf16 (O stays f32 in oneDNN's pipeline).
  std::vector<uint16_t> q16, k16, v16;
  for (auto [from, to] : {std::pair{&p.q, &q16}, {&p.k, &k16}, {&p.v, &v16}}) {
    if (!bf16) break;
    to->resize(from->size());
    for (size_t i = 0; i < from->size(); ++i) (*to)[i] = simdattn::F32ToBF16((*from)[i]);
  }
  simdattn::bench::OneDnnAttention attn(
      s.batch, s.q_heads, s.kv_heads, s.q_len, s.kv_len, s.head_dim, causal,
      bf16, bf16 ? (const void*)q16.data() : p.q.data(),
      bf16 ? (const void*)k16.data() : p.k.data(),
      bf16 ? (const void*)v16.data() : p.v.data(), p.o.data());
  if (!attn.error().empty()) {
    state.SkipWithError(attn.error().c_str());
    return;
  }
  for (auto _ : state) {
    attn.Run(threads);
    benchmark::DoNotOptimize(p.o.data());
  }
  state.SetLabel(attn.implementations());
  SetCounters(state, s, causal, -1, bf16 ? 2.0 : 4.0);
}

// A register-resident peak loop (flops returned per call) on every thread
// of the pool, counted as one FLOPS rate.
void BenchPeakLoop(benchmark::State& state, int threads,
                   double (*loop)(int64_t iterations, float* sink),
                   const char* label) {
  simdattn::ThreadPool pool(threads);
  constexpr int64_t kIterations = 4 << 20;
  std::vector<float> sinks(size_t(threads) * 16);
  struct Job {
    double (*loop)(int64_t, float*);
    float* sinks;
    double flops[64];
  } job{loop, sinks.data(), {}};
  double flops = 0.0;
  for (auto _ : state) {
    pool.ParallelFor(threads, [](void* arg, int64_t i) {
      Job* j = static_cast<Job*>(arg);
      j->flops[i] = j->loop(kIterations, j->sinks + i * 16);
    }, &job);
    for (int t = 0; t < threads; ++t) flops += job.flops[t];
  }
  benchmark::DoNotOptimize(sinks.data());
  state.SetLabel(label);
  state.counters["FLOPS"] = benchmark::Counter(flops, benchmark::Counter::kIsRate);
}

// roofline/fma_f32: f32 FMAs on the widest vectors, the f32 peak.
void BenchFmaPeak(benchmark::State& state, int threads) {
  BenchPeakLoop(state, threads, &simdattn::bench::FmaPeakLoop,
                simdattn::bench::RooflineTarget());
}

// roofline/dot_bf16: the vdpbf16ps loop, where the CPU has AVX512_BF16 (the
// library's AVX3_BF16 target is available).
void BenchDotBf16Peak(benchmark::State& state, int threads) {
  const std::vector<std::string> avail = simdattn::AvailableTargets();
  if (std::find(avail.begin(), avail.end(), "AVX3_BF16") == avail.end()) {
    state.SkipWithError("no AVX512_BF16 on this CPU (or not compiled)");
    return;
  }
  BenchPeakLoop(state, threads, &simdattn::bench::DotBf16PeakLoop, "AVX3_BF16");
}

// Memory that streams from DRAM in the benchmark (the read roofline's buffer
// and the decode K/V caches) is advised to 2 MiB pages, so that the roofline
// and the decode entries measured against it read memory the same way. On
// 4 KiB pages each page costs a TLB walk (two-level under a hypervisor); on
// the 2-vCPU KVM guest of the README a 1 GiB streaming read ran at 12.0-12.7
// GB/s on 4 KiB pages against 13.4-14.1 GB/s on 2 MiB pages (alternating,
// 1 thread). Null when the allocation fails.
void* AllocHugePages(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
  void* p = nullptr;
  if (posix_memalign(&p, kHuge, rounded == 0 ? kHuge : rounded) != 0) return nullptr;
  madvise(p, rounded, MADV_HUGEPAGE);  // advice only: 4 KiB pages if refused
  return p;
}

// The streaming read's buffer: 1 GiB on 2 MiB pages, touched once (null if
// it cannot be had).
constexpr size_t kReadBufferBytes = size_t{1} << 30;
const float* ReadBuffer() {
  static float* buffer = [] {
    void* p = AllocHugePages(kReadBufferBytes);
    if (p != nullptr) std::memset(p, 0, kReadBufferBytes);
    return static_cast<float*>(p);
  }();
  return buffer;
}

// Reads the n floats at data, split evenly over the pool's `threads` threads
// (at most 64).
void StreamReadThreads(simdattn::ThreadPool& pool, int threads, const float* data,
                       size_t n) {
  struct Job {
    const float* data;
    size_t per_thread;
    float sums[64];
  } job{data, n / size_t(threads), {}};
  pool.ParallelFor(threads, [](void* arg, int64_t i) {
    Job* j = static_cast<Job*>(arg);
    j->sums[i] = simdattn::bench::StreamRead(j->data + size_t(i) * j->per_thread,
                                             j->per_thread);
  }, &job);
  benchmark::DoNotOptimize(job.sums);
}

// Streaming read of 1 GiB (ReadBuffer), split evenly over the pool's threads.
void BenchReadBandwidth(benchmark::State& state, int threads) {
  const float* buffer = ReadBuffer();
  if (buffer == nullptr) {
    state.SkipWithError("cannot allocate 1 GiB");
    return;
  }
  simdattn::ThreadPool pool(threads);
  for (auto _ : state) {
    StreamReadThreads(pool, threads, buffer, kReadBufferBytes / sizeof(float));
  }
  state.counters["bytes"] = benchmark::Counter(
      double(kReadBufferBytes) * double(state.iterations()), benchmark::Counter::kIsRate);
}

// Checks simdattn and oneDNN against the double-precision reference.
bool Verify(const Shape& s, bool causal) {
  Problem p(s);
  simdattn::AttentionOptions options;
  options.causal = causal;
  const auto q = p.Q(), k = p.K(), v = p.V();
  std::vector<double> ref;
  if (!simdattn::ReferenceAttention(q, k, v, options, &ref, nullptr).ok()) return false;
  auto max_err = [&](const AlignedFloats& o) {
    double e = 0.0;
    for (size_t i = 0; i < o.size(); ++i) {
      const double d = std::fabs(o[i] - ref[i]);
      if (!(d <= e)) e = std::isnan(d) ? INFINITY : d;
    }
    return e;  // max|V| <= 1, so this is SEMANTICS.md's err
  };
  const auto o = simdattn::MakeBHSD(p.o.data(), simdattn::DType::kF32, s.batch,
                                    s.q_heads, s.q_len, s.head_dim);
  const simdattn::Status st = simdattn::Attention(q, k, v, o, options);
  const double e_simd = st.ok() ? max_err(p.o) : INFINITY;
  simdattn::bench::OneDnnAttention dnn(s.batch, s.q_heads, s.kv_heads, s.q_len,
                                       s.kv_len, s.head_dim, causal, false,
                                       p.q.data(), p.k.data(), p.v.data(),
                                       p.o.data());
  dnn.Run(1);
  const double e_dnn = max_err(p.o);
  const bool ok = e_simd <= 2e-5 && e_dnn <= 2e-5;
  std::printf("verify %s/%s: simdattn err %.2e, onednn err %.2e (bound 2e-5) %s\n",
              s.Name().c_str(), causal ? "causal" : "none", e_simd, e_dnn,
              ok ? "ok" : "FAILED");
  return ok;
}

// ---------------------------------------------------------------- decode

// Whether an entry name is a decode entry: at most 16 queries per head
// (Lq 1, or speculative decoding).
bool IsDecodeEntry(const std::string& name) {
  const size_t at = name.find("_Lq");
  return at != std::string::npos && std::strtoll(name.c_str() + at + 3, nullptr, 10) <= 16;
}
// Lq = 1 against a long KV cache, bound by reading K and V once. Caches are
// kept cold by rotating through enough copies of Q/K/V to exceed twice the
// last-level cache (one copy when it is already that large).

enum class KvStore { kF32, kF16, kBF16 };

const char* DecodeDtypeName(KvStore kv, bool onednn) {
  if (onednn) return kv == KvStore::kF32 ? "f32" : "bf16";
  switch (kv) {
    case KvStore::kF32: return "f32";
    case KvStore::kF16: return "qf32kvf16";
    case KvStore::kBF16: return "qf32kvbf16";
  }
  return "";
}

size_t LastLevelCacheBytes() {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return l3 > 0 ? static_cast<size_t>(l3) : (size_t{64} << 20);
}

// Copies of one decode problem, 16-bit K/V stored as raw bits; K/V on 2 MiB
// pages, as the read roofline's buffer.
template <class T>
using HugeVector = std::vector<T, simdattn::FunctionAllocator<T, &AllocHugePages>>;
struct DecodeCopies {
  std::vector<std::vector<float>> q;
  std::vector<std::vector<uint16_t>> q16;
  std::vector<HugeVector<uint16_t>> k16, v16;
  std::vector<HugeVector<float>> k32, v32;
  std::vector<float> o;
  size_t copies = 1;
  double kv_bytes = 0;  // K + V bytes of one copy, as stored
};

uint16_t RoundTo16(float x, KvStore t) {
  return t == KvStore::kF16 ? simdattn::F32ToF16(x) : simdattn::F32ToBF16(x);
}

DecodeCopies MakeDecodeCopies(const Shape& s, KvStore kv, bool q16) {
  DecodeCopies c;
  const size_t nq = size_t(s.batch * s.q_heads * s.q_len * s.head_dim);
  const size_t nkv = size_t(s.batch * s.kv_heads * s.kv_len * s.head_dim);
  const size_t elem = kv == KvStore::kF32 ? 4 : 2;
  c.kv_bytes = 2.0 * double(nkv) * double(elem);
  c.copies = std::max<size_t>(1, size_t(2.0 * double(LastLevelCacheBytes()) / c.kv_bytes) + 1);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (size_t i = 0; i < c.copies; ++i) {
    std::vector<float> q(nq);
    for (float& x : q) x = dist(rng);
    if (q16) {
      std::vector<uint16_t> h(nq);
      for (size_t j = 0; j < nq; ++j) h[j] = RoundTo16(q[j], kv);
      c.q16.push_back(std::move(h));
    }
    c.q.push_back(std::move(q));
    if (kv == KvStore::kF32) {
      HugeVector<float> k(nkv), v(nkv);
      for (float& x : k) x = dist(rng);
      for (float& x : v) x = dist(rng);
      c.k32.push_back(std::move(k));
      c.v32.push_back(std::move(v));
    } else {
      HugeVector<uint16_t> k(nkv), v(nkv);
      for (uint16_t& x : k) x = RoundTo16(dist(rng), kv);
      for (uint16_t& x : v) x = RoundTo16(dist(rng), kv);
      c.k16.push_back(std::move(k));
      c.v16.push_back(std::move(v));
    }
  }
  c.o.assign(nq, 0.0f);
  return c;
}

void SetDecodeCounters(benchmark::State& state, const Shape& s, double kv_bytes) {
  state.counters["bytes"] = benchmark::Counter(
      kv_bytes * double(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["FLOPS"] = benchmark::Counter(
      4.0 * double(s.batch * s.q_heads * s.q_len * s.kv_len * s.head_dim) *
          double(state.iterations()),
      benchmark::Counter::kIsRate);
}

// simdattn's f32 Q and K/V (as stored) of copy i.
struct DecodeInputs {
  simdattn::TensorView q, k, v;
};
DecodeInputs SimdattnDecodeInputs(const DecodeCopies& c, const Shape& s,
                                  KvStore kv, size_t i) {
  const bool f32 = kv == KvStore::kF32;
  const simdattn::DType kv_type = f32                    ? simdattn::DType::kF32
                                  : kv == KvStore::kF16 ? simdattn::DType::kF16
                                                        : simdattn::DType::kBF16;
  const void* k = f32 ? (const void*)c.k32[i].data() : c.k16[i].data();
  const void* v = f32 ? (const void*)c.v32[i].data() : c.v16[i].data();
  return {simdattn::MakeBHSD(c.q[i].data(), simdattn::DType::kF32, s.batch, s.q_heads,
                             s.q_len, s.head_dim),
          simdattn::MakeBHSD(k, kv_type, s.batch, s.kv_heads, s.kv_len, s.head_dim),
          simdattn::MakeBHSD(v, kv_type, s.batch, s.kv_heads, s.kv_len, s.head_dim)};
}

void BenchDecodeSimdattn(benchmark::State& state, const Shape& s, KvStore kv,
                         int threads, const Variant& var = Variant()) {
  DecodeCopies c = MakeDecodeCopies(s, kv, false);
  simdattn::ThreadPool pool(threads);
  simdattn::ExecutionOptions exec;
  exec.pool = &pool;
  VariantData data;
  const simdattn::AttentionOptions options = MakeOptions(s, var, &data);
  const auto o = simdattn::MakeBHSD(c.o.data(), simdattn::DType::kF32, s.batch,
                                    s.q_heads, s.q_len, s.head_dim);
  simdattn::RunInfo info;
  size_t i = 0;
  for (auto _ : state) {
    const DecodeInputs in = SimdattnDecodeInputs(c, s, kv, i);
    const simdattn::Status st =
        simdattn::Attention(in.q, in.k, in.v, o, options, {}, exec, &info);
    if (!st.ok()) {
      state.SkipWithError(st.message.c_str());
      return;
    }
    i = (i + 1) % c.copies;
  }
  state.SetLabel(info.target);
  SetDecodeCounters(state, s, c.kv_bytes);
}

// oneDNN's decode pipeline on the copies of c (f32, or bf16 Q and K/V) into
// o: Run(i, threads) computes copy i. Null, with the entry marked as an
// error, if some primitive is not an optimized one.
class OneDnnDecode {
 public:
  static std::unique_ptr<OneDnnDecode> Make(benchmark::State& state, const Shape& s,
                                            const DecodeCopies& c, bool bf16, float* o) {
    std::unique_ptr<OneDnnDecode> dnn(new OneDnnDecode(s, c, bf16, o));
    if (!dnn->attn_.error().empty()) {
      state.SkipWithError(dnn->attn_.error().c_str());
      return nullptr;
    }
    return dnn;
  }
  void Run(size_t i, int threads) {
    attn_.SetInputs(Q(i), K(i), V(i));
    attn_.Run(threads);
  }
  std::string implementations() const { return attn_.implementations(); }

 private:
  OneDnnDecode(const Shape& s, const DecodeCopies& c, bool bf16, float* o)
      : c_(c), bf16_(bf16),
        attn_(s.batch, s.q_heads, s.kv_heads, s.q_len, s.kv_len, s.head_dim, false,
              bf16, Q(0), K(0), V(0), o) {}
  const void* Q(size_t i) const { return bf16_ ? (const void*)c_.q16[i].data() : c_.q[i].data(); }
  const void* K(size_t i) const { return bf16_ ? (const void*)c_.k16[i].data() : c_.k32[i].data(); }
  const void* V(size_t i) const { return bf16_ ? (const void*)c_.v16[i].data() : c_.v32[i].data(); }

  const DecodeCopies& c_;
  bool bf16_;
  simdattn::bench::OneDnnAttention attn_;
};

void BenchDecodeOneDnn(benchmark::State& state, const Shape& s, KvStore kv,
                       int threads) {
  const bool bf16 = kv == KvStore::kBF16;
  DecodeCopies c = MakeDecodeCopies(s, kv, bf16);
  const auto dnn = OneDnnDecode::Make(state, s, c, bf16, c.o.data());
  if (dnn == nullptr) return;
  size_t i = 0;
  for (auto _ : state) {
    dnn->Run(i, threads);
    i = (i + 1) % c.copies;
  }
  state.SetLabel(dnn->implementations());
  SetDecodeCounters(state, s, c.kv_bytes);
}

// Paired entries (paired/...): two calls, A and B, alternate inside every
// iteration (which one goes first alternates too) and each is timed on its
// own; the counter `ratio` is the median over iterations of time(B) /
// time(A). The speed of a shared machine drifts over seconds, so two separate
// entries run minutes apart can differ by 20% on identical work; the two
// calls of a pair run under the same conditions. A call returns false after
// marking the entry as an error. `before_a`, when given, runs untimed just
// before each call of A.
void TimePairs(benchmark::State& state, const std::function<bool()>& a,
               const std::function<bool()>& b,
               const std::function<void()>& before_a = nullptr) {
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
  auto median = [](std::vector<double> x) {
    std::sort(x.begin(), x.end());
    const size_t n = x.size();
    return n % 2 == 1 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
  };
  state.counters["ratio"] = median(ratios);
  // Median milliseconds of each call, for reading the ratio against the
  // separate entries.
  state.counters["a_ms"] = 1e3 * median(times_a);
  state.counters["b_ms"] = 1e3 * median(times_b);
}

// One simdattn call on p's f32 tensors for the paired entries; false (and
// the entry marked as an error) if it fails.
bool CallF32(benchmark::State& state, Problem& p,
             const simdattn::AttentionOptions& options,
             const simdattn::ExecutionOptions& exec) {
  const simdattn::Status st =
      simdattn::Attention(p.Q(), p.K(), p.V(), p.O(), options, {}, exec);
  if (!st.ok()) state.SkipWithError(st.message.c_str());
  return st.ok();
}

// f32 prefill of shape s: A with options `a`, B with `b`, 1 thread.
void BenchPairedPrefill(benchmark::State& state, const Shape& s,
                        const Variant& a, const Variant& b) {
  Problem p(s);
  simdattn::ThreadPool pool(1);
  simdattn::ExecutionOptions exec;
  exec.pool = &pool;
  const OptionPair opt(s, a, b);
  TimePairs(state, [&] { return CallF32(state, p, opt.a, exec); },
            [&] { return CallF32(state, p, opt.b, exec); });
}

// f32 prefill of shape s against oneDNN's unfused pipeline on the same
// inputs: A = simdattn, B = oneDNN, so `ratio` is simdattn's speed-up.
void BenchPairedOneDnn(benchmark::State& state, const Shape& s, bool causal,
                       int threads) {
  Problem p(s);
  std::vector<float> o_dnn(p.o.size());
  simdattn::bench::OneDnnAttention attn(s.batch, s.q_heads, s.kv_heads, s.q_len,
                                        s.kv_len, s.head_dim, causal, false,
                                        p.q.data(), p.k.data(), p.v.data(),
                                        o_dnn.data());
  if (!attn.error().empty()) {
    state.SkipWithError(attn.error().c_str());
    return;
  }
  simdattn::ThreadPool pool(threads);
  simdattn::ExecutionOptions exec;
  exec.pool = &pool;
  simdattn::AttentionOptions options;
  options.causal = causal;
  TimePairs(state, [&] { return CallF32(state, p, options, exec); },
            [&] {
              attn.Run(threads);
              return true;
            });
}

// f32 prefill of shape s: A with 2 threads, B with 1, so `ratio` is the
// 2-thread speed-up.
//
// The 2-thread pool's worker sleeps through each 1-thread call (5-200 ms
// here), while between the back-to-back calls of the threads:2 entries (and
// of an engine that keeps its threads busy) it is still spinning. Waking a
// sleeping vCPU took 50-100 us on the 2-vCPU KVM guest (median 76 us after
// 13 ms idle, 0.5 us while spinning), and a 2-thread B4 H16 L256 D64 call
// right after a 1-thread one ran 1.5-1.9% slower than right after a
// 2-thread one (paired, 200 pairs). So an empty ParallelFor on the 2-thread
// pool wakes its worker, untimed, before each 2-thread call: the ratio
// compares the two thread counts in the steady state the separate entries
// measure (the woken call still ran 0.6-1.0% slower there). This entry
// for B4 H16 L256 D64, 4 runs of each alternating: 1.94 2.04 2.04 1.84 with
// the wake-up, 1.83 1.93 1.90 1.88 without.
void BenchPairedThreads(benchmark::State& state, const Shape& s, bool causal) {
  Problem p(s);
  simdattn::ThreadPool pool1(1), pool2(2);
  simdattn::ExecutionOptions exec1, exec2;
  exec1.pool = &pool1;
  exec2.pool = &pool2;
  simdattn::AttentionOptions options;
  options.causal = causal;
  TimePairs(
      state, [&] { return CallF32(state, p, options, exec2); },
      [&] { return CallF32(state, p, options, exec1); },
      [&] { pool2.ParallelFor(pool2.num_threads(), [](void*, int64_t) {}, nullptr); });
}

// One simdattn decode call on copy *i of c (then *i moves to the next copy)
// for the paired entries; false (and the entry marked as an error) if it
// fails.
bool DecodeCall(benchmark::State& state, DecodeCopies& c, const Shape& s,
                KvStore kv, const simdattn::AttentionOptions& options,
                const simdattn::ExecutionOptions& exec, size_t* i) {
  const DecodeInputs in = SimdattnDecodeInputs(c, s, kv, *i);
  const auto o = simdattn::MakeBHSD(c.o.data(), simdattn::DType::kF32, s.batch, s.q_heads,
                                    s.q_len, s.head_dim);
  const simdattn::Status st = simdattn::Attention(in.q, in.k, in.v, o, options, {}, exec);
  *i = (*i + 1) % c.copies;
  if (!st.ok()) state.SkipWithError(st.message.c_str());
  return st.ok();
}

// Decode with an f16 KV cache (cold, as BenchDecodeSimdattn): A and B each
// take the next copy in turn, 1 thread.
void BenchPairedDecode(benchmark::State& state, const Shape& s,
                       const Variant& a, const Variant& b) {
  DecodeCopies c = MakeDecodeCopies(s, KvStore::kF16, false);
  simdattn::ThreadPool pool(1);
  simdattn::ExecutionOptions exec;
  exec.pool = &pool;
  const OptionPair opts(s, a, b);
  size_t i = 0;
  TimePairs(state, [&] { return DecodeCall(state, c, s, KvStore::kF16, opts.a, exec, &i); },
            [&] { return DecodeCall(state, c, s, KvStore::kF16, opts.b, exec, &i); });
}

// Decode of shape s (cold, as BenchDecodeSimdattn) against a streaming read
// of as many bytes as its K and V (StreamReadThreads, the read roofline's
// loop, over the next unread part of ReadBuffer, so that it is cold too),
// with the same threads: A = simdattn, B = the read, so `ratio` is the
// decode's bytes rate as a fraction of the read's, both measured side by
// side. (roofline/read_bw and a decode entry run minutes apart, while the
// read bandwidth of this VM moved by up to a third within minutes.)
void BenchPairedDecodeRead(benchmark::State& state, const Shape& s, KvStore kv,
                           int threads) {
  DecodeCopies c = MakeDecodeCopies(s, kv, false);
  const float* buffer = ReadBuffer();
  const size_t n = size_t(c.kv_bytes) / sizeof(float);
  if (buffer == nullptr || 2 * n > kReadBufferBytes / sizeof(float)) {
    state.SkipWithError("no read buffer of twice the K/V bytes");
    return;
  }
  simdattn::ThreadPool pool(threads);
  simdattn::ExecutionOptions exec;
  exec.pool = &pool;
  size_t i = 0, offset = 0;
  TimePairs(
      state,
      [&] { return DecodeCall(state, c, s, kv, {}, exec, &i); },
      [&] {
        StreamReadThreads(pool, threads, buffer + offset, n);
        offset = offset + 2 * n <= kReadBufferBytes / sizeof(float) ? offset + n : 0;
        return true;
      });
}

// Decode of shape s (cold) against oneDNN's on the same copies, 1 thread: A
// = simdattn (f32 Q, K/V as stored), B = oneDNN (f32, or bf16 Q and K/V), so
// `ratio` is simdattn's speed-up. Each call takes the next copy in turn.
void BenchPairedDecodeOneDnn(benchmark::State& state, const Shape& s, KvStore kv) {
  const bool bf16 = kv == KvStore::kBF16;
  DecodeCopies c = MakeDecodeCopies(s, kv, bf16);
  std::vector<float> o_dnn(c.o.size());
  const auto dnn = OneDnnDecode::Make(state, s, c, bf16, o_dnn.data());
  if (dnn == nullptr) return;
  simdattn::ThreadPool pool(1);
  simdattn::ExecutionOptions exec;
  exec.pool = &pool;
  size_t i = 0;
  TimePairs(
      state,
      [&] { return DecodeCall(state, c, s, kv, {}, exec, &i); },
      [&] {
        dnn->Run(i, 1);
        i = (i + 1) % c.copies;
        return true;
      });
}

// Keeps the median of each entry for the summary table.
class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      const bool median = r.aggregate_name == "median";
      if (r.run_type == Run::RT_Aggregate && !median) continue;
      if (auto rc = r.counters.find("ratio"); rc != r.counters.end() && !r.error_occurred) {
        std::string name = r.run_name.str();
        const size_t mt = name.find("/min_time:");  // then /real_time
        if (mt != std::string::npos) name.erase(mt);
        if (median || ratios_.count(name) == 0) ratios_[name] = double(rc->second);
        continue;
      }
      auto it = r.counters.find("FLOPS");
      if (it == r.counters.end()) it = r.counters.find("bytes");
      if (it == r.counters.end() || r.error_occurred) continue;
      // Without repetitions the single run stands for the median.
      std::string name = r.run_name.str();
      const size_t rt = name.find("/real_time");
      if (rt != std::string::npos) name.erase(rt);
      auto bytes = r.counters.find("bytes");
      const double byte_rate = bytes == r.counters.end() ? 0.0 : double(bytes->second);
      if (median || medians_.count(name) == 0) {
        medians_[name] = {double(it->second), byte_rate, r.report_label};
      }
    }
  }

  void PrintSummary() const {
    std::printf("\n%%peak: of roofline/fma_f32 with the same threads (bf16 on "
                "vdpbf16ps, ours on AVX3_BF16 or oneDNN's avx512_core_bf16: "
                "of roofline/dot_bf16)");
    std::printf("\n%-9s %-49s %-7s %9s %9s %9s %9s %9s\n", "impl",
                "dtype/shape/mask/threads", "target", "GFLOP/s", "%peak",
                "vs oneDNN", "vs naive", "vs f32");
    for (const auto& [name, m] : medians_) {
      // name = attention/<impl>/<dtype>/<shape>/<mask>/threads:<n>
      if (name.rfind("attention/", 0) != 0) continue;
      if (IsDecodeEntry(name)) continue;  // decode, below
      const size_t a = name.find('/') + 1, b = name.find('/', a);
      const std::string impl = name.substr(a, b - a);
      const size_t c = name.find('/', b + 1);
      const std::string rest = name.substr(c + 1);
      const std::string threads = name.substr(name.rfind("/threads:") + 9);
      auto ratio = [&](const std::string& other) -> std::string {
        auto it = medians_.find(other);
        if (it == medians_.end() || it->second.flops <= 0) return "";
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%.2fx", m.flops / it->second.flops);
        return buf;
      };
      auto with_impl = [&](const std::string& other) {
        std::string n = name;
        n.replace(a, b - a, other);
        return n;
      };
      // Entries that ran the native bf16 products against the vdpbf16ps
      // loop, the others (bf16 widened to f32 included) against the FMAs.
      // oneDNN's label names its primitives' ISAs: avx512_core_bf16 is
      // vdpbf16ps (AMX, avx512_core_amx, is beyond both loops: FMAs).
      std::string peak;
      const std::string dtype = name.substr(b + 1, c - b - 1);
      const bool native_bf16 =
          m.label == "AVX3_BF16" || m.label.find("avx512_core_bf16") != std::string::npos;
      auto roof = medians_.find("roofline/dot_bf16/threads:" + threads);
      if (dtype != "bf16" || !native_bf16 || roof == medians_.end()) {
        roof = medians_.find("roofline/fma_f32/threads:" + threads);
      }
      if (roof != medians_.end()) {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%.0f%%", 100.0 * m.flops / roof->second.flops);
        peak = buf;
      }
      const std::string vs_dnn = impl == "simdattn" ? ratio(with_impl("onednn")) : "";
      std::string naive = with_impl("naive");
      naive = naive.substr(0, naive.rfind("/threads:")) + "/threads:1";
      const std::string vs_naive = impl == "simdattn" ? ratio(naive) : "";
      const std::string label = impl == "simdattn" ? m.label : "";
      // 16-bit storage against the same entry in f32 (f16: >= 0.9x wanted).
      const std::string vs_f32 =
          impl == "simdattn" && dtype != "f32"
              ? ratio(name.substr(0, b + 1) + "f32/" + rest) : "";
      std::printf("%-9s %-49s %-7s %9.1f %9s %9s %9s %9s\n", impl.c_str(),
                  name.substr(b + 1).c_str(), label.c_str(), m.flops * 1e-9,
                  peak.c_str(), vs_dnn.c_str(), vs_naive.c_str(), vs_f32.c_str());
    }
    // The same figures from the paired/ entries (f32): each is a median of
    // call-by-call ratios, where the figures above divide medians of entries
    // that ran minutes apart.
    std::printf("\n%-44s %12s %12s\n", "paired, call by call (f32)",
                "vs oneDNN 1T", "2T / 1T");
    std::map<std::string, std::map<std::string, double>> paired;
    for (const auto& [name, ratio] : ratios_) {
      // paired/f32/<shape>/<mask>/<what>/threads:<n> or .../threads2_vs_threads1
      // (prefill; decode entries go in their own table below)
      if (name.rfind("paired/f32/", 0) != 0 || IsDecodeEntry(name)) continue;
      const size_t shape = std::string("paired/f32/").size();
      const size_t mask_end = name.find('/', name.find('/', shape) + 1);
      const std::string what = name.substr(mask_end + 1);
      paired[name.substr(shape, mask_end - shape)][what] = ratio;
    }
    for (const auto& [shape_mask, figures] : paired) {
      auto cell = [&figures](const char* what, const char* format, double scale) {
        auto it = figures.find(what);
        char buf[32] = "";
        if (it != figures.end()) std::snprintf(buf, sizeof(buf), format, scale * it->second);
        return std::string(buf);
      };
      const std::string vs_dnn = cell("onednn_vs_simdattn/threads:1", "%.2fx", 1.0);
      const std::string scaling = cell("threads2_vs_threads1", "%.2fx", 1.0);
      if ((vs_dnn + scaling).empty()) continue;
      std::printf("%-44s %12s %12s\n", shape_mask.c_str(), vs_dnn.c_str(), scaling.c_str());
    }
    // Option costs: time relative to plain attention with the same visible
    // pairs (the option entries do the same work per call, so the ratio of
    // any rate counter is the ratio of times), and the window's speed-up
    // over causal.
    // "paired": from the paired/ entries (median of call-by-call ratios, the
    // figure to trust); "entries": from the separate attention/ entries.
    auto option_costs = [this](const char* title, const std::string& dtype_shape) {
      const std::string base = "attention/simdattn/" + dtype_shape + "/";
      auto plain = medians_.find(base + "none/threads:1");
      std::printf("\n%-40s %16s %16s\n", title, "extra (paired)", "extra (entries)");
      for (const char* opt : {"softcap", "alibi", "sinks", "mask_bool", "mask_add",
                              "kv_lengths", "dropout"}) {
        std::string paired, entries;
        char buf[32];
        auto pr = ratios_.find("paired/" + dtype_shape + "/" + opt + "_vs_none/threads:1");
        if (pr != ratios_.end()) {
          std::snprintf(buf, sizeof(buf), "%.1f%%", 100.0 * (pr->second - 1.0));
          paired = buf;
        }
        auto it = medians_.find(base + opt + "/threads:1");
        if (plain != medians_.end() && it != medians_.end() && it->second.bytes > 0) {
          std::snprintf(buf, sizeof(buf), "%.0f%%",
                        100.0 * (plain->second.bytes / it->second.bytes - 1.0));
          entries = buf;
        }
        if (paired.empty() && entries.empty()) continue;
        std::printf("%-40s %16s %16s\n", opt, paired.c_str(), entries.c_str());
      }
    };
    option_costs("option (B1 H8 L2048 D128, 1 thread)",
                 "f32/B1_Hq8_Hkv8_Lq2048_Lk2048_D128");
    option_costs("option (decode f16 KV Lk 16384, 1 thread)",
                 "qf32kvf16/B1_Hq32_Hkv8_Lq1_Lk16384_D128");
    auto paired_window = ratios_.find(
        "paired/f32/B1_Hq8_Hkv8_Lq8192_Lk8192_D128/causal_vs_causal_window512/threads:1");
    if (paired_window != ratios_.end()) {
      std::printf("window 512 over L 8192 vs full causal (paired): %.1fx faster\n",
                  paired_window->second);
    }
    const std::string wbase = "attention/simdattn/f32/B1_Hq8_Hkv8_Lq8192_Lk8192_D128/";
    auto full = medians_.find(wbase + "causal/threads:1");
    auto win = medians_.find(wbase + "causal_window512/threads:1");
    if (full != medians_.end() && win != medians_.end() && win->second.flops > 0) {
      // time = flops / rate, with the visible pairs of each.
      Shape w{1, 8, 8, 8192, 8192, 128};
      const double t_full = VisiblePairs(w, true) / full->second.flops;
      const double t_win = VisiblePairs(w, true, 511) / win->second.flops;
      std::printf("window 512 over L 8192 vs full causal (entries): %.1fx faster\n",
                  t_full / t_win);
    }

    // Decode: bound by reading K and V once.
    std::printf("\n%-9s %-48s %9s %9s %9s\n", "impl", "decode (K+V read)",
                "GB/s", "%read_bw", "vs oneDNN");
    for (const auto& [name, m] : medians_) {
      if (name.rfind("attention/", 0) != 0 || !IsDecodeEntry(name) ||
          (name.find("/none/") == std::string::npos &&
           name.find("/causal/") == std::string::npos)) {
        continue;
      }
      const size_t a = name.find('/') + 1, b = name.find('/', a);
      const std::string impl = name.substr(a, b - a);
      const size_t c = name.find('/', b + 1);
      const std::string dtype = name.substr(b + 1, c - b - 1);
      const std::string threads = name.substr(name.rfind("/threads:") + 9);
      std::string pct, vs;
      auto bw = medians_.find("roofline/read_bw/threads:" + threads);
      if (bw != medians_.end() && bw->second.flops > 0) {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%.0f%%", 100.0 * m.bytes / bw->second.flops);
        pct = buf;
      }
      if (impl == "simdattn") {
        // f32 against oneDNN f32, a 16-bit KV cache against oneDNN bf16.
        const std::string dnn_dtype = dtype == "f32" ? "f32" : "bf16";
        auto it = medians_.find("attention/onednn/" + dnn_dtype + name.substr(c));
        if (it != medians_.end() && it->second.bytes > 0) {
          char buf[32];
          std::snprintf(buf, sizeof(buf), "%.2fx", m.bytes / it->second.bytes);
          vs = buf;
        }
      }
      std::printf("%-9s %-48s %9.1f %9s %9s\n", impl.c_str(),
                  name.substr(b + 1).c_str(), m.bytes * 1e-9, pct.c_str(), vs.c_str());
    }
    // The same two ratios from the paired/ entries (medians of call-by-call
    // ratios): simdattn's bytes rate over a streaming read of the same bytes
    // next to it, and over oneDNN's.
    bool header = false;
    for (const auto& [name, ratio] : ratios_) {
      const std::string tag = "/none/read_vs_simdattn/threads:";
      const size_t at = name.find(tag);
      if (name.rfind("paired/", 0) != 0 || at == std::string::npos) continue;
      if (!header) {
        std::printf("\n%-58s %9s %9s\n", "decode, paired call by call", "of read",
                    "vs oneDNN");
        header = true;
      }
      const std::string threads = name.substr(at + tag.size());
      const std::string what = name.substr(7, at - 7);  // <dtype>/<shape>
      std::string vs;
      auto dnn = ratios_.find("paired/" + what + "/none/onednn_vs_simdattn/threads:" + threads);
      if (dnn != ratios_.end()) {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%.2fx", dnn->second);
        vs = buf;
      }
      std::printf("%-58s %8.0f%% %9s\n", (what + "/threads:" + threads).c_str(),
                  100.0 * ratio, vs.c_str());
    }
    std::printf("\n");
    for (const auto& [name, m] : medians_) {
      if (name.rfind("roofline/", 0) != 0) continue;
      std::printf("%-54s %9.1f G/s\n", name.c_str(), m.flops * 1e-9);
    }
  }

  // Writes one line per shape/mask/threads: GFLOP/s of simdattn, oneDNN and
  // the plain loop (0 when not measured) and the FMA roofline, tab-separated,
  // for tools/bench.sh's chart.
  bool WriteTable(const char* path) const {
    FILE* f = std::fopen(path, "w");
    if (f == nullptr) return false;
    std::fprintf(f, "entry\tsimdattn\tonednn\tnaive\troofline\n");
    for (const auto& [name, m] : medians_) {
      if (name.rfind("attention/simdattn/f32/", 0) != 0) continue;  // the chart is f32
      if (IsDecodeEntry(name)) continue;
      const std::string rest = name.substr(std::string("attention/simdattn/").size());
      const std::string threads = name.substr(name.rfind("/threads:") + 9);
      auto rate = [&](const std::string& key) {
        auto it = medians_.find(key);
        return it == medians_.end() ? 0.0 : it->second.flops * 1e-9;
      };
      std::string naive = "attention/naive/" + rest;
      naive = naive.substr(0, naive.rfind("/threads:")) + "/threads:1";
      std::fprintf(f, "%s\t%.2f\t%.2f\t%.2f\t%.2f\n", rest.c_str(), m.flops * 1e-9,
                   rate("attention/onednn/" + rest), rate(naive),
                   rate("roofline/fma_f32/threads:" + threads));
    }
    return std::fclose(f) == 0;
  }

 private:
  struct Median {
    double flops;
    double bytes;
    std::string label;
  };
  std::map<std::string, Median> medians_;
  std::map<std::string, double> ratios_;  // paired entries' `ratio`
};

}  // namespace

int main(int argc, char** argv) {
  // Our own flags, taken out before Google Benchmark parses the rest:
  //   --verify        check every implementation against the reference first
  //   --table=PATH    write the summary as tab-separated values
  bool verify = false;
  std::string table_path;
  for (int i = 1; i < argc;) {
    const std::string arg = argv[i];
    bool ours = true;
    if (arg == "--verify") {
      verify = true;
    } else if (arg.rfind("--table=", 0) == 0) {
      table_path = arg.substr(8);
    } else {
      ours = false;
    }
    if (ours) {
      for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
      --argc;
    } else {
      ++i;
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;

  for (int threads : {1, 2}) {
    const std::string t = "/threads:" + std::to_string(threads);
    benchmark::RegisterBenchmark(("roofline/fma_f32" + t).c_str(),
                                 [threads](benchmark::State& st) { BenchFmaPeak(st, threads); })
        ->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("roofline/dot_bf16" + t).c_str(),
                                 [threads](benchmark::State& st) { BenchDotBf16Peak(st, threads); })
        ->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("roofline/read_bw" + t).c_str(),
                                 [threads](benchmark::State& st) { BenchReadBandwidth(st, threads); })
        ->UseRealTime()->Unit(benchmark::kMillisecond);
  }

  const Shape shapes[] = {{1, 8, 8, 512, 512, 64},   {1, 8, 8, 2048, 2048, 64},
                          {1, 8, 8, 2048, 2048, 128}, {4, 16, 16, 256, 256, 64},
                          {1, 32, 8, 1024, 1024, 128}};
  bool verified = true;
  for (const Shape& s : shapes) {
    for (bool causal : {false, true}) {
      if (verify) verified = Verify(s, causal) && verified;
      const std::string mask = causal ? "causal" : "none";
      const std::string base = "f32/" + s.Name() + "/" + mask;
      for (int threads : {1, 2}) {
        const std::string t = "/threads:" + std::to_string(threads);
        Variant var;
        var.name = mask;
        var.causal = causal;
        benchmark::RegisterBenchmark(("attention/simdattn/" + base + t).c_str(),
                                     [s, var, threads](benchmark::State& st) {
                                       BenchSimdattn(st, s, var, threads);
                                     })
            ->UseRealTime()->Unit(benchmark::kMillisecond);
        benchmark::RegisterBenchmark(("attention/onednn/" + base + t).c_str(),
                                     [s, causal, threads](benchmark::State& st) {
                                       BenchOneDnn(st, s, causal, threads);
                                     })
            ->UseRealTime()->Unit(benchmark::kMillisecond);
        // The same comparison paired call by call (TimePairs), 1 thread only:
        // with 2 threads on 2 cores, oneDNN's OpenMP workers still spin
        // after its call and take a core from the simdattn call paired with
        // it (measured: simdattn's 2-thread time 5.1 ms after a simdattn
        // call, 6.9 ms after a oneDNN one, B4 H16 L256 D64). Pairing with
        // the FMA loop was tried too and dropped: right after it the
        // attention call ran 13.5 ms against 10.1 ms after oneDNN (clocks).
        if (threads == 1) {
          benchmark::RegisterBenchmark(("paired/" + base + "/onednn_vs_simdattn" + t).c_str(),
                                       [s, causal, threads](benchmark::State& st) {
                                         BenchPairedOneDnn(st, s, causal, threads);
                                       })
              ->UseRealTime()->MinTime(3.0)->Unit(benchmark::kMillisecond);
        }
        // 16-bit storage: simdattn in bf16 and f16, oneDNN in bf16.
        const std::string rest = s.Name() + "/" + mask + t;
        for (simdattn::DType dt : {simdattn::DType::kBF16, simdattn::DType::kF16}) {
          const std::string name = dt == simdattn::DType::kBF16 ? "bf16/" : "f16/";
          benchmark::RegisterBenchmark(("attention/simdattn/" + name + rest).c_str(),
                                       [s, causal, dt, threads](benchmark::State& st) {
                                         BenchSimdattn16(st, s, causal, dt, threads);
                                       })
              ->UseRealTime()->Unit(benchmark::kMillisecond);
        }
        benchmark::RegisterBenchmark(("attention/onednn/bf16/" + rest).c_str(),
                                     [s, causal, threads](benchmark::State& st) {
                                       BenchOneDnn(st, s, causal, threads, true);
                                     })
            ->UseRealTime()->Unit(benchmark::kMillisecond);
      }
      benchmark::RegisterBenchmark(("paired/" + base + "/threads2_vs_threads1").c_str(),
                                   [s, causal](benchmark::State& st) {
                                     BenchPairedThreads(st, s, causal);
                                   })
          ->UseRealTime()->MinTime(3.0)->Unit(benchmark::kMillisecond);
      // The plain loop is ~50x slower: only on the small shapes.
      if (s.q_len * s.kv_len <= 512 * 512) {
        benchmark::RegisterBenchmark(("attention/naive/" + base + "/threads:1").c_str(),
                                     [s, causal](benchmark::State& st) { BenchNaive(st, s, causal); })
            ->UseRealTime()->Unit(benchmark::kMillisecond);
      }
    }
  }
  // The cost of each option (SEMANTICS.md) on top of plain attention with the
  // same visible pairs, and a 512-key sliding window against full causal.
  // Decode (f16 KV cache, Lk 16384) gets the same options.
  {
    const Shape s{1, 8, 8, 2048, 2048, 128};
    std::vector<Variant> vars(7);
    vars[0].name = "softcap", vars[0].softcap = 30.0f;
    vars[1].name = "alibi", vars[1].alibi = true;
    vars[2].name = "sinks", vars[2].sinks = true;
    vars[3].name = "mask_bool", vars[3].mask_bool = true;
    vars[4].name = "mask_add", vars[4].mask_add = true;
    vars[5].name = "kv_lengths", vars[5].kv_lengths = true;
    vars[6].name = "dropout", vars[6].dropout = 0.1f;
    for (const Variant& var : vars) {
      benchmark::RegisterBenchmark(
          ("attention/simdattn/f32/" + s.Name() + "/" + var.name + "/threads:1").c_str(),
          [s, var](benchmark::State& st) { BenchSimdattn(st, s, var, 1); })
          ->UseRealTime()->Unit(benchmark::kMillisecond);
    }
    const Shape dec{1, 32, 8, 1, 16384, 128};
    for (const Variant& var : vars) {
      benchmark::RegisterBenchmark(
          (std::string("attention/simdattn/") + DecodeDtypeName(KvStore::kF16, false) +
           "/" + dec.Name() + "/" + var.name + "/threads:1").c_str(),
          [dec, var](benchmark::State& st) {
            BenchDecodeSimdattn(st, dec, KvStore::kF16, 1, var);
          })
          ->UseRealTime()->Unit(benchmark::kMillisecond);
    }
    const Shape w{1, 8, 8, 8192, 8192, 128};
    Variant causal, window;
    causal.name = "causal", causal.causal = true;
    window.name = "causal_window512", window.causal = true, window.window_left = 511;
    for (const Variant& var : {causal, window}) {
      benchmark::RegisterBenchmark(
          ("attention/simdattn/f32/" + w.Name() + "/" + var.name + "/threads:1").c_str(),
          [w, var](benchmark::State& st) { BenchSimdattn(st, w, var, 1); })
          ->UseRealTime()->Unit(benchmark::kMillisecond);
    }
    // The same comparisons, paired call by call (TimePairs): ratio = time
    // with the option / time without; for the window, time of full causal /
    // time of the window. Prefill pairs take about 0.3 s: 10 s gives some 30
    // pairs per run (3 s gave 8 to 17, and medians that moved by 5-10%
    // between runs); decode pairs take about 25 ms.
    const Variant plain;
    for (const Variant& var : vars) {
      benchmark::RegisterBenchmark(
          ("paired/f32/" + s.Name() + "/" + var.name + "_vs_none/threads:1").c_str(),
          [s, plain, var](benchmark::State& st) { BenchPairedPrefill(st, s, plain, var); })
          ->UseRealTime()->MinTime(10.0)->Unit(benchmark::kMillisecond);
    }
    for (const Variant& var : vars) {
      benchmark::RegisterBenchmark(
          (std::string("paired/") + DecodeDtypeName(KvStore::kF16, false) + "/" +
           dec.Name() + "/" + var.name + "_vs_none/threads:1").c_str(),
          [dec, plain, var](benchmark::State& st) { BenchPairedDecode(st, dec, plain, var); })
          ->UseRealTime()->MinTime(3.0)->Unit(benchmark::kMillisecond);
    }
    benchmark::RegisterBenchmark(
        ("paired/f32/" + w.Name() + "/causal_vs_causal_window512/threads:1").c_str(),
        [w, window, causal](benchmark::State& st) { BenchPairedPrefill(st, w, window, causal); })
        ->UseRealTime()->MinTime(10.0)->Unit(benchmark::kMillisecond);
  }

  for (int64_t lk : {4096, 16384, 65536}) {
    const Shape s{1, 32, 8, 1, lk, 128};
    for (int threads : {1, 2}) {
      const std::string t = "/" + s.Name() + "/none/threads:" + std::to_string(threads);
      for (KvStore kv : {KvStore::kF32, KvStore::kF16, KvStore::kBF16}) {
        benchmark::RegisterBenchmark(
            (std::string("attention/simdattn/") + DecodeDtypeName(kv, false) + t).c_str(),
            [s, kv, threads](benchmark::State& st) { BenchDecodeSimdattn(st, s, kv, threads); })
            ->UseRealTime()->Unit(benchmark::kMillisecond);
        if (kv == KvStore::kF16) continue;  // oneDNN 2.6 matmul: f32 or bf16
        benchmark::RegisterBenchmark(
            (std::string("attention/onednn/") + DecodeDtypeName(kv, true) + t).c_str(),
            [s, kv, threads](benchmark::State& st) { BenchDecodeOneDnn(st, s, kv, threads); })
            ->UseRealTime()->Unit(benchmark::kMillisecond);
      }
    }
    // The decode targets' two ratios, paired call by call (TimePairs): against
    // a read of the same bytes (1 and 2 threads) and against oneDNN (1
    // thread; with 2, oneDNN's OpenMP workers still spin after its call).
    // One repetition of 3 s each: the ratio is already a median of 50-6000
    // pairs, while three repetitions (each filling its copies again) made
    // the decode part of a run 12 minutes longer.
    for (int threads : {1, 2}) {
      const std::string t = "/" + s.Name() + "/none/";
      const std::string n = "/threads:" + std::to_string(threads);
      for (KvStore kv : {KvStore::kF32, KvStore::kF16, KvStore::kBF16}) {
        benchmark::RegisterBenchmark(
            (std::string("paired/") + DecodeDtypeName(kv, false) + t + "read_vs_simdattn" + n)
                .c_str(),
            [s, kv, threads](benchmark::State& st) { BenchPairedDecodeRead(st, s, kv, threads); })
            ->UseRealTime()->MinTime(3.0)->Repetitions(1)->Unit(benchmark::kMillisecond);
        if (kv == KvStore::kF16 || threads != 1) continue;
        benchmark::RegisterBenchmark(
            (std::string("paired/") + DecodeDtypeName(kv, false) + t + "onednn_vs_simdattn" + n)
                .c_str(),
            [s, kv](benchmark::State& st) { BenchPairedDecodeOneDnn(st, s, kv); })
            ->UseRealTime()->MinTime(3.0)->Repetitions(1)->Unit(benchmark::kMillisecond);
      }
    }
  }

  // Speculative decoding: a few queries per head, bottom-right causal.
  for (int64_t lq : {2, 4, 8}) {
    const Shape s{1, 32, 8, lq, 16384, 128};
    Variant var;
    var.name = "causal", var.causal = true, var.bottom_right = true;
    for (int threads : {1, 2}) {
      benchmark::RegisterBenchmark(
          (std::string("attention/simdattn/") + DecodeDtypeName(KvStore::kF16, false) + "/" +
           s.Name() + "/causal/threads:" + std::to_string(threads)).c_str(),
          [s, var, threads](benchmark::State& st) {
            BenchDecodeSimdattn(st, s, KvStore::kF16, threads, var);
          })
          ->UseRealTime()->Unit(benchmark::kMillisecond);
    }
  }

  if (!verified) {
    std::fprintf(stderr, "simdattn_bench: verification failed\n");
    return 1;
  }

  SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.PrintSummary();
  benchmark::Shutdown();
  if (!table_path.empty() && !reporter.WriteTable(table_path.c_str())) {
    std::fprintf(stderr, "simdattn_bench: cannot write %s\n", table_path.c_str());
    return 1;
  }
  return 0;
}
