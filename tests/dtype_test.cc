// Tests of the scalar f16/bf16 conversions in lib/dtype.h: exhaustive over all
// 16-bit patterns, checked against closed-form decodings and against the
// round-to-nearest-even definition rather than against another converter.

#include "lib/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace simdattn {
namespace test {
namespace {

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE binary16 decoded from its fields: (-1)^s * 2^(e-15) * 1.m, or
// 2^-14 * 0.m for e = 0.
double DecodeF16(uint16_t h) {
  const int sign = (h >> 15) & 1;
  const int exp = (h >> 10) & 0x1F;
  const int mant = h & 0x3FF;
  double mag;
  if (exp == 0x1F) {
    mag = mant == 0 ? std::numeric_limits<double>::infinity()
                    : std::numeric_limits<double>::quiet_NaN();
  } else if (exp == 0) {
    mag = std::ldexp(static_cast<double>(mant), -24);
  } else {
    mag = std::ldexp(static_cast<double>(1024 + mant), exp - 25);
  }
  return sign ? -mag : mag;
}

// bfloat16: 8 exponent bits (bias 127), 7 mantissa bits.
double DecodeBF16(uint16_t h) {
  const int sign = (h >> 15) & 1;
  const int exp = (h >> 7) & 0xFF;
  const int mant = h & 0x7F;
  double mag;
  if (exp == 0xFF) {
    mag = mant == 0 ? std::numeric_limits<double>::infinity()
                    : std::numeric_limits<double>::quiet_NaN();
  } else if (exp == 0) {
    mag = std::ldexp(static_cast<double>(mant), -133);  // 2^-126 * m / 128
  } else {
    mag = std::ldexp(static_cast<double>(128 + mant), exp - 134);
  }
  return sign ? -mag : mag;
}

bool IsNanF16(uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0; }
bool IsNanBF16(uint16_t h) { return (h & 0x7F80) == 0x7F80 && (h & 0x7F) != 0; }

// ---------------------------------------------------------------- f16

TEST(DTypeTest, F16ToF32MatchesFieldDecodingForAllPatterns) {
  for (uint32_t x = 0; x < 65536; ++x) {
    const uint16_t h = static_cast<uint16_t>(x);
    const float f = F16ToF32(h);
    const double want = DecodeF16(h);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << x;
      EXPECT_EQ(std::signbit(f), (x & 0x8000) != 0) << std::hex << x;
    } else {
      EXPECT_EQ(static_cast<double>(f), want) << std::hex << x;
      // Also the sign of zero.
      EXPECT_EQ(std::signbit(f), (x & 0x8000) != 0) << std::hex << x;
    }
  }
}

TEST(DTypeTest, F16InfAndNanWidenToInfAndNan) {
  // Exponent 31 must not be treated as a normal exponent (65536 bug).
  EXPECT_EQ(F16ToF32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(F16ToF32(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(F16ToF32(0x7E00)));
  EXPECT_TRUE(std::isnan(F16ToF32(0x7C01)));  // signalling pattern
  EXPECT_EQ(F16ToF32(0x7BFF), 65504.0f);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(F16ToF32(0x03FF), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(F16ToF32(0x0400), std::ldexp(1.0f, -14));  // smallest normal
}

TEST(DTypeTest, F16RoundTripIsIdentityForAllNonNan) {
  for (uint32_t x = 0; x < 65536; ++x) {
    const uint16_t h = static_cast<uint16_t>(x);
    const uint16_t back = F32ToF16(F16ToF32(h));
    if (IsNanF16(h)) {
      EXPECT_TRUE(IsNanF16(back)) << std::hex << x << " -> " << back;
      EXPECT_EQ(back & 0x8000, h & 0x8000) << std::hex << x;
    } else {
      EXPECT_EQ(back, h) << std::hex << x;
    }
  }
}

// For every pair of adjacent finite f16 values (including subnormals and the
// 0 / 2^-24 pair), the exact midpoint (representable in f32: 12 significant
// bits) rounds to the one with an even mantissa, and its f32 neighbours round
// to the nearer value.
TEST(DTypeTest, F32ToF16RoundsToNearestEvenAtEveryMidpoint) {
  for (uint32_t lo = 0; lo < 0x7BFF; ++lo) {
    const uint16_t hi = static_cast<uint16_t>(lo + 1);
    const double mid = 0.5 * (DecodeF16(static_cast<uint16_t>(lo)) + DecodeF16(hi));
    const float m = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(m), mid) << std::hex << lo;
    const uint16_t even = (lo & 1) == 0 ? static_cast<uint16_t>(lo) : hi;
    for (uint16_t sign : {uint16_t{0}, uint16_t{0x8000}}) {
      const float s = sign ? -1.0f : 1.0f;
      EXPECT_EQ(F32ToF16(s * m), even | sign) << std::hex << lo;
      EXPECT_EQ(F32ToF16(s * std::nextafter(m, 0.0f)), lo | sign) << std::hex << lo;
      EXPECT_EQ(F32ToF16(s * std::nextafter(m, 1e9f)), hi | sign) << std::hex << lo;
    }
  }
}

TEST(DTypeTest, F32ToF16OverflowUnderflowAndSpecials) {
  const float inf = std::numeric_limits<float>::infinity();
  // 65520 is the midpoint of 65504 (odd mantissa 0x3FF) and 2^16: ties to
  // even go to Inf; anything below stays at the largest finite value.
  EXPECT_EQ(F32ToF16(65504.0f), 0x7BFF);
  EXPECT_EQ(F32ToF16(std::nextafter(65520.0f, 0.0f)), 0x7BFF);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7C00);
  EXPECT_EQ(F32ToF16(-65520.0f), 0xFC00);
  EXPECT_EQ(F32ToF16(1e10f), 0x7C00);
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::max()), 0x7C00);
  EXPECT_EQ(F32ToF16(inf), 0x7C00);
  EXPECT_EQ(F32ToF16(-inf), 0xFC00);
  // 2^-25 is the midpoint of 0 and 2^-24: ties to even (0).
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(F32ToF16(-std::ldexp(1.0f, -25)), 0x8000);
  EXPECT_EQ(F32ToF16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(F32ToF16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp -> even 2
  // f32 subnormals and tiny normals flush to signed zero.
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(F32ToF16(-std::numeric_limits<float>::min()), 0x8000);
  EXPECT_EQ(F32ToF16(0.0f), 0x0000);
  EXPECT_EQ(F32ToF16(-0.0f), 0x8000);
  // NaN stays NaN (never Inf), whatever its payload, with its sign.
  for (uint32_t u : {0x7FC00000u, 0x7F800001u, 0x7F802000u, 0xFF800001u,
                     0x7FFFFFFFu}) {
    const uint16_t h = F32ToF16(FromBits(u));
    EXPECT_TRUE(IsNanF16(h)) << std::hex << u << " -> " << h;
    EXPECT_EQ((h & 0x8000) != 0, (u & 0x80000000u) != 0) << std::hex << u;
  }
}

// A sweep over f32 bit patterns (every 251st, all exponents and signs): the
// result is a nearest f16, with ties to even.
TEST(DTypeTest, F32ToF16IsNearestOnSweep) {
  for (uint64_t u64 = 0; u64 < (1ull << 32); u64 += 251) {
    const uint32_t u = static_cast<uint32_t>(u64);
    const float f = FromBits(u);
    const uint16_t h = F32ToF16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(IsNanF16(h)) << std::hex << u;
      continue;
    }
    const double x = std::fabs(static_cast<double>(f));
    const uint16_t mag = h & 0x7FFF;
    ASSERT_EQ((h & 0x8000) != 0, std::signbit(f)) << std::hex << u;
    if (x >= 65520.0) {
      ASSERT_EQ(mag, 0x7C00) << std::hex << u;
      continue;
    }
    ASSERT_LT(mag, 0x7C00) << std::hex << u;
    const double err = std::fabs(x - DecodeF16(mag));
    if (mag > 0) {
      const double err_down = std::fabs(x - DecodeF16(static_cast<uint16_t>(mag - 1)));
      ASSERT_TRUE(err < err_down || (err == err_down && (mag & 1) == 0)) << std::hex << u;
    }
    if (mag < 0x7BFF) {
      const double err_up = std::fabs(x - DecodeF16(static_cast<uint16_t>(mag + 1)));
      ASSERT_TRUE(err < err_up || (err == err_up && (mag & 1) == 0)) << std::hex << u;
    }
  }
}

// ---------------------------------------------------------------- bf16

TEST(DTypeTest, BF16ToF32MatchesFieldDecodingForAllPatterns) {
  for (uint32_t x = 0; x < 65536; ++x) {
    const uint16_t h = static_cast<uint16_t>(x);
    const float f = BF16ToF32(h);
    const double want = DecodeBF16(h);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << x;
    } else {
      EXPECT_EQ(static_cast<double>(f), want) << std::hex << x;
    }
    EXPECT_EQ(std::signbit(f), (x & 0x8000) != 0) << std::hex << x;
  }
}

TEST(DTypeTest, BF16RoundTripIsIdentityForAllNonNan) {
  for (uint32_t x = 0; x < 65536; ++x) {
    const uint16_t h = static_cast<uint16_t>(x);
    const uint16_t back = F32ToBF16(BF16ToF32(h));
    if (IsNanBF16(h)) {
      EXPECT_TRUE(IsNanBF16(back)) << std::hex << x << " -> " << back;
      EXPECT_EQ(back & 0x8000, h & 0x8000) << std::hex << x;
    } else {
      EXPECT_EQ(back, h) << std::hex << x;
    }
  }
}

// Every adjacent pair of finite bf16 values (subnormals included): the f32
// midpoint (bits lo << 16 | 0x8000) ties to the even one, its neighbours go to
// the nearer one. The last pair (max finite, Inf) rounds its midpoint to Inf.
TEST(DTypeTest, F32ToBF16RoundsToNearestEvenAtEveryMidpoint) {
  for (uint32_t lo = 0; lo < 0x7F80; ++lo) {
    const uint16_t hi = static_cast<uint16_t>(lo + 1);
    const uint32_t mid_bits = (lo << 16) | 0x8000u;
    ASSERT_EQ(static_cast<double>(FromBits(mid_bits)),
              0.5 * (DecodeBF16(static_cast<uint16_t>(lo)) +
                     (hi == 0x7F80 ? std::ldexp(1.0, 128) : DecodeBF16(hi))));
    const uint16_t even = (lo & 1) == 0 ? static_cast<uint16_t>(lo) : hi;
    for (uint32_t sign : {0u, 0x80000000u}) {
      const uint16_t s16 = static_cast<uint16_t>(sign >> 16);
      EXPECT_EQ(F32ToBF16(FromBits(sign | mid_bits)), even | s16) << std::hex << lo;
      EXPECT_EQ(F32ToBF16(FromBits(sign | (mid_bits - 1))), lo | s16) << std::hex << lo;
      EXPECT_EQ(F32ToBF16(FromBits(sign | (mid_bits + 1))), hi | s16) << std::hex << lo;
    }
  }
}

TEST(DTypeTest, F32ToBF16Specials) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(F32ToBF16(inf), 0x7F80);
  EXPECT_EQ(F32ToBF16(-inf), 0xFF80);
  EXPECT_EQ(F32ToBF16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up
  EXPECT_EQ(F32ToBF16(0.0f), 0x0000);
  EXPECT_EQ(F32ToBF16(-0.0f), 0x8000);
  EXPECT_EQ(F32ToBF16(1.0f), 0x3F80);
  EXPECT_EQ(F32ToBF16(FromBits(0x3F808000u)), 0x3F80);  // tie, even stays
  EXPECT_EQ(F32ToBF16(FromBits(0x3F818000u)), 0x3F82);  // tie, odd rounds up
  // A NaN whose payload lives only in the low 16 bits must not truncate to
  // Inf; the sign is kept.
  for (uint32_t u : {0x7F800001u, 0xFF800001u, 0x7FC00000u, 0x7FFFFFFFu,
                     0x7F80FFFFu}) {
    const uint16_t h = F32ToBF16(FromBits(u));
    EXPECT_TRUE(IsNanBF16(h)) << std::hex << u << " -> " << h;
    EXPECT_EQ((h & 0x8000) != 0, (u & 0x80000000u) != 0) << std::hex << u;
  }
}

}  // namespace
}  // namespace test
}  // namespace simdattn
