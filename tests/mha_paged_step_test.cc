// MultiHeadAttention::StepPaged against the double reference of the whole
// layer: a prefill chunk then single tokens over a paged cache (NHD and
// HND pages, block tables out of order) equal one causal call over the
// whole sequence, without RoPE, with tables built from theta (NeoX pairs,
// partial rotary_dim), with given tables (GPT-J pairs), on a bf16 cache;
// and its errors. On every target (the layer packs for the target at load).

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "simdattn/mha.h"
#include "simdattn/serving.h"
#include "tests/mha_reference.h"
#include "tests/test_util.h"

namespace simdattn {
namespace test {
namespace {

constexpr int64_t kB = 2, kL = 13, kE = 32, kHkv = 2, kD = 8, kBlock = 8, kPages = 5;

// A layer of E 32, Hq 4, Hkv 2 with random Llama-named weights.
std::unique_ptr<MultiHeadAttention> MakePagedLayer(std::mt19937* rng, MhaConfig* c,
                                                   MhaWeights* w) {
  MhaConfig config{kE, 4};
  config.num_kv_heads = kHkv;
  MultiHeadAttention* layer = nullptr;
  EXPECT_TRUE(MultiHeadAttention::Create(config, &layer).ok());
  if (layer == nullptr) return nullptr;
  std::unique_ptr<MultiHeadAttention> owned(layer);
  *c = layer->config();
  *w = RandomWeights(*c, rng);
  std::vector<std::string> names;
  const std::vector<NamedTensor> t = Named(*c, w, "llama", &names);
  const Status s = layer->LoadWeights(t.data(), int64_t(t.size()));
  EXPECT_TRUE(s.ok()) << s.message;
  return owned;
}

struct PagedCase {
  std::string name;
  MhaRotary rotary;
  bool hnd = false;
  DType cache_dtype = DType::kF32;
  int64_t prefill = 5;
  double bound = 1e-4;
};

// The cache's pages for one case: 4-byte elements, used as 2-byte ones
// for a 16-bit cache.
struct Pages {
  std::vector<float> k, v;
  std::vector<int32_t> block_table = {3, 0, 4, 1};  // entry 0: pages 3, 0; entry 1: 4, 1
  std::vector<int32_t> seq_lens = {0, 0};
  MhaPagedKvCache View(const PagedCase& pc) {
    k.assign(size_t(kPages * kBlock * kHkv * kD), 0.0f);
    v.assign(k.size(), 0.0f);
    using Make = MutableTensorView (*)(void*, DType, int64_t, int64_t, int64_t, int64_t);
    const Make make = pc.hnd ? static_cast<Make>(&MakePagedHND) : static_cast<Make>(&MakePagedNHD);
    MhaPagedKvCache cache;
    cache.k = make(k.data(), pc.cache_dtype, kPages, kBlock, kHkv, kD);
    cache.v = make(v.data(), pc.cache_dtype, kPages, kBlock, kHkv, kD);
    cache.block_table = block_table.data();
    cache.max_blocks_per_seq = 2;
    cache.seq_lens = seq_lens.data();
    return cache;
  }
};

void CopyTokens(const std::vector<float>& src, int64_t src_len, int64_t src_t0,
                std::vector<float>* dst, int64_t dst_len, int64_t dst_t0, int64_t T) {
  for (int64_t b = 0; b < kB; ++b) {
    std::memcpy(dst->data() + (b * dst_len + dst_t0) * kE, src.data() + (b * src_len + src_t0) * kE,
                size_t(T * kE) * sizeof(float));
  }
}

void RunPagedCase(const PagedCase& pc, std::mt19937* rng) {
  SCOPED_TRACE(pc.name);
  MhaConfig c;
  MhaWeights w;
  auto layer = MakePagedLayer(rng, &c, &w);
  ASSERT_NE(layer, nullptr);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(size_t(kB * kL * kE)), steps(x.size());
  for (float& e : x) e = u(*rng);
  Pages pages;
  MhaPagedKvCache cache = pages.View(pc);
  MhaForwardOptions options;
  options.rotary = pc.rotary;
  for (int64_t t0 = 0; t0 < kL; t0 += t0 == 0 ? pc.prefill : 1) {
    const int64_t T = t0 == 0 ? pc.prefill : 1;
    std::vector<float> xt(size_t(kB * T * kE)), ot(xt.size());
    CopyTokens(x, kL, t0, &xt, T, 0, T);
    const Status s = layer->StepPaged({xt.data(), DType::kF32, kB, T, kE}, &cache,
                                      {ot.data(), DType::kF32, kB, T, kE}, options);
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(pages.seq_lens[0], t0 + T);
    ASSERT_EQ(pages.seq_lens[1], t0 + T);
    CopyTokens(ot, T, 0, &steps, kL, t0, T);
  }
  MhaForwardOptions causal;
  causal.attention.causal = true;
  std::vector<double> want;
  ASSERT_TRUE(ReferenceMha(c, w, {&x, &x, &x, kB, kL, kL, true, &pc.rotary}, causal, &want, nullptr));
  double err = 0.0;
  for (size_t i = 0; i < want.size(); ++i) err = std::max(err, std::fabs(steps[i] - want[i]));
  EXPECT_LE(err, pc.bound);
}

TEST(MhaPagedStepTest, PrefillThenStepsEqualTheWholeSequence) {
  std::mt19937 rng(71);
  std::vector<PagedCase> cases(5);
  cases[0].name = "no rope, NHD";
  cases[1].name = "theta 10000, rotary_dim 4 (NeoX pairs), HND";
  cases[1].rotary.enabled = true;
  cases[1].rotary.rotary_dim = 4;
  cases[1].hnd = true;
  cases[2].name = "given tables, GPT-J pairs, prefill 8 (a whole page)";
  std::vector<float> cos_t(16 * 4), sin_t(16 * 4);
  for (int64_t p = 0; p < 16; ++p) {
    for (int64_t i = 0; i < 4; ++i) {
      cos_t[size_t(p * 4 + i)] = float(std::cos(0.3 * double(p) / double(i + 1)));
      sin_t[size_t(p * 4 + i)] = float(std::sin(0.3 * double(p) / double(i + 1)));
    }
  }
  cases[2].rotary.enabled = true;
  cases[2].rotary.interleaved = true;
  cases[2].rotary.cos = cos_t.data();
  cases[2].rotary.sin = sin_t.data();
  cases[2].rotary.max_position = 16;
  cases[2].prefill = 8;
  cases[3].name = "theta 500, single tokens only";
  cases[3].rotary.enabled = true;
  cases[3].rotary.theta = 500.0;
  cases[3].prefill = 1;
  cases[4].name = "bf16 cache, theta 10000";
  cases[4].rotary.enabled = true;
  cases[4].cache_dtype = DType::kBF16;
  // K and V rounded to 8 significant bits: measured up to 1.4e-3 over the
  // targets (3.4e-2 with the reference left unrotated).
  cases[4].bound = 5e-3;
  for (const std::string& target : TestTargets()) {
    SCOPED_TRACE(target);
    ScopedTarget scoped(target);
    for (const PagedCase& pc : cases) RunPagedCase(pc, &rng);
  }
}

TEST(MhaPagedStepTest, ErrorsNameTheArgument) {
  std::mt19937 rng(72);
  MhaConfig c;
  MhaWeights w;
  auto layer = MakePagedLayer(&rng, &c, &w);
  ASSERT_NE(layer, nullptr);
  std::vector<float> x(size_t(kB * 4 * kE)), out(x.size());
  const MhaTensor xt{x.data(), DType::kF32, kB, 4, kE};
  const MutableMhaTensor ot{out.data(), DType::kF32, kB, 4, kE};
  Pages pages;
  MhaPagedKvCache cache = pages.View(PagedCase());
  const auto expect = [](const Status& s, StatusCode code, const std::string& what) {
    EXPECT_EQ(s.code, code) << s.message;
    EXPECT_NE(s.message.find(what), std::string::npos) << s.message;
  };
  expect(layer->StepPaged(xt, nullptr, ot), StatusCode::kInvalidArgument, "cache");
  pages.seq_lens[1] = 13;  // 13 + 4 > 2 pages of 8
  expect(layer->StepPaged(xt, &cache, ot), StatusCode::kInvalidArgument, "seq_lens[1]");
  pages.seq_lens[1] = 0;
  pages.block_table[2] = -1;
  expect(layer->StepPaged(xt, &cache, ot), StatusCode::kInvalidArgument, "block_table[2]");
  pages.block_table[2] = 4;
  MhaForwardOptions options;
  options.rotary.enabled = true;
  options.rotary.rotary_dim = 3;
  expect(layer->StepPaged(xt, &cache, ot, options), StatusCode::kInvalidArgument, "rotary_dim");
  options.rotary.rotary_dim = 0;
  options.rotary.theta = 0.0;
  expect(layer->StepPaged(xt, &cache, ot, options), StatusCode::kInvalidArgument, "theta");
  options.rotary.theta = 10000.0;
  expect(layer->Forward(xt, nullptr, nullptr, ot, options), StatusCode::kUnimplemented, "rotary");
  MhaTensor seq_first = xt;
  seq_first.batch_first = false;
  MutableMhaTensor out_seq_first = ot;
  out_seq_first.batch_first = false;
  expect(layer->StepPaged(seq_first, &cache, out_seq_first), StatusCode::kUnimplemented,
         "batch_first");
  EXPECT_EQ(pages.seq_lens[0], 0);
  EXPECT_EQ(pages.seq_lens[1], 0);
}

}  // namespace
}  // namespace test
}  // namespace simdattn
