// The oneDNN baseline of simdattn_bench: the unfused pipeline a oneDNN 2.6
// user writes (matmul, softmax_v2, matmul). Benchmark-only; the library never
// links oneDNN.

#ifndef SIMDATTN_BENCH_ONEDNN_ATTENTION_H_
#define SIMDATTN_BENCH_ONEDNN_ATTENTION_H_

#include <cstdint>
#include <memory>
#include <string>

namespace simdattn {
namespace bench {

// Sets the OpenMP threads oneDNN runs on. Its primitives plan their split
// for the count at creation and keep it: call this before creating them as
// well as before running them (an entry built after a 1-thread one otherwise
// runs its "2-thread" primitives on 1).
void SetOneDnnThreads(int threads);

// S = scale * Q·Kᵀ (+ causal mask as a binary_add post-op with a fully
// materialized [B·Hkv, G·Lq, Lk] mask: broadcast masks take oneDNN 2.6.3's
// reference path), P = softmax_v2 (accurate) over Lk, O = P·V; batched as
// [B·Hkv, G·Lq, D] so grouped-query heads share K/V. Inputs are dense BHSD,
// f32 or (bf16 = true) bf16 for Q, K and V alike (oneDNN 2.6's bf16 matmul
// wants both operands in bf16); S is f32, P is written in the inputs' type by
// softmax_v2, O is f32. Primitives and the S/P buffers are created once in
// the constructor.
class OneDnnAttention {
 public:
  OneDnnAttention(int64_t batch, int64_t q_heads, int64_t kv_heads,
                  int64_t q_len, int64_t kv_len, int64_t head_dim, bool causal,
                  bool bf16, const void* q, const void* k, const void* v,
                  float* o);
  // Points the pipeline at another copy of the inputs (same shapes).
  void SetInputs(const void* q, const void* k, const void* v);
  ~OneDnnAttention();

  // Empty when every primitive runs an optimized implementation; otherwise
  // names the primitive that fell back to a reference one.
  const std::string& error() const;
  // impl_info_str of the three primitives, e.g. "brg:avx512_core / ...".
  const std::string& implementations() const;

  // Runs the pipeline once on `threads` OpenMP threads.
  void Run(int threads);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bench
}  // namespace simdattn

#endif  // SIMDATTN_BENCH_ONEDNN_ATTENTION_H_
