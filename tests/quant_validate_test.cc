// Bad input of quantized K/V (SEMANTICS.md "Quantized KV caches"): scales
// required exactly where a format needs them, their shapes and values,
// q8_0's head dims and byte strides, outputs overlapping the scales; each
// error names the argument and nothing is written.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/quant.h"
#include "simdattn/attention.h"
#include "simdattn/serving.h"

namespace simdattn {
namespace {

// A valid call (B2 Hq4 Hkv2 Lq3 Lk5 D64) with int8 K, q8_0 V.
struct QuantCall {
  std::vector<float> q, o, k_scales;
  std::vector<int8_t> k;
  std::vector<uint8_t> v;
  TensorView qv, kv, vv;
  MutableTensorView ov;
  AttentionOptions options;

  QuantCall() {
    q.assign(2 * 4 * 3 * 64, 0.25f);
    k.assign(2 * 2 * 5 * 64, 3);
    v.assign(2 * 2 * 5 * 2 * 34, 0);
    // 20 scales, in a buffer as large as o: a test that moves o onto the
    // scales overlaps them and nothing else, wherever the heap put q.
    k_scales.assign(2 * 4 * 3 * 64, 0.01f);
    o.assign(2 * 4 * 3 * 64, -7.0f);
    qv = MakeBHSD(q.data(), DType::kF32, 2, 4, 3, 64);
    kv = MakeBHSD(k.data(), DType::kInt8, 2, 2, 5, 64);
    vv = MakeBHSD(v.data(), DType::kQ8_0, 2, 2, 5, 64);
    for (int i = 0; i < 3; ++i) vv.strides[i] *= 34;  // bytes
    for (int i = 0; i < 3; ++i) vv.strides[i] /= 32;
    ov = MakeBHSD(o.data(), DType::kF32, 2, 4, 3, 64);
    options.k_scales = MakeBHSD(k_scales.data(), DType::kF32, 2, 2, 5, 1);
  }

  Status Run() { return Attention(qv, kv, vv, ov, options); }
  bool OutputsUntouched() const {
    for (float x : o) if (x != -7.0f) return false;
    return true;
  }
};

void ExpectInvalid(QuantCall& c, const std::string& needle) {
  const Status s = c.Run();
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument) << s.message;
  EXPECT_NE(s.message.find(needle), std::string::npos)
      << "message '" << s.message << "' should mention '" << needle << "'";
  EXPECT_TRUE(c.OutputsUntouched());
}

TEST(QuantValidateTest, ValidCallRuns) {
  QuantCall c;
  const Status s = c.Run();
  EXPECT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(std::string(DTypeName(DType::kQ8_0)), "q8_0");
  EXPECT_EQ(DTypeSize(DType::kQ8_0), 34);
  EXPECT_EQ(DTypeSize(DType::kFp8E5M2), 1);
}

TEST(QuantValidateTest, ScalesRequiredExactlyWhereNeeded) {
  { QuantCall c; c.options.k_scales = {}; ExpectInvalid(c, "k_scales.data is null"); }
  {
    QuantCall c;
    c.options.v_scales = c.options.k_scales;
    ExpectInvalid(c, "v_scales is set but v.dtype = q8_0");
  }
  { QuantCall c; c.options.k_scale = 2.0f; ExpectInvalid(c, "k_scale = 2 but k.dtype = int8"); }
  {
    QuantCall c;
    c.vv.dtype = DType::kFp8E4M3;
    c.vv = MakeBHSD(c.v.data(), DType::kFp8E4M3, 2, 2, 5, 64);
    c.options.v_scale = std::numeric_limits<float>::infinity();
    ExpectInvalid(c, "v_scale = inf: must be finite and >= 0");
    c.options.v_scale = -1.0f;
    ExpectInvalid(c, "v_scale = -1");
    c.options.v_scale = 0.0f;
    EXPECT_TRUE(c.Run().ok());
  }
}

TEST(QuantValidateTest, ScaleViews) {
  {
    QuantCall c;
    c.options.k_scales.shape[2] = 4;
    ExpectInvalid(c, "k_scales.shape [2, 2, 4, 1] must be [B, Hkv, Lk, 1] = [2, 2, 5, 1]");
  }
  { QuantCall c; c.options.k_scales.dtype = DType::kF16; ExpectInvalid(c, "k_scales.dtype = f16"); }
  {
    QuantCall c;  // broadcast strides are fine
    c.options.k_scales.strides[0] = 0;
    c.options.k_scales.strides[1] = 0;
    EXPECT_TRUE(c.Run().ok());
  }
  {
    QuantCall c;  // O over the scales
    c.ov.data = c.k_scales.data();
    ExpectInvalid(c, "o overlaps input k_scales");
  }
}

TEST(QuantValidateTest, Q8_0Views) {
  {
    QuantCall c;
    c.qv.shape[3] = c.kv.shape[3] = 40;
    c.vv.shape[3] = c.ov.shape[3] = 40;
    ExpectInvalid(c, "v.shape[3] (Dv) = 40: q8_0 needs a multiple of 32");
  }
  { QuantCall c; c.vv.strides[3] = 34; ExpectInvalid(c, "v.strides[3] = 34"); }
  { QuantCall c; c.qv.dtype = DType::kQ8_0; ExpectInvalid(c, "q.dtype = q8_0"); }
}

// The scalar conversions: every fp8 code round-trips, RNE between codes,
// saturation at the largest finite value, NaN kept.
TEST(QuantFormatTest, Fp8RoundTripAndSaturation) {
  for (int b = 0; b < 256; ++b) {
    const uint8_t code = static_cast<uint8_t>(b);
    const float e4 = E4M3ToF32(code), e5 = E5M2ToF32(code);
    if (std::isnan(e4)) {
      EXPECT_EQ(code & 0x7F, 0x7F);
    } else {
      EXPECT_EQ(F32ToE4M3(e4), code == 0x80 ? 0x80 : code) << b;
    }
    if (!std::isnan(e5) && !std::isinf(e5)) EXPECT_EQ(F32ToE5M2(e5), code) << b;
  }
  EXPECT_EQ(E4M3ToF32(0x7E), 448.0f);
  EXPECT_EQ(E4M3ToF32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(E5M2ToF32(0x7B), 57344.0f);
  EXPECT_EQ(E5M2ToF32(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(F32ToE4M3(1000.0f), 0x7E);
  EXPECT_EQ(F32ToE4M3(-1e30f), 0xFE);
  EXPECT_EQ(F32ToE4M3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(F32ToE5M2(1e6f), 0x7B);
  EXPECT_EQ(F32ToE4M3(std::nanf("")) & 0x7F, 0x7F);
  // Ties to even: 1 + 1/16 lies between 1 (0x38) and 1.125 (0x39).
  EXPECT_EQ(F32ToE4M3(1.0625f), 0x38);
  EXPECT_EQ(F32ToE4M3(1.1875f), 0x3A);
  // Subnormal tie: 1.5 x 2^-9 rounds to 2 x 2^-9.
  EXPECT_EQ(F32ToE4M3(1.5f * std::ldexp(1.0f, -9)), 0x02);
}

TEST(QuantFormatTest, Int8AndQ8_0) {
  const float x[32] = {1.0f, -2.54f, 0.5f, 0.0f, 2.54f};
  int8_t q[32];
  const float scale = QuantizeRowInt8(x, 32, q);
  EXPECT_EQ(scale, 2.54f / 127.0f);
  EXPECT_EQ(q[1], -127);
  EXPECT_EQ(q[4], 127);
  EXPECT_EQ(q[0], 50);
  uint8_t block[34];
  QuantizeRowQ8_0(x, 32, block);
  EXPECT_NEAR(Q8_0Value(block, 1), -2.54f, 2.54f / 127.0f);
  EXPECT_EQ(Q8_0Value(block, 3), 0.0f);
  const float zeros[32] = {};
  QuantizeRowQ8_0(zeros, 32, block);
  EXPECT_EQ(Q8_0Value(block, 5), 0.0f);
  float bad[4] = {1.0f, std::nanf(""), 0.0f, 0.0f};
  EXPECT_TRUE(std::isnan(QuantizeRowInt8(bad, 4, q)));
}

// QuantizeKv: the rows of x in each format as lib/quant.h stores them,
// and its errors name the argument with nothing written.
TEST(QuantizeKvTest, RowsAndErrors) {
  float x[2 * 64];
  for (int i = 0; i < 128; ++i) x[i] = 0.03f * static_cast<float>(i) - 2.0f;
  const TensorView xv = MakeBHSD(x, DType::kF32, 1, 1, 2, 64);
  int8_t q[128];
  float scales[2] = {-1.0f, -1.0f};
  ASSERT_TRUE(QuantizeKv(xv, MakeBHSD(q, DType::kInt8, 1, 1, 2, 64),
                         MakeBHSD(scales, DType::kF32, 1, 1, 2, 1)).ok());
  int8_t want[64];
  EXPECT_EQ(scales[1], QuantizeRowInt8(x + 64, 64, want));
  EXPECT_EQ(std::memcmp(q + 64, want, 64), 0);
  uint8_t blocks[2 * 68], want_blocks[68];
  MutableTensorView bv = MakeBHSD(blocks, DType::kQ8_0, 1, 1, 2, 64);
  bv.strides[2] = 68;
  bv.strides[1] = bv.strides[0] = 136;
  ASSERT_TRUE(QuantizeKv(xv, bv).ok());
  QuantizeRowQ8_0(x + 64, 64, want_blocks);
  EXPECT_EQ(std::memcmp(blocks + 68, want_blocks, 68), 0);
  uint8_t f8[128] = {};
  const Status s = QuantizeKv(xv, MakeBHSD(f8, DType::kFp8E4M3, 1, 1, 2, 64), {}, 0.0f);
  EXPECT_NE(s.message.find("scale = 0"), std::string::npos) << s.message;
  const Status t = QuantizeKv(xv, MakeBHSD(q, DType::kInt8, 1, 1, 2, 64));
  EXPECT_NE(t.message.find("scales.data is null"), std::string::npos) << t.message;
  for (uint8_t b : f8) EXPECT_EQ(b, 0);
}

}  // namespace
}  // namespace simdattn
