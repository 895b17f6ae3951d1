// The C API of the multi-head attention layer (simdattn.h, section
// "multi-head attention layer"): a layer made, loaded and run through
// simdattn_mha_* equals the double reference of the whole layer, with
// need_weights and a PyTorch key_padding_mask through the C structs; the
// step call over a dense cache (prefill then single tokens) equals one
// causal forward; paged steps with RoPE (simdattn_mha_step_paged) equal the
// reference with RoPE; and the checks only the C structs allow (NULL pointers,
// struct_size) name the argument in simdattn_last_error().

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "simdattn/mha.h"
#include "simdattn/simdattn.h"
#include "tests/mha_reference.h"

namespace simdattn {
namespace test {
namespace {

std::vector<float> RandomFloats(size_t n, std::mt19937* rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(*rng);
  return v;
}

// A layer of E = 32, Hq = 4, Hkv = 2 made through the C API with random
// weights under `naming`, its resolved config in *c and weights in *w.
simdattn_mha* MakeCLayer(const std::string& naming, std::mt19937* rng, MhaConfig* c,
                         MhaWeights* w) {
  simdattn_mha_config config;
  simdattn_mha_config_init(&config);
  config.embed_dim = 32;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  simdattn_mha* layer = nullptr;
  EXPECT_EQ(simdattn_mha_create(&config, &layer), SIMDATTN_OK) << simdattn_last_error();
  if (layer == nullptr) return nullptr;
  *c = MhaConfig{32, 4};
  c->num_kv_heads = 2;
  c->head_dim = 8;
  c->kdim = c->vdim = 32;
  *w = RandomWeights(*c, rng);
  std::vector<std::string> names;
  const std::vector<NamedTensor> t = Named(*c, w, naming, &names);
  std::vector<simdattn_named_tensor> ct(t.size());
  for (size_t i = 0; i < t.size(); ++i) {
    ct[i].name = t[i].name;
    ct[i].data = t[i].data;
    ct[i].dtype = static_cast<int32_t>(t[i].dtype);
    ct[i].ndim = static_cast<int32_t>(t[i].ndim);
    for (int d = 0; d < 4; ++d) ct[i].shape[d] = t[i].shape[d];
  }
  EXPECT_EQ(simdattn_mha_load(layer, ct.data(), int64_t(ct.size()), nullptr), SIMDATTN_OK)
      << simdattn_last_error();
  return layer;
}

simdattn_mha_tensor CTensor(const float* data, int64_t b, int64_t len, int64_t dim) {
  simdattn_mha_tensor t;
  t.data = const_cast<float*>(data);
  t.dtype = SIMDATTN_F32;
  t.batch_first = 1;
  t.batch = b;
  t.len = len;
  t.dim = dim;
  return t;
}

double MaxError(const std::vector<float>& got, const std::vector<double>& want) {
  double err = 0.0;
  for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::fabs(got[i] - want[i]));
  return err;
}

TEST(CApiMhaTest, ForwardWithMaskAndWeightsEqualsTheReference) {
  std::mt19937 rng(61);
  for (const std::string naming : {"torch", "llama"}) {
    SCOPED_TRACE(naming);
    MhaConfig c;
    MhaWeights w;
    simdattn_mha* layer = MakeCLayer(naming, &rng, &c, &w);
    ASSERT_NE(layer, nullptr);
    const int64_t B = 2, L = 9, E = 32;
    const std::vector<float> x = RandomFloats(size_t(B * L * E), &rng);
    std::vector<uint8_t> padding(size_t(B * L), 0);
    padding[size_t(L - 1)] = padding[size_t(2 * L - 2)] = 1;  // masked out
    std::vector<float> out(x.size()), weights(size_t(B * 4 * L * L));
    simdattn_mha_options opt;
    simdattn_mha_options_init(&opt);
    opt.key_padding_mask.data = padding.data();
    opt.key_padding_mask.dtype = SIMDATTN_BOOL;
    opt.key_padding_mask.ndim = 2;
    opt.key_padding_mask.shape[0] = B;
    opt.key_padding_mask.shape[1] = L;
    opt.weights = weights.data();
    opt.average_weights = 0;
    const simdattn_mha_tensor q = CTensor(x.data(), B, L, E), o = CTensor(out.data(), B, L, E);
    simdattn_run_info info;
    std::memset(&info, 0, sizeof(info));
    info.struct_size = sizeof(info);
    ASSERT_EQ(simdattn_mha_forward(layer, &q, nullptr, nullptr, &o, &opt, nullptr, &info),
              SIMDATTN_OK)
        << simdattn_last_error();
    EXPECT_NE(info.target, nullptr);
    MhaForwardOptions ref_opt;
    ref_opt.key_padding_mask.data = padding.data();
    ref_opt.key_padding_mask.dtype = DType::kBool;
    ref_opt.key_padding_mask.ndim = 2;
    ref_opt.key_padding_mask.shape[0] = B;
    ref_opt.key_padding_mask.shape[1] = L;
    ref_opt.average_weights = false;
    std::vector<double> want, want_weights;
    ASSERT_TRUE(ReferenceMha(c, w, {&x, &x, &x, B, L, L, true}, ref_opt, &want, &want_weights));
    EXPECT_LE(MaxError(out, want), 1e-4);
    EXPECT_LE(MaxError(weights, want_weights), 1e-5);
    simdattn_mha_destroy(layer);
  }
}

// Copies T tokens from t0 of each of B sequences of len L between
// [B, L, E] and [B, T, E] (to_chunk) or back.
void CopyTokens(std::vector<float>* full, std::vector<float>* chunk, int64_t B, int64_t L,
                int64_t E, int64_t t0, int64_t T, bool to_chunk) {
  for (int64_t b = 0; b < B; ++b) {
    float* f = full->data() + (b * L + t0) * E;
    float* ch = chunk->data() + b * T * E;
    std::memcpy(to_chunk ? ch : f, to_chunk ? f : ch, size_t(T * E) * sizeof(float));
  }
}

TEST(CApiMhaTest, StepsOverADenseCacheEqualOneCausalForward) {
  std::mt19937 rng(62);
  MhaConfig c;
  MhaWeights w;
  simdattn_mha* layer = MakeCLayer("torch", &rng, &c, &w);
  ASSERT_NE(layer, nullptr);
  const int64_t B = 2, L = 7, E = 32, Hkv = 2, D = 8, cap = 12;
  std::vector<float> x = RandomFloats(size_t(B * L * E), &rng);
  std::vector<float> full(x.size()), steps(x.size());
  simdattn_mha_options causal;
  simdattn_mha_options_init(&causal);
  causal.attention.causal = 1;
  const simdattn_mha_tensor q = CTensor(x.data(), B, L, E), o = CTensor(full.data(), B, L, E);
  ASSERT_EQ(simdattn_mha_forward(layer, &q, nullptr, nullptr, &o, &causal, nullptr, nullptr),
            SIMDATTN_OK)
      << simdattn_last_error();
  std::vector<float> kc(size_t(B * Hkv * cap * D)), vc(kc.size());
  const simdattn_tensor k_cache = simdattn_bhsd(kc.data(), SIMDATTN_F32, B, Hkv, cap, D);
  const simdattn_tensor v_cache = simdattn_bhsd(vc.data(), SIMDATTN_F32, B, Hkv, cap, D);
  int64_t length = 0;
  while (length < L) {
    const int64_t t0 = length, T = length == 0 ? 4 : 1;  // a prefill chunk, then tokens
    std::vector<float> xt(size_t(B * T * E)), ot(xt.size());
    CopyTokens(&x, &xt, B, L, E, t0, T, true);
    const simdattn_mha_tensor xs = CTensor(xt.data(), B, T, E), os = CTensor(ot.data(), B, T, E);
    ASSERT_EQ(simdattn_mha_step(layer, &xs, &k_cache, &v_cache, &length, &os, nullptr, nullptr,
                                nullptr),
              SIMDATTN_OK)
        << simdattn_last_error();
    EXPECT_EQ(length, t0 + T);
    CopyTokens(&steps, &ot, B, L, E, t0, T, false);
  }
  double err = 0.0;
  for (size_t i = 0; i < full.size(); ++i) err = std::max(err, double(std::fabs(full[i] - steps[i])));
  EXPECT_LE(err, 1e-5);
  simdattn_mha_destroy(layer);
}

TEST(CApiMhaTest, PagedStepsWithRopeEqualTheReference) {
  std::mt19937 rng(63);
  MhaConfig c;
  MhaWeights w;
  simdattn_mha* layer = MakeCLayer("llama", &rng, &c, &w);
  ASSERT_NE(layer, nullptr);
  const int64_t B = 2, L = 10, E = 32, Hkv = 2, D = 8, block = 8, pages = 4;
  std::vector<float> x = RandomFloats(size_t(B * L * E), &rng), steps(x.size());
  std::vector<float> kc(size_t(pages * block * Hkv * D)), vc(kc.size());
  const simdattn_tensor k_cache = simdattn_paged_nhd(kc.data(), SIMDATTN_F32, pages, block, Hkv, D);
  const simdattn_tensor v_cache = simdattn_paged_hnd(vc.data(), SIMDATTN_F32, pages, block, Hkv, D);
  const int32_t block_table[4] = {2, 0, 3, 1};
  int32_t seq_lens[2] = {0, 0};
  simdattn_mha_rotary rotary;
  simdattn_mha_rotary_init(&rotary);
  rotary.enabled = 1;
  rotary.rotary_dim = 4;
  rotary.theta = 1000.0;
  for (int64_t t0 = 0; t0 < L; t0 = seq_lens[0]) {
    const int64_t T = t0 == 0 ? 6 : 1;  // a prefill chunk, then tokens
    std::vector<float> xt(size_t(B * T * E)), ot(xt.size());
    CopyTokens(&x, &xt, B, L, E, t0, T, true);
    const simdattn_mha_tensor xs = CTensor(xt.data(), B, T, E), os = CTensor(ot.data(), B, T, E);
    ASSERT_EQ(simdattn_mha_step_paged(layer, &xs, &k_cache, &v_cache, block_table, 2, 0,
                                      seq_lens, &rotary, &os, nullptr, nullptr, nullptr),
              SIMDATTN_OK)
        << simdattn_last_error();
    EXPECT_EQ(seq_lens[1], t0 + T);
    CopyTokens(&steps, &ot, B, L, E, t0, T, false);
  }
  MhaRotary r;
  r.enabled = true;
  r.rotary_dim = 4;
  r.theta = 1000.0;
  MhaForwardOptions causal;
  causal.attention.causal = true;
  std::vector<double> want;
  ASSERT_TRUE(ReferenceMha(c, w, {&x, &x, &x, B, L, L, true, &r}, causal, &want, nullptr));
  EXPECT_LE(MaxError(steps, want), 1e-4);
  rotary.struct_size = 4;
  ASSERT_NE(simdattn_mha_step_paged(layer, nullptr, &k_cache, &v_cache, block_table, 2, 0,
                                    seq_lens, &rotary, nullptr, nullptr, nullptr, nullptr),
            SIMDATTN_OK);
  EXPECT_NE(std::string(simdattn_last_error()).find("x"), std::string::npos);
  std::vector<float> x1(size_t(B * E)), o1(x1.size());
  const simdattn_mha_tensor xs = CTensor(x1.data(), B, 1, E), os = CTensor(o1.data(), B, 1, E);
  EXPECT_EQ(simdattn_mha_step_paged(layer, &xs, &k_cache, &v_cache, block_table, 2, 0, seq_lens,
                                    &rotary, &os, nullptr, nullptr, nullptr),
            SIMDATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(simdattn_last_error()).find("simdattn_mha_rotary"), std::string::npos)
      << simdattn_last_error();
  simdattn_mha_destroy(layer);
}

// simdattn_last_error() after a failed call contains `what`.
void ExpectError(int code, const std::string& what) {
  EXPECT_EQ(code, SIMDATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(simdattn_last_error()).find(what), std::string::npos)
      << simdattn_last_error();
}

TEST(CApiMhaTest, ErrorsNameTheArgument) {
  simdattn_mha_config config;
  simdattn_mha_config_init(&config);
  simdattn_mha* layer = reinterpret_cast<simdattn_mha*>(&config);  // must be reset to NULL
  ExpectError(simdattn_mha_create(nullptr, &layer), "config");
  EXPECT_EQ(layer, nullptr);
  ExpectError(simdattn_mha_create(&config, nullptr), "out");
  config.embed_dim = 32;
  config.num_heads = 5;  // does not divide 32
  ExpectError(simdattn_mha_create(&config, &layer), "num_heads");
  config.num_heads = 4;
  config.struct_size = 8;
  ExpectError(simdattn_mha_create(&config, &layer), "struct_size");
  config.struct_size = sizeof(config);
  ASSERT_EQ(simdattn_mha_create(&config, &layer), SIMDATTN_OK) << simdattn_last_error();
  ExpectError(simdattn_mha_load(nullptr, nullptr, 0, nullptr), "layer");
  ExpectError(simdattn_mha_load(layer, nullptr, 3, nullptr), "tensors");
  std::vector<float> x(32), out(32);
  const simdattn_mha_tensor q = CTensor(x.data(), 1, 1, 32), o = CTensor(out.data(), 1, 1, 32);
  ExpectError(simdattn_mha_forward(layer, nullptr, nullptr, nullptr, &o, nullptr, nullptr,
                                   nullptr),
              "query");
  ExpectError(simdattn_mha_forward(layer, &q, nullptr, nullptr, nullptr, nullptr, nullptr,
                                   nullptr),
              "out");
  simdattn_mha_options opt;
  simdattn_mha_options_init(&opt);
  opt.struct_size = 4;
  ExpectError(simdattn_mha_forward(layer, &q, nullptr, nullptr, &o, &opt, nullptr, nullptr),
              "simdattn_mha_options");
  int64_t length = 0;
  ExpectError(simdattn_mha_step(layer, &q, nullptr, nullptr, &length, &o, nullptr, nullptr,
                                nullptr),
              "k_cache");
  simdattn_mha_destroy(layer);
  simdattn_mha_destroy(nullptr);  // a no-op
}

}  // namespace
}  // namespace test
}  // namespace simdattn
