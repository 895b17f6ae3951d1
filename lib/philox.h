// Philox4x32-10 counter-based random generator (Salmon et al., SC'11), scalar
// and header-only so the reference and every fast kernel share one definition.

#ifndef SIMDATTN_LIB_PHILOX_H_
#define SIMDATTN_LIB_PHILOX_H_

#include <cstdint>

namespace simdattn {

struct Philox4x32Counter {
  uint32_t v[4];
};

struct Philox4x32Key {
  uint32_t v[2];
};

namespace philox_internal {

constexpr uint32_t kMultiplier0 = 0xD2511F53u;
constexpr uint32_t kMultiplier1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1

// One Philox S-box round: two 32x32->64 multiplies, whose high halves are
// mixed with the other two counter words and the round key.
inline Philox4x32Counter Round(const Philox4x32Counter& c,
                               const Philox4x32Key& k) {
  const uint64_t p0 = static_cast<uint64_t>(kMultiplier0) * c.v[0];
  const uint64_t p1 = static_cast<uint64_t>(kMultiplier1) * c.v[2];
  const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32);
  const uint32_t lo0 = static_cast<uint32_t>(p0);
  const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32);
  const uint32_t lo1 = static_cast<uint32_t>(p1);
  Philox4x32Counter out;
  out.v[0] = hi1 ^ c.v[1] ^ k.v[0];
  out.v[1] = lo1;
  out.v[2] = hi0 ^ c.v[3] ^ k.v[1];
  out.v[3] = lo0;
  return out;
}

}  // namespace philox_internal

// Philox4x32 with 10 rounds; the key is bumped by the Weyl constants between
// rounds (9 bumps), exactly as Random123's philox4x32_R(10, ...).
inline Philox4x32Counter Philox4x32_10(Philox4x32Counter counter,
                                       Philox4x32Key key) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key.v[0] += philox_internal::kWeyl0;
      key.v[1] += philox_internal::kWeyl1;
    }
    counter = philox_internal::Round(counter, key);
  }
  return counter;
}

// Dropout draws (SEMANTICS.md's keep(b, h, i, j)). One Philox4x32-10 call
// gives the 16-bit draws of 8 consecutive keys of one (b, h, i): counter
// (j / 8, i, h, b), key (seed low, seed high), word (j % 8) / 2, its low half
// for even j and its high half for odd j. A key is kept when its draw is
// >= DropoutThreshold(p) = floor(p * 2^16), so the keep probability is
// 1 - floor(p * 2^16) / 2^16, within 2^-16 of 1 - p. Sixteen bits per key
// halve the generator's cost against one word per key.
constexpr int64_t kDropoutKeysPerCall = 8;

inline uint32_t DropoutThreshold(float p) {
  // p < 1, so the threshold is at most 65535; p = 0 gives 0: every key kept.
  return static_cast<uint32_t>(static_cast<double>(p) * 65536.0);
}

inline Philox4x32Counter DropoutCounter(int64_t b, int64_t h, int64_t i,
                                        int64_t j_group) {
  return {{static_cast<uint32_t>(j_group), static_cast<uint32_t>(i),
           static_cast<uint32_t>(h), static_cast<uint32_t>(b)}};
}

// The draw of key j from its group's Philox output.
inline uint32_t DropoutDraw(const Philox4x32Counter& out, int64_t j) {
  const int64_t k = j % kDropoutKeysPerCall;
  return (out.v[k / 2] >> (16 * (k % 2))) & 0xFFFFu;
}

}  // namespace simdattn

#endif  // SIMDATTN_LIB_PHILOX_H_
