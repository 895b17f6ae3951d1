// Scalar conversions of the quantized K/V formats (SEMANTICS.md "Quantized
// KV caches"): fp8 e4m3 / e5m2 to and from f32, and the quantizers of int8
// rows, q8_0 blocks and fp8 values. Shared by the reference, AppendKv, the
// kernels' scalar tails, the C/Python front ends and the tests.

#ifndef SIMDATTN_LIB_QUANT_H_
#define SIMDATTN_LIB_QUANT_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "lib/dtype.h"

namespace simdattn {

// Values per q8_0 block and bytes per block (an f16 scale, then 32 int8).
constexpr int64_t kQ8Block = 32;
constexpr int64_t kQ8BlockBytes = 34;

// Largest finite fp8 magnitudes (OCP).
constexpr float kE4M3Max = 448.0f;
constexpr float kE5M2Max = 57344.0f;

// OCP e4m3: sign, 4 exponent bits (bias 7), 3 mantissa bits; no Inf,
// S.1111.111 is NaN; exponent 0 holds the subnormals m * 2^-9. Exact.
inline float E4M3ToF32(uint8_t b) {
  const float sign = (b & 0x80) != 0 ? -1.0f : 1.0f;
  const int e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -9);
  return sign * std::ldexp(static_cast<float>(8 + m), e - 10);
}

// OCP e5m2 is the upper byte of an IEEE binary16 (bias 15, Inf and NaN).
inline float E5M2ToF32(uint8_t b) {
  return F16ToF32(static_cast<uint16_t>(b << 8));
}

// x rounded to nearest even into fp8 with `man` mantissa bits and exponent
// bias `bias`; finite values beyond the largest (code max_code) and +-Inf
// saturate to it; NaN gives nan_code (with x's sign).
inline uint8_t F32ToFp8(float x, int man, int bias, uint8_t max_code,
                        uint8_t nan_code) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  const uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<uint8_t>(sign | nan_code);
  float a;
  std::memcpy(&a, &abs, 4);
  if (a < std::ldexp(1.0f, 1 - bias)) {  // subnormal range: units of 2^(1-bias-man)
    // Exact scaling by a power of two; nearbyint rounds to nearest even. A
    // result of 2^man is the smallest normal, whose code is the same.
    const float q = std::nearbyint(std::ldexp(a, bias - 1 + man));
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(q));
  }
  const int shift = 23 - man;
  const uint32_t rounded =
      (abs + (1u << (shift - 1)) - 1u + ((abs >> shift) & 1u)) >> shift;
  const uint32_t code = rounded - (static_cast<uint32_t>(127 - bias) << man);
  return static_cast<uint8_t>(sign | (code > max_code ? max_code : code));
}

inline uint8_t F32ToE4M3(float x) { return F32ToFp8(x, 3, 7, 0x7E, 0x7F); }
inline uint8_t F32ToE5M2(float x) { return F32ToFp8(x, 2, 15, 0x7B, 0x7E); }

// q = round(x / scale) to nearest even, clamped to [-127, 127].
inline int8_t QuantizeInt8(float x, float scale) {
  if (!(scale > 0.0f)) return 0;
  const float q = std::nearbyint(x / scale);
  return static_cast<int8_t>(q > 127.0f ? 127 : (q < -127.0f ? -127 : q));
}

// The symmetric scale of n values: max|x| / 127 in f32, NaN when a value
// is not finite (the row then reads back as NaN: int8 holds no NaN).
inline float Int8Scale(const float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return std::numeric_limits<float>::quiet_NaN();
    amax = std::fabs(x[i]) > amax ? std::fabs(x[i]) : amax;
  }
  return amax / 127.0f;
}

// n values into int8 with one scale (Int8Scale); returns the scale.
inline float QuantizeRowInt8(const float* x, int64_t n, int8_t* q) {
  const float scale = Int8Scale(x, n);
  for (int64_t i = 0; i < n; ++i) q[i] = QuantizeInt8(x[i], scale);
  return scale;
}

// n values (n % 32 == 0) into n / 32 q8_0 blocks: each an f16 scale
// d = max|x| / 127 (rounded to f16), then round(x / d) clamped.
inline void QuantizeRowQ8_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n / kQ8Block; ++b) {
    const float* xb = x + b * kQ8Block;
    uint8_t* ob = out + b * kQ8BlockBytes;
    const uint16_t d16 = F32ToF16(Int8Scale(xb, kQ8Block));
    std::memcpy(ob, &d16, 2);
    const float d = F16ToF32(d16);
    for (int64_t i = 0; i < kQ8Block; ++i) {
      const int8_t q = QuantizeInt8(xb[i], d);
      std::memcpy(ob + 2 + i, &q, 1);
    }
  }
}

// n values stored as fp8 (e4m3 when `e4m3`, else e5m2): x / scale rounded
// to nearest even, saturating at the largest finite value.
inline void QuantizeRowFp8(const float* x, int64_t n, float scale, bool e4m3,
                           uint8_t* q) {
  for (int64_t i = 0; i < n; ++i) {
    q[i] = e4m3 ? F32ToE4M3(x[i] / scale) : F32ToE5M2(x[i] / scale);
  }
}

// Element i of a q8_0 row, dequantized (exactly, in f32: d * q has at most
// 11 + 8 significant bits).
inline float Q8_0Value(const uint8_t* row, int64_t i) {
  const uint8_t* block = row + i / kQ8Block * kQ8BlockBytes;
  uint16_t d;
  std::memcpy(&d, block, 2);
  const int8_t q = static_cast<int8_t>(block[2 + i % kQ8Block]);
  return F16ToF32(d) * static_cast<float>(q);
}

// Bytes of one q8_0 row of d values (d / 32 blocks).
inline int64_t Q8_0RowBytes(int64_t d) { return d / kQ8Block * kQ8BlockBytes; }

}  // namespace simdattn

#endif  // SIMDATTN_LIB_QUANT_H_
