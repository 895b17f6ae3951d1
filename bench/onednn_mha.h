// The oneDNN 2.6 pipeline of a multi-head attention layer as a user would
// write it, for simdattn_bench's mha/onednn entries: a QKV matmul with
// bias, the bench's unfused attention (matmul, softmax_v2, matmul) on
// strided views of its output, and the output matmul. Benchmark-only.

#ifndef SIMDATTN_BENCH_ONEDNN_MHA_H_
#define SIMDATTN_BENCH_ONEDNN_MHA_H_

#include <cstdint>
#include <memory>
#include <string>

namespace simdattn {
namespace bench {

struct OneDnnMhaShape {
  int64_t q_len, kv_len, embed_dim, heads, kv_heads, head_dim;
  bool causal;
  // Decode: one query token; its K and V rows are copied into the dense
  // caches k_cache/v_cache [Hkv, kv_len, D] at row kv_len - 1, and the
  // attention reads the caches. Otherwise self-attention over the QKV
  // matmul's output (one KV head per query head).
  bool decode;
};

class OneDnnMha {
 public:
  // w_qkv [Hq*D + 2*Hkv*D, E], b_qkv, w_o [E, Hq*D], b_o (f32, dense);
  // k_cache, v_cache: decode only.
  OneDnnMha(const OneDnnMhaShape& s, const float* w_qkv, const float* b_qkv,
            const float* w_o, const float* b_o, float* k_cache, float* v_cache);
  ~OneDnnMha();
  const std::string& error() const;
  // out [L, E] from x [L, E] on `threads` OpenMP threads.
  void Run(const float* x, float* out, int threads);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace bench
}  // namespace simdattn

#endif  // SIMDATTN_BENCH_ONEDNN_MHA_H_
