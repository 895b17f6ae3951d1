// The C API with quantized K/V: the dtypes and the scales of
// simdattn_options reach the C++ API unchanged (the same bits as a C++
// call), and a missing int8 scale is an error naming it.

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "simdattn/serving.h"
#include "simdattn/simdattn.h"
#include "tests/quant_util.h"

namespace simdattn {
namespace test {
namespace {

TEST(CApiQuantTest, SameBitsAsCpp) {
  static_assert(SIMDATTN_INT8 == static_cast<int>(DType::kInt8), "int8");
  static_assert(SIMDATTN_Q8_0 == static_cast<int>(DType::kQ8_0), "q8_0");
  static_assert(SIMDATTN_FP8_E4M3 == static_cast<int>(DType::kFp8E4M3), "e4m3");
  static_assert(SIMDATTN_FP8_E5M2 == static_cast<int>(DType::kFp8E5M2), "e5m2");
  std::mt19937 rng(42);
  Tensor q(DType::kF32, 1, 4, 3, 64), k(DType::kF32, 1, 2, 50, 64), v(DType::kF32, 1, 2, 50, 64);
  q.FillUniform(&rng, -1.0f, 1.0f);
  k.FillUniform(&rng, -1.0f, 1.0f);
  v.FillUniform(&rng, -1.0f, 1.0f);
  const KvTensor kq = StoreKv(k, DType::kInt8, Layout::kBHSD);
  const KvTensor vq = StoreKv(v, DType::kFp8E4M3, Layout::kBHSD, 0.01f);
  std::vector<float> o_cpp(4 * 3 * 64), o_c(4 * 3 * 64, 7.0f);
  AttentionOptions options;
  SetScales(kq, true, &options);
  SetScales(vq, false, &options);
  const Status s = Attention(q.View(), kq.View(), vq.View(),
                             MakeBHSD(o_cpp.data(), DType::kF32, 1, 4, 3, 64), options);
  ASSERT_TRUE(s.ok()) << s.message;

  simdattn_options c;
  simdattn_options_init(&c);
  c.k_scales = ToC(kq.ScalesView());
  c.has_fp8_scales = 1;
  c.k_scale = 1.0f;
  c.v_scale = 0.01f;
  simdattn_tensor cq = ToC(q.View()), ck = ToC(kq.View()), cv = ToC(vq.View());
  simdattn_tensor co = simdattn_bhsd(o_c.data(), SIMDATTN_F32, 1, 4, 3, 64);
  ASSERT_EQ(simdattn_attention(&cq, &ck, &cv, &co, &c, nullptr, nullptr, nullptr), SIMDATTN_OK)
      << simdattn_last_error();
  EXPECT_EQ(std::memcmp(o_c.data(), o_cpp.data(), o_c.size() * sizeof(float)), 0);

  c.k_scales.data = nullptr;
  c.k_scales.shape[0] = c.k_scales.shape[1] = c.k_scales.shape[2] = c.k_scales.shape[3] = 0;
  EXPECT_EQ(simdattn_attention(&cq, &ck, &cv, &co, &c, nullptr, nullptr, nullptr),
            SIMDATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(simdattn_last_error()).find("k_scales.data is null"), std::string::npos)
      << simdattn_last_error();
}

// simdattn_append_kv_quantized writes what AppendKv writes (int8 K with
// its scale cache, fp8 V with its scale); a missing int8 scale cache is an
// error naming it.
TEST(CApiQuantTest, AppendKvQuantizedSameBitsAsCpp) {
  const int64_t tokens = 5, heads = 2, d = 32, blocks = 2, bs = 8;
  std::mt19937 rng(43);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> k(tokens * heads * d), v(tokens * heads * d);
  for (float& x : k) x = u(rng);
  for (float& x : v) x = u(rng);
  const std::vector<int32_t> slots = {3, -1, 9, 0, 15};
  const int64_t n = blocks * bs * heads * d;
  std::vector<uint8_t> kc_cpp(n, 1), vc_cpp(n, 1), kc_c(n, 1), vc_c(n, 1);
  std::vector<float> ks_cpp(blocks * bs * heads, -1.0f), ks_c = ks_cpp;
  QuantizedCacheScales qs;
  qs.k_scales = MakePagedNHD(ks_cpp.data(), DType::kF32, blocks, bs, heads, 1);
  qs.v_scale = 0.005f;
  const TensorView kn = MakeTokenMajor(k.data(), DType::kF32, tokens, heads, d);
  const TensorView vn = MakeTokenMajor(v.data(), DType::kF32, tokens, heads, d);
  const Status s = AppendKv(kn, vn, MakePagedNHD(kc_cpp.data(), DType::kInt8, blocks, bs, heads, d),
                            MakePagedNHD(vc_cpp.data(), DType::kFp8E5M2, blocks, bs, heads, d),
                            slots.data(), {}, {}, {}, qs);
  ASSERT_TRUE(s.ok()) << s.message;

  simdattn_kv_scales cs;
  simdattn_kv_scales_init(&cs);
  EXPECT_EQ(cs.k_scale, 1.0f);
  cs.k_scales = simdattn_paged_nhd(ks_c.data(), SIMDATTN_F32, blocks, bs, heads, 1);
  cs.v_scale = 0.005f;
  const simdattn_tensor ckn = ToC(kn), cvn = ToC(vn);
  const simdattn_tensor ckc = simdattn_paged_nhd(kc_c.data(), SIMDATTN_INT8, blocks, bs, heads, d);
  const simdattn_tensor cvc =
      simdattn_paged_nhd(vc_c.data(), SIMDATTN_FP8_E5M2, blocks, bs, heads, d);
  ASSERT_EQ(simdattn_append_kv_quantized(&ckn, &cvn, &ckc, &cvc, slots.data(), nullptr, nullptr,
                                         nullptr, &cs),
            SIMDATTN_OK)
      << simdattn_last_error();
  EXPECT_EQ(kc_c, kc_cpp);
  EXPECT_EQ(vc_c, vc_cpp);
  EXPECT_EQ(std::memcmp(ks_c.data(), ks_cpp.data(), ks_c.size() * 4), 0);

  EXPECT_EQ(simdattn_append_kv(&ckn, &cvn, &ckc, &cvc, slots.data(), nullptr, nullptr, nullptr),
            SIMDATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(simdattn_last_error()).find("k_scales.data is null"), std::string::npos)
      << simdattn_last_error();
  cs.struct_size = sizeof(cs) - 1;
  EXPECT_EQ(simdattn_append_kv_quantized(&ckn, &cvn, &ckc, &cvc, slots.data(), nullptr, nullptr,
                                         nullptr, &cs),
            SIMDATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(simdattn_last_error()).find("simdattn_kv_scales->struct_size"),
            std::string::npos)
      << simdattn_last_error();
}

}  // namespace
}  // namespace test
}  // namespace simdattn
