// AppendKv into quantized paged caches (int8 with its scale cache, q8_0,
// fp8 e4m3 / e5m2): every written row and scale has the bits QuantizeKv
// gives for the row AppendKv writes into an f32 cache (converted, K
// rotated), other slots stay untouched, NHD and HND; attention over the
// appended cache equals attention over QuantizeKv'd dense K/V; bad scales
// are kInvalidArgument naming the argument with nothing written.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/quant.h"
#include "simdattn/serving.h"

namespace simdattn {
namespace test {
namespace {

constexpr uint8_t kSentinel = 0xA5;
constexpr float kScaleSentinel = -7.0f;

// Bytes of one row of d values in `dtype` (q8_0: d / 32 blocks).
int64_t RowBytes(DType dtype, int64_t d) {
  return dtype == DType::kQ8_0 ? Q8_0RowBytes(d) : d * DTypeSize(dtype);
}

// One paged cache [num_blocks, H, block_size, d] in `dtype` (NHD or HND
// storage), its int8 scale cache [num_blocks, H, block_size, 1] laid out
// alike, and fp8's scale.
struct Cache {
  DType dtype = DType::kF32;
  int64_t num_blocks = 0, heads = 0, block_size = 0, d = 0;
  bool nhd = true;
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  float scale = 1.0f;

  Cache(DType t, int64_t nb, int64_t h, int64_t bs, int64_t dim, bool n)
      : dtype(t), num_blocks(nb), heads(h), block_size(bs), d(dim), nhd(n),
        bytes(static_cast<size_t>(nb * h * bs * RowBytes(t, dim)), kSentinel),
        scales(static_cast<size_t>(nb * h * bs), kScaleSentinel) {
    if (t == DType::kFp8E4M3) scale = 2.0f / 448.0f;
    if (t == DType::kFp8E5M2) scale = 0.5f;
  }
  // Index of slot (block, h, row) in units of rows.
  int64_t Slot(int64_t block, int64_t h, int64_t row) const {
    return nhd ? (block * block_size + row) * heads + h
               : (block * heads + h) * block_size + row;
  }
  const uint8_t* Row(int64_t block, int64_t h, int64_t row) const {
    return bytes.data() + Slot(block, h, row) * RowBytes(dtype, d);
  }
  MutableTensorView View() {
    MutableTensorView v;
    v.data = bytes.data();
    v.dtype = dtype;
    const int64_t unit = dtype == DType::kQ8_0 ? RowBytes(dtype, d) : d;
    const int64_t s[4] = {block_size * heads * unit, nhd ? unit : block_size * unit,
                          nhd ? heads * unit : unit, 1};
    const int64_t shape[4] = {num_blocks, heads, block_size, d};
    for (int i = 0; i < 4; ++i) v.shape[i] = shape[i], v.strides[i] = s[i];
    return v;
  }
  MutableTensorView ScalesView() {
    if (dtype != DType::kInt8) return {};
    MutableTensorView v;
    v.data = scales.data();
    const int64_t s[4] = {block_size * heads, nhd ? 1 : block_size, nhd ? heads : 1, 1};
    const int64_t shape[4] = {num_blocks, heads, block_size, 1};
    for (int i = 0; i < 4; ++i) v.shape[i] = shape[i], v.strides[i] = s[i];
    return v;
  }
  float FloatScale() const { return IsFp8() ? scale : 1.0f; }
  bool IsFp8() const { return dtype == DType::kFp8E4M3 || dtype == DType::kFp8E5M2; }
};

// The inputs of one call: token-major f32 K/V (and q), slots with skipped
// tokens, a RoPE table.
struct Inputs {
  int64_t tokens = 13, kv_heads = 2, q_heads = 4, dk = 64, dv = 32;
  int64_t num_blocks = 4, block_size = 8, max_position = 50;
  std::vector<float> k, v, q, cos, sin;
  std::vector<int32_t> slots, positions;

  explicit Inputs(uint32_t seed, bool special) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    k.resize(static_cast<size_t>(tokens * kv_heads * dk));
    v.resize(static_cast<size_t>(tokens * kv_heads * dv));
    q.resize(static_cast<size_t>(tokens * q_heads * dk));
    for (float& x : k) x = u(rng);
    for (float& x : v) x = u(rng);
    for (float& x : q) x = u(rng);
    cos.resize(static_cast<size_t>(max_position * dk / 2));
    sin.resize(cos.size());
    for (size_t i = 0; i < cos.size(); ++i) {
      cos[i] = std::cos(0.37f * static_cast<float>(i));
      sin[i] = std::sin(0.37f * static_cast<float>(i));
    }
    std::vector<int32_t> all(static_cast<size_t>(num_blocks * block_size));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    for (int64_t t = 0; t < tokens; ++t) {
      slots.push_back(t % 5 == 3 ? -1 : all[static_cast<size_t>(t)]);
      positions.push_back(static_cast<int32_t>(rng() % max_position));
    }
    // An all-zero row (int8 scale 0, q8_0 blocks with scale 0) and, when
    // `special`, values past fp8's range, a tiny row and a NaN.
    std::fill(v.begin(), v.begin() + dv, 0.0f);
    std::fill(k.begin() + dk, k.begin() + dk + 32, 0.0f);
    if (special) {
      v[dv * 2 + 1] = 1.0e6f;
      v[dv * 2 + 2] = -300.0f;
      for (int64_t i = 0; i < dv; ++i) v[dv * 3 + i] = 1e-6f * static_cast<float>(i);
      v[dv * 4 + 5] = std::numeric_limits<float>::quiet_NaN();
    }
  }
  TensorView KNew() const { return MakeTokenMajor(k.data(), DType::kF32, tokens, kv_heads, dk); }
  TensorView VNew() const { return MakeTokenMajor(v.data(), DType::kF32, tokens, kv_heads, dv); }
  RotaryEmbedding Rotary() const {
    RotaryEmbedding r;
    r.positions = positions.data();
    r.cos = cos.data();
    r.sin = sin.data();
    r.max_position = max_position;
    return r;
  }
};

// Appends `in` into caches of kd / vd (and rotates a copy of q), returns them.
struct Appended {
  Cache k, v;
  std::vector<float> q;
};

Appended Append(const Inputs& in, DType kd, DType vd, bool nhd, bool rotate) {
  Appended a{Cache(kd, in.num_blocks, in.kv_heads, in.block_size, in.dk, nhd),
             Cache(vd, in.num_blocks, in.kv_heads, in.block_size, in.dv, nhd), in.q};
  QuantizedCacheScales qs;
  qs.k_scales = a.k.ScalesView();
  qs.v_scales = a.v.ScalesView();
  qs.k_scale = a.k.FloatScale();
  qs.v_scale = a.v.FloatScale();
  const MutableTensorView q =
      rotate ? MakeTokenMajor(a.q.data(), DType::kF32, in.tokens, in.q_heads, in.dk)
             : MutableTensorView();
  const Status s = AppendKv(in.KNew(), in.VNew(), a.k.View(), a.v.View(), in.slots.data(),
                            rotate ? in.Rotary() : RotaryEmbedding(), q, {}, qs);
  EXPECT_TRUE(s.ok()) << s.message;
  return a;
}

// Every slot of `got` against QuantizeKv of the f32 cache `wide`: written
// slots bit for bit (rows and int8 scales), others untouched.
void ExpectQuantizedLike(Cache& wide, Cache& got, const std::vector<bool>& written) {
  Cache want(got.dtype, got.num_blocks, got.heads, got.block_size, got.d, got.nhd);
  want.scale = got.scale;
  const Status s = QuantizeKv(wide.View(), want.View(), want.ScalesView(), want.FloatScale());
  ASSERT_TRUE(s.ok()) << s.message;
  const int64_t row_bytes = RowBytes(got.dtype, got.d);
  for (int64_t b = 0; b < got.num_blocks; ++b) {
    for (int64_t h = 0; h < got.heads; ++h) {
      for (int64_t r = 0; r < got.block_size; ++r) {
        SCOPED_TRACE(::testing::Message() << "block " << b << " head " << h << " row " << r);
        const bool w = written[static_cast<size_t>(b * got.block_size + r)];
        const uint8_t* g = got.Row(b, h, r);
        const float gs = got.scales[static_cast<size_t>(got.Slot(b, h, r))];
        if (!w) {
          EXPECT_TRUE(std::all_of(g, g + row_bytes, [](uint8_t x) { return x == kSentinel; }));
          EXPECT_EQ(gs, kScaleSentinel);
          continue;
        }
        EXPECT_EQ(std::memcmp(g, want.Row(b, h, r), static_cast<size_t>(row_bytes)), 0);
        if (got.dtype == DType::kInt8) {
          const float ws = want.scales[static_cast<size_t>(want.Slot(b, h, r))];
          EXPECT_EQ(std::memcmp(&gs, &ws, 4), 0) << gs << " vs " << ws;
        } else {
          EXPECT_EQ(gs, kScaleSentinel);
        }
      }
    }
  }
}

constexpr DType kFormats[4] = {DType::kInt8, DType::kQ8_0, DType::kFp8E4M3,
                               DType::kFp8E5M2};

TEST(AppendKvQuantTest, WritesQuantizeKvBitsEveryFormatLayoutAndRotation) {
  uint32_t seed = 9100;
  for (DType fmt : kFormats) {
    for (bool nhd : {true, false}) {
      for (bool rotate : {false, true}) {
        SCOPED_TRACE(::testing::Message() << DTypeName(fmt) << (nhd ? " NHD" : " HND")
                                          << (rotate ? " rotated" : ""));
        const Inputs in(seed++, true);
        // K in fmt, V in the next format: mixed pairs too.
        const DType vfmt = kFormats[(std::find(kFormats, kFormats + 4, fmt) - kFormats + 1) % 4];
        Appended wide = Append(in, DType::kF32, DType::kF32, nhd, rotate);
        Appended got = Append(in, fmt, vfmt, nhd, rotate);
        std::vector<bool> written(static_cast<size_t>(in.num_blocks * in.block_size), false);
        for (int32_t slot : in.slots) {
          if (slot >= 0) written[static_cast<size_t>(slot)] = true;
        }
        ExpectQuantizedLike(wide.k, got.k, written);
        ExpectQuantizedLike(wide.v, got.v, written);
        EXPECT_EQ(got.q, wide.q);  // q rotated as for wide caches
      }
    }
  }
}

// Decode over one sequence appended in order: PagedAttention on the
// appended cache against Attention on K/V that QuantizeKv stored densely.
TEST(AppendKvQuantTest, AttentionOverAppendedCacheEqualsDenseQuantizeKv) {
  for (DType fmt : kFormats) {
    for (bool nhd : {true, false}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(fmt) << (nhd ? " NHD" : " HND"));
      Inputs in(77, false);
      // One sequence: token t in slot t (pages in order), no skipped token.
      for (int64_t t = 0; t < in.tokens; ++t) in.slots[t] = static_cast<int32_t>(t);
      Appended got = Append(in, fmt, fmt, nhd, false);
      // Dense [1, Hkv, tokens, D] quantized by QuantizeKv.
      Cache dk(fmt, 1, in.kv_heads, in.tokens, in.dk, false);
      Cache dv(fmt, 1, in.kv_heads, in.tokens, in.dv, false);
      ASSERT_TRUE(QuantizeKv(in.KNew(), dk.View(), dk.ScalesView(), got.k.FloatScale()).ok());
      ASSERT_TRUE(QuantizeKv(in.VNew(), dv.View(), dv.ScalesView(), got.v.FloatScale()).ok());
      const std::vector<float> q(in.q.begin(), in.q.begin() + in.q_heads * in.dk);
      const TensorView qv = MakeTokenMajor(q.data(), DType::kF32, 1, in.q_heads, in.dk);
      std::vector<float> o_paged(static_cast<size_t>(in.q_heads * in.dv), 1.0f);
      std::vector<float> o_dense(o_paged.size(), 2.0f);
      AttentionOptions po;
      po.k_scales = got.k.ScalesView();
      po.v_scales = got.v.ScalesView();
      po.k_scale = got.k.FloatScale();
      po.v_scale = got.v.FloatScale();
      const int32_t table[2] = {0, 1}, lens[1] = {static_cast<int32_t>(in.tokens)};
      PagedKvCache cache;
      cache.k = got.k.View();
      cache.v = got.v.View();
      cache.block_table = table;
      cache.max_blocks_per_seq = 2;
      cache.kv_lens = lens;
      Status s = PagedAttention(qv, cache, 1, nullptr,
                                MakeTokenMajor(o_paged.data(), DType::kF32, 1, in.q_heads, in.dv),
                                po);
      ASSERT_TRUE(s.ok()) << s.message;
      AttentionOptions dop;
      dop.k_scales = dk.ScalesView();
      dop.v_scales = dv.ScalesView();
      dop.k_scale = po.k_scale;
      dop.v_scale = po.v_scale;
      TensorView qd = qv;  // [1, Hq, 1, Dk]
      s = Attention(qd, dk.View(), dv.View(),
                    MakeTokenMajor(o_dense.data(), DType::kF32, 1, in.q_heads, in.dv), dop);
      ASSERT_TRUE(s.ok()) << s.message;
      for (size_t i = 0; i < o_paged.size(); ++i) {
        EXPECT_NEAR(o_paged[i], o_dense[i], 1e-6f * (1.0f + std::fabs(o_dense[i]))) << i;
      }
    }
  }
}

// A call that must fail: kInvalidArgument whose message has `want`, and
// neither cache nor scale cache changed.
struct BadCall {
  Inputs in{5, false};
  Cache k{DType::kInt8, 4, 2, 8, 64, true};
  Cache v{DType::kFp8E4M3, 4, 2, 8, 32, true};
  QuantizedCacheScales qs;
  BadCall() {
    qs.k_scales = k.ScalesView();
    qs.v_scale = 0.01f;
  }
  void Expect(const std::string& want) {
    const Cache k0 = k, v0 = v;
    const Status s = AppendKv(in.KNew(), in.VNew(), k.View(), v.View(), in.slots.data(), {},
                              {}, {}, qs);
    EXPECT_EQ(s.code, StatusCode::kInvalidArgument);
    EXPECT_NE(s.message.find(want), std::string::npos) << s.message;
    EXPECT_EQ(k.bytes, k0.bytes);
    EXPECT_EQ(k.scales, k0.scales);
    EXPECT_EQ(v.bytes, v0.bytes);
  }
};

TEST(AppendKvQuantTest, BadScalesNameTheArgumentAndWriteNothing) {
  {
    BadCall c;  // the good call, for reference
    const Status s = AppendKv(c.in.KNew(), c.in.VNew(), c.k.View(), c.v.View(),
                              c.in.slots.data(), {}, {}, {}, c.qs);
    ASSERT_TRUE(s.ok()) << s.message;
  }
  {
    BadCall c;
    c.qs.k_scales = {};
    c.Expect("k_scales.data is null");
  }
  {
    BadCall c;
    c.qs.v_scales = c.k.ScalesView();
    c.Expect("v_scales is set but v_cache.dtype = fp8_e4m3");
  }
  {
    BadCall c;
    c.qs.v_scale = 0.0f;
    c.Expect("v_scale = 0");
  }
  {
    BadCall c;
    c.qs.v_scale = std::numeric_limits<float>::infinity();
    c.Expect("v_scale = inf");
  }
  {
    BadCall c;
    c.qs.k_scale = 2.0f;
    c.Expect("k_scale = 2 but k_cache.dtype = int8");
  }
  {
    BadCall c;
    c.qs.k_scales.shape[2] = 4;
    c.Expect("k_scales.shape [4, 2, 4, 1] must be [4, 2, 8, 1]");
  }
  {
    BadCall c;
    c.qs.k_scales.dtype = DType::kF16;
    c.Expect("k_scales.dtype = f16: must be f32");
  }
  {
    BadCall c;
    c.qs.k_scales.strides[2] = 0;
    c.Expect("k_scales.strides make distinct slots share a scale");
  }
  {
    BadCall c;
    c.qs.k_scales.data = c.v.bytes.data();  // inside the V cache
    c.Expect("v_cache overlaps k_scales");
  }
  {
    BadCall c;
    c.qs.k_scales.data = const_cast<float*>(c.in.k.data());
    c.Expect("k_scales overlaps input k_new");
  }
  {
    BadCall c;  // q8_0 needs D % 32 == 0
    c.in.dv = 48;
    c.in.v.resize(static_cast<size_t>(c.in.tokens * c.in.kv_heads * 48));
    c.v = Cache(DType::kQ8_0, 4, 2, 8, 48, true);
    c.qs.v_scale = 1.0f;
    c.Expect("v_cache.shape[3] (Dv) = 48: q8_0 needs a multiple of 32");
  }
}

}  // namespace
}  // namespace test
}  // namespace simdattn
