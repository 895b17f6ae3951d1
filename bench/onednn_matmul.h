// oneDNN 2.6 matmul as the GEMM baseline of simdattn_bench: dst = src · Wᵀ
// + bias with W [n, k] (a Linear layer's layout), reordered once into the
// layout oneDNN's implementation prefers (as our panels are packed once).
// Benchmark-only; the library never links oneDNN.

#ifndef SIMDATTN_BENCH_ONEDNN_MATMUL_H_
#define SIMDATTN_BENCH_ONEDNN_MATMUL_H_

#include <cstdint>
#include <memory>
#include <string>

namespace simdattn {
namespace bench {

class OneDnnMatmul {
 public:
  // src [m, k], w [n, k], bias [n] (or null), dst [m, n], all f32, dense.
  OneDnnMatmul(int64_t m, int64_t n, int64_t k, const float* w, const float* bias);
  ~OneDnnMatmul();
  // Empty unless the primitive fell back to oneDNN's reference code.
  const std::string& error() const;
  const std::string& implementation() const;
  // dst = src · Wᵀ + bias on `threads` OpenMP threads.
  void Run(const float* src, float* dst, int threads);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bench
}  // namespace simdattn

#endif  // SIMDATTN_BENCH_ONEDNN_MATMUL_H_
