// Storage and mask kinds as the kernels see them: target-independent enums
// shared by the driver (lib/api.cc, lib/plan.cc) and every kernel file.

#ifndef SIMDATTN_LIB_KERNELS_TYPES_H_
#define SIMDATTN_LIB_KERNELS_TYPES_H_

#include <cstdint>

namespace simdattn {

// How a tensor's elements are stored. Math is always f32. Q and O are
// f32, f16 or bf16; K and V any of these or a quantized format (kI8,
// kQ8_0, kE4M3, kE5M2: DType kInt8, kQ8_0, kFp8E4M3, kFp8E5M2), each its
// own. kMixed only ever appears as AttentionArgs::kv_type: K and V differ.
enum class Storage : int { kF32, kF16, kBF16, kI8, kQ8_0, kE4M3, kE5M2, kMixed };

// Bytes per stride unit: the element size, except q8_0, whose strides are
// in bytes.
inline constexpr int64_t StorageBytes(Storage s) {
  return s == Storage::kF32 ? 4 : (s == Storage::kF16 || s == Storage::kBF16) ? 2 : 1;
}

// f32, f16 or bf16: a type the kernels widen (or read) without a scale.
inline constexpr bool IsWideStorage(Storage s) {
  return s == Storage::kF32 || s == Storage::kF16 || s == Storage::kBF16;
}

// Bytes of one row of d values.
inline constexpr int64_t StorageRowBytes(Storage s, int64_t d) {
  return s == Storage::kQ8_0 ? d / 32 * 34 : d * StorageBytes(s);
}

// The explicit mask of a call (SEMANTICS.md): none, boolean (uint8, 0 hides
// the key), or additive f32 / f16.
enum class MaskKind : int { kNone, kBool, kAddF32, kAddF16 };

}  // namespace simdattn

#endif  // SIMDATTN_LIB_KERNELS_TYPES_H_
