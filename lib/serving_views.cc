// The view helpers of serving.h: token-major rows and paged caches as the
// logical 4-D views the serving calls take.

#include <cstdint>

#include "simdattn/serving.h"

namespace simdattn {
namespace {

template <class View, class Ptr>
View Strided(Ptr data, DType dtype, const int64_t (&shape)[4],
             const int64_t (&strides)[4]) {
  View v;
  v.data = data;
  v.dtype = dtype;
  for (int i = 0; i < 4; ++i) {
    v.shape[i] = shape[i];
    v.strides[i] = strides[i];
  }
  return v;
}

// [tokens, heads, d] storage as [1, heads, tokens, d].
template <class View, class Ptr>
View TokenMajor(Ptr data, DType dtype, int64_t tokens, int64_t heads,
                int64_t d) {
  return Strided<View>(data, dtype, {1, heads, tokens, d},
                       {tokens * heads * d, d, heads * d, 1});
}

// [num_blocks, block_size, heads, d] (nhd) or [num_blocks, heads,
// block_size, d] storage as [num_blocks, heads, block_size, d].
template <class View, class Ptr>
View Paged(Ptr data, DType dtype, int64_t num_blocks, int64_t block_size,
           int64_t heads, int64_t d, bool nhd) {
  const int64_t page = block_size * heads * d;
  if (nhd) {
    return Strided<View>(data, dtype, {num_blocks, heads, block_size, d},
                         {page, d, heads * d, 1});
  }
  return Strided<View>(data, dtype, {num_blocks, heads, block_size, d},
                       {page, block_size * d, d, 1});
}

}  // namespace

TensorView MakeTokenMajor(const void* data, DType dtype, int64_t tokens,
                          int64_t heads, int64_t d) {
  return TokenMajor<TensorView>(data, dtype, tokens, heads, d);
}
MutableTensorView MakeTokenMajor(void* data, DType dtype, int64_t tokens,
                                 int64_t heads, int64_t d) {
  return TokenMajor<MutableTensorView>(data, dtype, tokens, heads, d);
}
TensorView MakePagedNHD(const void* data, DType dtype, int64_t num_blocks,
                        int64_t block_size, int64_t heads, int64_t d) {
  return Paged<TensorView>(data, dtype, num_blocks, block_size, heads, d, true);
}
MutableTensorView MakePagedNHD(void* data, DType dtype, int64_t num_blocks,
                               int64_t block_size, int64_t heads, int64_t d) {
  return Paged<MutableTensorView>(data, dtype, num_blocks, block_size, heads, d,
                                  true);
}
TensorView MakePagedHND(const void* data, DType dtype, int64_t num_blocks,
                        int64_t block_size, int64_t heads, int64_t d) {
  return Paged<TensorView>(data, dtype, num_blocks, block_size, heads, d, false);
}
MutableTensorView MakePagedHND(void* data, DType dtype, int64_t num_blocks,
                               int64_t block_size, int64_t heads, int64_t d) {
  return Paged<MutableTensorView>(data, dtype, num_blocks, block_size, heads, d,
                                  false);
}

}  // namespace simdattn
