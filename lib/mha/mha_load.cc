// Loading the layer's weights under PyTorch nn.MultiheadAttention or Llama
// names and packing them once for the GEMM.

#include <cstring>
#include <map>
#include <string>

#include "lib/dtype.h"
#include "lib/mha/mha_internal.h"

namespace simdattn {
namespace {

const char* const kNames[] = {
    "in_proj_weight", "in_proj_bias",  "q_proj_weight", "k_proj_weight",
    "v_proj_weight",  "out_proj.weight", "out_proj.bias", "bias_k",
    "bias_v",         "q_proj.weight", "k_proj.weight", "v_proj.weight",
    "o_proj.weight",  "q_proj.bias",   "k_proj.bias",   "v_proj.bias",
    "o_proj.bias"};

// Whether `name` is `key` or ends with "." + key.
bool Matches(const std::string& name, const std::string& key) {
  if (name == key) return true;
  return name.size() > key.size() + 1 &&
         name.compare(name.size() - key.size(), key.size(), key) == 0 &&
         name[name.size() - key.size() - 1] == '.';
}

using Found = std::map<std::string, const NamedTensor*>;

// Each tensor under the one known name it matches.
Status Classify(const NamedTensor* tensors, int64_t num, Found* found) {
  for (int64_t i = 0; i < num; ++i) {
    const NamedTensor& t = tensors[i];
    const std::string where = "tensors[" + std::to_string(i) + "]";
    if (t.name == nullptr) return Invalid(where + ".name is null");
    const std::string name = t.name;
    const char* key = nullptr;
    for (const char* k : kNames) {
      if (Matches(name, k)) key = k;
    }
    if (key == nullptr) return Invalid("unexpected tensor '" + name + "'");
    if (found->count(key)) return Invalid("duplicate tensor '" + name + "' (" + key + ")");
    if (t.data == nullptr) return Invalid("tensor '" + name + "': data is null");
    if (t.dtype != DType::kF32 && t.dtype != DType::kF16 && t.dtype != DType::kBF16) {
      return Invalid("tensor '" + name + "': dtype " + DTypeName(t.dtype));
    }
    if (t.ndim < 1 || t.ndim > 4) {
      return Invalid("tensor '" + name + "': ndim = " + std::to_string(t.ndim));
    }
    (*found)[key] = &t;
  }
  return Status::Ok();
}

std::string ShapeString(const NamedTensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.ndim; ++d) s += (d ? ", " : "") + std::to_string(t.shape[d]);
  return s + "]";
}

// The tensor under `key`: required (present when `want`, absent otherwise),
// a matrix [rows, cols] (cols 0: a vector of rows elements, any shape).
Status Take(const Found& found, const char* key, bool want, int64_t rows, int64_t cols,
            const NamedTensor** out) {
  const auto it = found.find(key);
  *out = it == found.end() ? nullptr : it->second;
  if (!want) {
    return *out == nullptr ? Status::Ok()
                           : Invalid(std::string("unexpected tensor '") + (*out)->name +
                                     "' for this config");
  }
  if (*out == nullptr) return Invalid(std::string("missing tensor ") + key);
  const NamedTensor& t = **out;
  int64_t numel = 1;
  for (int64_t d = 0; d < t.ndim; ++d) numel *= t.shape[d];
  const bool ok = cols == 0 ? numel == rows
                            : t.ndim == 2 && t.shape[0] == rows && t.shape[1] == cols;
  if (ok) return Status::Ok();
  return Invalid(std::string("tensor '") + t.name + "': shape " + ShapeString(t) +
                 ", want " + (cols == 0 ? std::to_string(rows) + " elements"
                                        : "[" + std::to_string(rows) + ", " +
                                              std::to_string(cols) + "]"));
}

// The Q, K and V matrices (and biases) as one of the three namings gives them.
Status InputMatrices(const MhaConfig& c, int64_t nq, int64_t nkv, const Found& f,
                     WeightMatrix m[3]) {
  const bool in_proj = f.count("in_proj_weight") != 0;
  const bool llama = f.count("q_proj.weight") || f.count("k_proj.weight") || f.count("v_proj.weight");
  const char* qn = llama ? "q_proj.weight" : "q_proj_weight";
  const char* kn = llama ? "k_proj.weight" : "k_proj_weight";
  const char* vn = llama ? "v_proj.weight" : "v_proj_weight";
  const NamedTensor* t[3] = {nullptr, nullptr, nullptr};
  Status s;
  if (in_proj) {
    if (c.kdim != c.embed_dim || c.vdim != c.embed_dim) {
      return Invalid("in_proj_weight needs kdim = vdim = embed_dim; give q/k/v_proj_weight");
    }
    s = Take(f, "in_proj_weight", true, nq + 2 * nkv, c.embed_dim, &t[0]);
    for (const char* n : {qn, kn, vn}) {
      if (s.ok()) s = Take(f, n, false, 0, 0, &t[1]);
    }
    if (!s.ok()) return s;
    const int64_t size = DTypeSize(t[0]->dtype);
    const char* base = static_cast<const char*>(t[0]->data);
    m[0] = {base, t[0]->dtype, nq, c.embed_dim};
    m[1] = {base + nq * c.embed_dim * size, t[0]->dtype, nkv, c.embed_dim};
    m[2] = {base + (nq + nkv) * c.embed_dim * size, t[0]->dtype, nkv, c.embed_dim};
  } else {
    s = Take(f, qn, true, nq, c.embed_dim, &t[0]);
    if (s.ok()) s = Take(f, kn, true, nkv, c.kdim, &t[1]);
    if (s.ok()) s = Take(f, vn, true, nkv, c.vdim, &t[2]);
    if (!s.ok()) return s;
    m[0] = {t[0]->data, t[0]->dtype, nq, c.embed_dim};
    m[1] = {t[1]->data, t[1]->dtype, nkv, c.kdim};
    m[2] = {t[2]->data, t[2]->dtype, nkv, c.vdim};
  }
  // Biases: in_proj_bias, or Llama's per-projection biases.
  const bool split_bias = f.count("q_proj.bias") || f.count("k_proj.bias") || f.count("v_proj.bias");
  const NamedTensor* b[3] = {nullptr, nullptr, nullptr};
  if (split_bias) {
    s = Take(f, "q_proj.bias", c.bias, nq, 0, &b[0]);
    if (s.ok()) s = Take(f, "k_proj.bias", c.bias, nkv, 0, &b[1]);
    if (s.ok()) s = Take(f, "v_proj.bias", c.bias, nkv, 0, &b[2]);
    const NamedTensor* absent = nullptr;  // in_proj_bias may not come with them
    if (s.ok()) s = Take(f, "in_proj_bias", false, 0, 0, &absent);
    if (!s.ok()) return s;
    for (int i = 0; i < 3; ++i) m[i].bias = b[i]->data, m[i].bias_dtype = b[i]->dtype;
    return Status::Ok();
  }
  s = Take(f, "in_proj_bias", c.bias, nq + 2 * nkv, 0, &b[0]);
  if (!s.ok() || !c.bias) return s;
  const int64_t size = DTypeSize(b[0]->dtype);
  const char* base = static_cast<const char*>(b[0]->data);
  const int64_t offsets[3] = {0, nq, nq + nkv};
  for (int i = 0; i < 3; ++i) m[i].bias = base + offsets[i] * size, m[i].bias_dtype = b[0]->dtype;
  return Status::Ok();
}

Status OutputMatrix(const MhaConfig& c, int64_t nq, const Found& f, WeightMatrix* m) {
  const bool llama = f.count("o_proj.weight") != 0;
  const NamedTensor* w = nullptr;
  const NamedTensor* b = nullptr;
  Status s = Take(f, llama ? "o_proj.weight" : "out_proj.weight", true, c.embed_dim, nq, &w);
  if (s.ok()) s = Take(f, llama ? "o_proj.bias" : "out_proj.bias", c.bias, c.embed_dim, 0, &b);
  if (s.ok()) s = Take(f, llama ? "out_proj.weight" : "o_proj.weight", false, 0, 0, &b);
  if (s.ok()) s = Take(f, llama ? "out_proj.bias" : "o_proj.bias", false, 0, 0, &b);
  if (!s.ok()) return s;
  *m = {w->data, w->dtype, c.embed_dim, nq};
  if (c.bias) {
    const NamedTensor* ob = f.at(llama ? "o_proj.bias" : "out_proj.bias");
    m->bias = ob->data;
    m->bias_dtype = ob->dtype;
  }
  return Status::Ok();
}

void Widen(const NamedTensor& t, int64_t n, std::vector<float>* out) {
  out->resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const float* f = static_cast<const float*>(t.data);
    const uint16_t* h = static_cast<const uint16_t*>(t.data);
    (*out)[static_cast<size_t>(i)] = t.dtype == DType::kF32    ? f[i]
                                     : t.dtype == DType::kBF16 ? BF16ToF32(h[i])
                                                               : F16ToF32(h[i]);
  }
}

}  // namespace

Status MultiHeadAttention::LoadWeights(const NamedTensor* tensors, int64_t num,
                                       const ExecutionOptions& exec) {
  Impl& m = *impl_;
  const MhaConfig& c = m.config;
  if (tensors == nullptr && num > 0) return Invalid("tensors is null");
  Found found;
  Status s = Classify(tensors, num, &found);
  WeightMatrix in[3], out;
  if (s.ok()) s = InputMatrices(c, m.nq, m.nkv, found, in);
  if (s.ok()) s = OutputMatrix(c, m.nq, found, &out);
  const NamedTensor *bk = nullptr, *bv = nullptr;
  if (s.ok()) s = Take(found, "bias_k", c.add_bias_kv, m.nkv, 0, &bk);
  if (s.ok()) s = Take(found, "bias_v", c.add_bias_kv, m.nkv, 0, &bv);
  if (!s.ok()) return s;
  const bool fused = c.kdim == c.embed_dim && c.vdim == c.embed_dim;
  std::vector<PackedWeights> packs(fused ? 1 : 3);
  if (fused) {
    s = PackWeights(in, 3, c.embed_dim, exec, &packs[0]);
  } else {
    const int64_t ks[3] = {c.embed_dim, c.kdim, c.vdim};
    for (int i = 0; i < 3 && s.ok(); ++i) s = PackWeights(&in[i], 1, ks[i], exec, &packs[size_t(i)]);
  }
  PackedWeights out_pack;
  if (s.ok()) s = PackWeights(&out, 1, m.nq, exec, &out_pack);
  if (!s.ok()) return s;
  std::lock_guard<std::mutex> lock(m.mutex);
  m.fused = fused;
  m.in_packs = std::move(packs);
  m.out_pack = std::move(out_pack);
  m.q_ref = {0, 0};
  m.k_ref = fused ? ProjRef{0, 1} : ProjRef{1, 0};
  m.v_ref = fused ? ProjRef{0, 2} : ProjRef{2, 0};
  if (c.add_bias_kv) {
    Widen(*bk, m.nkv, &m.bias_k);
    Widen(*bv, m.nkv, &m.bias_v);
  }
  m.loaded = true;
  return Status::Ok();
}

}  // namespace simdattn
