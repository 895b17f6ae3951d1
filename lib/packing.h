// Which prefill calls run against a packed copy of K/V (lib/api.cc). The
// automatic choice leaves small f32 groups in place; tests force each path
// so that both meet every shape.

#ifndef SIMDATTN_LIB_PACKING_H_
#define SIMDATTN_LIB_PACKING_H_

namespace simdattn {

enum class PackPolicy {
  kAuto,    // pack when it pays (16-bit K/V, or f32 blocks that read 1 MiB
            // or more of them)
  kAlways,  // pack every prefill call with several query blocks per group
  kNever,   // always read K/V in place
};

// Process-wide; for tests and experiments only.
void SetPackPolicy(PackPolicy policy);

}  // namespace simdattn

#endif  // SIMDATTN_LIB_PACKING_H_
