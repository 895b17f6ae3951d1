// The multi-head attention layer in double precision for the tests: its
// weights as plain vectors, the projections and the output projection in
// double, and the attention in between by the library's oracle
// (ReferenceAttention) on Q, K and V rounded to the layer's storage, so
// every SEMANTICS.md option is checked by the oracle that defines it.

#ifndef SIMDATTN_TESTS_MHA_REFERENCE_H_
#define SIMDATTN_TESTS_MHA_REFERENCE_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "simdattn/mha.h"

namespace simdattn {
namespace test {

// Weights of a layer, f32, PyTorch's shapes.
struct MhaWeights {
  std::vector<float> wq, wk, wv, wo;  // [nq, E], [nkv, kdim], [nkv, vdim], [E, nq]
  std::vector<float> bq, bk, bv, bo;  // empty without bias
  std::vector<float> bias_k, bias_v;  // [nkv] with add_bias_kv
  std::vector<float> in_proj;         // [nq + 2 nkv, E] when fused naming is used
  std::vector<float> in_bias;
};

// Random weights (uniform, scaled by 1/sqrt(fan-in)) for a resolved config.
MhaWeights RandomWeights(const MhaConfig& c, std::mt19937* rng);

// NamedTensors over w: PyTorch naming ("torch": in_proj_weight when
// kdim = vdim = E, else q/k/v_proj_weight) or Llama naming ("llama").
// `prefix` is put before every name.
std::vector<NamedTensor> Named(const MhaConfig& c, MhaWeights* w, const std::string& naming,
                               std::vector<std::string>* names, const std::string& prefix = "");

// One forward as the layer computes it, in double: out [B, Lq, E] in x's
// layout, weights (when want_weights) [B, Hq, Lq, Lk'] per head.
struct MhaRefInput {
  const std::vector<float>* q;  // [B, Lq, E] or [Lq, B, E]
  const std::vector<float>* k;  // [B, Lk, kdim], or q
  const std::vector<float>* v;
  int64_t batch, q_len, kv_len;
  bool batch_first;
  // When enabled: the projected Q and K rotated in double, row (b, j) at
  // position j (the tables' values when given, else angles from theta).
  const MhaRotary* rotary = nullptr;
};
bool ReferenceMha(const MhaConfig& c, const MhaWeights& w, const MhaRefInput& in,
                  const MhaForwardOptions& options, std::vector<double>* out,
                  std::vector<double>* weights);

}  // namespace test
}  // namespace simdattn

#endif  // SIMDATTN_TESTS_MHA_REFERENCE_H_
