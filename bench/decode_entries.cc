// Decode entries: attention/<impl>/<dtype>/<shape>/<mask>/threads:<n> with
// Lq = 1 against a long KV cache (simdattn with an f32, f16 or bf16 cache,
// oneDNN in f32 or bf16), speculative decoding (a few queries per head,
// bottom-right causal) and decode with each option of SEMANTICS.md.

#include <unistd.h>

#include <algorithm>
#include <list>
#include <random>
#include <string>
#include <utility>

#include "bench/decode.h"
#include "bench/entries.h"
#include "lib/dtype.h"

namespace simdattn {
namespace bench {
namespace {

size_t LastLevelCacheBytes() {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return l3 > 0 ? static_cast<size_t>(l3) : (size_t{64} << 20);
}

uint16_t Round16(float x, KvStore t) { return t == KvStore::kF16 ? F32ToF16(x) : F32ToBF16(x); }

std::shared_ptr<DecodeCopies> MakeDecodeCopies(const Shape& s, KvStore kv) {
  auto c = std::make_shared<DecodeCopies>();
  const size_t nq = size_t(s.batch * s.q_heads * s.q_len * s.head_dim);
  const size_t nkv = size_t(s.batch * s.kv_heads * s.kv_len * s.head_dim);
  const size_t elem = kv == KvStore::kF32 ? 4 : 2;
  c->kv_bytes = 2.0 * double(nkv) * double(elem);
  c->copies = std::max<size_t>(1, size_t(2.0 * double(LastLevelCacheBytes()) / c->kv_bytes) + 1);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (size_t i = 0; i < c->copies; ++i) {
    std::vector<float> q(nq);
    for (float& x : q) x = dist(rng);
    if (kv != KvStore::kF32) {
      std::vector<uint16_t> h(nq);
      for (size_t j = 0; j < nq; ++j) h[j] = Round16(q[j], kv);
      c->q16.push_back(std::move(h));
    }
    c->q.push_back(std::move(q));
    if (kv == KvStore::kF32) {
      HugeVector<float> k(nkv), v(nkv);
      for (float& x : k) x = dist(rng);
      for (float& x : v) x = dist(rng);
      c->k32.push_back(std::move(k));
      c->v32.push_back(std::move(v));
    } else {
      HugeVector<uint16_t> k(nkv), v(nkv);
      for (uint16_t& x : k) x = Round16(dist(rng), kv);
      for (uint16_t& x : v) x = Round16(dist(rng), kv);
      c->k16.push_back(std::move(k));
      c->v16.push_back(std::move(v));
    }
  }
  c->o.assign(nq, 0.0f);
  return c;
}

void BenchDecodeSimdattn(benchmark::State& state, const Shape& s, KvStore kv, int threads,
                         const Variant& var, bool q_bf16) {
  const std::shared_ptr<DecodeCopies> c = CachedDecodeCopies(s, kv);
  ThreadPool pool(threads);
  ExecutionOptions exec;
  exec.pool = &pool;
  VariantData data;
  const AttentionOptions options = MakeOptions(s, var, &data);
  const auto o = MakeBHSD(c->o.data(), DType::kF32, s.batch, s.q_heads, s.q_len, s.head_dim);
  RunInfo info;
  size_t i = 0;
  for (auto _ : state) {
    const DecodeInputs in = SimdattnDecodeInputs(*c, s, kv, i, q_bf16);
    const Status st = Attention(in.q, in.k, in.v, o, options, {}, exec, &info);
    if (!st.ok()) {
      state.SkipWithError(st.message.c_str());
      return;
    }
    i = (i + 1) % c->copies;
  }
  state.SetLabel(info.target);
  SetDecodeCounters(state, s, c->kv_bytes);
}

void BenchDecodeOneDnn(benchmark::State& state, const Shape& s, KvStore kv, int threads) {
  const std::shared_ptr<DecodeCopies> c = CachedDecodeCopies(s, kv);
  SetOneDnnThreads(threads);
  const auto dnn = OneDnnDecode::Make(state, s, *c, kv == KvStore::kBF16, c->o.data());
  if (dnn == nullptr) return;
  size_t i = 0;
  for (auto _ : state) {
    dnn->Run(i, threads);
    i = (i + 1) % c->copies;
  }
  state.SetLabel(dnn->implementations());
  SetDecodeCounters(state, s, c->kv_bytes);
}

// One decode family: attention/<impl>/<dtype>/... (oneDNN 2.6's matmul
// takes f32 or bf16, so it has no f16 family). q_bf16: simdattn with bf16
// Q as well as K/V (dtype bf16, as oneDNN's bf16 family).
struct DecodeFamily {
  bool onednn;
  KvStore kv;
  bool q_bf16 = false;
};
constexpr DecodeFamily kDecodeFamilies[] = {
    {false, KvStore::kF32},  {true, KvStore::kF32},  {false, KvStore::kF16},
    {false, KvStore::kBF16}, {true, KvStore::kBF16},
};

void RegisterDecodeFamily(const Shape& s, const DecodeFamily& f, const Variant& var, int threads) {
  const std::string name = std::string("attention/") + (f.onednn ? "onednn/" : "simdattn/") +
                           (f.q_bf16 ? "bf16" : DecodeDtypeName(f.kv, f.onednn)) + "/" +
                           s.Name() + "/" + var.name + ThreadsField(threads);
  const KvStore kv = f.kv;
  if (f.onednn) {
    Register(name,
             [s, kv, threads](benchmark::State& st) { BenchDecodeOneDnn(st, s, kv, threads); });
  } else {
    const bool q_bf16 = f.q_bf16;
    Register(name, [s, kv, threads, var, q_bf16](benchmark::State& st) {
      BenchDecodeSimdattn(st, s, kv, threads, var, q_bf16);
    });
  }
}

}  // namespace

const char* DecodeDtypeName(KvStore kv, bool onednn) {
  if (onednn) return kv == KvStore::kF32 ? "f32" : "bf16";
  switch (kv) {
    case KvStore::kF32:
      return "f32";
    case KvStore::kF16:
      return "qf32kvf16";
    case KvStore::kBF16:
      return "qf32kvbf16";
  }
  return "";
}

std::shared_ptr<DecodeCopies> CachedDecodeCopies(const Shape& s, KvStore kv) {
  constexpr size_t kKept = 3;
  static std::list<std::pair<std::string, std::shared_ptr<DecodeCopies>>> recent;
  const std::string key = s.Name() + "/" + DecodeDtypeName(kv, false);
  for (auto it = recent.begin(); it != recent.end(); ++it) {
    if (it->first == key) {
      recent.splice(recent.begin(), recent, it);
      return recent.front().second;
    }
  }
  // Free the least recently used copies before filling new ones.
  while (recent.size() >= kKept) recent.pop_back();
  recent.emplace_front(key, MakeDecodeCopies(s, kv));
  return recent.front().second;
}

DecodeInputs SimdattnDecodeInputs(const DecodeCopies& c, const Shape& s, KvStore kv, size_t i,
                                  bool q_bf16) {
  const bool f32 = kv == KvStore::kF32;
  const DType kv_type = f32 ? DType::kF32 : kv == KvStore::kF16 ? DType::kF16 : DType::kBF16;
  const void* k = f32 ? (const void*)c.k32[i].data() : c.k16[i].data();
  const void* v = f32 ? (const void*)c.v32[i].data() : c.v16[i].data();
  const bool bf16_q = q_bf16 && kv == KvStore::kBF16;
  return {bf16_q ? MakeBHSD(c.q16[i].data(), DType::kBF16, s.batch, s.q_heads, s.q_len,
                            s.head_dim)
                 : MakeBHSD(c.q[i].data(), DType::kF32, s.batch, s.q_heads, s.q_len, s.head_dim),
          MakeBHSD(k, kv_type, s.batch, s.kv_heads, s.kv_len, s.head_dim),
          MakeBHSD(v, kv_type, s.batch, s.kv_heads, s.kv_len, s.head_dim)};
}

bool DecodeCall(benchmark::State& state, DecodeCopies& c, const Shape& s, KvStore kv,
                const AttentionOptions& options, const ExecutionOptions& exec, size_t* i) {
  const DecodeInputs in = SimdattnDecodeInputs(c, s, kv, *i);
  const auto o = MakeBHSD(c.o.data(), DType::kF32, s.batch, s.q_heads, s.q_len, s.head_dim);
  const Status st = Attention(in.q, in.k, in.v, o, options, {}, exec);
  *i = (*i + 1) % c.copies;
  if (!st.ok()) state.SkipWithError(st.message.c_str());
  return st.ok();
}

void SetDecodeCounters(benchmark::State& state, const Shape& s, double kv_bytes) {
  state.counters["bytes"] =
      benchmark::Counter(kv_bytes * double(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["FLOPS"] =
      benchmark::Counter(4.0 * double(s.batch * s.q_heads * s.q_len * s.kv_len * s.head_dim) *
                             double(state.iterations()),
                         benchmark::Counter::kIsRate);
}

std::unique_ptr<OneDnnDecode> OneDnnDecode::Make(benchmark::State& state, const Shape& s,
                                                 const DecodeCopies& c, bool bf16, float* o) {
  std::unique_ptr<OneDnnDecode> dnn(new OneDnnDecode(s, c, bf16, o));
  if (!dnn->attn_.error().empty()) {
    state.SkipWithError(dnn->attn_.error().c_str());
    return nullptr;
  }
  return dnn;
}

OneDnnDecode::OneDnnDecode(const Shape& s, const DecodeCopies& c, bool bf16, float* o)
    : c_(c),
      bf16_(bf16),
      attn_(s.batch, s.q_heads, s.kv_heads, s.q_len, s.kv_len, s.head_dim, false, bf16, Q(0), K(0),
            V(0), o) {}

void OneDnnDecode::Run(size_t i, int threads) {
  attn_.SetInputs(Q(i), K(i), V(i));
  attn_.Run(threads);
}

const void* OneDnnDecode::Q(size_t i) const {
  return bf16_ ? (const void*)c_.q16[i].data() : c_.q[i].data();
}
const void* OneDnnDecode::K(size_t i) const {
  return bf16_ ? (const void*)c_.k16[i].data() : c_.k32[i].data();
}
const void* OneDnnDecode::V(size_t i) const {
  return bf16_ ? (const void*)c_.v16[i].data() : c_.v32[i].data();
}

const std::vector<DecodeShape>& DecodeShapes() {
  static const std::vector<DecodeShape> shapes = {{{1, 32, 8, 1, 4096, 128}, false},
                                                  {{1, 32, 8, 1, 16384, 128}, true},
                                                  {{1, 32, 8, 1, 65536, 128}, false}};
  return shapes;
}

void RegisterDecodeEntries(const BenchConfig& config) {
  const Variant plain;
  for (const DecodeShape& ds : DecodeShapes()) {
    if (config.headline && !ds.headline) continue;
    for (int threads : config.threads) {
      for (const DecodeFamily& f : kDecodeFamilies)
        RegisterDecodeFamily(ds.shape, f, plain, threads);
    }
  }
  if (config.headline) return;
  // Speculative decoding: a few queries per head, bottom-right causal; f32
  // Q with an f16 cache, and bf16 Q with a bf16 one.
  Variant spec;
  spec.name = "causal", spec.causal = true, spec.bottom_right = true;
  for (int64_t lq : {2, 4, 8}) {
    for (int threads : config.threads) {
      RegisterDecodeFamily({1, 32, 8, lq, 16384, 128}, {false, KvStore::kF16}, spec, threads);
      RegisterDecodeFamily({1, 32, 8, lq, 16384, 128}, {false, KvStore::kBF16, true}, spec,
                           threads);
    }
  }
  for (const Variant& var : OptionVariants()) {
    for (int threads : config.threads) {
      RegisterDecodeFamily(kOptionDecodeShape, {false, KvStore::kF16}, var, threads);
    }
  }
}

}  // namespace bench
}  // namespace simdattn
