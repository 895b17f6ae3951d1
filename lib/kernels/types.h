// Storage and mask kinds as the kernels see them: target-independent enums
// shared by the driver (lib/api.cc, lib/plan.cc) and every kernel file.

#ifndef SIMDATTN_LIB_KERNELS_TYPES_H_
#define SIMDATTN_LIB_KERNELS_TYPES_H_

#include <cstdint>

namespace simdattn {

// How a tensor's elements are stored. Math is always f32.
enum class Storage : int { kF32, kF16, kBF16 };

inline constexpr int64_t StorageBytes(Storage s) {
  return s == Storage::kF32 ? 4 : 2;
}

// The explicit mask of a call (SEMANTICS.md): none, boolean (uint8, 0 hides
// the key), or additive f32 / f16.
enum class MaskKind : int { kNone, kBool, kAddF32, kAddF16 };

}  // namespace simdattn

#endif  // SIMDATTN_LIB_KERNELS_TYPES_H_
