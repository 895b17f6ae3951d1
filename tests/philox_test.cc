// Philox4x32-10 against the published Random123 known-answer vectors, and
// DropoutKeep's use of it (lib/philox.h): the documented counter, key and
// threshold, and decisions that vary with every index.

#include <cmath>
#include <cstdint>

#include "gtest/gtest.h"
#include "lib/philox.h"
#include "lib/reference.h"

namespace simdattn {
namespace test {
namespace {

Philox4x32Counter Ctr(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  return Philox4x32Counter{{a, b, c, d}};
}

void ExpectPhilox(const Philox4x32Counter& ctr, uint32_t k0, uint32_t k1,
                  const Philox4x32Counter& want) {
  const Philox4x32Counter got = Philox4x32_10(ctr, Philox4x32Key{{k0, k1}});
  for (int w = 0; w < 4; ++w) {
    EXPECT_EQ(got.v[w], want.v[w]) << "word " << w;
  }
}

// Random123's kat_vectors for philox4x32_10.
TEST(PhiloxTest, KnownAnswerZero) {
  ExpectPhilox(Ctr(0, 0, 0, 0), 0, 0,
               Ctr(0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8));
}

TEST(PhiloxTest, KnownAnswerAllOnes) {
  ExpectPhilox(Ctr(0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff), 0xffffffff,
               0xffffffff, Ctr(0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd));
}

TEST(PhiloxTest, KnownAnswerPi) {
  ExpectPhilox(Ctr(0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), 0xa4093822,
               0x299f31d0, Ctr(0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1));
}

// DropoutKeep's contract: key (seed low, seed high), counter (j/8, i, h, b),
// 16-bit draw j % 8 of the output (word (j % 8) / 2, low half first), kept
// when draw >= floor(p * 2^16).
TEST(DropoutKeepTest, UsesDocumentedCounterKeyAndThreshold) {
  const uint64_t seed = 0x0123456789abcdefull;
  const int64_t b = 3, h = 5, i = 7;
  for (int64_t j = 0; j < 20; ++j) {
    const Philox4x32Counter out =
        Philox4x32_10(Ctr(static_cast<uint32_t>(j / 8), 7, 5, 3),
                      Philox4x32Key{{0x89abcdefu, 0x01234567u}});
    const uint32_t word = out.v[(j % 8) / 2];
    const uint32_t draw = j % 2 == 0 ? word & 0xFFFFu : word >> 16;
    // p = draw / 2^16 (exact in float) has threshold draw: kept.
    const float p_at = static_cast<float>(draw) / 65536.0f;
    EXPECT_TRUE(DropoutKeep(seed, p_at, b, h, i, j)) << j;
    // One step of 2^-16 more drops it; any p just below keeps it.
    if (draw < 65535) {
      EXPECT_FALSE(DropoutKeep(seed, static_cast<float>(draw + 1) / 65536.0f, b, h, i, j)) << j;
    }
    if (draw > 0) {
      EXPECT_TRUE(DropoutKeep(seed, std::nextafter(static_cast<float>(draw + 1) / 65536.0f, 0.0f),
                              b, h, i, j)) << j;
      EXPECT_TRUE(DropoutKeep(seed, std::nextafter(p_at, 0.0f), b, h, i, j)) << j;
    }
    EXPECT_TRUE(DropoutKeep(seed, 0.0f, b, h, i, j)) << "p = 0 keeps all";
  }
  // The largest p below 1 still keeps draws of 65535.
  EXPECT_EQ(DropoutThreshold(std::nextafter(1.0f, 0.0f)), 65535u);
}

// Keep decisions along j differ between counter blocks (j / 8), words and
// their halves; along i, h and b they vary too (no accidental correlation).
TEST(DropoutKeepTest, VariesWithEveryIndex) {
  const uint64_t seed = 99;
  const float p = 0.5f;
  auto count_diff = [&](auto index_of) {
    int n = 0;
    for (int64_t t = 0; t < 256; ++t) {
      int64_t b0, h0, i0, j0, b1, h1, i1, j1;
      index_of(t, &b0, &h0, &i0, &j0, &b1, &h1, &i1, &j1);
      n += DropoutKeep(seed, p, b0, h0, i0, j0) != DropoutKeep(seed, p, b1, h1, i1, j1);
    }
    return n;
  };
  // Compare position t with position t shifted by one along each index.
  const int diff_j = count_diff([](int64_t t, int64_t* b0, int64_t* h0, int64_t* i0,
                                   int64_t* j0, int64_t* b1, int64_t* h1, int64_t* i1,
                                   int64_t* j1) {
    *b0 = *b1 = 0; *h0 = *h1 = 0; *i0 = *i1 = 0; *j0 = t; *j1 = t + 1;
  });
  const int diff_i = count_diff([](int64_t t, int64_t* b0, int64_t* h0, int64_t* i0,
                                   int64_t* j0, int64_t* b1, int64_t* h1, int64_t* i1,
                                   int64_t* j1) {
    *b0 = *b1 = 0; *h0 = *h1 = 0; *i0 = 0; *i1 = 1; *j0 = *j1 = t;
  });
  const int diff_h = count_diff([](int64_t t, int64_t* b0, int64_t* h0, int64_t* i0,
                                   int64_t* j0, int64_t* b1, int64_t* h1, int64_t* i1,
                                   int64_t* j1) {
    *b0 = *b1 = 0; *h0 = 0; *h1 = 1; *i0 = *i1 = 0; *j0 = *j1 = t;
  });
  const int diff_b = count_diff([](int64_t t, int64_t* b0, int64_t* h0, int64_t* i0,
                                   int64_t* j0, int64_t* b1, int64_t* h1, int64_t* i1,
                                   int64_t* j1) {
    *b0 = 0; *b1 = 1; *h0 = *h1 = 0; *i0 = *i1 = 0; *j0 = *j1 = t;
  });
  // Expected ~128 each for independent fair coins; 6 sd = 48.
  for (int d : {diff_j, diff_i, diff_h, diff_b}) {
    EXPECT_GT(d, 80);
    EXPECT_LT(d, 176);
  }
}

}  // namespace
}  // namespace test
}  // namespace simdattn
