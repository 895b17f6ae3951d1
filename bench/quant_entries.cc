// Quantized KV cache entries: decode attention/simdattn/qf32kv<fmt>/<shape>/
// none/threads:<n> with an int8 (i8), q8_0 (q80) or fp8 e4m3 (e4m3) cache
// next to the 16-bit entries of decode_entries.cc, and prefill with an int8
// K/V (qf32kvi8) next to the f32 prefill. The bytes counter is what a call
// reads of K and V: their bytes as stored plus int8's per-token scales.
// paired/qf32kv<fmt>/<shape>/bf16_vs_<fmt>/threads:<n> alternates the bf16
// decode (A) with the quantized one (B) on the same shape; its ratio is
// time(fmt) / time(bf16), which drift on a shared machine moves less than
// two separate entries. paired/qf32kvi8/<shape>/bf16_vs_i8_floor/threads:<n>
// pairs the bf16 decode with Int8DecodeFloor on the int8 cache: the least
// time the int8 decode can take on this machine (docs/BENCHMARKING.md).

#include <unistd.h>

#include <algorithm>
#include <list>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench/decode.h"
#include "bench/entries.h"
#include "bench/roofline.h"
#include "hwy/aligned_allocator.h"
#include "lib/quant.h"

namespace simdattn {
namespace bench {
namespace {

enum class QuantFmt { kI8, kQ8_0, kE4M3 };

const char* FmtName(QuantFmt f) {
  return f == QuantFmt::kI8 ? "i8" : f == QuantFmt::kQ8_0 ? "q80" : "e4m3";
}

DType FmtDType(QuantFmt f) {
  return f == QuantFmt::kI8 ? DType::kInt8 : f == QuantFmt::kQ8_0 ? DType::kQ8_0
                                                                  : DType::kFp8E4M3;
}

// One quantized K or V [B, Hkv, L, D] (BHSD) with its scales.
struct QuantKv {
  HugeVector<uint8_t> bytes;
  std::vector<float> scales;  // int8: [B, Hkv, L]
  int64_t row = 0;            // bytes per row

  // f32 values in [-1, 1) from rng quantized into f, rows of d values.
  QuantKv(QuantFmt f, int64_t rows, int64_t d, std::mt19937* rng) {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    row = f == QuantFmt::kQ8_0 ? Q8_0RowBytes(d) : d;
    bytes.resize(size_t(rows * row));
    if (f == QuantFmt::kI8) scales.resize(size_t(rows));
    std::vector<float> x(static_cast<size_t>(d));
    for (int64_t r = 0; r < rows; ++r) {
      for (float& v : x) v = dist(*rng);
      uint8_t* out = bytes.data() + r * row;
      if (f == QuantFmt::kI8) {
        scales[size_t(r)] = QuantizeRowInt8(x.data(), d, reinterpret_cast<int8_t*>(out));
      } else if (f == QuantFmt::kQ8_0) {
        QuantizeRowQ8_0(x.data(), d, out);
      } else {
        for (int64_t e = 0; e < d; ++e) out[e] = F32ToE4M3(x[size_t(e)] * 448.0f);
      }
    }
  }

  // The view of shape [b, h, l, d] (q8_0: byte strides).
  TensorView View(QuantFmt f, int64_t b, int64_t h, int64_t l, int64_t d) const {
    TensorView v = MakeBHSD(bytes.data(), FmtDType(f), b, h, l, d);
    if (f == QuantFmt::kQ8_0) {
      v.strides[2] = row;
      v.strides[1] = l * row;
      v.strides[0] = h * l * row;
    }
    return v;
  }
  double Bytes() const { return double(bytes.size()) + 4.0 * double(scales.size()); }
};

// Copies of one quantized decode problem, enough to exceed twice the
// last-level cache (as DecodeCopies).
struct QuantCopies {
  std::vector<std::vector<float>> q;
  std::vector<std::unique_ptr<QuantKv>> k, v;
  std::vector<float> o;
  size_t copies = 1;
  double kv_bytes = 0;
};

std::shared_ptr<QuantCopies> MakeQuantCopies(const Shape& s, QuantFmt f) {
  auto c = std::make_shared<QuantCopies>();
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const int64_t rows = s.batch * s.kv_heads * s.kv_len;
  const size_t nq = size_t(s.batch * s.q_heads * s.q_len * s.head_dim);
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  const double llc = l3 > 0 ? double(l3) : double(64 << 20);
  for (size_t i = 0; i < c->copies; ++i) {
    c->k.emplace_back(new QuantKv(f, rows, s.head_dim, &rng));
    c->v.emplace_back(new QuantKv(f, rows, s.head_dim, &rng));
    c->kv_bytes = c->k.back()->Bytes() + c->v.back()->Bytes();
    c->copies = std::max<size_t>(1, size_t(2.0 * llc / c->kv_bytes) + 1);
    std::vector<float> q(nq);
    for (float& x : q) x = dist(rng);
    c->q.push_back(std::move(q));
  }
  c->o.assign(nq, 0.0f);
  return c;
}

std::shared_ptr<QuantCopies> CachedQuantCopies(const Shape& s, QuantFmt f) {
  static std::list<std::pair<std::string, std::shared_ptr<QuantCopies>>> recent;
  const std::string key = s.Name() + "/" + FmtName(f);
  for (auto it = recent.begin(); it != recent.end(); ++it) {
    if (it->first == key) return it->second;
  }
  while (recent.size() >= 2) recent.pop_back();
  recent.emplace_front(key, MakeQuantCopies(s, f));
  return recent.front().second;
}

// The options of copy i: its scales (int8) or the fp8 scale 1/448.
AttentionOptions QuantOptions(const QuantCopies& c, const Shape& s, QuantFmt f,
                              size_t i) {
  AttentionOptions o;
  if (f == QuantFmt::kI8) {
    o.k_scales = MakeBHSD(c.k[i]->scales.data(), DType::kF32, s.batch, s.kv_heads,
                          s.kv_len, 1);
    o.v_scales = MakeBHSD(c.v[i]->scales.data(), DType::kF32, s.batch, s.kv_heads,
                          s.kv_len, 1);
  } else if (f == QuantFmt::kE4M3) {
    o.k_scale = o.v_scale = 1.0f / 448.0f;
  }
  return o;
}

// One quantized decode call on copy *i of c (then *i moves to the next
// copy); false (and the entry marked as an error) if it fails.
bool QuantDecodeCall(benchmark::State& state, QuantCopies& c, const Shape& s, QuantFmt f,
                     const ExecutionOptions& exec, size_t* i, RunInfo* info) {
  const auto o = MakeBHSD(c.o.data(), DType::kF32, s.batch, s.q_heads, s.q_len, s.head_dim);
  const auto q = MakeBHSD(c.q[*i].data(), DType::kF32, s.batch, s.q_heads, s.q_len, s.head_dim);
  const Status st = Attention(q, c.k[*i]->View(f, s.batch, s.kv_heads, s.kv_len, s.head_dim),
                              c.v[*i]->View(f, s.batch, s.kv_heads, s.kv_len, s.head_dim), o,
                              QuantOptions(c, s, f, *i), {}, exec, info);
  if (!st.ok()) {
    state.SkipWithError(st.message.c_str());
    return false;
  }
  *i = (*i + 1) % c.copies;
  return true;
}

void BenchQuantDecode(benchmark::State& state, const Shape& s, QuantFmt f, int threads) {
  const std::shared_ptr<QuantCopies> c = CachedQuantCopies(s, f);
  ThreadPool pool(threads);
  ExecutionOptions exec;
  exec.pool = &pool;
  RunInfo info;
  size_t i = 0;
  for (auto _ : state) {
    if (!QuantDecodeCall(state, *c, s, f, exec, &i, &info)) return;
  }
  state.SetLabel(std::string(info.target) + " " + info.path);
  SetDecodeCounters(state, s, c->kv_bytes);
}

// A: the bf16 decode of shape s, B: the same shape with a cache in f.
void BenchPairedQuantDecode(benchmark::State& state, const Shape& s, QuantFmt f,
                            int threads) {
  const std::shared_ptr<DecodeCopies> bf16 = CachedDecodeCopies(s, KvStore::kBF16);
  const std::shared_ptr<QuantCopies> c = CachedQuantCopies(s, f);
  ThreadPool pool(threads);
  ExecutionOptions exec;
  exec.pool = &pool;
  RunInfo info;
  size_t ia = 0, ib = 0;
  TimePairs(
      state, [&] { return DecodeCall(state, *bf16, s, KvStore::kBF16, {}, exec, &ia); },
      [&] { return QuantDecodeCall(state, *c, s, f, exec, &ib, &info); });
  state.SetLabel(std::string(info.target) + " " + info.path);
}

// Int8DecodeFloor over copy *i of an int8 problem (then *i moves on): a task
// of the pool per chunk of kFloorChunkKeys keys of a KV head (B * Hkv), each
// with its 4 query rows. Tasks of whole heads scale worse on 2 threads
// (the threads' streams then lie whole heads apart); the decode splits keys
// into chunks as well.
constexpr int64_t kFloorChunkKeys = 4096;
void Int8FloorCall(QuantCopies& c, const Shape& s, ThreadPool& pool, size_t* i) {
  struct Job {
    const float* q;
    const int8_t* k;
    const int8_t* v;
    int64_t keys, dim, chunks, o_stride;
    hwy::AlignedFreeUniquePtr<float[]> o;
    std::vector<float> sinks;
  } job{c.q[*i].data(),
        reinterpret_cast<const int8_t*>(c.k[*i]->bytes.data()),
        reinterpret_cast<const int8_t*>(c.v[*i]->bytes.data()),
        s.kv_len,
        s.head_dim,
        (s.kv_len + kFloorChunkKeys - 1) / kFloorChunkKeys,
        // Each task's output rows on whole cache lines of their own, or
        // threads writing neighbouring tasks' rows share a line.
        (4 * s.head_dim + 15) / 16 * 16,
        nullptr,
        {}};
  const int64_t tasks = s.batch * s.kv_heads * job.chunks;
  job.o = hwy::AllocateAligned<float>(size_t(tasks * job.o_stride));
  job.sinks.resize(size_t(tasks));
  pool.ParallelFor(
      tasks,
      [](void* arg, int64_t t) {
        Job* j = static_cast<Job*>(arg);
        const int64_t h = t / j->chunks, first = t % j->chunks * kFloorChunkKeys;
        const int64_t kv = (h * j->keys + first) * j->dim;
        const int64_t n = std::min(kFloorChunkKeys, j->keys - first);
        j->sinks[size_t(t)] = Int8DecodeFloor(j->q + h * 4 * j->dim, j->k + kv, j->v + kv, n,
                                              j->dim, j->o.get() + t * j->o_stride);
      },
      &job);
  benchmark::DoNotOptimize(job.sinks.data());
  benchmark::DoNotOptimize(job.o.get());
  *i = (*i + 1) % c.copies;
}

// A: the bf16 decode of shape s, B: Int8DecodeFloor on its int8 cache.
void BenchPairedInt8Floor(benchmark::State& state, const Shape& s, int threads) {
  if (s.q_heads != 4 * s.kv_heads || s.head_dim % 16 != 0 || s.kv_len % 4 != 0) {
    state.SkipWithError(
        "the floor loop takes 4 query rows per KV head, D and Lk multiples of 16 and 4");
    return;
  }
  const std::shared_ptr<DecodeCopies> bf16 = CachedDecodeCopies(s, KvStore::kBF16);
  const std::shared_ptr<QuantCopies> c = CachedQuantCopies(s, QuantFmt::kI8);
  ThreadPool pool(threads);
  ExecutionOptions exec;
  exec.pool = &pool;
  size_t ia = 0, ib = 0;
  TimePairs(
      state, [&] { return DecodeCall(state, *bf16, s, KvStore::kBF16, {}, exec, &ia); },
      [&] {
        Int8FloorCall(*c, s, pool, &ib);
        return true;
      });
  state.SetLabel(RooflineTarget());
}

// Prefill with int8 K/V (f32 Q and O), the f32 problem's K and V quantized.
void BenchQuantPrefill(benchmark::State& state, const Shape& s, int threads) {
  Problem& p = CachedProblem(s);
  std::mt19937 rng(13);
  const QuantKv k(QuantFmt::kI8, s.batch * s.kv_heads * s.kv_len, s.head_dim, &rng);
  const QuantKv v(QuantFmt::kI8, s.batch * s.kv_heads * s.kv_len, s.head_dim, &rng);
  ThreadPool pool(threads);
  ExecutionOptions exec;
  exec.pool = &pool;
  AttentionOptions options;
  options.k_scales = MakeBHSD(k.scales.data(), DType::kF32, s.batch, s.kv_heads, s.kv_len, 1);
  options.v_scales = MakeBHSD(v.scales.data(), DType::kF32, s.batch, s.kv_heads, s.kv_len, 1);
  if (TimeAttention(state, p.Q(), k.View(QuantFmt::kI8, s.batch, s.kv_heads, s.kv_len, s.head_dim),
                    v.View(QuantFmt::kI8, s.batch, s.kv_heads, s.kv_len, s.head_dim), p.O(),
                    options, exec)) {
    SetCounters(state, s, false, -1, 1.0);
  }
}

}  // namespace

void RegisterQuantEntries(const BenchConfig& config) {
  for (const DecodeShape& ds : DecodeShapes()) {
    if (ds.shape.kv_len < 16384 || (config.headline && !ds.headline)) continue;
    for (int threads : config.threads) {
      for (QuantFmt f : {QuantFmt::kI8, QuantFmt::kQ8_0, QuantFmt::kE4M3}) {
        const Shape s = ds.shape;
        Register(std::string("attention/simdattn/qf32kv") + FmtName(f) + "/" + s.Name() +
                     "/none" + ThreadsField(threads),
                 [s, f, threads](benchmark::State& st) { BenchQuantDecode(st, s, f, threads); });
        Register(std::string("paired/qf32kv") + FmtName(f) + "/" + s.Name() + "/bf16_vs_" +
                     FmtName(f) + ThreadsField(threads),
                 [s, f, threads](benchmark::State& st) {
                   BenchPairedQuantDecode(st, s, f, threads);
                 });
      }
      const Shape s = ds.shape;
      Register("paired/qf32kvi8/" + s.Name() + "/bf16_vs_i8_floor" + ThreadsField(threads),
               [s, threads](benchmark::State& st) { BenchPairedInt8Floor(st, s, threads); });
    }
  }
  if (config.headline) return;
  const Shape prefill{1, 8, 8, 2048, 2048, 128};
  for (int threads : config.threads) {
    Register("attention/simdattn/qf32kvi8/" + prefill.Name() + "/none" + ThreadsField(threads),
             [prefill, threads](benchmark::State& st) { BenchQuantPrefill(st, prefill, threads); });
  }
}

}  // namespace bench
}  // namespace simdattn
