// Where a Highway target's function lies in a HWY_EXPORT table, for the
// dispatch tables that pick a target by name (lib/dispatch.cc) rather than
// by Highway's own chooser.

#ifndef SIMDATTN_LIB_EXPORT_INDEX_H_
#define SIMDATTN_LIB_EXPORT_INDEX_H_

#include <cstddef>
#include <cstdint>

#include "hwy/highway.h"

namespace simdattn {

// Highway's export table: entry 0 is its own chooser, entries
// 1..HWY_MAX_DYNAMIC_TARGETS the dynamic targets in ChosenTarget bit order,
// the last one SCALAR/EMU128. Returns the entry of `target_bit` (one bit of
// HWY_TARGETS), or -1 when this build does not compile that target.
inline int64_t ExportTableIndex(int64_t target_bit) {
  if ((target_bit & HWY_TARGETS) == 0) return -1;
  if (target_bit == HWY_SCALAR || target_bit == HWY_EMU128) {
    return HWY_MAX_DYNAMIC_TARGETS + 1;
  }
  const int64_t shifted = HWY_CHOSEN_TARGET_SHIFT(target_bit);
  if (shifted == 0) return -1;
  return static_cast<int64_t>(
      hwy::Num0BitsBelowLS1Bit_Nonzero64(static_cast<uint64_t>(shifted)));
}

}  // namespace simdattn

#endif  // SIMDATTN_LIB_EXPORT_INDEX_H_
