// Aliasing and overflow: SharesBytes against brute-force enumeration of
// random small views (never "apart" when they share a byte; exact whenever
// each view's strides nest), outputs interleaved with inputs in one buffer
// accepted, any shared element rejected naming both, and extents or strides
// whose element counts or byte offsets overflow int64 rejected naming the
// argument.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/reference.h"
#include "lib/validate.h"
#include "simdattn/attention.h"
#include "simdattn/serving.h"
#include "tests/test_util.h"

namespace simdattn {
namespace test {
namespace {

// Every byte offset (from `base`) that a view touches.
std::set<int64_t> Enumerate(int64_t base, int64_t size, const int64_t* shape,
                            const int64_t* strides) {
  std::set<int64_t> bytes;
  for (int64_t a = 0; a < shape[0]; ++a)
    for (int64_t b = 0; b < shape[1]; ++b)
      for (int64_t c = 0; c < shape[2]; ++c)
        for (int64_t d = 0; d < shape[3]; ++d) {
          const int64_t e = a * strides[0] + b * strides[1] + c * strides[2] + d * strides[3];
          for (int64_t i = 0; i < size; ++i) bytes.insert(base + e * size + i);
        }
  return bytes;
}

// Whether each dimension's stride covers the span of the smaller ones (the
// case SharesBytes decides exactly).
bool Nested(const ByteSet& s) {
  int64_t span = s.size;
  for (int i = s.num_dims - 1; i >= 0; --i) {
    if (s.stride[i] < span) return false;
    span += s.stride[i] * (s.extent[i] - 1);
  }
  return true;
}

struct RandomView {
  int64_t offset, shape[4], strides[4];
};

// A view of up to 4 x 3 x 3 x 4 elements with strides from nested layouts
// (dense, padded, interleaved), others at random, some 0 or negative.
RandomView MakeView(std::mt19937* rng) {
  std::uniform_int_distribution<int64_t> extent(1, 4), pick(0, 9), small(-6, 12);
  RandomView v;
  int64_t span = 1;
  for (int i = 3; i >= 0; --i) {
    v.shape[i] = std::min<int64_t>(extent(*rng), i == 1 || i == 2 ? 3 : 4);
    const int64_t kind = pick(*rng);
    v.strides[i] = kind < 6 ? span + kind % 3 * span  // nested: dense or spread
                   : kind < 8 ? small(*rng)
                   : kind == 8 ? 0 : -span;
    span += std::abs(v.strides[i]) * (v.shape[i] - 1);
  }
  v.offset = std::uniform_int_distribution<int64_t>(0, 40)(*rng);
  return v;
}

std::string Show(const RandomView& v) {
  std::string s = "+" + std::to_string(v.offset) + " shape";
  for (int64_t x : v.shape) s += " " + std::to_string(x);
  s += " strides";
  for (int64_t x : v.strides) s += " " + std::to_string(x);
  return s;
}

// Exact on every pair (small views stay within the step budget), nested
// or not; symmetric.
TEST(OverlapTest, SharesBytesMatchesEnumeration) {
  std::mt19937 rng(3100);
  const DType types[3] = {DType::kF32, DType::kF16, DType::kBool};
  std::vector<uint8_t> buffer(1 << 16);
  int exact = 0, shared = 0;
  for (int n = 0; n < 20000; ++n) {
    const RandomView a = MakeView(&rng), b = MakeView(&rng);
    const DType ta = types[n % 3], tb = types[(n / 3) % 3];
    // Bases in the middle of the buffer: negative strides stay inside.
    const uint8_t* base = buffer.data() + (1 << 15);
    const ByteSet sa = ViewBytes(base + a.offset, ta, a.shape, a.strides);
    const ByteSet sb = ViewBytes(base + b.offset, tb, b.shape, b.strides);
    const std::set<int64_t> ea = Enumerate(a.offset, DTypeSize(ta), a.shape, a.strides);
    const std::set<int64_t> eb = Enumerate(b.offset, DTypeSize(tb), b.shape, b.strides);
    std::vector<int64_t> common;
    std::set_intersection(ea.begin(), ea.end(), eb.begin(), eb.end(),
                          std::back_inserter(common));
    const bool truth = !common.empty();
    const bool answer = SharesBytes(sa, sb);
    ASSERT_EQ(answer, SharesBytes(sb, sa)) << "case " << n;
    ASSERT_EQ(answer, truth) << "case " << n << ": " << Show(a) << " and " << Show(b);
    if (Nested(sa) && Nested(sb)) {
      ASSERT_EQ(answer, truth) << "case " << n << ": " << Show(a) << " and " << Show(b);
      ++exact;
    }
    shared += truth;
  }
  EXPECT_GT(exact, 5000);  // pairs that nest (decided without splitting)
  EXPECT_GT(shared, 2000);
  EXPECT_LT(shared, 18000);
}

// Large views decide in a few steps when they nest (Q and O interleaved in
// one 4 GiB-sized address range: never dereferenced), and within the budget
// otherwise.
TEST(OverlapTest, LargeViewsDecideQuickly) {
  const int64_t b = 64, l = 4096, h = 32, d = 128;
  const int64_t shape[4] = {b, h, l, d};
  const int64_t strides[4] = {l * 2 * h * d, d, 2 * h * d, 1};
  const char* base = reinterpret_cast<const char*>(uintptr_t{1} << 40);
  const ByteSet q = ViewBytes(base, DType::kF16, shape, strides);
  const ByteSet o = ViewBytes(base + 2 * h * d, DType::kF16, shape, strides);
  EXPECT_FALSE(SharesBytes(q, o));
  const ByteSet o1 = ViewBytes(base + 2 * h * d - 2, DType::kF16, shape, strides);
  EXPECT_TRUE(SharesBytes(q, o1));
  // Rows of 3 elements every 2: not nested, decided (conservatively) within
  // the budget.
  const int64_t odd_shape[4] = {1, 1, int64_t{1} << 30, 3};
  const int64_t odd_strides[4] = {0, 0, 2, 1};
  const ByteSet odd = ViewBytes(base, DType::kF32, odd_shape, odd_strides);
  EXPECT_TRUE(SharesBytes(odd, o));
}

// Q and O as interleaved views of one buffer [B, L, 2, H, D]: Q in slot 0,
// O in slot 1, no element shared: accepted, and O equals the reference.
// Shifted by one element into Q's slot, or with Q's extent spilling into
// O's, it is rejected naming q.
TEST(OverlapTest, OutputInterleavedWithQueries) {
  const int64_t b = 2, l = 5, h = 3, d = 8;
  std::vector<float> qo(static_cast<size_t>(b * l * 2 * h * d));
  std::mt19937 rng(3200);
  std::uniform_real_distribution<float> u(-1, 1);
  for (float& x : qo) x = u(rng);
  std::vector<float> kv(static_cast<size_t>(b * h * l * d));
  for (float& x : kv) x = u(rng);
  TensorView q = MakeBSHD(qo.data(), DType::kF32, b, h, l, d);
  q.strides[0] = l * 2 * h * d;
  q.strides[2] = 2 * h * d;
  MutableTensorView o = MakeBSHD(qo.data() + h * d, DType::kF32, b, h, l, d);
  o.strides[0] = q.strides[0];
  o.strides[2] = q.strides[2];
  const TensorView k = MakeBHSD(kv.data(), DType::kF32, b, h, l, d);
  std::vector<double> ref;
  ASSERT_TRUE(ReferenceAttention(q, k, k, {}, &ref, nullptr).ok());
  const Status s = Attention(q, k, k, o, {});
  ASSERT_TRUE(s.ok()) << s.message;
  double err = 0;
  for (int64_t i = 0; i < b * h * l * d; ++i) {
    const int64_t bi = i / (h * l * d), hi = i / (l * d) % h, li = i / d % l, di = i % d;
    const float got = static_cast<const float*>(o.data)[bi * o.strides[0] + hi * o.strides[1] +
                                                        li * o.strides[2] + di];
    err = std::max(err, std::abs(got - ref[static_cast<size_t>(i)]));
  }
  EXPECT_LE(err, 2e-5);
  MutableTensorView shifted = o;
  shifted.data = qo.data() + h * d - 1;
  Status bad = Attention(q, k, k, shifted, {});
  EXPECT_EQ(bad.code, StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message.find("o overlaps input q"), std::string::npos) << bad.message;
  MutableTensorView lse = MakeBHSD(qo.data(), DType::kF32, b, h, l, 1);
  bad = Attention(q, k, k, MakeBHSD(std::vector<float>(qo.size()).data(), DType::kF32, b, h, l, d),
                  {}, lse);
  EXPECT_NE(bad.message.find("lse overlaps input q"), std::string::npos) << bad.message;
}

// Extents whose element count or byte offsets overflow int64: each named.
TEST(OverlapTest, OverflowNamesTheArgument) {
  std::vector<float> buf(1024);
  const TensorView q = MakeBHSD(buf.data(), DType::kF32, 1, 1, 4, 8);
  const TensorView k = MakeBHSD(buf.data() + 64, DType::kF32, 1, 1, 4, 8);
  std::vector<float> out(64);
  const MutableTensorView o = MakeBHSD(out.data(), DType::kF32, 1, 1, 4, 8);
  const int64_t big = int64_t{1} << 40;
  const struct {
    const char* want;
    int which;  // 0 q, 1 k, 2 v, 3 o, 4 mask
    int dim;
    int64_t extent, stride;
  } cases[] = {
      {"k.shape", 1, 2, big, 8},  // count overflows with Lk = 2^40 and B = 2^40
      {"v: offsets", 2, 1, 2, std::numeric_limits<int64_t>::max() / 2},
      {"o: offsets", 3, 2, 4, std::numeric_limits<int64_t>::max() / 3},
      {"mask: offsets", 4, 2, 4, std::numeric_limits<int64_t>::max() / 3},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.want);
    TensorView views[3] = {q, k, k};
    MutableTensorView out_view = o;
    AttentionOptions options;
    std::vector<uint8_t> mask(64, 1);
    if (c.which == 4) {
      options.mask = MakeBHSD(mask.data(), DType::kBool, 1, 1, 4, 4);
      options.mask.strides[c.dim] = c.stride;
    } else if (c.which == 3) {
      out_view.strides[c.dim] = c.stride;
    } else {
      views[c.which].shape[c.dim] = c.extent;
      views[c.which].strides[c.dim] = c.stride;
      if (c.which == 1) {
        views[1].shape[0] = big;
        views[2].shape[0] = big;
        views[2].shape[2] = big;
      }
    }
    const Status s = Attention(views[0], views[1], views[2], out_view, options);
    EXPECT_EQ(s.code, StatusCode::kInvalidArgument);
    EXPECT_NE(s.message.find(c.want), std::string::npos) << s.message;
    EXPECT_NE(s.message.find("overflow"), std::string::npos) << s.message;
  }
}

// 2^61 + 1 query heads (Q broadcast over them, O an f16 view that is
// never touched): the sinks' Hq x 4 bytes pass int64. Validation saturates
// the array's size instead of overflowing (UBSan would stop here) and
// finds O's 4 EiB over an input (the sinks, or Q where it lies above them).
TEST(OverlapTest, HeadCountPastInt64Bytes) {
  const int64_t hq = (int64_t{1} << 61) + 1;
  std::vector<float> q(1, 1.0f), kv(1, 1.0f), sinks(4, 0.0f);
  TensorView qv = MakeBHSD(q.data(), DType::kF32, 1, hq, 1, 1);
  qv.strides[0] = qv.strides[1] = qv.strides[2] = 0;
  const TensorView kvv = MakeBHSD(kv.data(), DType::kF32, 1, 1, 1, 1);
  const MutableTensorView o = MakeBHSD(reinterpret_cast<uint16_t*>(sinks.data()) + 2,
                                       DType::kF16, 1, hq, 1, 1);
  AttentionOptions options;
  options.sinks = sinks.data();
  const Status s = Attention(qv, kvv, kvv, o, options);
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument);
  EXPECT_NE(s.message.find("o overlaps input"), std::string::npos) << s.message;
}

// A block table row of 2^59 pages of 16 keys: its capacity in keys passes
// int64. Validation must not overflow (UBSan would stop here), and since
// only the pages a sequence uses are read, the call either runs or names
// the table (its declared extent reaches the output).
TEST(OverlapTest, PagedCapacityPastInt64) {
  std::vector<float> k(2 * 16 * 8, 0.5f), v(2 * 16 * 8, 0.25f), q(8, 1.0f), o(8, -7.0f);
  const std::vector<int32_t> table = {1}, kv_lens = {16};
  PagedKvCache cache;
  cache.k = MakePagedNHD(k.data(), DType::kF32, 2, 16, 1, 8);
  cache.v = MakePagedNHD(v.data(), DType::kF32, 2, 16, 1, 8);
  cache.block_table = table.data();
  cache.max_blocks_per_seq = int64_t{1} << 59;
  cache.kv_lens = kv_lens.data();
  const Status s = PagedAttention(MakeTokenMajor(q.data(), DType::kF32, 1, 1, 8), cache, 1,
                                   nullptr, MakeTokenMajor(o.data(), DType::kF32, 1, 1, 8));
  if (s.ok()) {
    for (float x : o) EXPECT_NEAR(x, 0.25f, 1e-6);
  } else {
    EXPECT_EQ(s.code, StatusCode::kInvalidArgument);
    EXPECT_NE(s.message.find("block_table"), std::string::npos) << s.message;
    for (float x : o) EXPECT_EQ(x, -7.0f);
  }
}

}  // namespace
}  // namespace test
}  // namespace simdattn
