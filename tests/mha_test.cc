// The multi-head attention layer on every target against the double
// reference of the whole layer (tests/mha_reference.h): self- and
// cross-attention, kdim/vdim, GQA with Llama names, bias on and off,
// add_bias_kv, PyTorch masks, the SEMANTICS.md options passed through,
// need_weights, batch_first both ways, the step API, errors, threads.

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "simdattn/mha.h"
#include "tests/mha_reference.h"
#include "tests/test_util.h"

namespace simdattn {
namespace test {
namespace {

// f32 throughout: GEMM chains of <= 64 terms, the attention's 2e-5 bound.
constexpr double kMhaBound = 1e-4;

std::unique_ptr<MultiHeadAttention> MakeLayer(const MhaConfig& config, MhaWeights* w,
                                              const std::string& naming, std::mt19937* rng,
                                              MhaConfig* resolved) {
  MultiHeadAttention* layer = nullptr;
  EXPECT_TRUE(MultiHeadAttention::Create(config, &layer).ok());
  if (layer == nullptr) return nullptr;
  std::unique_ptr<MultiHeadAttention> owned(layer);
  *resolved = layer->config();
  *w = RandomWeights(*resolved, rng);
  std::vector<std::string> names;
  const std::vector<NamedTensor> t = Named(*resolved, w, naming, &names);
  const Status s = layer->LoadWeights(t.data(), int64_t(t.size()));
  EXPECT_TRUE(s.ok()) << s.message;
  return owned;
}

MhaMask Mask(const void* data, DType dtype, std::vector<int64_t> dims) {
  MhaMask m;
  m.data = data;
  m.dtype = dtype;
  m.ndim = int64_t(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) m.shape[i] = dims[i];
  return m;
}

std::vector<float> Random(size_t n, std::mt19937* rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(*rng);
  return v;
}

struct RunCase {
  int64_t batch = 2, q_len = 9, kv_len = 9;
  bool cross = false, batch_first = true;
};

// Forward on the layer and the reference; compares out (and weights)
// within `bound` (the f32 one unless the layer stores 16-bit Q, K, V).
void Check(MultiHeadAttention* layer, const MhaConfig& c, const MhaWeights& w, const RunCase& r,
           MhaForwardOptions options, std::mt19937* rng, const std::string& what,
           double bound = kMhaBound) {
  SCOPED_TRACE(what);
  const std::vector<float> xq = Random(size_t(r.batch * r.q_len * c.embed_dim), rng);
  const std::vector<float> xk = r.cross ? Random(size_t(r.batch * r.kv_len * c.kdim), rng) : xq;
  const std::vector<float> xv = r.cross ? Random(size_t(r.batch * r.kv_len * c.vdim), rng) : xq;
  const auto view = [&](const std::vector<float>& x, int64_t len, int64_t dim) {
    return MhaTensor{x.data(), DType::kF32, r.batch, len, dim, r.batch_first};
  };
  const MhaTensor q = view(xq, r.q_len, c.embed_dim);
  const MhaTensor k = view(xk, r.kv_len, c.kdim), v = view(xv, r.kv_len, c.vdim);
  std::vector<float> out(xq.size() / size_t(c.embed_dim) * size_t(c.embed_dim));
  const int64_t lkp = r.kv_len + (c.add_bias_kv ? 1 : 0);
  const bool want_weights = options.weights != nullptr;
  std::vector<float> weights(size_t(r.batch * c.num_heads * r.q_len * lkp));
  if (want_weights) options.weights = weights.data();
  RunInfo info;
  const Status s = layer->Forward(q, r.cross ? &k : nullptr, r.cross ? &v : nullptr,
                                  {out.data(), DType::kF32, r.batch, r.q_len, c.embed_dim,
                                   r.batch_first},
                                  options, {}, &info);
  ASSERT_TRUE(s.ok()) << s.message;
  RecordTargetRun(info.target);
  std::vector<double> ref, ref_w;
  ASSERT_TRUE(ReferenceMha(c, w, {&xq, &xk, &xv, r.batch, r.q_len, r.kv_len, r.batch_first},
                           options, &ref, want_weights ? &ref_w : nullptr));
  double err = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) err = std::max(err, std::fabs(out[i] - ref[i]));
  EXPECT_LE(err, bound) << "target " << info.target;
  if (!want_weights) return;
  double werr = 0.0;
  const int64_t rows = r.batch * r.q_len, heads = c.num_heads;
  for (int64_t b = 0; b < r.batch; ++b)
    for (int64_t i = 0; i < r.q_len; ++i)
      for (int64_t j = 0; j < lkp; ++j) {
        double avg = 0.0;
        for (int64_t h = 0; h < heads; ++h) {
          const size_t idx = size_t(((b * heads + h) * r.q_len + i) * lkp + j);
          avg += ref_w[idx] / double(heads);
          if (!options.average_weights) werr = std::max(werr, std::fabs(weights[idx] - ref_w[idx]));
        }
        if (options.average_weights) {
          werr = std::max(werr, std::fabs(weights[size_t((b * r.q_len + i) * lkp + j)] - avg));
        }
      }
  (void)rows;
  EXPECT_LE(werr, 1e-5) << "weights, target " << info.target;
}

TEST(MhaTest, SelfAttentionBothLayoutsBiasMasksOnEveryTarget) {
  std::mt19937 rng(41);
  for (const std::string& target : TestTargets()) {
    ScopedTarget scoped(target);
    for (bool bias : {true, false}) {
      MhaConfig c{32, 4};
      c.bias = bias;
      MhaWeights w;
      MhaConfig rc;
      auto layer = MakeLayer(c, &w, "torch", &rng, &rc);
      ASSERT_NE(layer, nullptr);
      for (bool bf : {true, false}) {
        RunCase r;
        r.batch_first = bf;
        Check(layer.get(), rc, w, r, {}, &rng, target + " plain");
        std::vector<uint8_t> pad(size_t(r.batch * r.kv_len), 0);
        pad[3] = pad[size_t(r.kv_len + 8)] = 1;
        std::vector<float> am = Random(size_t(r.q_len * r.kv_len), &rng);
        MhaForwardOptions o;
        o.key_padding_mask = Mask(pad.data(), DType::kBool, {r.batch, r.kv_len});
        o.attn_mask = Mask(am.data(), DType::kF32, {r.q_len, r.kv_len});
        Check(layer.get(), rc, w, r, o, &rng, target + " masks");
        MhaForwardOptions f;
        f.attn_mask = o.attn_mask;  // the caller's f32 mask as a view
        Check(layer.get(), rc, w, r, f, &rng, target + " f32 attn_mask");
      }
    }
  }
}

TEST(MhaTest, CrossAttentionKdimVdimBiasKvOnEveryTarget) {
  std::mt19937 rng(42);
  for (const std::string& target : TestTargets()) {
    ScopedTarget scoped(target);
    MhaConfig c{24, 3};
    c.kdim = 16;
    c.vdim = 20;
    c.add_bias_kv = true;
    MhaWeights w;
    MhaConfig rc;
    auto layer = MakeLayer(c, &w, "torch", &rng, &rc);
    ASSERT_NE(layer, nullptr);
    RunCase r;
    r.cross = true;
    r.q_len = 5;
    r.kv_len = 7;
    Check(layer.get(), rc, w, r, {}, &rng, target + " cross");
    std::vector<uint8_t> am(size_t(r.batch * 3 * r.q_len * r.kv_len), 0);
    for (size_t i = 0; i < am.size(); i += 3) am[i] = 1;
    MhaForwardOptions o;
    o.attn_mask = Mask(am.data(), DType::kBool, {r.batch * 3, r.q_len, r.kv_len});
    o.weights = reinterpret_cast<float*>(1);  // Check points it at its buffer
    o.average_weights = false;
    Check(layer.get(), rc, w, r, o, &rng, target + " cross per-head mask, weights");
  }
}

TEST(MhaTest, GqaLlamaNamesCausalAndOptionsOnEveryTarget) {
  std::mt19937 rng(43);
  for (const std::string& target : TestTargets()) {
    ScopedTarget scoped(target);
    MhaConfig c{40, 4};
    c.num_kv_heads = 2;
    c.head_dim = 16;  // Hq * D = 64 != E
    c.bias = false;
    MhaWeights w;
    MhaConfig rc;
    auto layer = MakeLayer(c, &w, "llama", &rng, &rc);
    ASSERT_NE(layer, nullptr);
    RunCase r;
    r.q_len = r.kv_len = 13;
    MhaForwardOptions o;
    o.attention.causal = true;
    Check(layer.get(), rc, w, r, o, &rng, target + " causal");
    o.weights = reinterpret_cast<float*>(1);
    Check(layer.get(), rc, w, r, o, &rng, target + " causal, averaged weights");
    std::vector<float> slopes = {0.5f, 0.25f, 0.125f, 0.0625f}, sinks = {0.3f, -1.0f, 2.0f, 0.0f};
    MhaForwardOptions x;
    x.attention.softcap = 5.0f;
    x.attention.alibi_slopes = slopes.data();
    x.attention.sinks = sinks.data();
    x.attention.window_left = 4;
    x.attention.scale = 0.2f;
    Check(layer.get(), rc, w, r, x, &rng, target + " softcap, alibi, sinks, window, scale");
  }
}

// Q, K, V and the attention's output stored in 16 bits inside the layer:
// the reference keeps them f32, so the bound is the storage type's
// rounding carried through two projections (bf16 2^-9, f16 2^-12 relative).
TEST(MhaTest, SixteenBitStorageInsideTheLayerOnEveryTarget) {
  std::mt19937 rng(46);
  for (const std::string& target : TestTargets()) {
    ScopedTarget scoped(target);
    for (DType dt : {DType::kBF16, DType::kF16}) {
      MhaConfig c{32, 4};
      c.dtype = dt;
      MhaWeights w;
      MhaConfig rc;
      auto layer = MakeLayer(c, &w, "torch", &rng, &rc);
      ASSERT_NE(layer, nullptr);
      MhaForwardOptions o;
      o.attention.causal = true;
      Check(layer.get(), rc, w, {}, o, &rng, target + " " + DTypeName(dt),
            dt == DType::kBF16 ? 5e-2 : 5e-3);
    }
  }
}

// Decoding token by token through Step gives what Forward gives with a
// causal mask over the whole sequence.
TEST(MhaTest, StepMatchesCausalForwardOnEveryTarget) {
  std::mt19937 rng(44);
  for (const std::string& target : TestTargets()) {
    ScopedTarget scoped(target);
    MhaConfig c{32, 4};
    c.num_kv_heads = 2;
    MhaWeights w;
    MhaConfig rc;
    auto layer = MakeLayer(c, &w, "torch", &rng, &rc);
    ASSERT_NE(layer, nullptr);
    const int64_t B = 2, L = 7, E = 32, D = 8, cap = 16;
    const std::vector<float> x = Random(size_t(B * L * E), &rng);
    std::vector<float> full(x.size()), steps(x.size());
    MhaForwardOptions causal;
    causal.attention.causal = true;
    ASSERT_TRUE(layer->Forward({x.data(), DType::kF32, B, L, E}, nullptr, nullptr,
                               {full.data(), DType::kF32, B, L, E}, causal).ok());
    std::vector<float> kc(size_t(B * 2 * cap * D)), vc(kc.size());
    MhaKvCache cache;
    cache.k = MakeBHSD(kc.data(), DType::kF32, B, 2, cap, D);
    cache.v = MakeBHSD(vc.data(), DType::kF32, B, 2, cap, D);
    // The first 3 tokens as one chunk (prefill), then one at a time.
    std::vector<float> xt, ot;
    for (int64_t t0 = 0; t0 < L; t0 = cache.length) {
      const int64_t T = t0 == 0 ? 3 : 1;
      xt.assign(size_t(B * T * E), 0.0f);
      ot.assign(xt.size(), 0.0f);
      for (int64_t b = 0; b < B; ++b)
        std::memcpy(&xt[size_t(b * T * E)], &x[size_t((b * L + t0) * E)], size_t(T * E) * 4);
      const Status s = layer->Step({xt.data(), DType::kF32, B, T, E}, &cache,
                                   {ot.data(), DType::kF32, B, T, E});
      ASSERT_TRUE(s.ok()) << s.message;
      for (int64_t b = 0; b < B; ++b)
        std::memcpy(&steps[size_t((b * L + t0) * E)], &ot[size_t(b * T * E)], size_t(T * E) * 4);
    }
    EXPECT_EQ(cache.length, L);
    double err = 0.0;
    for (size_t i = 0; i < full.size(); ++i) err = std::max(err, double(std::fabs(full[i] - steps[i])));
    EXPECT_LE(err, 1e-5) << target;
  }
}

TEST(MhaTest, BitIdenticalForAnyThreadCount) {
  std::mt19937 rng(45);
  MhaConfig c{64, 4};
  MhaWeights w;
  MhaConfig rc;
  auto layer = MakeLayer(c, &w, "torch", &rng, &rc);
  ASSERT_NE(layer, nullptr);
  const int64_t B = 2, L = 130;
  const std::vector<float> x = Random(size_t(B * L * 64), &rng);
  std::vector<float> first;
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    ExecutionOptions exec;
    exec.pool = &pool;
    std::vector<float> out(x.size());
    ASSERT_TRUE(layer->Forward({x.data(), DType::kF32, B, L, 64}, nullptr, nullptr,
                               {out.data(), DType::kF32, B, L, 64}, {}, exec).ok());
    if (first.empty()) first = out;
    EXPECT_EQ(out, first) << threads << " threads";
  }
}

TEST(MhaTest, ErrorsNameTheArgument) {
  MultiHeadAttention* raw = nullptr;
  Status s = MultiHeadAttention::Create({30, 4}, &raw);
  EXPECT_NE(s.message.find("num_heads"), std::string::npos) << s.message;
  s = MultiHeadAttention::Create({32, 4, 3}, &raw);
  EXPECT_NE(s.message.find("num_kv_heads"), std::string::npos) << s.message;
  ASSERT_TRUE(MultiHeadAttention::Create({32, 4}, &raw).ok());
  std::unique_ptr<MultiHeadAttention> layer(raw);
  std::mt19937 rng(1);
  MhaWeights w = RandomWeights(layer->config(), &rng);
  std::vector<std::string> names;
  std::vector<NamedTensor> t = Named(layer->config(), &w, "torch", &names, "layers.0.attn.");
  std::vector<float> x(2 * 3 * 32), out(x.size());
  s = layer->Forward({x.data(), DType::kF32, 2, 3, 32}, nullptr, nullptr, {out.data(), DType::kF32, 2, 3, 32});
  EXPECT_NE(s.message.find("not loaded"), std::string::npos) << s.message;
  s = layer->LoadWeights(t.data(), int64_t(t.size()) - 1);  // no out_proj.bias
  EXPECT_NE(s.message.find("out_proj.bias"), std::string::npos) << s.message;
  t[0].shape[0] = 95;
  s = layer->LoadWeights(t.data(), int64_t(t.size()));
  EXPECT_NE(s.message.find("in_proj_weight"), std::string::npos) << s.message;
  t[0].shape[0] = 96;
  ASSERT_TRUE(layer->LoadWeights(t.data(), int64_t(t.size())).ok());  // prefixed names
  s = layer->Forward({x.data(), DType::kF32, 2, 3, 31}, nullptr, nullptr, {out.data(), DType::kF32, 2, 3, 32});
  EXPECT_NE(s.message.find("query.dim"), std::string::npos) << s.message;
  std::vector<uint8_t> am(9, 0);
  MhaForwardOptions o;
  o.attn_mask = Mask(am.data(), DType::kBool, {3, 4});
  s = layer->Forward({x.data(), DType::kF32, 2, 3, 32}, nullptr, nullptr, {out.data(), DType::kF32, 2, 3, 32}, o);
  EXPECT_NE(s.message.find("attn_mask"), std::string::npos) << s.message;
}

}  // namespace
}  // namespace test
}  // namespace simdattn
