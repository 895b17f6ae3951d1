// oneDNN 2.6 unfused attention pipeline for simdattn_bench (see the header).

#include "bench/onednn_attention.h"

#include <omp.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"

namespace simdattn {
namespace bench {

struct OneDnnAttention::Impl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  dnnl::matmul qk, pv;
  dnnl::softmax_v2_forward softmax;
  dnnl::memory q_mem, k_mem, v_mem, o_mem, s_mem, p_mem, mask_mem;
  std::vector<float> scores, mask;
  std::vector<uint16_t> probs;  // P in bf16 for the bf16 pipeline
  bool causal = false;
  std::string error, impls;
};

namespace {

using dims = dnnl::memory::dims;
using dt = dnnl::memory::data_type;

bool IsReference(const char* impl) {
  return std::string(impl).rfind("ref", 0) == 0;
}

}  // namespace

OneDnnAttention::OneDnnAttention(int64_t batch, int64_t q_heads,
                                 int64_t kv_heads, int64_t q_len,
                                 int64_t kv_len, int64_t head_dim, bool causal,
                                 bool bf16, const void* q, const void* k,
                                 const void* v, float* o)
    : impl_(new Impl) {
  Impl& m = *impl_;
  m.causal = causal;
  const int64_t n = batch * kv_heads;           // batch of the matmuls
  const int64_t rows = (q_heads / kv_heads) * q_len;  // G·Lq query rows
  const int64_t D = head_dim, L = kv_len;

  const dt in_dt = bf16 ? dt::bf16 : dt::f32;
  const dnnl::memory::desc q_md(dims{n, rows, D}, in_dt, dims{rows * D, D, 1});
  // Kᵀ as a strided view of K [n, L, D]: logical [n, D, L].
  const dnnl::memory::desc kt_md(dims{n, D, L}, in_dt, dims{L * D, 1, D});
  const dnnl::memory::desc s_md(dims{n, rows, L}, dt::f32, dims{rows * L, L, 1});
  const dnnl::memory::desc p_md(dims{n, rows, L}, in_dt, dims{rows * L, L, 1});
  const dnnl::memory::desc v_md(dims{n, L, D}, in_dt, dims{L * D, D, 1});
  const dnnl::memory::desc o_md(dims{n, rows, D}, dt::f32, dims{rows * D, D, 1});

  dnnl::primitive_attr qk_attr;
  qk_attr.set_output_scales(0, {1.0f / std::sqrt(static_cast<float>(D))});
  if (causal) {
    // Row r of a batch entry is query i = r % Lq (top-left alignment).
    m.mask.assign(static_cast<size_t>(n * rows * L), 0.0f);
    for (int64_t b = 0; b < n; ++b)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = (r % q_len) + 1; j < L; ++j)
          m.mask[static_cast<size_t>((b * rows + r) * L + j)] =
              -std::numeric_limits<float>::infinity();
    dnnl::post_ops po;
    po.append_binary(dnnl::algorithm::binary_add, s_md);
    qk_attr.set_post_ops(po);
    m.mask_mem = dnnl::memory(s_md, m.engine, m.mask.data());
  }
  const dnnl::matmul::primitive_desc qk_pd(
      dnnl::matmul::desc(q_md, kt_md, s_md), qk_attr, m.engine);
  const dnnl::softmax_v2_forward::primitive_desc sm_pd(
      dnnl::softmax_v2_forward::desc(dnnl::prop_kind::forward_inference,
                                     dnnl::algorithm::softmax_accurate, s_md,
                                     p_md, 2),
      m.engine);
  const dnnl::matmul::primitive_desc pv_pd(
      dnnl::matmul::desc(p_md, v_md, o_md), m.engine);
  m.qk = dnnl::matmul(qk_pd);
  m.softmax = dnnl::softmax_v2_forward(sm_pd);
  m.pv = dnnl::matmul(pv_pd);

  m.impls = std::string(qk_pd.impl_info_str()) + " / " +
            sm_pd.impl_info_str() + " / " + pv_pd.impl_info_str();
  if (IsReference(qk_pd.impl_info_str())) m.error = "Q·Kᵀ matmul runs oneDNN's reference implementation";
  if (IsReference(sm_pd.impl_info_str())) m.error = "softmax runs oneDNN's reference implementation";
  if (IsReference(pv_pd.impl_info_str())) m.error = "P·V matmul runs oneDNN's reference implementation";

  m.scores.assign(static_cast<size_t>(n * rows * L), 0.0f);
  m.q_mem = dnnl::memory(q_md, m.engine, const_cast<void*>(q));
  m.k_mem = dnnl::memory(kt_md, m.engine, const_cast<void*>(k));
  m.v_mem = dnnl::memory(v_md, m.engine, const_cast<void*>(v));
  m.o_mem = dnnl::memory(o_md, m.engine, o);
  m.s_mem = dnnl::memory(s_md, m.engine, m.scores.data());
  if (bf16) {
    m.probs.assign(m.scores.size(), 0);
    m.p_mem = dnnl::memory(p_md, m.engine, m.probs.data());
  } else {
    m.p_mem = m.s_mem;  // softmax in place
  }
}

OneDnnAttention::~OneDnnAttention() = default;

void OneDnnAttention::SetInputs(const void* q, const void* k, const void* v) {
  impl_->q_mem.set_data_handle(const_cast<void*>(q));
  impl_->k_mem.set_data_handle(const_cast<void*>(k));
  impl_->v_mem.set_data_handle(const_cast<void*>(v));
}

const std::string& OneDnnAttention::error() const { return impl_->error; }
const std::string& OneDnnAttention::implementations() const {
  return impl_->impls;
}

void SetOneDnnThreads(int threads) { omp_set_num_threads(threads); }

void OneDnnAttention::Run(int threads) {
  Impl& m = *impl_;
  SetOneDnnThreads(threads);
  if (m.causal) {
    m.qk.execute(m.stream,
                 {{DNNL_ARG_SRC, m.q_mem},
                  {DNNL_ARG_WEIGHTS, m.k_mem},
                  {DNNL_ARG_DST, m.s_mem},
                  {DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, m.mask_mem}});
  } else {
    m.qk.execute(m.stream, {{DNNL_ARG_SRC, m.q_mem},
                            {DNNL_ARG_WEIGHTS, m.k_mem},
                            {DNNL_ARG_DST, m.s_mem}});
  }
  m.softmax.execute(m.stream, {{DNNL_ARG_SRC, m.s_mem}, {DNNL_ARG_DST, m.p_mem}});
  m.pv.execute(m.stream, {{DNNL_ARG_SRC, m.p_mem},
                          {DNNL_ARG_WEIGHTS, m.v_mem},
                          {DNNL_ARG_DST, m.o_mem}});
  m.stream.wait();
}

}  // namespace bench
}  // namespace simdattn
