// oneDNN 2.6 matmul baseline (see the header).

#include "bench/onednn_matmul.h"

#include <cstdint>
#include <string>
#include <vector>

#include "bench/common.h"
#include "bench/onednn_attention.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace simdattn {
namespace bench {

struct OneDnnMatmul::Impl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  dnnl::matmul matmul;
  dnnl::memory::desc src_md, dst_md;
  dnnl::memory w_mem, bias_mem, scratch_mem;
  std::vector<uint8_t> scratch;  // user scratchpad: no allocation per call
  void* w_buffer = nullptr;  // the reordered weights, on 2 MiB pages
  bool bias = false;
  std::string error, impl;
  ~Impl() { std::free(w_buffer); }
};

OneDnnMatmul::OneDnnMatmul(int64_t m, int64_t n, int64_t k, const float* w,
                           const float* bias)
    : impl_(new Impl) {
  using dims = dnnl::memory::dims;
  using dt = dnnl::memory::data_type;
  Impl& x = *impl_;
  x.bias = bias != nullptr;
  x.src_md = dnnl::memory::desc(dims{m, k}, dt::f32, dims{k, 1});
  x.dst_md = dnnl::memory::desc(dims{m, n}, dt::f32, dims{n, 1});
  const dnnl::memory::desc w_any(dims{k, n}, dt::f32, dnnl::memory::format_tag::any);
  const dnnl::memory::desc w_user(dims{k, n}, dt::f32, dims{1, k});  // Wᵀ view of [n, k]
  const dnnl::memory::desc b_md(dims{1, n}, dt::f32, dims{n, 1});
  const auto desc = x.bias ? dnnl::matmul::desc(x.src_md, w_any, b_md, x.dst_md)
                           : dnnl::matmul::desc(x.src_md, w_any, x.dst_md);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::matmul::primitive_desc pd(desc, attr, x.engine);
  x.scratch.assign(pd.scratchpad_desc().get_size() + 1, 0);
  x.scratch_mem = dnnl::memory(pd.scratchpad_desc(), x.engine, x.scratch.data());
  x.impl = pd.impl_info_str();
  if (x.impl.rfind("ref", 0) == 0) x.error = "matmul runs oneDNN's reference implementation";
  x.matmul = dnnl::matmul(pd);
  x.w_buffer = AllocHugePages(pd.weights_desc().get_size());
  x.w_mem = dnnl::memory(pd.weights_desc(), x.engine, x.w_buffer);
  dnnl::memory user(w_user, x.engine, const_cast<float*>(w));
  dnnl::reorder(user, x.w_mem).execute(x.stream, user, x.w_mem);
  if (x.bias) x.bias_mem = dnnl::memory(b_md, x.engine, const_cast<float*>(bias));
  x.stream.wait();
}

OneDnnMatmul::~OneDnnMatmul() = default;

const std::string& OneDnnMatmul::error() const { return impl_->error; }
const std::string& OneDnnMatmul::implementation() const { return impl_->impl; }

void OneDnnMatmul::Run(const float* src, float* dst, int threads) {
  Impl& x = *impl_;
  SetOneDnnThreads(threads);
  dnnl::memory s(x.src_md, x.engine, const_cast<float*>(src));
  dnnl::memory d(x.dst_md, x.engine, dst);
  if (x.bias) {
    x.matmul.execute(x.stream, {{DNNL_ARG_SRC, s}, {DNNL_ARG_WEIGHTS, x.w_mem},
                                {DNNL_ARG_BIAS, x.bias_mem}, {DNNL_ARG_DST, d},
                                {DNNL_ARG_SCRATCHPAD, x.scratch_mem}});
  } else {
    x.matmul.execute(x.stream, {{DNNL_ARG_SRC, s}, {DNNL_ARG_WEIGHTS, x.w_mem}, {DNNL_ARG_DST, d},
                                {DNNL_ARG_SCRATCHPAD, x.scratch_mem}});
  }
  x.stream.wait();
}

}  // namespace bench
}  // namespace simdattn
