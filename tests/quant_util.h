// Quantized K/V for the tests: a K or V tensor of f32 values stored in any
// K/V format (the wide ones through Tensor, the quantized ones as bytes with
// their scales), views of it for Attention(), and the bound the kernels
// meet on dequantized values.

#ifndef SIMDATTN_TESTS_QUANT_UTIL_H_
#define SIMDATTN_TESTS_QUANT_UTIL_H_

#include <cstdint>
#include <vector>

#include "simdattn/attention.h"
#include "tests/test_util.h"

namespace simdattn {
namespace test {

// K or V [d0, d1, d2, d3] in `dtype`. Quantized formats: `bytes` with
// strides in elements (q8_0: bytes, rows of d3 / 32 blocks); int8 per-row
// scales [d0, d1, d2] in `scales`; fp8's per-tensor `scale`.
struct KvTensor {
  DType dtype = DType::kF32;
  Tensor wide;  // f32, f16, bf16
  std::vector<uint8_t, CacheLineAllocator<uint8_t>> bytes;
  int64_t shape[4] = {0, 0, 0, 0};
  int64_t strides[4] = {0, 0, 0, 0};
  std::vector<float> scales;
  int64_t scale_strides[4] = {0, 0, 0, 1};
  float scale = 1.0f;

  bool quantized() const;
  // Bytes of row (i0, i1, i2).
  uint8_t* Row(int64_t i0, int64_t i1, int64_t i2);
  const uint8_t* Row(int64_t i0, int64_t i1, int64_t i2) const;
  int64_t RowBytes() const;
  TensorView View() const;
  TensorView ScalesView() const;  // empty unless int8
  // Largest |dequantized value| (NaN and Inf skipped).
  double MaxAbs() const;
};

// `src` (any wide dtype) stored as `dtype`: wide types rounded, int8 with
// per-row scales max|x| / 127, q8_0 per block, fp8 as x / fp8_scale
// (saturating). BHSD or BSHD; `pad` extra bytes/elements per row.
KvTensor StoreKv(const Tensor& src, DType dtype, Layout layout,
                 float fp8_scale = 1.0f, int64_t pad = 0);

// Sets K's (is_k) or V's scales of `options` for t.
void SetScales(const KvTensor& t, bool is_k, AttentionOptions* options);

}  // namespace test
}  // namespace simdattn

#endif  // SIMDATTN_TESTS_QUANT_UTIL_H_
