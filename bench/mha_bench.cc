// mha/{simdattn,onednn}/f32/<shape>/<mask>/threads:<n>: the multi-head
// attention layer (projections, attention, output projection) against the
// oneDNN pipeline a user writes (bench/onednn_mha.h), same weights:
//   B1_L2048_E1024_H16/{none,causal}   self-attention, Forward
//   B1_L1_Lk8192_E4096_H32_KV8/decode  one token against an 8192-token
//                                      f32 cache (Llama-8B-like widths), Step
// Counters: FLOPS = the projections' 2·M·N·K plus the attention's
// 4·Hq·(visible pairs)·D; bytes = weights, activations and the KV cache.

#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/common.h"
#include "bench/mha_entries.h"
#include "bench/onednn_attention.h"
#include "bench/onednn_mha.h"
#include "simdattn/mha.h"

namespace simdattn {
namespace bench {
namespace {

struct MhaShape {
  std::string name;
  int64_t q_len, kv_len, embed_dim, heads, kv_heads;
  bool decode;
  int64_t head_dim() const { return embed_dim / heads; }
};

const MhaShape kMhaShapes[] = {
    {"B1_L2048_E1024_H16", 2048, 2048, 1024, 16, 16, false},
    {"B1_L1_Lk8192_E4096_H32_KV8", 1, 8192, 4096, 32, 8, true}};

// Weights, input and (decode) the caches of one shape, made once per run.
struct MhaProblem {
  AlignedFloats w_qkv, b_qkv, w_o, b_o, x, out;
  float* k_cache = nullptr;
  float* v_cache = nullptr;
  explicit MhaProblem(const MhaShape& s) {
    std::mt19937 rng(7);
    const float r = 1.0f / std::sqrt(float(s.embed_dim));
    std::uniform_real_distribution<float> u(-r, r), one(-1.0f, 1.0f);
    const int64_t D = s.head_dim(), nq = s.heads * D, n = nq + 2 * s.kv_heads * D;
    w_qkv.resize(size_t(n * s.embed_dim));
    b_qkv.resize(size_t(n));
    w_o.resize(size_t(s.embed_dim * nq));
    b_o.resize(size_t(s.embed_dim));
    x.resize(size_t(s.q_len * s.embed_dim));
    out.assign(x.size(), 0.0f);
    for (AlignedFloats* v : {&w_qkv, &b_qkv, &w_o, &b_o}) {
      for (float& e : *v) e = u(rng);
    }
    for (float& e : x) e = one(rng);
    if (s.decode) {
      const size_t bytes = size_t(s.kv_heads * s.kv_len * D) * 4;
      k_cache = static_cast<float*>(AllocHugePages(bytes));
      v_cache = static_cast<float*>(AllocHugePages(bytes));
      for (size_t i = 0; i < bytes / 4; ++i) k_cache[i] = one(rng), v_cache[i] = one(rng);
    }
  }
  ~MhaProblem() {
    std::free(k_cache);
    std::free(v_cache);
  }
};

MhaProblem& CachedMhaProblem(const MhaShape& s) {
  static std::map<std::string, std::unique_ptr<MhaProblem>> problems;
  std::unique_ptr<MhaProblem>& slot = problems[s.name];
  if (!slot) slot.reset(new MhaProblem(s));
  return *slot;
}

void SetMhaCounters(benchmark::State& state, const MhaShape& s, bool causal) {
  const int64_t D = s.head_dim(), nq = s.heads * D, n = nq + 2 * s.kv_heads * D;
  const double pairs = s.decode ? double(s.kv_len)
                                : VisiblePairs({1, s.heads, s.kv_heads, s.q_len, s.kv_len, D},
                                               causal);
  const double flops = 2.0 * double(s.q_len) * double(s.embed_dim) * double(n + nq) +
                       4.0 * double(s.heads) * pairs * double(D);
  double bytes = 4.0 * double(s.embed_dim * (n + nq) + 2 * s.q_len * s.embed_dim);
  if (s.decode) bytes += 4.0 * 2.0 * double(s.kv_heads * s.kv_len * D);
  const double it = double(state.iterations());
  state.counters["FLOPS"] = benchmark::Counter(flops * it, benchmark::Counter::kIsRate);
  state.counters["bytes"] = benchmark::Counter(bytes * it, benchmark::Counter::kIsRate);
}

// The layer with the problem's weights under PyTorch's fused names.
Status MakeLayer(const MhaShape& s, const MhaProblem& p, const ExecutionOptions& exec,
                 std::unique_ptr<MultiHeadAttention>* out) {
  MhaConfig c;
  c.embed_dim = s.embed_dim;
  c.num_heads = s.heads;
  c.num_kv_heads = s.kv_heads;
  MultiHeadAttention* layer = nullptr;
  Status st = MultiHeadAttention::Create(c, &layer);
  if (!st.ok()) return st;
  out->reset(layer);
  const int64_t D = s.head_dim(), nq = s.heads * D, n = nq + 2 * s.kv_heads * D;
  NamedTensor t[4];
  const char* names[4] = {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"};
  const float* data[4] = {p.w_qkv.data(), p.b_qkv.data(), p.w_o.data(), p.b_o.data()};
  const int64_t shapes[4][2] = {{n, s.embed_dim}, {n, 0}, {s.embed_dim, nq}, {s.embed_dim, 0}};
  for (int i = 0; i < 4; ++i) {
    t[i].name = names[i];
    t[i].data = data[i];
    t[i].ndim = shapes[i][1] == 0 ? 1 : 2;
    t[i].shape[0] = shapes[i][0];
    t[i].shape[1] = shapes[i][1];
  }
  return layer->LoadWeights(t, 4, exec);
}

void BenchMhaSimdattn(benchmark::State& state, const MhaShape& s, bool causal, int threads) {
  MhaProblem& p = CachedMhaProblem(s);
  ThreadPool pool(threads);
  ExecutionOptions exec;
  exec.pool = &pool;
  std::unique_ptr<MultiHeadAttention> layer;
  Status st = MakeLayer(s, p, exec, &layer);
  const MhaTensor x{p.x.data(), DType::kF32, 1, s.q_len, s.embed_dim, true};
  const MutableMhaTensor out{p.out.data(), DType::kF32, 1, s.q_len, s.embed_dim, true};
  MhaForwardOptions options;
  options.attention.causal = causal;
  MhaKvCache cache;
  if (s.decode) {
    cache.k = MakeBHSD(p.k_cache, DType::kF32, 1, s.kv_heads, s.kv_len, s.head_dim());
    cache.v = MakeBHSD(p.v_cache, DType::kF32, 1, s.kv_heads, s.kv_len, s.head_dim());
  }
  RunInfo info;
  for (auto _ : state) {
    if (st.ok() && s.decode) {
      cache.length = s.kv_len - 1;  // the token goes to the last row each time
      st = layer->Step(x, &cache, out, {}, exec, &info);
    } else if (st.ok()) {
      st = layer->Forward(x, nullptr, nullptr, out, options, exec, &info);
    }
    if (!st.ok()) {
      state.SkipWithError(st.message.c_str());
      return;
    }
    benchmark::DoNotOptimize(p.out.data());
  }
  state.SetLabel(info.target);
  SetMhaCounters(state, s, causal);
}

void BenchMhaOneDnn(benchmark::State& state, const MhaShape& s, bool causal, int threads) {
  MhaProblem& p = CachedMhaProblem(s);
  SetOneDnnThreads(threads);
  OneDnnMha mha({s.q_len, s.kv_len, s.embed_dim, s.heads, s.kv_heads, s.head_dim(), causal,
                 s.decode},
                p.w_qkv.data(), p.b_qkv.data(), p.w_o.data(), p.b_o.data(), p.k_cache,
                p.v_cache);
  if (!mha.error().empty()) {
    state.SkipWithError(mha.error().c_str());
    return;
  }
  for (auto _ : state) {
    mha.Run(p.x.data(), p.out.data(), threads);
    benchmark::DoNotOptimize(p.out.data());
  }
  SetMhaCounters(state, s, causal);
}

}  // namespace

void RegisterMhaEntries(const BenchConfig& config) {
  if (config.headline) return;
  for (const MhaShape& s : kMhaShapes) {
    for (const char* mask : s.decode ? std::vector<const char*>{"decode"}
                                     : std::vector<const char*>{"none", "causal"}) {
      const bool causal = std::string(mask) == "causal";
      for (int threads : config.threads) {
        const std::string tail = "/f32/" + s.name + "/" + mask + ThreadsField(threads);
        Register("mha/simdattn" + tail, [s, causal, threads](benchmark::State& st) {
          BenchMhaSimdattn(st, s, causal, threads);
        });
        Register("mha/onednn" + tail, [s, causal, threads](benchmark::State& st) {
          BenchMhaOneDnn(st, s, causal, threads);
        });
      }
    }
  }
}

}  // namespace bench
}  // namespace simdattn
