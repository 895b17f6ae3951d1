// Scalar conversions between f32 and the 16-bit storage types (f16, bf16),
// exact for widening, round-to-nearest-even for narrowing; Inf and NaN kept.

#ifndef SIMDATTN_LIB_DTYPE_H_
#define SIMDATTN_LIB_DTYPE_H_

#include <cstdint>
#include <cstring>

namespace simdattn {

inline float BF16ToF32(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t F32ToBF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  const uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

inline float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  uint32_t u;
  if (exp == 0x1F) {  // Inf / NaN
    u = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {  // normal
    u = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {  // signed zero
    u = sign;
  } else {  // subnormal: mant * 2^-24, exact in f32
    float f = static_cast<float>(mant) * (1.0f / 16777216.0f);
    std::memcpy(&u, &f, 4);
    u |= sign;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t F32ToF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);  // NaN
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to Inf
  if (abs < 0x38800000u) {  // result is subnormal or zero: units of 2^-24
    float a;
    std::memcpy(&a, &abs, 4);
    // Exact: a * 2^24 < 2^10, and the float add rounds to nearest even.
    const float scaled = a * 16777216.0f;
    const float rounded = (scaled + 8388608.0f) - 8388608.0f;
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(rounded));
  }
  // Normal: rebias exponent, round mantissa to 10 bits (nearest even).
  const uint32_t rounding = 0xFFFu + ((abs >> 13) & 1u);
  const uint32_t r = (abs + rounding) >> 13;
  return static_cast<uint16_t>(sign | static_cast<uint16_t>(r - (112u << 10)));
}

}  // namespace simdattn

#endif  // SIMDATTN_LIB_DTYPE_H_
