// oneDNN 2.6 multi-head attention pipeline for simdattn_bench (see the
// header).

#include "bench/onednn_mha.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "bench/onednn_attention.h"
#include "bench/onednn_matmul.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace simdattn {
namespace bench {

using dims = dnnl::memory::dims;
using dt = dnnl::memory::data_type;
using md = dnnl::memory::desc;

struct OneDnnMha::Impl {
  OneDnnMhaShape s;
  std::unique_ptr<OneDnnMatmul> qkv_mm, out_mm;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  dnnl::matmul qk, pv;
  dnnl::softmax_v2_forward softmax;
  md q_md, kt_md, v_md, o_md;
  dnnl::memory s_mem, mask_mem;
  // User scratchpads, allocated once (oneDNN's own would be allocated and
  // first-touched per call, which costs page faults here).
  dnnl::memory qk_scratch, sm_scratch, pv_scratch;
  std::vector<uint8_t> scratch[3];
  std::vector<float> qkv, o, scores, mask;
  float *k_cache = nullptr, *v_cache = nullptr;
  std::string error;
};

namespace {

bool IsReference(const char* impl) { return std::string(impl).rfind("ref", 0) == 0; }

// The attention's memory descriptors over the QKV buffer (rows ld apart)
// or the caches: Q [Hkv, G*Lq, D], Kᵀ [Hkv, D, Lk], V [Hkv, Lk, D],
// O [Hkv, G*Lq, D] into the [Lq, Hq*D] buffer of the output matmul.
void Descriptors(OneDnnMha::Impl& m) {
  const OneDnnMhaShape& s = m.s;
  const int64_t D = s.head_dim, G = s.heads / s.kv_heads, rows = G * s.q_len;
  const int64_t ld = (s.heads + 2 * s.kv_heads) * D, nq = s.heads * D, L = s.kv_len;
  // Self-attention: G = 1, row i of head h at i * ld + h * D. Decode:
  // Lq = 1, row g of KV head hk at (hk * G + g) * D.
  const int64_t q_row = s.decode ? D : ld, o_row = s.decode ? D : nq;
  m.q_md = md(dims{s.kv_heads, rows, D}, dt::f32, dims{G * D, q_row, 1});
  m.o_md = md(dims{s.kv_heads, rows, D}, dt::f32, dims{G * D, o_row, 1});
  if (s.decode) {
    m.kt_md = md(dims{s.kv_heads, D, L}, dt::f32, dims{L * D, 1, D});
    m.v_md = md(dims{s.kv_heads, L, D}, dt::f32, dims{L * D, D, 1});
  } else {
    m.kt_md = md(dims{s.kv_heads, D, L}, dt::f32, dims{D, 1, ld});
    m.v_md = md(dims{s.kv_heads, L, D}, dt::f32, dims{D, ld, 1});
  }
}

}  // namespace

OneDnnMha::OneDnnMha(const OneDnnMhaShape& s, const float* w_qkv, const float* b_qkv,
                     const float* w_o, const float* b_o, float* k_cache, float* v_cache)
    : impl_(new Impl) {
  Impl& m = *impl_;
  m.s = s;
  m.k_cache = k_cache;
  m.v_cache = v_cache;
  const int64_t D = s.head_dim, nq = s.heads * D, ld = nq + 2 * s.kv_heads * D;
  const int64_t rows = (s.heads / s.kv_heads) * s.q_len, L = s.kv_len;
  m.qkv_mm.reset(new OneDnnMatmul(s.q_len, ld, s.embed_dim, w_qkv, b_qkv));
  m.out_mm.reset(new OneDnnMatmul(s.q_len, s.embed_dim, nq, w_o, b_o));
  m.qkv.assign(size_t(s.q_len * ld), 0.0f);
  m.o.assign(size_t(s.q_len * nq), 0.0f);
  Descriptors(m);
  const md s_md(dims{s.kv_heads, rows, L}, dt::f32, dims{rows * L, L, 1});
  dnnl::primitive_attr attr, plain;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  plain.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  attr.set_output_scales(0, {1.0f / std::sqrt(float(D))});
  if (s.causal) {  // materialized, as the bench's attention baseline does
    m.mask.assign(size_t(s.kv_heads * rows * L), 0.0f);
    for (int64_t b = 0; b < s.kv_heads; ++b)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = r % s.q_len + 1; j < L; ++j)
          m.mask[size_t((b * rows + r) * L + j)] = -std::numeric_limits<float>::infinity();
    dnnl::post_ops po;
    po.append_binary(dnnl::algorithm::binary_add, s_md);
    attr.set_post_ops(po);
    m.mask_mem = dnnl::memory(s_md, m.engine, m.mask.data());
  }
  const dnnl::matmul::primitive_desc qk_pd(dnnl::matmul::desc(m.q_md, m.kt_md, s_md), attr,
                                           m.engine);
  const dnnl::softmax_v2_forward::primitive_desc sm_pd(
      dnnl::softmax_v2_forward::desc(dnnl::prop_kind::forward_inference,
                                     dnnl::algorithm::softmax_accurate, s_md, s_md, 2),
      plain, m.engine);
  const dnnl::matmul::primitive_desc pv_pd(dnnl::matmul::desc(s_md, m.v_md, m.o_md), plain,
                                           m.engine);
  const dnnl::memory::desc pads[3] = {qk_pd.scratchpad_desc(), sm_pd.scratchpad_desc(),
                                      pv_pd.scratchpad_desc()};
  dnnl::memory* mems[3] = {&m.qk_scratch, &m.sm_scratch, &m.pv_scratch};
  for (int i = 0; i < 3; ++i) {
    m.scratch[i].assign(pads[i].get_size() + 1, 0);
    *mems[i] = dnnl::memory(pads[i], m.engine, m.scratch[i].data());
  }
  m.qk = dnnl::matmul(qk_pd);
  m.softmax = dnnl::softmax_v2_forward(sm_pd);
  m.pv = dnnl::matmul(pv_pd);
  if (IsReference(qk_pd.impl_info_str())) m.error = "Q·Kᵀ runs oneDNN's reference code";
  if (IsReference(sm_pd.impl_info_str())) m.error = "softmax runs oneDNN's reference code";
  if (IsReference(pv_pd.impl_info_str())) m.error = "P·V runs oneDNN's reference code";
  if (!m.qkv_mm->error().empty()) m.error = m.qkv_mm->error();
  if (!m.out_mm->error().empty()) m.error = m.out_mm->error();
  m.scores.assign(size_t(s.kv_heads * rows * L), 0.0f);
  m.s_mem = dnnl::memory(s_md, m.engine, m.scores.data());
}

OneDnnMha::~OneDnnMha() = default;

const std::string& OneDnnMha::error() const { return impl_->error; }

void OneDnnMha::Run(const float* x, float* out, int threads) {
  Impl& m = *impl_;
  const OneDnnMhaShape& s = m.s;
  const int64_t D = s.head_dim, nq = s.heads * D, nkv = s.kv_heads * D;
  m.qkv_mm->Run(x, m.qkv.data(), threads);
  SetOneDnnThreads(threads);
  float* qkv = m.qkv.data();
  dnnl::memory q(m.q_md, m.engine, qkv), o(m.o_md, m.engine, m.o.data());
  dnnl::memory k, v;
  if (s.decode) {  // the new token's K and V into the caches' last row
    for (int64_t h = 0; h < s.kv_heads; ++h) {
      std::memcpy(m.k_cache + (h * s.kv_len + s.kv_len - 1) * D, qkv + nq + h * D, size_t(D) * 4);
      std::memcpy(m.v_cache + (h * s.kv_len + s.kv_len - 1) * D, qkv + nq + nkv + h * D,
                  size_t(D) * 4);
    }
    k = dnnl::memory(m.kt_md, m.engine, m.k_cache);
    v = dnnl::memory(m.v_md, m.engine, m.v_cache);
  } else {
    k = dnnl::memory(m.kt_md, m.engine, qkv + nq);
    v = dnnl::memory(m.v_md, m.engine, qkv + nq + nkv);
  }
  if (s.causal) {
    m.qk.execute(m.stream, {{DNNL_ARG_SRC, q}, {DNNL_ARG_WEIGHTS, k}, {DNNL_ARG_DST, m.s_mem},
                            {DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, m.mask_mem},
                            {DNNL_ARG_SCRATCHPAD, m.qk_scratch}});
  } else {
    m.qk.execute(m.stream, {{DNNL_ARG_SRC, q}, {DNNL_ARG_WEIGHTS, k}, {DNNL_ARG_DST, m.s_mem},
                            {DNNL_ARG_SCRATCHPAD, m.qk_scratch}});
  }
  m.softmax.execute(m.stream, {{DNNL_ARG_SRC, m.s_mem}, {DNNL_ARG_DST, m.s_mem},
                               {DNNL_ARG_SCRATCHPAD, m.sm_scratch}});
  m.pv.execute(m.stream, {{DNNL_ARG_SRC, m.s_mem}, {DNNL_ARG_WEIGHTS, v}, {DNNL_ARG_DST, o},
                          {DNNL_ARG_SCRATCHPAD, m.pv_scratch}});
  m.stream.wait();
  m.out_mm->Run(m.o.data(), out, threads);
}

}  // namespace bench
}  // namespace simdattn
