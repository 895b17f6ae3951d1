// Helpers of the reference tests: dense views of small vectors, an identity
// V that makes each output row the row's attention weights, and
// VisibilityCase, which checks which keys each row sees.

#ifndef SIMDATTN_TESTS_REFERENCE_UTIL_H_
#define SIMDATTN_TESTS_REFERENCE_UTIL_H_

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "lib/reference.h"
#include "simdattn/attention.h"

namespace simdattn {
namespace test {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kTol = 1e-12;

// A dense BHSD f32 view of `data`, which must hold b*h*s*d floats.
inline TensorView Dense(const std::vector<float>& data, int64_t b,
                        int64_t h, int64_t s, int64_t d) {
  TensorView t;
  t.data = data.data();
  t.dtype = DType::kF32;
  t.shape[0] = b;
  t.shape[1] = h;
  t.shape[2] = s;
  t.shape[3] = d;
  t.strides[3] = 1;
  t.strides[2] = d;
  t.strides[1] = s * d;
  t.strides[0] = h * s * d;
  return t;
}

// The same for 16-bit storage (f16 or bf16 bit patterns).
inline TensorView Dense16(const std::vector<uint16_t>& data, DType dtype,
                          int64_t b, int64_t h, int64_t s, int64_t d) {
  TensorView t;
  t.data = data.data();
  t.dtype = dtype;
  t.shape[0] = b;
  t.shape[1] = h;
  t.shape[2] = s;
  t.shape[3] = d;
  t.strides[3] = 1;
  t.strides[2] = d;
  t.strides[1] = s * d;
  t.strides[0] = h * s * d;
  return t;
}

// Identity matrix as V [b, h, n, n]: output row i then equals the attention
// weights of row i, so a test can read the weights directly.
inline std::vector<float> IdentityV(int64_t b, int64_t h, int64_t n) {
  std::vector<float> v(static_cast<size_t>(b * h * n * n), 0.0f);
  for (int64_t bh = 0; bh < b * h; ++bh) {
    for (int64_t j = 0; j < n; ++j) v[static_cast<size_t>((bh * n + j) * n + j)] = 1.0f;
  }
  return v;
}

struct Result {
  Status status;
  std::vector<double> o;
  std::vector<double> lse;
};

inline Result RunReference(const TensorView& q, const TensorView& k,
                           const TensorView& v,
                           const AttentionOptions& options) {
  Result r;
  r.status = ReferenceAttention(q, k, v, options, &r.o, &r.lse);
  return r;
}

// A "zero keys, identity values" problem: every score is 0, so each row's
// output is 1/n on exactly the n keys it sees and 0 elsewhere. Lets a test
// state visibility as a predicate and check it cell by cell.
struct VisibilityCase {
  int64_t batch = 1, heads = 1, lq = 1, lk = 1, dk = 4;
  std::vector<float> q, k, v;
  VisibilityCase(int64_t b, int64_t h, int64_t lq_, int64_t lk_)
      : batch(b), heads(h), lq(lq_), lk(lk_) {
    q.assign(static_cast<size_t>(b * h * lq * dk), 1.0f);
    k.assign(static_cast<size_t>(b * h * lk * dk), 0.0f);
    v = IdentityV(b, h, lk);
  }
  Result Run(const AttentionOptions& options) const {
    return test::RunReference(Dense(q, batch, heads, lq, dk), Dense(k, batch, heads, lk, dk),
                     Dense(v, batch, heads, lk, lk), options);
  }
  // Checks o and lse against `sees(b, h, i, j)`.
  template <typename Pred>
  void Expect(const Result& r, Pred sees) const {
    ASSERT_TRUE(r.status.ok()) << r.status.message;
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t i = 0; i < lq; ++i) {
          int64_t n = 0;
          for (int64_t j = 0; j < lk; ++j) n += sees(b, h, i, j) ? 1 : 0;
          const int64_t row = (b * heads + h) * lq + i;
          for (int64_t j = 0; j < lk; ++j) {
            const double want = sees(b, h, i, j) ? 1.0 / n : 0.0;
            EXPECT_NEAR(r.o[row * lk + j], want, kTol)
                << "b=" << b << " h=" << h << " i=" << i << " j=" << j;
          }
          // All scores are 0, so LSE = log(n); log(0) = -inf for empty rows.
          if (n == 0) {
            EXPECT_EQ(r.lse[row], -kInf) << "b=" << b << " h=" << h << " i=" << i;
          } else {
            EXPECT_NEAR(r.lse[row], std::log(static_cast<double>(n)), kTol)
                << "b=" << b << " h=" << h << " i=" << i;
          }
        }
      }
    }
  }
};

}  // namespace test
}  // namespace simdattn

#endif  // SIMDATTN_TESTS_REFERENCE_UTIL_H_
