// simdattn._simdattn: the compiled half of the Python package. It takes
// operands already described by simdattn/__init__.py (address, dtype,
// shape and strides in elements), calls the C API with the GIL released,
// and returns the status and message for Python to raise. Thread pools are
// kept per thread count for the life of the process.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "simdattn/simdattn.h"

namespace py = pybind11;

namespace {

// (address, dtype, shape, strides): a 4-D operand as the Python side
// describes it. Its memory is kept alive by the caller for the call.
using Operand = std::tuple<uintptr_t, int32_t, std::array<int64_t, 4>,
                           std::array<int64_t, 4>>;
// (address, count, dtype) of an option array; address 0: absent.
using Vector = std::tuple<uintptr_t, int64_t, int32_t>;

simdattn_tensor ToTensor(const Operand& op) {
  simdattn_tensor t;
  t.data = reinterpret_cast<void*>(std::get<0>(op));
  t.dtype = std::get<1>(op);
  for (int i = 0; i < 4; ++i) {
    t.shape[i] = std::get<2>(op)[i];
    t.strides[i] = std::get<3>(op)[i];
  }
  return t;
}

// The pool of `threads` threads, created on first use and kept.
simdattn_pool* PoolOf(int32_t threads) {
  static std::mutex mutex;
  static std::map<int32_t, simdattn_pool*> pools;
  std::lock_guard<std::mutex> lock(mutex);
  simdattn_pool*& pool = pools[threads];
  if (pool == nullptr) pool = simdattn_pool_create(threads);
  return pool;
}

// The executor of one call: a pool of `threads` threads (0: the library's
// default) and the target cap ("" for none; `target` must outlive exec).
// False when the pool cannot be created.
bool MakeExec(int32_t threads, const std::string& target, simdattn_exec* exec) {
  simdattn_exec_init(exec);
  exec->max_target = target.empty() ? nullptr : target.c_str();
  if (threads > 0) exec->pool = PoolOf(threads);
  return threads <= 0 || exec->pool != nullptr;
}

constexpr const char* kNoPool = "could not create a pool of threads";

struct Options {
  simdattn_options c;
  Options(bool has_scale, float scale, bool causal, int32_t alignment,
          int64_t window_left, int64_t window_right, float softcap,
          const Vector& slopes, const Vector& sinks, const Vector& lengths,
          float dropout_p, uint64_t seed) {
    simdattn_options_init(&c);
    c.has_scale = has_scale;
    c.scale = scale;
    c.causal = causal;
    c.alignment = alignment;
    c.window_left = window_left;
    c.window_right = window_right;
    c.softcap = softcap;
    c.alibi_slopes = reinterpret_cast<const float*>(std::get<0>(slopes));
    c.num_alibi_slopes = std::get<1>(slopes);
    c.sinks = reinterpret_cast<const float*>(std::get<0>(sinks));
    c.num_sinks = std::get<1>(sinks);
    c.kv_lengths = reinterpret_cast<const void*>(std::get<0>(lengths));
    c.num_kv_lengths = std::get<1>(lengths);
    c.kv_lengths_dtype = std::get<2>(lengths);
    c.dropout_p = dropout_p;
    c.dropout_seed = seed;
  }

  // Quantized K/V: int8's scale operands (None: none) and fp8's scales.
  void SetKvScales(py::object k_scales, py::object v_scales, bool has_fp8,
                   float k_scale, float v_scale) {
    if (!k_scales.is_none()) c.k_scales = ToTensor(k_scales.cast<Operand>());
    if (!v_scales.is_none()) c.v_scales = ToTensor(v_scales.cast<Operand>());
    c.has_fp8_scales = has_fp8;
    c.k_scale = k_scale;
    c.v_scale = v_scale;
  }
};

// simdattn_quantize_kv; returns (status, message).
py::tuple QuantizeKv(const Operand& x, const Operand& out, py::object scales, float scale) {
  const simdattn_tensor tx = ToTensor(x), to = ToTensor(out);
  simdattn_tensor ts;
  const bool has_scales = !scales.is_none();
  if (has_scales) ts = ToTensor(scales.cast<Operand>());
  int status;
  std::string message;
  {
    py::gil_scoped_release release;
    status = simdattn_quantize_kv(&tx, &to, has_scales ? &ts : nullptr, scale);
    if (status != SIMDATTN_OK) message = simdattn_last_error();
  }
  return py::make_tuple(status, message);
}

// Runs one call; returns (status, message, target, path).
py::tuple Attention(const Operand& q, const Operand& k, const Operand& v,
                    const Operand& o, py::object lse, py::object mask,
                    const Options& options, int32_t threads,
                    const std::string& target, bool allow_bf16_compute) {
  simdattn_options opt = options.c;
  const simdattn_tensor tq = ToTensor(q), tk = ToTensor(k), tv = ToTensor(v),
                        to = ToTensor(o);
  simdattn_tensor tlse;
  const bool has_lse = !lse.is_none();
  if (has_lse) tlse = ToTensor(lse.cast<Operand>());
  if (!mask.is_none()) opt.mask = ToTensor(mask.cast<Operand>());
  simdattn_exec exec;
  if (!MakeExec(threads, target, &exec)) {
    return py::make_tuple(int{SIMDATTN_OUT_OF_MEMORY}, kNoPool, "", "");
  }
  exec.allow_bf16_compute = allow_bf16_compute;
  simdattn_run_info info;
  info.struct_size = sizeof(info);
  int status;
  std::string message;
  {
    py::gil_scoped_release release;
    status = simdattn_attention(&tq, &tk, &tv, &to, &opt, has_lse ? &tlse : nullptr,
                                &exec, &info);
    if (status != SIMDATTN_OK) message = simdattn_last_error();
  }
  if (status != SIMDATTN_OK) return py::make_tuple(status, message, "", "");
  return py::make_tuple(status, "", info.target, info.path);
}

// (positions, cos, sin addresses, max_position, rotary_dim, interleaved) of
// the rotary embedding; a positions address of 0: no rotation.
using Rotary = std::tuple<uintptr_t, uintptr_t, uintptr_t, int64_t, int64_t, bool>;

// (k_scales, v_scales, k_scale, v_scale) of quantized caches: the int8
// scale caches' operands (None: none) and the fp8 scales.
using KvScales = std::tuple<py::object, py::object, float, float>;

// Runs simdattn_append_kv_quantized; returns (status, message).
py::tuple AppendKv(const Operand& k_new, const Operand& v_new,
                   const Operand& k_cache, const Operand& v_cache,
                   uintptr_t slot_mapping, py::object q, const Rotary& rotary,
                   const KvScales& kv_scales, int32_t threads) {
  const simdattn_tensor tk = ToTensor(k_new), tv = ToTensor(v_new),
                        tkc = ToTensor(k_cache), tvc = ToTensor(v_cache);
  simdattn_tensor tq;
  const bool has_q = !q.is_none();
  if (has_q) tq = ToTensor(q.cast<Operand>());
  simdattn_rotary rot;
  simdattn_rotary_init(&rot);
  rot.positions = reinterpret_cast<const int32_t*>(std::get<0>(rotary));
  rot.cos = reinterpret_cast<const float*>(std::get<1>(rotary));
  rot.sin = reinterpret_cast<const float*>(std::get<2>(rotary));
  rot.max_position = std::get<3>(rotary);
  rot.rotary_dim = std::get<4>(rotary);
  rot.interleaved = std::get<5>(rotary);
  simdattn_kv_scales scales;
  simdattn_kv_scales_init(&scales);
  if (!std::get<0>(kv_scales).is_none()) {
    scales.k_scales = ToTensor(std::get<0>(kv_scales).cast<Operand>());
  }
  if (!std::get<1>(kv_scales).is_none()) {
    scales.v_scales = ToTensor(std::get<1>(kv_scales).cast<Operand>());
  }
  scales.k_scale = std::get<2>(kv_scales);
  scales.v_scale = std::get<3>(kv_scales);
  simdattn_exec exec;
  if (!MakeExec(threads, "", &exec)) {
    return py::make_tuple(int{SIMDATTN_OUT_OF_MEMORY}, kNoPool);
  }
  int status;
  std::string message;
  {
    py::gil_scoped_release release;
    status = simdattn_append_kv_quantized(
        &tk, &tv, &tkc, &tvc, reinterpret_cast<const int32_t*>(slot_mapping), &rot,
        has_q ? &tq : nullptr, &exec, &scales);
    if (status != SIMDATTN_OK) message = simdattn_last_error();
  }
  return py::make_tuple(status, message);
}

// The paged cache and ragged rows of paged_attention: (address, ...) of
// int32 arrays the Python side made contiguous; cu_seqlens 0: one query
// per sequence.
struct PagedArrays {
  uintptr_t block_table;
  int64_t max_blocks_per_seq, block_table_stride;
  uintptr_t kv_lens;
  int64_t num_seqs;
  uintptr_t cu_seqlens_q;
};

// Runs one paged call; returns (status, message, target, path).
py::tuple PagedAttention(const Operand& q, const Operand& k, const Operand& v,
                         const Operand& o, py::object lse,
                         const PagedArrays& arrays, const Options& options,
                         int32_t threads, const std::string& target) {
  const simdattn_tensor tq = ToTensor(q), to = ToTensor(o);
  simdattn_tensor tlse;
  const bool has_lse = !lse.is_none();
  if (has_lse) tlse = ToTensor(lse.cast<Operand>());
  simdattn_paged_cache cache;
  simdattn_paged_cache_init(&cache);
  cache.k = ToTensor(k);
  cache.v = ToTensor(v);
  cache.block_table = reinterpret_cast<const int32_t*>(arrays.block_table);
  cache.max_blocks_per_seq = arrays.max_blocks_per_seq;
  cache.block_table_stride = arrays.block_table_stride;
  cache.kv_lens = reinterpret_cast<const int32_t*>(arrays.kv_lens);
  simdattn_exec exec;
  if (!MakeExec(threads, target, &exec)) {
    return py::make_tuple(int{SIMDATTN_OUT_OF_MEMORY}, kNoPool, "", "");
  }
  simdattn_run_info info;
  info.struct_size = sizeof(info);
  int status;
  std::string message;
  {
    py::gil_scoped_release release;
    status = simdattn_paged_attention(
        &tq, &cache, arrays.num_seqs,
        reinterpret_cast<const int32_t*>(arrays.cu_seqlens_q), &to, &options.c,
        has_lse ? &tlse : nullptr, &exec, &info);
    if (status != SIMDATTN_OK) message = simdattn_last_error();
  }
  if (status != SIMDATTN_OK) return py::make_tuple(status, message, "", "");
  return py::make_tuple(status, "", info.target, info.path);
}

// Merges partial results; returns (status, message).
py::tuple MergeStates(const std::vector<Operand>& outs,
                      const std::vector<Operand>& lses, const Operand& out,
                      py::object lse, int32_t threads) {
  std::vector<simdattn_tensor> touts, tlses;
  for (const Operand& op : outs) touts.push_back(ToTensor(op));
  for (const Operand& op : lses) tlses.push_back(ToTensor(op));
  const simdattn_tensor tout = ToTensor(out);
  simdattn_tensor tlse;
  const bool has_lse = !lse.is_none();
  if (has_lse) tlse = ToTensor(lse.cast<Operand>());
  simdattn_exec exec;
  if (!MakeExec(threads, "", &exec)) {
    return py::make_tuple(int{SIMDATTN_OUT_OF_MEMORY}, kNoPool);
  }
  int status;
  std::string message;
  {
    py::gil_scoped_release release;
    status = simdattn_merge_states(touts.data(), tlses.data(),
                                   static_cast<int64_t>(touts.size()), &tout,
                                   has_lse ? &tlse : nullptr, &exec);
    if (status != SIMDATTN_OK) message = simdattn_last_error();
  }
  return py::make_tuple(status, message);
}

py::dict Info() {
  simdattn_info info;
  info.struct_size = sizeof(info);
  simdattn_get_info(&info);
  std::vector<std::string> compiled(info.compiled, info.compiled + info.num_compiled);
  std::vector<std::string> available(info.available, info.available + info.num_available);
  py::dict d;
  d["compiled"] = compiled;
  d["available"] = available;
  d["selected"] = std::string(info.selected);
  d["max_target_error"] = info.max_target_error != nullptr
                              ? py::object(py::str(info.max_target_error))
                              : py::object(py::none());
  return d;
}

}  // namespace

PYBIND11_MODULE(_simdattn, m) {
  m.doc() = "simdattn's compiled core; use the simdattn package.";
  py::class_<Options>(m, "Options")
      .def(py::init<bool, float, bool, int32_t, int64_t, int64_t, float, Vector,
                    Vector, Vector, float, uint64_t>())
      .def("set_kv_scales", &Options::SetKvScales);
  m.def("quantize_kv", &QuantizeKv);
  m.def("attention", &Attention);
  m.def("append_kv", &AppendKv);
  py::class_<PagedArrays>(m, "PagedArrays")
      .def(py::init<uintptr_t, int64_t, int64_t, uintptr_t, int64_t, uintptr_t>());
  m.def("paged_attention", &PagedAttention);
  m.def("merge_states", &MergeStates);
  m.def("info", &Info);
  m.def("version", [] { return std::string(simdattn_version()); });
  m.attr("OK") = int{SIMDATTN_OK};
  m.attr("INVALID_ARGUMENT") = int{SIMDATTN_INVALID_ARGUMENT};
  m.attr("UNIMPLEMENTED") = int{SIMDATTN_UNIMPLEMENTED};
  m.attr("OUT_OF_MEMORY") = int{SIMDATTN_OUT_OF_MEMORY};
  m.attr("INTERNAL") = int{SIMDATTN_INTERNAL};
}
