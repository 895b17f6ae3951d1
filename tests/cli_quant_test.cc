// `simdattn run --kv-dtype int8|q8_0|fp8_e4m3|fp8_e5m2`: the tool stores K
// and V with QuantizeKv (fp8 with scale max|x| / 448 or / 57344) and runs
// attention on them, so O matches Attention() on K/V quantized here; and a
// format the shapes do not allow is an error naming it.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "simdattn/attention.h"
#include "simdattn/serving.h"
#include "tests/cli_util.h"
#include "tests/test_util.h"
#include "tools/npy.h"

namespace simdattn {
namespace test {
namespace {

// t (f32, any layout) quantized as the CLI does: dense BHSD bytes, int8's
// scales, fp8's scale max|x| / max.
struct Quantized {
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  float scale = 1.0f;
  TensorView view, scales_view;
};

void QuantizeLikeCli(const Tensor& t, DType dtype, Quantized* out) {
  const TensorView w = t.View();
  const int64_t* l = w.shape;
  const int64_t row = dtype == DType::kQ8_0 ? l[3] / 32 * 34 : l[3];
  out->bytes.assign(static_cast<size_t>(l[0] * l[1] * l[2] * row), 0);
  MutableTensorView q = MakeBHSD(out->bytes.data(), dtype, l[0], l[1], l[2], l[3]);
  if (dtype == DType::kQ8_0) {
    q.strides[0] = l[1] * l[2] * row, q.strides[1] = l[2] * row, q.strides[2] = row;
  }
  MutableTensorView sv;
  if (dtype == DType::kInt8) {
    out->scales.assign(static_cast<size_t>(l[0] * l[1] * l[2]), 0.0f);
    sv = MakeBHSD(out->scales.data(), DType::kF32, l[0], l[1], l[2], 1);
    out->scales_view = sv;
  }
  if (dtype == DType::kFp8E4M3 || dtype == DType::kFp8E5M2) {
    double amax = 0.0;
    for (int64_t a = 0; a < l[0]; ++a)
      for (int64_t b = 0; b < l[1]; ++b)
        for (int64_t c = 0; c < l[2]; ++c)
          for (int64_t d = 0; d < l[3]; ++d) amax = std::max(amax, static_cast<double>(std::fabs(t.Get(a, b, c, d))));
    out->scale = static_cast<float>(amax) / (dtype == DType::kFp8E4M3 ? 448.0f : 57344.0f);
  }
  const Status s = QuantizeKv(w, q, sv, out->scale);
  ASSERT_TRUE(s.ok()) << s.message;
  out->view = q;
}

TEST(CliQuantTest, KvDTypeQuantizesLikeQuantizeKv) {
  const DType formats[] = {DType::kInt8, DType::kQ8_0, DType::kFp8E4M3, DType::kFp8E5M2};
  uint32_t seed = 4400;
  for (DType fmt : formats) {
    for (Layout layout : {Layout::kBHSD, Layout::kBSHD}) {
      const bool bshd = layout == Layout::kBSHD;
      SCOPED_TRACE(std::string(DTypeName(fmt)) + (bshd ? " bshd" : " bhsd"));
      std::mt19937 rng(seed++);
      Tensor q(DType::kF32, 2, 4, 3, 64, layout), k(DType::kF32, 2, 2, 40, 64, layout),
          v(DType::kF32, 2, 2, 40, 32, layout);
      q.FillUniform(&rng, -1.0f, 1.0f);
      k.FillUniform(&rng, -1.0f, 1.0f);
      v.FillUniform(&rng, -2.0f, 2.0f);
      TempDir dir;
      WriteTensor(dir.File("q.npy"), q, layout);
      WriteTensor(dir.File("k.npy"), k, layout);
      WriteTensor(dir.File("v.npy"), v, layout);
      const CliResult r = RunCli("run --q " + dir.File("q.npy") + " --k " + dir.File("k.npy") +
                                 " --v " + dir.File("v.npy") + " --out " + dir.File("o.npy") +
                                 " --layout " + (bshd ? "bshd" : "bhsd") + " --kv-dtype " +
                                 DTypeName(fmt));
      ASSERT_EQ(r.code, 0) << r.err;
      npy::Array o_file;
      std::string error;
      ASSERT_TRUE(npy::Read(dir.File("o.npy"), &o_file, &error)) << error;

      Quantized kq, vq;
      QuantizeLikeCli(k, fmt, &kq);
      QuantizeLikeCli(v, fmt, &vq);
      AttentionOptions options;
      options.k_scales = kq.scales_view;
      options.v_scales = vq.scales_view;
      options.k_scale = kq.scale;
      options.v_scale = vq.scale;
      Tensor o(DType::kF32, 2, 4, 3, 32, layout), o_wide(DType::kF32, 2, 4, 3, 32, layout);
      ASSERT_TRUE(Attention(q.View(), kq.view, vq.view, o.MutableView(), options).ok());
      ASSERT_TRUE(Attention(q.View(), k.View(), v.View(), o_wide.MutableView()).ok());
      ASSERT_EQ(o_file.f32.size() * 4, o.bytes.size());
      std::vector<float> want(o_file.f32.size()), wide(o_file.f32.size());
      std::memcpy(want.data(), o.bytes.data(), o.bytes.size());
      std::memcpy(wide.data(), o_wide.bytes.data(), o_wide.bytes.size());
      double err = 0.0, quant_effect = 0.0;
      for (size_t i = 0; i < want.size(); ++i) {
        err = std::max(err, static_cast<double>(std::fabs(o_file.f32[i] - want[i])));
        quant_effect = std::max(quant_effect, static_cast<double>(std::fabs(wide[i] - want[i])));
      }
      EXPECT_LE(err, 1e-5);
      EXPECT_GT(quant_effect, 1e-4);  // the comparison tells quantized from f32
    }
  }
}

TEST(CliQuantTest, KvDTypeErrorsNameTheProblem) {
  std::mt19937 rng(5);
  Tensor q(DType::kF32, 1, 2, 1, 48), k(DType::kF32, 1, 2, 8, 48);
  q.FillUniform(&rng, -1.0f, 1.0f);
  k.FillUniform(&rng, -1.0f, 1.0f);
  TempDir dir;
  WriteTensor(dir.File("q.npy"), q, Layout::kBHSD);
  WriteTensor(dir.File("k.npy"), k, Layout::kBHSD);
  const std::string base = "run --q " + dir.File("q.npy") + " --k " + dir.File("k.npy") +
                           " --v " + dir.File("k.npy") + " --out " + dir.File("o.npy");
  CliResult r = RunCli(base + " --kv-dtype q8_0");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--k as --kv-dtype q8_0"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("multiple of 32"), std::string::npos) << r.err;
  r = RunCli(base + " --kv-dtype int4");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("int8, q8_0, fp8_e4m3 or fp8_e5m2, got 'int4'"), std::string::npos)
      << r.err;
  r = RunCli(base + " --dtype f16 --kv-dtype int8");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("conflicts"), std::string::npos) << r.err;
  r = RunCli(base + " --kv-dtype int8");  // D = 48 is fine for int8
  EXPECT_EQ(r.code, 0) << r.err;
}

}  // namespace
}  // namespace test
}  // namespace simdattn
