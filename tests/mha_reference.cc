// The double reference of the multi-head attention layer (see the header).

#include "tests/mha_reference.h"

#include <cmath>
#include <limits>

#include "lib/reference.h"

namespace simdattn {
namespace test {
namespace {

std::vector<float> Uniform(size_t n, float scale, std::mt19937* rng) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(*rng);
  return v;
}

// y[r][o] = sum_i x[row r][i] w[o][i] + b[o], rows in x's order.
std::vector<double> Linear(const std::vector<float>& x, int64_t rows, int64_t in,
                           const std::vector<float>& w, const std::vector<float>& b,
                           int64_t out) {
  std::vector<double> y(size_t(rows * out));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double s = b.empty() ? 0.0 : b[size_t(o)];
      for (int64_t i = 0; i < in; ++i) s += double(x[size_t(r * in + i)]) * w[size_t(o * in + i)];
      y[size_t(r * out + o)] = s;
    }
  }
  return y;
}

// Rows of a projection (row (b, j) as MhaRow orders them) as f32 BHSD
// [B, H, L', D], with `extra` appended as key L' - 1 when not empty.
std::vector<float> Heads(const std::vector<double>& y, int64_t batch, int64_t len, bool bf,
                         int64_t heads, int64_t d, const std::vector<float>& extra) {
  const int64_t lp = len + (extra.empty() ? 0 : 1);
  std::vector<float> t(size_t(batch * heads * lp * d));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t j = 0; j < lp; ++j)
        for (int64_t e = 0; e < d; ++e) {
          const int64_t row = bf ? b * len + j : j * batch + b;
          t[size_t(((b * heads + h) * lp + j) * d + e)] =
              j < len ? float(y[size_t(row * heads * d + h * d + e)]) : extra[size_t(h * d + e)];
        }
  return t;
}

// RoPE (mha.h's MhaRotary) of every head of y's rows, row (b, j) as MhaRow
// orders them at position j, in double.
void Rotate(std::vector<double>* y, int64_t batch, int64_t len, bool bf, int64_t heads,
            int64_t d, const MhaRotary& r) {
  const int64_t rd = r.rotary_dim == 0 ? d : r.rotary_dim, half = rd / 2;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t j = 0; j < len; ++j)
      for (int64_t h = 0; h < heads; ++h) {
        double* x = y->data() + ((bf ? b * len + j : j * batch + b) * heads + h) * d;
        for (int64_t i = 0; i < half; ++i) {
          const double angle = double(j) * std::pow(r.theta, -2.0 * double(i) / double(rd));
          const double c = r.cos != nullptr ? r.cos[j * half + i] : std::cos(angle);
          const double s = r.sin != nullptr ? r.sin[j * half + i] : std::sin(angle);
          const int64_t i0 = r.interleaved ? 2 * i : i, i1 = r.interleaved ? 2 * i + 1 : i + half;
          const double x0 = x[i0], x1 = x[i1];
          x[i0] = x0 * c - x1 * s;
          x[i1] = x1 * c + x0 * s;
        }
      }
}

TensorView Bhsd(const std::vector<float>& v, int64_t b, int64_t h, int64_t s, int64_t d) {
  return MakeBHSD(v.data(), DType::kF32, b, h, s, d);
}

// The PyTorch masks as one f32 additive [B, H, Lq, Lk'] mask.
std::vector<float> TorchMask(const MhaForwardOptions& o, int64_t batch, int64_t heads,
                             int64_t lq, int64_t lk, bool bias_kv) {
  const int64_t lkp = lk + (bias_kv ? 1 : 0);
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> m(size_t(batch * heads * lq * lkp), 0.0f);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < lq; ++i)
        for (int64_t j = 0; j < lk; ++j) {
          float x = 0.0f;
          const MhaMask& a = o.attn_mask;
          if (a.data != nullptr) {
            const int64_t idx = a.ndim == 3 ? ((b * heads + h) * lq + i) * lk + j : i * lk + j;
            x += a.dtype == DType::kBool ? (static_cast<const uint8_t*>(a.data)[idx] ? -inf : 0.0f)
                                         : static_cast<const float*>(a.data)[idx];
          }
          const MhaMask& p = o.key_padding_mask;
          if (p.data != nullptr) {
            const int64_t idx = b * lk + j;
            x += p.dtype == DType::kBool ? (static_cast<const uint8_t*>(p.data)[idx] ? -inf : 0.0f)
                                         : static_cast<const float*>(p.data)[idx];
          }
          m[size_t(((b * heads + h) * lq + i) * lkp + j)] = x;
        }
  return m;
}

}  // namespace

MhaWeights RandomWeights(const MhaConfig& c, std::mt19937* rng) {
  const int64_t nq = c.num_heads * c.head_dim, nkv = c.num_kv_heads * c.head_dim;
  MhaWeights w;
  w.wq = Uniform(size_t(nq * c.embed_dim), 1.0f / std::sqrt(float(c.embed_dim)), rng);
  w.wk = Uniform(size_t(nkv * c.kdim), 1.0f / std::sqrt(float(c.kdim)), rng);
  w.wv = Uniform(size_t(nkv * c.vdim), 1.0f / std::sqrt(float(c.vdim)), rng);
  w.wo = Uniform(size_t(c.embed_dim * nq), 1.0f / std::sqrt(float(nq)), rng);
  if (c.bias) {
    w.bq = Uniform(size_t(nq), 0.5f, rng);
    w.bk = Uniform(size_t(nkv), 0.5f, rng);
    w.bv = Uniform(size_t(nkv), 0.5f, rng);
    w.bo = Uniform(size_t(c.embed_dim), 0.5f, rng);
  }
  if (c.add_bias_kv) {
    w.bias_k = Uniform(size_t(nkv), 1.0f, rng);
    w.bias_v = Uniform(size_t(nkv), 1.0f, rng);
  }
  return w;
}

std::vector<NamedTensor> Named(const MhaConfig& c, MhaWeights* w, const std::string& naming,
                               std::vector<std::string>* names, const std::string& prefix) {
  const int64_t nq = c.num_heads * c.head_dim, nkv = c.num_kv_heads * c.head_dim;
  std::vector<NamedTensor> t;
  names->clear();
  names->reserve(16);
  const auto add = [&](const std::string& n, const std::vector<float>& v, int64_t r, int64_t cols) {
    names->push_back(prefix + n);
    NamedTensor x;
    x.name = names->back().c_str();
    x.data = v.data();
    x.ndim = cols == 0 ? 1 : 2;
    x.shape[0] = r;
    x.shape[1] = cols;
    t.push_back(x);
  };
  const bool fused = naming == "torch" && c.kdim == c.embed_dim && c.vdim == c.embed_dim;
  if (fused) {
    w->in_proj = w->wq;
    w->in_proj.insert(w->in_proj.end(), w->wk.begin(), w->wk.end());
    w->in_proj.insert(w->in_proj.end(), w->wv.begin(), w->wv.end());
    add("in_proj_weight", w->in_proj, nq + 2 * nkv, c.embed_dim);
  } else {
    const bool llama = naming == "llama";
    add(llama ? "q_proj.weight" : "q_proj_weight", w->wq, nq, c.embed_dim);
    add(llama ? "k_proj.weight" : "k_proj_weight", w->wk, nkv, c.kdim);
    add(llama ? "v_proj.weight" : "v_proj_weight", w->wv, nkv, c.vdim);
  }
  add(naming == "llama" ? "o_proj.weight" : "out_proj.weight", w->wo, c.embed_dim, nq);
  if (c.bias) {
    if (naming == "llama") {
      add("q_proj.bias", w->bq, nq, 0);
      add("k_proj.bias", w->bk, nkv, 0);
      add("v_proj.bias", w->bv, nkv, 0);
      add("o_proj.bias", w->bo, c.embed_dim, 0);
    } else {
      w->in_bias = w->bq;
      w->in_bias.insert(w->in_bias.end(), w->bk.begin(), w->bk.end());
      w->in_bias.insert(w->in_bias.end(), w->bv.begin(), w->bv.end());
      add("in_proj_bias", w->in_bias, nq + 2 * nkv, 0);
      add("out_proj.bias", w->bo, c.embed_dim, 0);
    }
  }
  if (c.add_bias_kv) {
    add("bias_k", w->bias_k, nkv, 0);
    add("bias_v", w->bias_v, nkv, 0);
  }
  return t;
}

bool ReferenceMha(const MhaConfig& c, const MhaWeights& w, const MhaRefInput& in,
                  const MhaForwardOptions& options, std::vector<double>* out,
                  std::vector<double>* weights) {
  const int64_t B = in.batch, Lq = in.q_len, Lk = in.kv_len, D = c.head_dim;
  const int64_t H = c.num_heads, Hk = c.num_kv_heads, nq = H * D, nkv = Hk * D;
  std::vector<double> q = Linear(*in.q, B * Lq, c.embed_dim, w.wq, w.bq, nq);
  std::vector<double> k = Linear(*in.k, B * Lk, c.kdim, w.wk, w.bk, nkv);
  if (in.rotary != nullptr && in.rotary->enabled) {
    Rotate(&q, B, Lq, in.batch_first, H, D, *in.rotary);
    Rotate(&k, B, Lk, in.batch_first, Hk, D, *in.rotary);
  }
  const std::vector<double> v = Linear(*in.v, B * Lk, c.vdim, w.wv, w.bv, nkv);
  const std::vector<float> qh = Heads(q, B, Lq, in.batch_first, H, D, {});
  const std::vector<float> kh = Heads(k, B, Lk, in.batch_first, Hk, D, w.bias_k);
  const std::vector<float> vh = Heads(v, B, Lk, in.batch_first, Hk, D, w.bias_v);
  const int64_t Lkp = Lk + (c.add_bias_kv ? 1 : 0);
  AttentionOptions opts = options.attention;
  std::vector<float> mask;
  if (options.attn_mask.data != nullptr || options.key_padding_mask.data != nullptr) {
    mask = TorchMask(options, B, H, Lq, Lk, c.add_bias_kv);
    opts.mask = Bhsd(mask, B, H, Lq, Lkp);
  }
  std::vector<double> o, lse;
  if (!ReferenceAttention(Bhsd(qh, B, H, Lq, D), Bhsd(kh, B, Hk, Lkp, D), Bhsd(vh, B, Hk, Lkp, D),
                          opts, &o, &lse).ok()) {
    return false;
  }
  std::vector<float> concat(size_t(B * Lq * nq));  // rows in x's order
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Lq; ++i)
        for (int64_t e = 0; e < D; ++e) {
          const int64_t row = in.batch_first ? b * Lq + i : i * B + b;
          concat[size_t(row * nq + h * D + e)] = float(o[size_t(((b * H + h) * Lq + i) * D + e)]);
        }
  *out = Linear(concat, B * Lq, nq, w.wo, w.bo, c.embed_dim);
  if (weights == nullptr) return true;
  // exp(s - lse) with s from the rounded Q and K, masks only (the tests of
  // weights use no other score option).
  weights->assign(size_t(B * H * Lq * Lkp), 0.0);
  const double scale = opts.scale ? double(*opts.scale) : 1.0 / std::sqrt(double(D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Lq; ++i)
        for (int64_t j = 0; j < Lkp; ++j) {
          if (opts.causal && j > i) continue;
          double s = 0.0;
          for (int64_t e = 0; e < D; ++e) {
            s += double(qh[size_t(((b * H + h) * Lq + i) * D + e)]) *
                 kh[size_t(((b * Hk + h / (H / Hk)) * Lkp + j) * D + e)];
          }
          s *= scale;
          if (!mask.empty()) s += mask[size_t(((b * H + h) * Lq + i) * Lkp + j)];
          (*weights)[size_t(((b * H + h) * Lq + i) * Lkp + j)] =
              std::exp(s - lse[size_t((b * H + h) * Lq + i)]);
        }
  return true;
}

}  // namespace test
}  // namespace simdattn
