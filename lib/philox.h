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

}  // namespace simdattn

#endif  // SIMDATTN_LIB_PHILOX_H_
