// Decode inputs shared by the decode entries and the paired decode entries:
// Lq = 1 (or a few queries) against a long KV cache, bound by reading K and V
// once. Caches are kept cold by rotating through enough copies of Q/K/V to
// exceed twice the last-level cache (one copy when it is already that large).

#ifndef SIMDATTN_BENCH_DECODE_H_
#define SIMDATTN_BENCH_DECODE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench/common.h"
#include "bench/onednn_attention.h"

namespace simdattn {
namespace bench {

// How the KV cache is stored; Q and O are f32 for simdattn.
enum class KvStore { kF32, kF16, kBF16 };

// The <dtype> field of decode entries: simdattn f32, qf32kvf16, qf32kvbf16;
// oneDNN f32 or bf16 (Q, K and V alike).
const char* DecodeDtypeName(KvStore kv, bool onednn);

template <class T>
using HugeVector = std::vector<T, FunctionAllocator<T, &AllocHugePages>>;

// Copies of one decode problem; 16-bit K/V (and, for oneDNN, Q rounded to
// the same type) stored as raw bits, K/V on 2 MiB pages as the read
// roofline's buffer.
struct DecodeCopies {
  std::vector<std::vector<float>> q;
  std::vector<std::vector<uint16_t>> q16;  // 16-bit KV caches only
  std::vector<HugeVector<uint16_t>> k16, v16;
  std::vector<HugeVector<float>> k32, v32;
  std::vector<float> o;
  size_t copies = 1;
  double kv_bytes = 0;  // K + V bytes of one copy, as stored
};

// The copies of (s, kv), kept while they are among the three most recently
// used, so that the trials and repetitions of an entry fill them once (about
// 1 GB each with a 480 MiB last-level cache).
std::shared_ptr<DecodeCopies> CachedDecodeCopies(const Shape& s, KvStore kv);

// simdattn's Q (f32, or with q_bf16 the bf16 copy of a bf16 cache's
// problem) and K/V (as stored) of copy i.
struct DecodeInputs {
  TensorView q, k, v;
};
DecodeInputs SimdattnDecodeInputs(const DecodeCopies& c, const Shape& s, KvStore kv, size_t i,
                                  bool q_bf16 = false);

// One simdattn decode call on copy *i of c (then *i moves to the next copy);
// false (and the entry marked as an error) if it fails.
bool DecodeCall(benchmark::State& state, DecodeCopies& c, const Shape& s, KvStore kv,
                const AttentionOptions& options, const ExecutionOptions& exec, size_t* i);

// The bytes (K and V as stored) and FLOPS rates of a decode entry.
void SetDecodeCounters(benchmark::State& state, const Shape& s, double kv_bytes);

// oneDNN's decode pipeline on the copies of c (f32, or bf16 Q and K/V) into
// o: Run(i, threads) computes copy i. Make returns null, with the entry
// marked as an error, if some primitive is not an optimized one.
class OneDnnDecode {
 public:
  static std::unique_ptr<OneDnnDecode> Make(benchmark::State& state, const Shape& s,
                                            const DecodeCopies& c, bool bf16, float* o);
  void Run(size_t i, int threads);
  std::string implementations() const { return attn_.implementations(); }

 private:
  OneDnnDecode(const Shape& s, const DecodeCopies& c, bool bf16, float* o);
  const void* Q(size_t i) const;
  const void* K(size_t i) const;
  const void* V(size_t i) const;

  const DecodeCopies& c_;
  bool bf16_;
  OneDnnAttention attn_;
};

}  // namespace bench
}  // namespace simdattn

#endif  // SIMDATTN_BENCH_DECODE_H_
