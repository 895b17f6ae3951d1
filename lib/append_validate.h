// Argument checking for AppendKv (serving.h): turns the public views into a
// validated AppendProblem or a Status naming the bad argument and value.

#ifndef SIMDATTN_LIB_APPEND_VALIDATE_H_
#define SIMDATTN_LIB_APPEND_VALIDATE_H_

#include <cstdint>

#include "simdattn/attention.h"
#include "simdattn/serving.h"

namespace simdattn {

// Extents of one validated AppendKv call.
struct AppendProblem {
  int64_t tokens = 0, kv_heads = 0, q_heads = 0;
  int64_t head_dim_k = 0, head_dim_v = 0;
  int64_t num_blocks = 0, block_size = 0;
  int64_t rotary_dim = 0;  // 0: no rotation
  bool rotate_q = false;   // q.data is set (then rotary_dim > 0)
};

// Checks every argument of AppendKv (SEMANTICS.md "Appending to a paged
// cache", "Quantized KV caches" and "Bad input"), reading slot_mapping and
// rotary.positions, and fills *p. Reads no K/V data and writes nothing. May throw std::bad_alloc
// (the duplicate-slot check sorts a copy of slot_mapping).
Status ValidateAppend(const TensorView& k_new, const TensorView& v_new,
                      const MutableTensorView& k_cache,
                      const MutableTensorView& v_cache,
                      const int32_t* slot_mapping,
                      const RotaryEmbedding& rotary,
                      const MutableTensorView& q,
                      const QuantizedCacheScales& scales, AppendProblem* p);

}  // namespace simdattn

#endif  // SIMDATTN_LIB_APPEND_VALIDATE_H_
