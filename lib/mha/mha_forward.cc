// MultiHeadAttention::Forward: projections (one fused GEMM for
// self-attention), the bias key of add_bias_kv, the masks, the fused
// attention, the output projection and, on request, the softmax weights.

#include <cstring>
#include <string>

#include "lib/dtype.h"
#include "lib/mha/mha_internal.h"

namespace simdattn {
namespace {

Status CheckTensor(const char* name, const MhaTensor& t, int64_t dim) {
  const std::string n = name;
  if (t.data == nullptr) return Invalid(n + ".data is null");
  if (t.dtype != DType::kF32 && t.dtype != DType::kF16 && t.dtype != DType::kBF16) {
    return Invalid(n + ".dtype = " + DTypeName(t.dtype));
  }
  if (t.batch < 1 || t.len < 1) {
    return Invalid(n + ": batch = " + std::to_string(t.batch) + ", len = " +
                   std::to_string(t.len) + " (want >= 1)");
  }
  if (t.dim != dim) {
    return Invalid(n + ".dim = " + std::to_string(t.dim) + ", want " + std::to_string(dim));
  }
  return Status::Ok();
}

MhaTensor AsInput(const MutableMhaTensor& t) {
  return {t.data, t.dtype, t.batch, t.len, t.dim, t.batch_first};
}

MutableTensorView Mutable(const TensorView& v) {
  MutableTensorView m;
  m.data = const_cast<void*>(v.data);
  m.dtype = v.dtype;
  for (int i = 0; i < 4; ++i) m.shape[i] = v.shape[i], m.strides[i] = v.strides[i];
  return m;
}

bool SameTensor(const MhaTensor& a, const MhaTensor& b) {
  return a.data == b.data && a.dtype == b.dtype && a.batch == b.batch && a.len == b.len &&
         a.dim == b.dim && a.batch_first == b.batch_first;
}

Status CheckForward(const MhaConfig& c, const MhaTensor& q, const MhaTensor& k,
                    const MhaTensor& v, const MutableMhaTensor& out) {
  Status s = CheckTensor("query", q, c.embed_dim);
  if (s.ok()) s = CheckTensor("key", k, c.kdim);
  if (s.ok()) s = CheckTensor("value", v, c.vdim);
  if (s.ok()) s = CheckTensor("out", AsInput(out), c.embed_dim);
  if (!s.ok()) return s;
  if (k.batch != q.batch || v.batch != q.batch || out.batch != q.batch) {
    return Invalid("batch: query " + std::to_string(q.batch) + ", key " +
                   std::to_string(k.batch) + ", value " + std::to_string(v.batch) +
                   ", out " + std::to_string(out.batch) + " differ");
  }
  if (k.len != v.len) {
    return Invalid("key.len = " + std::to_string(k.len) + " != value.len = " + std::to_string(v.len));
  }
  if (out.len != q.len) {
    return Invalid("out.len = " + std::to_string(out.len) + " != query.len = " + std::to_string(q.len));
  }
  if (k.batch_first != q.batch_first || v.batch_first != q.batch_first ||
      out.batch_first != q.batch_first) {
    return Invalid("batch_first: query, key, value and out must agree");
  }
  return Status::Ok();
}

// Where a call's projected Q and K|V rows lie: matrices of rows ld apart,
// K at column k_col and V at k_col + nkv of kv.
struct Projected {
  const void* q = nullptr;
  int64_t q_ld = 0;
  const void* kv = nullptr;
  int64_t kv_ld = 0, k_col = 0;
  bool kv_batch_first = true;
  int64_t kv_len = 0;
};

Status Project(MultiHeadAttention::Impl& m, const MhaTensor& q, const MhaTensor& k,
               const MhaTensor& v, const ExecutionOptions& exec, Projected* p) {
  const DType dt = m.config.dtype;
  const int64_t es = DTypeSize(dt), mq = q.batch * q.len, mk = k.batch * k.len;
  const auto gemm = [&](const MhaTensor& x, ProjRef r, int end, void* c, int64_t ldc) {
    return Gemm({x.data, x.dtype, x.batch * x.len, x.dim}, m.in_packs[size_t(r.pack)], r.seg,
                end, c, dt, ldc, exec);
  };
  const bool self = m.fused && SameTensor(q, k) && SameTensor(q, v);
  const int64_t q_cols = self ? m.nq + 2 * m.nkv : m.nq;
  Status s = MhaReserve(&m.qkv, size_t(mq * q_cols * es), "the projected Q, K, V");
  if (!s.ok()) return s;
  *p = {m.qkv.data(), q_cols, m.qkv.data(), q_cols, m.nq, q.batch_first, q.len};
  if (self) return gemm(q, m.q_ref, 3, m.qkv.data(), q_cols);
  s = gemm(q, m.q_ref, 1, m.qkv.data(), q_cols);
  if (s.ok()) s = MhaReserve(&m.kv, size_t(mk * 2 * m.nkv * es), "the projected K, V");
  if (!s.ok()) return s;
  *p = {m.qkv.data(), q_cols, m.kv.data(), 2 * m.nkv, 0, k.batch_first, k.len};
  if (m.fused && SameTensor(k, v)) return gemm(k, m.k_ref, 3, m.kv.data(), 2 * m.nkv);
  s = gemm(k, m.k_ref, m.k_ref.seg + 1, m.kv.data(), 2 * m.nkv);
  if (!s.ok()) return s;
  return gemm(v, m.v_ref, m.v_ref.seg + 1, m.kv.data() + m.nkv * es, 2 * m.nkv);
}

// add_bias_kv: K|V rows copied batch-first into [B, Lk + 1, 2 nkv] with
// bias_k|bias_v (rounded to the layer's dtype) as the last row of each.
Status AppendBiasKv(MultiHeadAttention::Impl& m, int64_t batch, Projected* p) {
  const DType dt = m.config.dtype;
  const int64_t es = DTypeSize(dt), lk = p->kv_len, w = 2 * m.nkv;
  Status s = MhaReserve(&m.kv_ext, size_t(batch * (lk + 1) * w * es), "the K, V with bias_k, bias_v");
  if (!s.ok()) return s;
  unsigned char* dst = m.kv_ext.data();
  const unsigned char* src = static_cast<const unsigned char*>(p->kv);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t j = 0; j < lk; ++j) {
      const int64_t row = MhaRow(p->kv_batch_first, batch, lk, b, j);
      std::memcpy(dst + (b * (lk + 1) + j) * w * es, src + (row * p->kv_ld + p->k_col) * es,
                  size_t(w * es));
    }
    unsigned char* last = dst + (b * (lk + 1) + lk) * w * es;
    for (int64_t c = 0; c < w; ++c) {
      const float x = c < m.nkv ? m.bias_k[size_t(c)] : m.bias_v[size_t(c - m.nkv)];
      if (dt == DType::kF32) std::memcpy(last + c * 4, &x, 4);
      const uint16_t h = dt == DType::kBF16 ? F32ToBF16(x) : F32ToF16(x);
      if (dt != DType::kF32) std::memcpy(last + c * 2, &h, 2);
    }
  }
  *p = {p->q, p->q_ld, m.kv_ext.data(), w, 0, true, lk + 1};
  return Status::Ok();
}

}  // namespace

Status MultiHeadAttention::Forward(const MhaTensor& query, const MhaTensor* key,
                                   const MhaTensor* value, const MutableMhaTensor& out,
                                   const MhaForwardOptions& options,
                                   const ExecutionOptions& exec, RunInfo* info) {
  Impl& m = *impl_;
  const MhaConfig& c = m.config;
  if (!m.loaded) return Invalid("layer: weights not loaded (LoadWeights)");
  if ((key == nullptr) != (value == nullptr)) return Invalid("key, value: give both or neither");
  if (options.rotary.enabled) return Unimplemented("options.rotary: StepPaged only");
  const MhaTensor& k = key != nullptr ? *key : query;
  const MhaTensor& v = value != nullptr ? *value : query;
  Status s = CheckForward(c, query, k, v, out);
  if (!s.ok()) return s;
  std::lock_guard<std::mutex> lock(m.mutex);
  const DType dt = c.dtype;
  const int64_t B = query.batch, Lq = query.len, H = c.num_heads, D = c.head_dim;
  TensorView mask;
  s = MhaBuildMask(options, B, H, Lq, k.len, c.add_bias_kv, &m.mask, &mask);
  Projected p;
  if (s.ok()) s = Project(m, query, k, v, exec, &p);
  if (s.ok() && c.add_bias_kv) s = AppendBiasKv(m, B, &p);
  if (s.ok()) s = MhaReserve(&m.o, size_t(B * Lq * m.nq * DTypeSize(dt)), "the attention output");
  if (s.ok() && options.weights != nullptr) {
    s = MhaReserve(&m.lse, size_t(B * H * Lq) * 4, "the LSE");
  }
  if (!s.ok()) return s;
  const bool bf = query.batch_first;
  const TensorView qv = MhaHeadsView(p.q, dt, p.q_ld, 0, bf, B, H, Lq, D);
  const TensorView kv = MhaHeadsView(p.kv, dt, p.kv_ld, p.k_col, p.kv_batch_first, B,
                                     c.num_kv_heads, p.kv_len, D);
  const TensorView vv = MhaHeadsView(p.kv, dt, p.kv_ld, p.k_col + m.nkv, p.kv_batch_first, B,
                                     c.num_kv_heads, p.kv_len, D);
  const MutableTensorView ov = Mutable(MhaHeadsView(m.o.data(), dt, m.nq, 0, bf, B, H, Lq, D));
  MutableTensorView lse;
  if (options.weights != nullptr) {
    lse = MakeBHSD(m.lse.data(), DType::kF32, B, H, Lq, 1);
  }
  AttentionOptions opts = options.attention;
  opts.mask = mask;
  s = Attention(qv, kv, vv, ov, opts, lse, exec, info);
  if (s.ok()) {
    s = Gemm({m.o.data(), dt, B * Lq, m.nq}, m.out_pack, 0, 1, out.data, out.dtype,
             c.embed_dim, exec);
  }
  if (s.ok() && options.weights != nullptr) {
    s = MhaSoftmaxWeights(qv, kv, opts, reinterpret_cast<const float*>(m.lse.data()),
                          options.average_weights, options.weights, exec);
  }
  return s;
}

}  // namespace simdattn
