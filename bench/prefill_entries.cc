// Prefill entries: attention/<impl>/<dtype>/<shape>/<mask>/threads:<n> for
// simdattn (f32, bf16, f16 storage), oneDNN's unfused pipeline (f32, bf16)
// and a plain loop (f32, 1 thread); and the option entries, simdattn with
// one option of SEMANTICS.md on top of plain attention.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "bench/common.h"
#include "bench/entries.h"
#include "bench/onednn_attention.h"
#include "lib/dtype.h"
#include "lib/reference.h"

namespace simdattn {
namespace bench {
namespace {

// The plain unfused loop a user would write without a library: S = Q·Kᵀ
// materialized per head, a three-pass softmax, then P·V. Single-threaded.
void NaiveAttention(Problem& p, bool causal, std::vector<float>* scores) {
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
      float* o = p.o.data() + (b * s.q_heads + h) * s.q_len * D;
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

void BenchSimdattn(benchmark::State& state, const Shape& s, const Variant& var, int threads) {
  Problem& p = CachedProblem(s);
  ThreadPool pool(threads);
  ExecutionOptions exec;
  exec.pool = &pool;
  VariantData data;
  const AttentionOptions options = MakeOptions(s, var, &data);
  if (TimeAttention(state, p.Q(), p.K(), p.V(), p.O(), options, exec)) {
    SetCounters(state, s, var.causal, var.window_left);
  }
}

// Q, K, V and O all stored in 16 bits (f16 or bf16), rounded from the f32
// problem; math in f32 inside the kernel.
void BenchSimdattn16(benchmark::State& state, const Shape& s, bool causal, DType dtype,
                     int threads) {
  const Problem& p = CachedProblem(s);
  const std::vector<uint16_t> q16 = RoundTo16(p.q, dtype), k16 = RoundTo16(p.k, dtype),
                              v16 = RoundTo16(p.v, dtype);
  std::vector<uint16_t> o16(q16.size());
  ThreadPool pool(threads);
  ExecutionOptions exec;
  exec.pool = &pool;
  AttentionOptions options;
  options.causal = causal;
  const auto q = MakeBHSD(q16.data(), dtype, s.batch, s.q_heads, s.q_len, s.head_dim);
  const auto k = MakeBHSD(k16.data(), dtype, s.batch, s.kv_heads, s.kv_len, s.head_dim);
  const auto v = MakeBHSD(v16.data(), dtype, s.batch, s.kv_heads, s.kv_len, s.head_dim);
  const auto o = MakeBHSD(o16.data(), dtype, s.batch, s.q_heads, s.q_len, s.head_dim);
  if (TimeAttention(state, q, k, v, o, options, exec)) {
    SetCounters(state, s, causal, -1, 2.0);
  }
}

void BenchNaive(benchmark::State& state, const Shape& s, bool causal) {
  Problem& p = CachedProblem(s);
  std::vector<float> scores;
  for (auto _ : state) {
    NaiveAttention(p, causal, &scores);
    benchmark::DoNotOptimize(p.o.data());
  }
  SetCounters(state, s, causal);
}

// bf16: Q, K and V rounded to bf16 (O stays f32 in oneDNN's pipeline).
void BenchOneDnn(benchmark::State& state, const Shape& s, bool causal, int threads, bool bf16) {
  Problem& p = CachedProblem(s);
  std::vector<uint16_t> q16, k16, v16;
  if (bf16) {
    q16 = RoundTo16(p.q, DType::kBF16);
    k16 = RoundTo16(p.k, DType::kBF16);
    v16 = RoundTo16(p.v, DType::kBF16);
  }
  SetOneDnnThreads(threads);
  OneDnnAttention attn(s.batch, s.q_heads, s.kv_heads, s.q_len, s.kv_len, s.head_dim, causal, bf16,
                       bf16 ? (const void*)q16.data() : p.q.data(),
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

// One prefill family: attention/<impl>/<dtype>/... at every shape, mask and
// thread count.
struct PrefillFamily {
  bool onednn;
  DType dtype;    // of Q, K, V (and O, but oneDNN's O is f32)
  bool headline;  // part of --headline
};
constexpr PrefillFamily kPrefillFamilies[] = {
    {false, DType::kF32, true},  {true, DType::kF32, true},  {false, DType::kBF16, true},
    {false, DType::kF16, false}, {true, DType::kBF16, true},
};

std::string FamilyName(const PrefillFamily& f) {
  const char* dtype = f.dtype == DType::kF32 ? "f32" : f.dtype == DType::kBF16 ? "bf16" : "f16";
  return std::string("attention/") + (f.onednn ? "onednn/" : "simdattn/") + dtype;
}

void BenchPrefill(benchmark::State& st, const PrefillFamily& f, const Shape& s, bool causal,
                  int threads) {
  if (f.onednn) {
    BenchOneDnn(st, s, causal, threads, f.dtype == DType::kBF16);
  } else if (f.dtype == DType::kF32) {
    Variant var;
    var.name = causal ? "causal" : "none";
    var.causal = causal;
    BenchSimdattn(st, s, var, threads);
  } else {
    BenchSimdattn16(st, s, causal, f.dtype, threads);
  }
}

// The plain loop is about 50x slower than simdattn: only on shapes up to
// 512 x 512 query-key pairs, 1 thread.
bool RunsNaive(const Shape& s) { return s.q_len * s.kv_len <= 512 * 512; }

void RegisterOptionVariant(const Shape& s, const Variant& var, const BenchConfig& config) {
  for (int threads : config.threads) {
    Register("attention/simdattn/f32/" + s.Name() + "/" + var.name + ThreadsField(threads),
             [s, var, threads](benchmark::State& st) { BenchSimdattn(st, s, var, threads); });
  }
}

// Checks one shape and mask; prints the errors.
bool Verify(const Shape& s, bool causal) {
  Problem p(s);
  AttentionOptions options;
  options.causal = causal;
  std::vector<double> ref;
  if (!ReferenceAttention(p.Q(), p.K(), p.V(), options, &ref, nullptr).ok()) return false;
  auto max_err = [&](const AlignedFloats& o) {
    double e = 0.0;
    for (size_t i = 0; i < o.size(); ++i) {
      const double d = std::fabs(o[i] - ref[i]);
      if (!(d <= e)) e = std::isnan(d) ? INFINITY : d;
    }
    return e;  // max|V| <= 1, so this is SEMANTICS.md's err
  };
  const Status st = Attention(p.Q(), p.K(), p.V(), p.O(), options);
  const double e_simd = st.ok() ? max_err(p.o) : INFINITY;
  SetOneDnnThreads(1);
  OneDnnAttention dnn(s.batch, s.q_heads, s.kv_heads, s.q_len, s.kv_len, s.head_dim, causal, false,
                      p.q.data(), p.k.data(), p.v.data(), p.o.data());
  dnn.Run(1);
  const double e_dnn = max_err(p.o);
  const bool ok = e_simd <= 2e-5 && e_dnn <= 2e-5;
  std::printf("verify %s/%s: simdattn err %.2e, onednn err %.2e (bound 2e-5) %s\n",
              s.Name().c_str(), causal ? "causal" : "none", e_simd, e_dnn, ok ? "ok" : "FAILED");
  return ok;
}

}  // namespace

const std::vector<PrefillShape>& PrefillShapes() {
  static const std::vector<PrefillShape> shapes = {{{1, 8, 8, 512, 512, 64}, false},
                                                   {{1, 8, 8, 2048, 2048, 64}, false},
                                                   {{1, 8, 8, 2048, 2048, 128}, true},
                                                   {{4, 16, 16, 256, 256, 64}, false},
                                                   {{1, 32, 8, 1024, 1024, 128}, false}};
  return shapes;
}

void RegisterPrefillEntries(const BenchConfig& config) {
  for (const PrefillShape& ps : PrefillShapes()) {
    if (config.headline && !ps.headline) continue;
    const Shape s = ps.shape;
    for (bool causal : {false, true}) {
      const std::string rest = s.Name() + (causal ? "/causal" : "/none");
      for (int threads : config.threads) {
        for (const PrefillFamily& f : kPrefillFamilies) {
          if (config.headline && !f.headline) continue;
          Register(FamilyName(f) + "/" + rest + ThreadsField(threads),
                   [f, s, causal, threads](benchmark::State& st) {
                     BenchPrefill(st, f, s, causal, threads);
                   });
        }
      }
      if (!config.headline && RunsNaive(s)) {
        Register("attention/naive/f32/" + rest + ThreadsField(1),
                 [s, causal](benchmark::State& st) { BenchNaive(st, s, causal); });
      }
    }
  }
}

void RegisterOptionEntries(const BenchConfig& config) {
  if (config.headline) return;
  for (const Variant& var : OptionVariants()) RegisterOptionVariant(kOptionShape, var, config);
  RegisterOptionVariant(kWindowShape, WindowShapeVariant(false), config);
  RegisterOptionVariant(kWindowShape, WindowShapeVariant(true), config);
  // Decode with each option: decode_entries.cc.
}

Variant WindowShapeVariant(bool window) {
  Variant v;
  v.name = window ? "causal_window512" : "causal";
  v.causal = true;
  if (window) v.window_left = kWindowLeft;
  return v;
}

bool VerifyPrefill(const BenchConfig& config) {
  bool ok = true;
  for (const PrefillShape& ps : PrefillShapes()) {
    if (config.headline && !ps.headline) continue;
    for (bool causal : {false, true}) ok = Verify(ps.shape, causal) && ok;
  }
  return ok;
}

}  // namespace bench
}  // namespace simdattn
