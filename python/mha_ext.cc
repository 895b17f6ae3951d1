// simdattn._simdattn_mha: the compiled half of simdattn.MultiheadAttention.
// Operands come described by simdattn/__init__.py (addresses, dtype codes,
// extents); calls go to the C API's simdattn_mha_* with the GIL released
// and return (status, message, ...) for Python to raise.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "simdattn/simdattn.h"

namespace py = pybind11;

namespace {

// (address, dtype, batch_first, batch, len, dim); address 0: absent.
using Act = std::tuple<uintptr_t, int32_t, bool, int64_t, int64_t, int64_t>;
// (address, dtype, shape); address 0: absent.
using Mask = std::tuple<uintptr_t, int32_t, std::vector<int64_t>>;
// (name, address, dtype, shape)
using Named = std::tuple<std::string, uintptr_t, int32_t, std::vector<int64_t>>;
// (has_scale, scale, causal, alignment or -1, window_left, window_right,
//  softcap, slopes address, sinks address, count, dropout_p, seed)
using Attn = std::tuple<bool, float, bool, int32_t, int64_t, int64_t, float, uintptr_t,
                        uintptr_t, int64_t, float, uint64_t>;

simdattn_pool* PoolOf(int32_t threads) {
  static std::mutex mutex;
  static std::map<int32_t, simdattn_pool*> pools;
  std::lock_guard<std::mutex> lock(mutex);
  simdattn_pool*& pool = pools[threads];
  if (pool == nullptr) pool = simdattn_pool_create(threads);
  return pool;
}

// threads 0: the process-wide pool; target "": no per-call cap.
simdattn_exec Exec(int32_t threads, const std::string& target) {
  simdattn_exec e;
  simdattn_exec_init(&e);
  if (threads > 0) e.pool = PoolOf(threads);
  e.max_target = target.c_str();
  return e;
}

simdattn_mha_tensor ToAct(const Act& a) {
  simdattn_mha_tensor t;
  t.data = reinterpret_cast<void*>(std::get<0>(a));
  t.dtype = std::get<1>(a);
  t.batch_first = std::get<2>(a);
  t.batch = std::get<3>(a);
  t.len = std::get<4>(a);
  t.dim = std::get<5>(a);
  return t;
}

simdattn_mha_mask ToMask(const Mask& m) {
  simdattn_mha_mask r{};
  r.data = reinterpret_cast<const void*>(std::get<0>(m));
  r.dtype = std::get<1>(m);
  const std::vector<int64_t>& shape = std::get<2>(m);
  r.ndim = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size() && i < 3; ++i) r.shape[i] = shape[i];
  return r;
}

void SetAttention(const Attn& a, simdattn_options* o) {
  o->has_scale = std::get<0>(a);
  o->scale = std::get<1>(a);
  o->causal = std::get<2>(a);
  if (std::get<3>(a) >= 0) o->alignment = std::get<3>(a);
  o->window_left = std::get<4>(a);
  o->window_right = std::get<5>(a);
  o->softcap = std::get<6>(a);
  o->alibi_slopes = reinterpret_cast<const float*>(std::get<7>(a));
  o->num_alibi_slopes = o->alibi_slopes != nullptr ? std::get<9>(a) : 0;
  o->sinks = reinterpret_cast<const float*>(std::get<8>(a));
  o->num_sinks = o->sinks != nullptr ? std::get<9>(a) : 0;
  o->dropout_p = std::get<10>(a);
  o->dropout_seed = std::get<11>(a);
}

py::tuple Create(int64_t embed_dim, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                 int64_t kdim, int64_t vdim, bool bias, bool add_bias_kv, int32_t dtype) {
  simdattn_mha_config c;
  simdattn_mha_config_init(&c);
  c.embed_dim = embed_dim;
  c.num_heads = num_heads;
  c.num_kv_heads = num_kv_heads;
  c.head_dim = head_dim;
  c.kdim = kdim;
  c.vdim = vdim;
  c.bias = bias;
  c.add_bias_kv = add_bias_kv;
  c.dtype = dtype;
  simdattn_mha* layer = nullptr;
  const int status = simdattn_mha_create(&c, &layer);
  return py::make_tuple(status, std::string(status ? simdattn_last_error() : ""),
                        reinterpret_cast<uintptr_t>(layer));
}

py::tuple Load(uintptr_t layer, const std::vector<Named>& tensors, int32_t threads,
               const std::string& target) {
  std::vector<simdattn_named_tensor> t(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    t[i].name = std::get<0>(tensors[i]).c_str();
    t[i].data = reinterpret_cast<const void*>(std::get<1>(tensors[i]));
    t[i].dtype = std::get<2>(tensors[i]);
    const std::vector<int64_t>& shape = std::get<3>(tensors[i]);
    t[i].ndim = static_cast<int32_t>(shape.size());
    for (size_t d = 0; d < shape.size() && d < 4; ++d) t[i].shape[d] = shape[d];
  }
  const simdattn_exec exec = Exec(threads, target);
  int status;
  {
    py::gil_scoped_release release;
    status = simdattn_mha_load(reinterpret_cast<simdattn_mha*>(layer), t.data(),
                               static_cast<int64_t>(t.size()), &exec);
  }
  return py::make_tuple(status, std::string(status ? simdattn_last_error() : ""));
}

py::tuple Forward(uintptr_t layer, const Act& q, const Act& k, const Act& v, const Act& out,
                  const Mask& key_padding, const Mask& attn_mask, const Attn& attention,
                  uintptr_t weights, bool average, int32_t threads, const std::string& target) {
  simdattn_mha_options o;
  simdattn_mha_options_init(&o);
  o.key_padding_mask = ToMask(key_padding);
  o.attn_mask = ToMask(attn_mask);
  SetAttention(attention, &o.attention);
  o.weights = reinterpret_cast<float*>(weights);
  o.average_weights = average;
  const simdattn_mha_tensor qt = ToAct(q), kt = ToAct(k), vt = ToAct(v), ot = ToAct(out);
  const simdattn_exec exec = Exec(threads, target);
  simdattn_run_info info{};
  info.struct_size = sizeof(info);
  int status;
  {
    py::gil_scoped_release release;
    status = simdattn_mha_forward(reinterpret_cast<simdattn_mha*>(layer), &qt,
                                  kt.data != nullptr ? &kt : nullptr,
                                  vt.data != nullptr ? &vt : nullptr, &ot, &o, &exec, &info);
  }
  return py::make_tuple(status, std::string(status ? simdattn_last_error() : ""),
                        std::string(status ? "" : info.target));
}

// A paged cache: (address, dtype, hnd, num_blocks, block_size, heads, d).
using Pages = std::tuple<uintptr_t, int32_t, bool, int64_t, int64_t, int64_t, int64_t>;
// RoPE: (enabled, rotary_dim, interleaved, cos address, sin address,
//  max_position, theta); addresses 0: tables built from theta.
using Rope = std::tuple<bool, int64_t, bool, uintptr_t, uintptr_t, int64_t, double>;
// The block table: (address of int32 [B, max_blocks], max_blocks).
using Table = std::tuple<uintptr_t, int64_t>;

simdattn_tensor ToPages(const Pages& p) {
  void* data = reinterpret_cast<void*>(std::get<0>(p));
  const auto make = std::get<2>(p) ? &simdattn_paged_hnd : &simdattn_paged_nhd;
  return make(data, std::get<1>(p), std::get<3>(p), std::get<4>(p), std::get<5>(p),
              std::get<6>(p));
}

py::tuple StepPaged(uintptr_t layer, const Act& x, const Pages& k, const Pages& v,
                    const Table& table, uintptr_t seq_lens, const Rope& rope, const Act& out,
                    const Attn& attention, int32_t threads, const std::string& target) {
  simdattn_mha_options o;
  simdattn_mha_options_init(&o);
  SetAttention(attention, &o.attention);
  simdattn_mha_rotary r;
  simdattn_mha_rotary_init(&r);
  r.enabled = std::get<0>(rope);
  r.rotary_dim = std::get<1>(rope);
  r.interleaved = std::get<2>(rope);
  r.cos = reinterpret_cast<const float*>(std::get<3>(rope));
  r.sin = reinterpret_cast<const float*>(std::get<4>(rope));
  r.max_position = std::get<5>(rope);
  r.theta = std::get<6>(rope);
  const simdattn_mha_tensor xt = ToAct(x), ot = ToAct(out);
  const simdattn_tensor kc = ToPages(k), vc = ToPages(v);
  const simdattn_exec exec = Exec(threads, target);
  simdattn_run_info info{};
  info.struct_size = sizeof(info);
  int status;
  {
    py::gil_scoped_release release;
    status = simdattn_mha_step_paged(
        reinterpret_cast<simdattn_mha*>(layer), &xt, &kc, &vc,
        reinterpret_cast<const int32_t*>(std::get<0>(table)), std::get<1>(table), 0,
        reinterpret_cast<int32_t*>(seq_lens), &r, &ot, &o, &exec, &info);
  }
  return py::make_tuple(status, std::string(status ? simdattn_last_error() : ""),
                        std::string(status ? "" : info.target));
}

}  // namespace

PYBIND11_MODULE(_simdattn_mha, m) {
  m.doc() = "simdattn multi-head attention layer (C API shim)";
  m.def("create", &Create);
  m.def("destroy", [](uintptr_t layer) { simdattn_mha_destroy(reinterpret_cast<simdattn_mha*>(layer)); });
  m.def("load", &Load);
  m.def("forward", &Forward);
  m.def("step_paged", &StepPaged);
}
