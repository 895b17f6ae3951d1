// Argument checking shared by Attention() and the reference: turns the
// public views into a validated Problem or a Status naming the bad argument.

#ifndef SIMDATTN_LIB_VALIDATE_H_
#define SIMDATTN_LIB_VALIDATE_H_

#include <cstdint>
#include <string>

#include "simdattn/attention.h"

namespace simdattn {

// ---------------------------------------------------------------- Views
// Helpers for every entry point that checks views.

// f32, f16 or bf16; IsQuantizedType: int8, q8_0, fp8 e4m3/e5m2; IsKvType:
// either (what K and V may be); KnownDType also allows bool.
bool IsStorageType(DType t);
bool IsQuantizedType(DType t);
bool IsKvType(DType t);
bool KnownDType(DType t);

// Byte range [lo, hi) touched by a view.
struct ByteRange {
  int64_t lo = 0;
  int64_t hi = 0;
};

// The bytes a view touches (extents <= 0 count as 1); false on int64
// overflow. A q8_0 view's strides[0..2] are in bytes and its rows
// shape[3] / 32 blocks of 34 bytes.
bool ComputeRange(const void* data, DType dtype, const int64_t* shape,
                  const int64_t* strides, ByteRange* r);
bool Overlap(const ByteRange& a, const ByteRange& b);

// True when distinct elements of the view share an address (an output must
// not write one address twice). Call after ComputeRange succeeded.
bool SelfOverlaps(const int64_t* shape, const int64_t* strides);

// The bytes of a view or an array as a set: base + sum of stride[i] * x_i
// (0 <= x_i < extent[i]) + [0, size), strides positive and descending
// (stride-0 and extent-1 dimensions dropped, negative strides flipped).
struct ByteSet {
  int64_t base = 0;
  int64_t size = 0;  // bytes of one element (an array: all of it)
  int num_dims = 0;
  int64_t stride[4] = {0, 0, 0, 0};  // bytes
  int64_t extent[4] = {0, 0, 0, 0};
};

// The bytes a view touches (call after ComputeRange succeeded); null data
// or a zero extent gives the empty set (size 0).
ByteSet ViewBytes(const void* data, DType dtype, const int64_t* shape,
                  const int64_t* strides);
// `count` elements of `elem_bytes` bytes from ptr (empty when null); a
// size past int64 saturates.
ByteSet ArrayBytes(const void* ptr, int64_t count, int64_t elem_bytes);

// Whether two sets share a byte: exact within a budget of 4096 steps,
// true past it. Views whose strides nest (each at least the span of the
// smaller ones: dense, padded, transposed, broadcast and interleaved
// layouts, e.g. Q and O or q, k and v as views of one buffer) take a few
// steps per dimension whatever their size; others are split into blocks.
bool SharesBytes(const ByteSet& a, const ByteSet& b);

// "[d0, d1, d2, d3]".
std::string ShapeString(const int64_t* shape);

// ---------------------------------------------------------------- Attention

// Extents and options of one validated call.
struct Problem {
  int64_t batch = 0, q_heads = 0, kv_heads = 0, q_len = 0, kv_len = 0;
  int64_t head_dim_qk = 0, head_dim_v = 0;
  int64_t group = 1;  // q_heads / kv_heads
  float scale = 1.0f;
  // Mask strides with broadcast dimensions set to 0 (valid when has_mask).
  bool has_mask = false;
  int64_t mask_strides[4] = {0, 0, 0, 0};
};

// Whether the call has per-batch valid key counts (in either type).
inline bool HasKvLengths(const AttentionOptions& options) {
  return options.kv_lengths != nullptr || options.kv_lengths_i32 != nullptr;
}

// The valid key count of batch b: kv_lengths[b] or kv_lengths_i32[b], or
// kv_len when neither is given.
inline int64_t KvLength(const AttentionOptions& options, int64_t b,
                        int64_t kv_len) {
  return options.kv_lengths != nullptr       ? options.kv_lengths[b]
         : options.kv_lengths_i32 != nullptr ? options.kv_lengths_i32[b]
                                             : kv_len;
}

// Checks Q, K, V and the options (SEMANTICS.md "Bad input") and fills *p.
Status ValidateInputs(const TensorView& q, const TensorView& k,
                      const TensorView& v, const AttentionOptions& options,
                      Problem* p);

// Checks O and the optional LSE against a validated problem, including that
// they overlap neither each other nor any input.
Status ValidateOutputs(const Problem& p, const TensorView& q,
                       const TensorView& k, const TensorView& v,
                       const AttentionOptions& options,
                       const MutableTensorView& o,
                       const MutableTensorView& lse);

}  // namespace simdattn

#endif  // SIMDATTN_LIB_VALIDATE_H_
