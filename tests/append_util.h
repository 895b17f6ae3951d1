// Helpers of the AppendKv tests: typed buffers decoded and rounded by the
// test's own code (not lib/dtype.h), the buffers and views of one call, and
// a double-precision reference of what the call writes.

#ifndef SIMDATTN_TESTS_APPEND_UTIL_H_
#define SIMDATTN_TESTS_APPEND_UTIL_H_

#include <cstdint>
#include <random>
#include <vector>

#include "simdattn/serving.h"

namespace simdattn {
namespace test {

// x rounded to nearest even in `dtype`: Inf past the largest finite value,
// subnormals where the type has them, NaN and Inf unchanged.
double RoundTo(double x, DType dtype);

// The spacing of `dtype`'s values at magnitude |x| (finite x).
double UlpOf(double x, DType dtype);

// Elements of one storage type in bytes the test owns.
struct Storage {
  DType dtype = DType::kF32;
  std::vector<uint8_t> bytes;

  Storage() = default;
  Storage(DType dtype, int64_t count, uint8_t fill);
  int64_t size() const;
  // The element's value, decoded exactly.
  double Get(int64_t i) const;
  // Stores RoundTo(x, dtype).
  void Set(int64_t i, double x);
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
};

// One AppendKv call: shapes, dtypes, layout, rotary settings.
struct AppendCase {
  int64_t tokens = 6, kv_heads = 2, q_heads = 4, dk = 16, dv = 8;
  int64_t num_blocks = 4, block_size = 8;
  DType k_dtype = DType::kF32, v_dtype = DType::kF32;    // k_new, v_new
  DType kc_dtype = DType::kF32, vc_dtype = DType::kF32;  // the caches
  DType q_dtype = DType::kF32;
  bool nhd = true;        // cache layout [blocks, block_size, H, D], else HND
  int64_t row_pad = 0;    // extra elements per token row of k_new, v_new, q
  bool rotate = false;    // positions, cos and sin set
  bool with_q = false;    // q rotated in place (needs rotate)
  bool interleaved = false;
  int64_t rotary_dim = 0;  // as RotaryEmbedding::rotary_dim (0: dk)
  int64_t max_position = 40;
  // Values: small dyadic numbers whose rotation is exact in f32 (so that
  // results can be compared bit for bit), else uniform values and a real
  // RoPE table.
  bool exact_values = true;
  uint32_t seed = 1;
};

// The buffers of a call: inputs filled from the case's seed, caches filled
// with sentinel bytes, slots a random injective map with some -1 entries.
struct AppendData {
  AppendCase c;
  Storage k_new, v_new, q, k_cache, v_cache;
  std::vector<int32_t> slots, positions;
  std::vector<float> cos, sin;

  explicit AppendData(const AppendCase& c);

  // Element index of cache element (block, head, row, d), computed from the
  // layout independently of the library's view helpers.
  int64_t CacheIndex(int64_t block, int64_t h, int64_t row, int64_t d,
                     int64_t dim) const;
  // Element index of token t, head h, dim d of a token-major input.
  int64_t RowIndex(int64_t t, int64_t h, int64_t d, int64_t heads,
                   int64_t dim) const;

  TensorView KNew() const;
  TensorView VNew() const;
  MutableTensorView KCache();
  MutableTensorView VCache();
  MutableTensorView Q();
  RotaryEmbedding Rotary() const;
  Status Run(const ExecutionOptions& exec = {});
};

// The rotated value of dim d of a row (x[0..dim) in double), and the sum of
// |x| over the dims it reads, for the token at `position`.
double ReferenceDim(const AppendCase& c, const AppendData& data,
                    const std::vector<double>& x, int64_t d, int32_t position,
                    double* magnitude);

// Checks `after` against `before` run through the reference: each written
// cache row equals its token's (rotated) row rounded to the cache's type,
// every other cache byte is untouched, and q is rotated in place. Values
// only converted, and rotated ones with exact values, must match bit for
// bit; other rotated values within one unit of the storage type plus the
// f32 rounding of the rotation.
void ExpectAppended(const AppendData& before, const AppendData& after);

}  // namespace test
}  // namespace simdattn

#endif  // SIMDATTN_TESTS_APPEND_UTIL_H_
