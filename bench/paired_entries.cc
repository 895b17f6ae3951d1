// Paired entries (paired/...): two calls, A and B, alternate inside every
// iteration (which one goes first alternates too) and each is timed on its
// own; the counter `ratio` is the median over iterations of time(B) /
// time(A), with the median milliseconds of each as a_ms and b_ms. The speed
// of a shared machine drifts over seconds, so two separate entries run
// minutes apart can differ by 20% on identical work; the two calls of a pair
// run under the same conditions.
//
//   paired/f32/<shape>/<mask>/onednn_vs_simdattn/threads:<n>   simdattn's speed-up
//   paired/f32/<shape>/<mask>/threads<n>_vs_threads1           n-thread speed-up
//   paired/<dtype>/<shape>/<option>_vs_none/threads:<n>        the option's cost
//   paired/f32/<shape>/causal_vs_causal_window512/threads:<n>  the window's gain
//   paired/<dtype>/<shape>/none/read_vs_simdattn/threads:<n>   decode / read roofline
//   paired/<dtype>/<shape>/none/onednn_vs_simdattn/threads:<n> decode speed-up

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "bench/common.h"
#include "bench/decode.h"
#include "bench/entries.h"
#include "bench/onednn_attention.h"

namespace simdattn {
namespace bench {
namespace {

// Option pairs on B1 H8 L2048 D128 (about 0.3 s a pair) run 10 s, some 30
// pairs: with 3 s (8-17 pairs) their medians moved by 5-10% between runs.
constexpr double kPrefillPairSeconds = 10.0;
// The other pairs run 3 s; the decode ones (50-6000 pairs in that time) a
// single repetition, their ratio being a median already.
constexpr double kShortPairSeconds = 3.0;

// One simdattn call on p's f32 tensors; false (and the entry marked as an
// error) if it fails.
bool CallF32(benchmark::State& state, Problem& p, const AttentionOptions& options,
             const ExecutionOptions& exec) {
  const Status st = Attention(p.Q(), p.K(), p.V(), p.O(), options, {}, exec);
  if (!st.ok()) state.SkipWithError(st.message.c_str());
  return st.ok();
}

// f32 prefill of shape s: A with variant a, B with variant b.
void BenchPairedPrefill(benchmark::State& state, const Shape& s, const Variant& a, const Variant& b,
                        int threads) {
  Problem& p = CachedProblem(s);
  ThreadPool pool(threads);
  ExecutionOptions exec;
  exec.pool = &pool;
  const OptionPair opt(s, a, b);
  TimePairs(
      state, [&] { return CallF32(state, p, opt.a, exec); },
      [&] { return CallF32(state, p, opt.b, exec); });
}

// f32 prefill: A = simdattn, B = oneDNN's unfused pipeline on the same inputs.
void BenchPairedOneDnn(benchmark::State& state, const Shape& s, bool causal, int threads) {
  Problem& p = CachedProblem(s);
  std::vector<float> o_dnn(p.o.size());
  SetOneDnnThreads(threads);
  OneDnnAttention attn(s.batch, s.q_heads, s.kv_heads, s.q_len, s.kv_len, s.head_dim, causal, false,
                       p.q.data(), p.k.data(), p.v.data(), o_dnn.data());
  if (!attn.error().empty()) {
    state.SkipWithError(attn.error().c_str());
    return;
  }
  ThreadPool pool(threads);
  ExecutionOptions exec;
  exec.pool = &pool;
  AttentionOptions options;
  options.causal = causal;
  TimePairs(
      state, [&] { return CallF32(state, p, options, exec); },
      [&] {
        attn.Run(threads);
        return true;
      });
}

// f32 prefill: A with `threads` threads, B with 1. The A pool's workers sleep
// through each 1-thread call, so an untimed empty ParallelFor wakes them
// before each A call, as back-to-back calls find them (B4 H16 L256 D64,
// 2 threads: ratio 1.84-2.04 with it, 1.83-1.93 without).
void BenchPairedThreads(benchmark::State& state, const Shape& s, bool causal, int threads) {
  Problem& p = CachedProblem(s);
  ThreadPool pool1(1), pool_n(threads);
  ExecutionOptions exec1, exec_n;
  exec1.pool = &pool1;
  exec_n.pool = &pool_n;
  AttentionOptions options;
  options.causal = causal;
  TimePairs(
      state, [&] { return CallF32(state, p, options, exec_n); },
      [&] { return CallF32(state, p, options, exec1); },
      [&] {
        pool_n.ParallelFor(
            pool_n.num_threads(), [](void*, int64_t) {}, nullptr);
      });
}

// Decode with an f16 KV cache (cold, each call on the next copy): A with
// variant a, B with variant b.
void BenchPairedDecode(benchmark::State& state, const Shape& s, const Variant& a, const Variant& b,
                       int threads) {
  const std::shared_ptr<DecodeCopies> c = CachedDecodeCopies(s, KvStore::kF16);
  ThreadPool pool(threads);
  ExecutionOptions exec;
  exec.pool = &pool;
  const OptionPair opts(s, a, b);
  size_t i = 0;
  TimePairs(
      state, [&] { return DecodeCall(state, *c, s, KvStore::kF16, opts.a, exec, &i); },
      [&] { return DecodeCall(state, *c, s, KvStore::kF16, opts.b, exec, &i); });
}

// Decode (cold): A = simdattn, B = a streaming read of as many bytes as its
// K and V (the read roofline's loop over the next unread part of ReadBuffer,
// so that it is cold too) with the same threads.
void BenchPairedDecodeRead(benchmark::State& state, const Shape& s, KvStore kv, int threads) {
  const std::shared_ptr<DecodeCopies> c = CachedDecodeCopies(s, kv);
  const float* buffer = ReadBuffer();
  const size_t n = size_t(c->kv_bytes) / sizeof(float);
  constexpr size_t kBufferFloats = kReadBufferBytes / sizeof(float);
  if (buffer == nullptr || 2 * n > kBufferFloats) {
    state.SkipWithError("no read buffer of twice the K/V bytes");
    return;
  }
  ThreadPool pool(threads);
  ExecutionOptions exec;
  exec.pool = &pool;
  size_t i = 0, offset = 0;
  TimePairs(
      state, [&] { return DecodeCall(state, *c, s, kv, {}, exec, &i); },
      [&] {
        StreamReadThreads(pool, threads, buffer + offset, n);
        offset = offset + 2 * n <= kBufferFloats ? offset + n : 0;
        return true;
      });
}

// Decode (cold): A = simdattn (f32 Q, K/V as stored), B = oneDNN (f32, or
// bf16 Q and K/V) on the same copies, each call on the next copy.
void BenchPairedDecodeOneDnn(benchmark::State& state, const Shape& s, KvStore kv, int threads) {
  const std::shared_ptr<DecodeCopies> c = CachedDecodeCopies(s, kv);
  std::vector<float> o_dnn(c->o.size());
  SetOneDnnThreads(threads);
  const auto dnn = OneDnnDecode::Make(state, s, *c, kv == KvStore::kBF16, o_dnn.data());
  if (dnn == nullptr) return;
  ThreadPool pool(threads);
  ExecutionOptions exec;
  exec.pool = &pool;
  size_t i = 0;
  TimePairs(
      state, [&] { return DecodeCall(state, *c, s, kv, {}, exec, &i); },
      [&] {
        dnn->Run(i, threads);
        i = (i + 1) % c->copies;
        return true;
      });
}

void RegisterPairedPrefill(const BenchConfig& config) {
  for (const PrefillShape& ps : PrefillShapes()) {
    const Shape s = ps.shape;
    for (bool causal : {false, true}) {
      const std::string base = "paired/f32/" + s.Name() + (causal ? "/causal" : "/none");
      for (int threads : config.threads) {
        if (PairableWithOneDnn(threads)) {
          Register(
              base + "/onednn_vs_simdattn" + ThreadsField(threads),
              [s, causal, threads](benchmark::State& st) {
                BenchPairedOneDnn(st, s, causal, threads);
              },
              kShortPairSeconds);
        }
        if (threads > 1) {
          Register(
              base + "/threads" + std::to_string(threads) + "_vs_threads1",
              [s, causal, threads](benchmark::State& st) {
                BenchPairedThreads(st, s, causal, threads);
              },
              kShortPairSeconds);
        }
      }
    }
  }
}

// ratio = time with the option / time without; for the window, time of full
// causal / time of the window.
void RegisterPairedOptions(const BenchConfig& config) {
  const Variant plain, causal = WindowShapeVariant(false), window = WindowShapeVariant(true);
  for (int threads : config.threads) {
    const std::string t = ThreadsField(threads);
    for (const Variant& var : OptionVariants()) {
      const Shape s = kOptionShape, dec = kOptionDecodeShape;
      Register(
          "paired/f32/" + s.Name() + "/" + var.name + "_vs_none" + t,
          [s, plain, var, threads](benchmark::State& st) {
            BenchPairedPrefill(st, s, plain, var, threads);
          },
          kPrefillPairSeconds);
      Register(
          std::string("paired/") + DecodeDtypeName(KvStore::kF16, false) + "/" + dec.Name() + "/" +
              var.name + "_vs_none" + t,
          [dec, plain, var, threads](benchmark::State& st) {
            BenchPairedDecode(st, dec, plain, var, threads);
          },
          kShortPairSeconds);
    }
    const Shape w = kWindowShape;
    Register(
        "paired/f32/" + w.Name() + "/causal_vs_causal_window512" + t,
        [w, window, causal, threads](benchmark::State& st) {
          BenchPairedPrefill(st, w, window, causal, threads);
        },
        kPrefillPairSeconds);
  }
}

void RegisterPairedDecode(const BenchConfig& config) {
  for (const DecodeShape& ds : DecodeShapes()) {
    const Shape s = ds.shape;
    const std::string base = "/" + s.Name() + "/none/";
    for (int threads : config.threads) {
      const std::string t = ThreadsField(threads);
      for (KvStore kv : {KvStore::kF32, KvStore::kF16, KvStore::kBF16}) {
        const std::string dtype = std::string("paired/") + DecodeDtypeName(kv, false);
        Register(
            dtype + base + "read_vs_simdattn" + t,
            [s, kv, threads](benchmark::State& st) { BenchPairedDecodeRead(st, s, kv, threads); },
            kShortPairSeconds, 1);
        if (kv == KvStore::kF16 || !PairableWithOneDnn(threads)) continue;
        Register(
            dtype + base + "onednn_vs_simdattn" + t,
            [s, kv, threads](benchmark::State& st) { BenchPairedDecodeOneDnn(st, s, kv, threads); },
            kShortPairSeconds, 1);
      }
    }
  }
}

}  // namespace

void RegisterPairedEntries(const BenchConfig& config) {
  if (config.headline) return;
  RegisterPairedPrefill(config);
  RegisterPairedOptions(config);
  RegisterPairedDecode(config);
}

}  // namespace bench
}  // namespace simdattn
