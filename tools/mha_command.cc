// `simdattn mha` (see mha_command.h): loads the .npz weights under their
// PyTorch or Llama names, infers the layer's widths and biases from them,
// runs Forward and writes the output as '<f4' .npy.

#include "tools/mha_command.h"

#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "simdattn/mha.h"
#include "tools/npy.h"
#include "tools/npz.h"

namespace simdattn {
namespace {

int Fail(const std::string& message) {
  std::cerr << "simdattn mha: " << message << std::endl;
  return 2;
}

bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The layer's config from the weights' names and shapes and the inputs.
MhaConfig ConfigFor(const MhaArgs& a, const std::map<std::string, npy::Array>& w, int64_t e) {
  MhaConfig c;
  c.embed_dim = e;
  c.num_heads = a.heads;
  c.num_kv_heads = a.kv_heads;
  c.head_dim = a.head_dim;
  c.bias = false;
  for (const auto& [name, array] : w) {
    if (EndsWith(name, "proj_bias") || EndsWith(name, "proj.bias")) c.bias = true;
    if (EndsWith(name, "bias_k")) c.add_bias_kv = true;
    const bool k = EndsWith(name, "k_proj_weight") || EndsWith(name, "k_proj.weight");
    const bool v = EndsWith(name, "v_proj_weight") || EndsWith(name, "v_proj.weight");
    if (k && array.shape.size() == 2) c.kdim = array.shape[1];
    if (v && array.shape.size() == 2) c.vdim = array.shape[1];
  }
  return c;
}

// x as [B, L, dim] (or [L, B, dim] with --seq-first); 2-D: one batch entry.
bool Activations(const npy::Array& x, const std::string& flag, bool seq_first, MhaTensor* t,
                 std::string* error) {
  if (x.type != npy::ElementType::kF32 || (x.shape.size() != 2 && x.shape.size() != 3)) {
    *error = flag + ": want a 2-D or 3-D float array, got " + npy::ShapeString(x.shape);
    return false;
  }
  const bool three = x.shape.size() == 3;
  t->data = x.f32.data();
  t->dtype = DType::kF32;
  t->batch_first = !seq_first;
  t->batch = three ? (seq_first ? x.shape[1] : x.shape[0]) : 1;
  t->len = three ? (seq_first ? x.shape[0] : x.shape[1]) : x.shape[0];
  t->dim = x.shape.back();
  return true;
}

}  // namespace

CLI::App* AddMhaCommand(CLI::App* app, MhaArgs* a) {
  CLI::App* mha = app->add_subcommand(
      "mha", "Multi-head attention layer: out = attention(x Wq, y Wk, y Wv) Wo with weights "
             "from a .npz under PyTorch nn.MultiheadAttention or Llama names.");
  mha->add_option("--weights", a->weights, ".npz of the weights (numpy.savez or savez_compressed)")
      ->required();
  mha->add_option("--x", a->x, "query input .npy, [B, L, E] or [L, E]")->required();
  mha->add_option("--kv-source", a->kv_source,
                  "key/value input .npy [B, S, kdim] (cross-attention); default: --x");
  mha->add_option("--heads", a->heads, "query heads")->required();
  mha->add_option("--kv-heads", a->kv_heads, "key/value heads (GQA); default: --heads");
  mha->add_option("--head-dim", a->head_dim, "values per head; default: E / heads");
  mha->add_flag("--causal", a->causal, "causal mask (PyTorch is_causal: top-left)");
  mha->add_flag("--seq-first", a->seq_first, "inputs are [L, B, E] (batch_first=False)");
  mha->add_option("--threads", a->threads, "threads; default: every core");
  mha->add_option("--out", a->out, "output .npy ('<f4', the shape of --x)")->required();
  return mha;
}

int RunMha(const MhaArgs& a) {
  std::string error;
  std::map<std::string, npy::Array> weights;
  if (!npz::Read(a.weights, &weights, &error)) return Fail(error);
  npy::Array x, y;
  if (!npy::Read(a.x, &x, &error)) return Fail(error);
  if (!a.kv_source.empty() && !npy::Read(a.kv_source, &y, &error)) return Fail(error);
  MhaTensor q, kv;
  if (!Activations(x, "--x", a.seq_first, &q, &error)) return Fail(error);
  if (!a.kv_source.empty() && !Activations(y, "--kv-source", a.seq_first, &kv, &error)) {
    return Fail(error);
  }
  MultiHeadAttention* raw = nullptr;
  Status s = MultiHeadAttention::Create(ConfigFor(a, weights, q.dim), &raw);
  if (!s.ok()) return Fail(s.message);
  std::unique_ptr<MultiHeadAttention> layer(raw);
  std::vector<NamedTensor> named;
  for (const auto& [name, array] : weights) {
    if (array.type != npy::ElementType::kF32) return Fail(a.weights + ": " + name + " is not float");
    NamedTensor t;
    t.name = name.c_str();
    t.data = array.f32.data();
    t.ndim = int64_t(array.shape.size());
    for (size_t d = 0; d < array.shape.size() && d < 4; ++d) t.shape[d] = array.shape[d];
    if (array.shape.empty()) t.ndim = 1, t.shape[0] = 1;
    named.push_back(t);
  }
  std::unique_ptr<ThreadPool> pool;
  ExecutionOptions exec;
  if (a.threads > 0) pool.reset(new ThreadPool(a.threads)), exec.pool = pool.get();
  s = layer->LoadWeights(named.data(), int64_t(named.size()), exec);
  if (!s.ok()) return Fail(a.weights + ": " + s.message);
  std::vector<float> out(x.f32.size());
  MhaForwardOptions options;
  options.attention.causal = a.causal;
  if (a.causal) options.attention.alignment = Alignment::kTopLeft;
  s = layer->Forward(q, a.kv_source.empty() ? nullptr : &kv, a.kv_source.empty() ? nullptr : &kv,
                     {out.data(), DType::kF32, q.batch, q.len, q.dim, q.batch_first}, options, exec);
  if (!s.ok()) return Fail(s.message);
  if (!npy::WriteF32(a.out, out.data(), x.shape, &error)) return Fail(error);
  return 0;
}

}  // namespace simdattn
