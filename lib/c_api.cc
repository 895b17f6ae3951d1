// The C API (include/simdattn/simdattn.h): converts the C structs to the
// C++ API's types, checks what only the C structs carry (struct sizes,
// enum values, the lengths of the option arrays), and keeps each thread's
// last error message. Nothing here allocates on the path of a call that
// succeeds, except a merge of more than kStackParts parts.

#include "simdattn/simdattn.h"

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "lib/dispatch.h"
#include "lib/status.h"
#include "simdattn/attention.h"
#include "simdattn/serving.h"

struct simdattn_pool {
  explicit simdattn_pool(int num_threads) : pool(num_threads) {}
  simdattn::ThreadPool pool;
};

namespace simdattn {
namespace {

// The calling thread's last error message, truncated to fit: a plain array,
// so that no thread-exit destructor is registered (which would allocate).
thread_local char t_last_error[1024];
// simdattn_info::max_target_error of the thread's last simdattn_get_info.
thread_local char t_info_error[1024];

void CopyMessage(const std::string& message, char* out, size_t size) {
  const size_t n = message.size() < size - 1 ? message.size() : size - 1;
  std::memcpy(out, message.data(), n);
  out[n] = '\0';
}

// Records the outcome of a call for simdattn_last_error and returns its code.
int Finish(const Status& s) {
  if (s.ok()) {
    t_last_error[0] = '\0';
  } else {
    CopyMessage(s.message, t_last_error, sizeof(t_last_error));
  }
  return static_cast<int>(s.code);
}

// A struct the caller sized with struct_size: at least this version's size;
// a larger one (a newer header) only with its unknown tail all zero, since
// a field added later means "as before" when zero.
Status CheckStructSize(const char* name, const void* s, size_t given,
                       size_t known) {
  if (given < known) {
    return Invalid(std::string(name) + "->struct_size = " + std::to_string(given) +
                   ": must be sizeof(" + name + ") = " + std::to_string(known) +
                   " (set by its _init function)");
  }
  const unsigned char* bytes = static_cast<const unsigned char*>(s);
  for (size_t i = known; i < given; ++i) {
    if (bytes[i] != 0) {
      return Invalid(std::string(name) + "->struct_size = " + std::to_string(given) +
                     ": fields past this library's " + std::to_string(known) +
                     " bytes are set; this library cannot honor them");
    }
  }
  return Status::Ok();
}

TensorView ToView(const simdattn_tensor& t) {
  TensorView v;
  v.data = t.data;
  v.dtype = static_cast<DType>(t.dtype);
  for (int i = 0; i < 4; ++i) {
    v.shape[i] = t.shape[i];
    v.strides[i] = t.strides[i];
  }
  return v;
}

MutableTensorView ToMutableView(const simdattn_tensor& t) {
  MutableTensorView v;
  v.data = t.data;
  v.dtype = static_cast<DType>(t.dtype);
  for (int i = 0; i < 4; ++i) {
    v.shape[i] = t.shape[i];
    v.strides[i] = t.strides[i];
  }
  return v;
}

// An option array and its length: null with a count of 0, or a pointer
// with exactly `want` (the extent it indexes) entries.
Status CheckArray(const char* name, const void* data, int64_t count,
                  const char* extent, int64_t want) {
  if ((data == nullptr && count == 0) || (data != nullptr && count == want)) {
    return Status::Ok();
  }
  const std::string field = std::string("options->num_") + name;
  if (data == nullptr) {
    return Invalid(std::string("options->") + name + " is NULL with " + field +
                   " = " + std::to_string(count));
  }
  return Invalid(field + " = " + std::to_string(count) + " but " + extent +
                 " = " + std::to_string(want) + ": one entry per " +
                 (std::strcmp(extent, "B") == 0 ? "batch" : "query head"));
}

// The scalar and enum fields of the options.
Status ConvertScalars(const simdattn_options& c, AttentionOptions* out) {
  if (c.has_scale) out->scale = c.scale;
  out->causal = c.causal != 0;
  switch (c.alignment) {
    case SIMDATTN_ALIGN_UNSET:
      break;
    case SIMDATTN_ALIGN_TOP_LEFT:
      out->alignment = Alignment::kTopLeft;
      break;
    case SIMDATTN_ALIGN_BOTTOM_RIGHT:
      out->alignment = Alignment::kBottomRight;
      break;
    default:
      return Invalid("options->alignment = " + std::to_string(c.alignment) +
                     ": must be SIMDATTN_ALIGN_UNSET, _TOP_LEFT or _BOTTOM_RIGHT");
  }
  out->window_left = c.window_left;
  out->window_right = c.window_right;
  out->softcap = c.softcap;
  out->dropout_p = c.dropout_p;
  out->dropout_seed = c.dropout_seed;
  return Status::Ok();
}

// The options of a call whose Q is `q` (for the lengths of the arrays).
Status ConvertOptions(const simdattn_options* c, const simdattn_tensor& q,
                      AttentionOptions* out) {
  if (c == nullptr) return Status::Ok();
  Status s = CheckStructSize("simdattn_options", c, c->struct_size,
                             sizeof(simdattn_options));
  if (!s.ok()) return s;
  s = ConvertScalars(*c, out);
  if (!s.ok()) return s;
  s = CheckArray("alibi_slopes", c->alibi_slopes, c->num_alibi_slopes, "Hq", q.shape[1]);
  if (!s.ok()) return s;
  s = CheckArray("sinks", c->sinks, c->num_sinks, "Hq", q.shape[1]);
  if (!s.ok()) return s;
  s = CheckArray("kv_lengths", c->kv_lengths, c->num_kv_lengths, "B", q.shape[0]);
  if (!s.ok()) return s;
  out->alibi_slopes = c->alibi_slopes;
  out->sinks = c->sinks;
  if (c->kv_lengths != nullptr) {
    if (c->kv_lengths_dtype == SIMDATTN_I32) {
      out->kv_lengths_i32 = static_cast<const int32_t*>(c->kv_lengths);
    } else if (c->kv_lengths_dtype == SIMDATTN_I64) {
      out->kv_lengths = static_cast<const int64_t*>(c->kv_lengths);
    } else {
      return Invalid("options->kv_lengths_dtype = " + std::to_string(c->kv_lengths_dtype) +
                     ": must be SIMDATTN_I32 or SIMDATTN_I64");
    }
  }
  out->mask = ToView(c->mask);
  out->k_scales = ToView(c->k_scales);
  out->v_scales = ToView(c->v_scales);
  if (c->has_fp8_scales != 0) {
    out->k_scale = c->k_scale;
    out->v_scale = c->v_scale;
  }
  return Status::Ok();
}

Status ConvertExec(const simdattn_exec* c, ExecutionOptions* out) {
  if (c == nullptr) return Status::Ok();
  const Status s = CheckStructSize("simdattn_exec", c, c->struct_size,
                                   sizeof(simdattn_exec));
  if (!s.ok()) return s;
  out->pool = c->pool != nullptr ? &c->pool->pool : nullptr;
  out->parallel_for = c->parallel_for;
  out->parallel_for_user = c->parallel_for_user;
  out->parallel_for_threads = c->parallel_for_threads;
  out->workspace = c->workspace;
  out->workspace_bytes = c->workspace_bytes;
  out->max_target = c->max_target;
  out->allow_bf16_compute = c->allow_bf16_compute != 0;
  return Status::Ok();
}

// Q, K and V must be given; their contents are the C++ API's to check.
Status CheckInputs(const simdattn_tensor* q, const simdattn_tensor* k,
                   const simdattn_tensor* v) {
  if (q == nullptr) return Invalid("q is NULL");
  if (k == nullptr) return Invalid("k is NULL");
  if (v == nullptr) return Invalid("v is NULL");
  return Status::Ok();
}

// The first version's simdattn_run_info ended after num_tasks.
constexpr size_t kRunInfoV1Size = offsetof(simdattn_run_info, num_tasks) + sizeof(int64_t);

// A run info of this version's size or of the first version's (or null).
Status CheckRunInfo(const simdattn_run_info* info) {
  if (info == nullptr || info->struct_size >= kRunInfoV1Size) return Status::Ok();
  return Invalid("info->struct_size = " + std::to_string(info->struct_size) +
                 ": must be sizeof(simdattn_run_info) = " +
                 std::to_string(sizeof(simdattn_run_info)));
}

// Fills the fields of *info (when not null) that its struct_size covers.
void CopyRunInfo(const RunInfo& run, simdattn_run_info* info) {
  if (info == nullptr) return;
  info->target = run.target;
  info->path = run.path;
  info->num_tasks = run.num_tasks;
  if (info->struct_size >= offsetof(simdattn_run_info, bytes_allocated) + sizeof(size_t)) {
    info->scratch_bytes = run.scratch_bytes;
    info->bytes_allocated = run.bytes_allocated;
  }
}

Status CAttention(const simdattn_tensor* q, const simdattn_tensor* k,
                 const simdattn_tensor* v, const simdattn_tensor* o,
                 const simdattn_options* options, const simdattn_tensor* lse,
                 const simdattn_exec* exec, simdattn_run_info* info) {
  Status s = CheckInputs(q, k, v);
  if (!s.ok()) return s;
  if (o == nullptr) return Invalid("o is NULL");
  s = CheckRunInfo(info);
  if (!s.ok()) return s;
  AttentionOptions opt;
  s = ConvertOptions(options, *q, &opt);
  if (!s.ok()) return s;
  ExecutionOptions ex;
  s = ConvertExec(exec, &ex);
  if (!s.ok()) return s;
  const MutableTensorView lse_view = lse != nullptr ? ToMutableView(*lse) : MutableTensorView();
  RunInfo run;
  s = simdattn::Attention(ToView(*q), ToView(*k), ToView(*v), ToMutableView(*o),
                          opt, lse_view, ex, &run);
  if (s.ok()) CopyRunInfo(run, info);
  return s;
}

Status CPagedAttention(const simdattn_tensor* q, const simdattn_paged_cache* cache,
                      int64_t num_seqs, const int32_t* cu_seqlens_q,
                      const simdattn_tensor* o, const simdattn_options* options,
                      const simdattn_tensor* lse, const simdattn_exec* exec,
                      simdattn_run_info* info) {
  if (q == nullptr) return Invalid("q is NULL");
  if (cache == nullptr) return Invalid("cache is NULL");
  if (o == nullptr) return Invalid("o is NULL");
  Status s = CheckStructSize("simdattn_paged_cache", cache, cache->struct_size,
                             sizeof(simdattn_paged_cache));
  if (!s.ok()) return s;
  s = CheckRunInfo(info);
  if (!s.ok()) return s;
  AttentionOptions opt;
  s = ConvertOptions(options, *q, &opt);
  if (!s.ok()) return s;
  ExecutionOptions ex;
  s = ConvertExec(exec, &ex);
  if (!s.ok()) return s;
  PagedKvCache c;
  c.k = ToView(cache->k);
  c.v = ToView(cache->v);
  c.block_table = cache->block_table;
  c.max_blocks_per_seq = cache->max_blocks_per_seq;
  c.block_table_stride = cache->block_table_stride;
  c.kv_lens = cache->kv_lens;
  const MutableTensorView lse_view = lse != nullptr ? ToMutableView(*lse) : MutableTensorView();
  RunInfo run;
  s = simdattn::PagedAttention(ToView(*q), c, num_seqs, cu_seqlens_q,
                               ToMutableView(*o), opt, lse_view, ex, &run);
  if (s.ok()) CopyRunInfo(run, info);
  return s;
}

Status CWorkspaceSize(const simdattn_tensor* q, const simdattn_tensor* k,
                     const simdattn_tensor* v, const simdattn_options* options,
                     const simdattn_exec* exec, size_t* bytes) {
  Status s = CheckInputs(q, k, v);
  if (!s.ok()) return s;
  if (bytes == nullptr) return Invalid("bytes is NULL");
  AttentionOptions opt;
  s = ConvertOptions(options, *q, &opt);
  if (!s.ok()) return s;
  ExecutionOptions ex;
  s = ConvertExec(exec, &ex);
  if (!s.ok()) return s;
  return simdattn::WorkspaceSize(ToView(*q), ToView(*k), ToView(*v), opt, ex, bytes);
}

// Parts of a merge converted on the stack; more go to the heap.
constexpr int64_t kStackParts = 32;

Status CMergeStates(const simdattn_tensor* outs, const simdattn_tensor* lses,
                    int64_t num_parts, const simdattn_tensor* out,
                    const simdattn_tensor* lse, const simdattn_exec* exec) {
  if (outs == nullptr) return Invalid("outs is NULL with num_parts = " + std::to_string(num_parts));
  if (lses == nullptr) return Invalid("lses is NULL with num_parts = " + std::to_string(num_parts));
  if (out == nullptr) return Invalid("out is NULL");
  ExecutionOptions ex;
  Status s = ConvertExec(exec, &ex);
  if (!s.ok()) return s;
  TensorView stack_outs[kStackParts], stack_lses[kStackParts];
  std::vector<TensorView> heap_outs, heap_lses;
  TensorView* o = stack_outs;
  TensorView* l = stack_lses;
  if (num_parts > kStackParts) {
    heap_outs.resize(static_cast<size_t>(num_parts));
    heap_lses.resize(static_cast<size_t>(num_parts));
    o = heap_outs.data();
    l = heap_lses.data();
  }
  for (int64_t i = 0; i < num_parts; ++i) {
    o[i] = ToView(outs[i]);
    l[i] = ToView(lses[i]);
  }
  const MutableTensorView lse_view = lse != nullptr ? ToMutableView(*lse) : MutableTensorView();
  return MergeStates(o, l, num_parts, ToMutableView(*out), lse_view, ex);
}

// Names of the compiled and available targets, as the dispatch table has
// them now (tests may switch the AMX entry to its emulator); the names are
// static strings, the arrays live as long as the process.
struct TargetNames {
  const char* compiled[64];
  const char* available[64];
  int32_t num_compiled = 0;
  int32_t num_available = 0;
};

std::mutex g_names_mutex;
TargetNames g_names;

const TargetNames& Names() {
  std::lock_guard<std::mutex> lock(g_names_mutex);
  TargetNames& n = g_names;
  n.num_compiled = n.num_available = 0;
  for (const TargetEntry& e : TargetTable()) {
    if (n.num_compiled == 64) break;
    n.compiled[n.num_compiled++] = e.name;
    if (e.supported) n.available[n.num_available++] = e.name;
  }
  return n;
}

Status GetInfo(simdattn_info* info) {
  if (info == nullptr) return Invalid("info is NULL");
  if (info->struct_size < sizeof(simdattn_info)) {
    return Invalid("info->struct_size = " + std::to_string(info->struct_size) +
                   ": must be sizeof(simdattn_info) = " +
                   std::to_string(sizeof(simdattn_info)));
  }
  const TargetNames& n = Names();
  info->compiled = n.compiled;
  info->num_compiled = n.num_compiled;
  info->available = n.available;
  info->num_available = n.num_available;
  std::string selected;
  const Status s = SelectedTarget(&selected);
  info->selected = "";
  for (int32_t i = 0; i < n.num_compiled; ++i) {
    if (selected == n.compiled[i]) info->selected = n.compiled[i];
  }
  info->max_target_error = nullptr;
  if (!s.ok()) {
    CopyMessage(s.message, t_info_error, sizeof(t_info_error));
    info->max_target_error = t_info_error;
  }
  return Status::Ok();
}

// Runs a call of the C API: its outcome recorded for simdattn_last_error,
// exceptions turned into status codes.
template <class Call>
int Guarded(const Call& call) {
  try {
    return Finish(call());
  } catch (const std::bad_alloc&) {
    Status s;
    s.code = StatusCode::kOutOfMemory;
    s.message = "out of memory";
    return Finish(s);
  } catch (...) {
    Status s;
    s.code = StatusCode::kInternal;
    s.message = "unexpected exception";
    return Finish(s);
  }
}

// A view of the C++ API as a C tensor of `dtype` (kept as the caller gave
// it, known or not).
simdattn_tensor FromView(const MutableTensorView& v, int32_t dtype) {
  simdattn_tensor t;
  t.data = v.data;
  t.dtype = dtype;
  for (int i = 0; i < 4; ++i) {
    t.shape[i] = v.shape[i];
    t.strides[i] = v.strides[i];
  }
  return t;
}

simdattn_tensor MakeTensor(void* data, int32_t dtype, int64_t b, int64_t h,
                           int64_t s, int64_t d, bool bshd) {
  return FromView(bshd ? MakeBSHD(data, static_cast<DType>(dtype), b, h, s, d)
                       : MakeBHSD(data, static_cast<DType>(dtype), b, h, s, d),
                  dtype);
}

Status ConvertRotary(const simdattn_rotary* c, RotaryEmbedding* out) {
  if (c == nullptr) return Status::Ok();
  const Status s = CheckStructSize("simdattn_rotary", c, c->struct_size,
                                   sizeof(simdattn_rotary));
  if (!s.ok()) return s;
  out->positions = c->positions;
  out->cos = c->cos;
  out->sin = c->sin;
  out->max_position = c->max_position;
  out->rotary_dim = c->rotary_dim;
  out->interleaved = c->interleaved != 0;
  return Status::Ok();
}

Status ConvertKvScales(const simdattn_kv_scales* c, QuantizedCacheScales* out) {
  if (c == nullptr) return Status::Ok();
  const Status s = CheckStructSize("simdattn_kv_scales", c, c->struct_size,
                                   sizeof(simdattn_kv_scales));
  if (!s.ok()) return s;
  out->k_scales = ToMutableView(c->k_scales);
  out->v_scales = ToMutableView(c->v_scales);
  out->k_scale = c->k_scale;
  out->v_scale = c->v_scale;
  return Status::Ok();
}

Status CAppendKv(const simdattn_tensor* k_new, const simdattn_tensor* v_new,
                 const simdattn_tensor* k_cache, const simdattn_tensor* v_cache,
                 const int32_t* slot_mapping, const simdattn_rotary* rotary,
                 const simdattn_tensor* q, const simdattn_exec* exec,
                 const simdattn_kv_scales* scales) {
  if (k_new == nullptr) return Invalid("k_new is NULL");
  if (v_new == nullptr) return Invalid("v_new is NULL");
  if (k_cache == nullptr) return Invalid("k_cache is NULL");
  if (v_cache == nullptr) return Invalid("v_cache is NULL");
  RotaryEmbedding rot;
  Status s = ConvertRotary(rotary, &rot);
  if (!s.ok()) return s;
  ExecutionOptions ex;
  s = ConvertExec(exec, &ex);
  if (!s.ok()) return s;
  QuantizedCacheScales qs;
  s = ConvertKvScales(scales, &qs);
  if (!s.ok()) return s;
  return AppendKv(ToView(*k_new), ToView(*v_new), ToMutableView(*k_cache),
                  ToMutableView(*v_cache), slot_mapping, rot,
                  q != nullptr ? ToMutableView(*q) : MutableTensorView(), ex, qs);
}

#define SIMDATTN_STR2(x) #x
#define SIMDATTN_STR(x) SIMDATTN_STR2(x)

}  // namespace
}  // namespace simdattn

extern "C" {

const char* simdattn_last_error(void) { return simdattn::t_last_error; }

const char* simdattn_status_name(int status) {
  return status >= SIMDATTN_OK && status <= SIMDATTN_INTERNAL
             ? simdattn::StatusCodeName(static_cast<simdattn::StatusCode>(status))
             : "unknown";
}

const char* simdattn_version(void) {
  return SIMDATTN_STR(SIMDATTN_VERSION_MAJOR) "." SIMDATTN_STR(
      SIMDATTN_VERSION_MINOR) "." SIMDATTN_STR(SIMDATTN_VERSION_PATCH);
}

int simdattn_abi_version(void) { return SIMDATTN_ABI_VERSION; }

simdattn_tensor simdattn_bhsd(void* data, int32_t dtype, int64_t b, int64_t h,
                              int64_t s, int64_t d) {
  return simdattn::MakeTensor(data, dtype, b, h, s, d, false);
}

simdattn_tensor simdattn_bshd(void* data, int32_t dtype, int64_t b, int64_t h,
                              int64_t s, int64_t d) {
  return simdattn::MakeTensor(data, dtype, b, h, s, d, true);
}

void simdattn_options_init(simdattn_options* options) {
  if (options == nullptr) return;
  std::memset(options, 0, sizeof(*options));
  options->struct_size = sizeof(*options);
  options->window_left = -1;
  options->window_right = -1;
  options->kv_lengths_dtype = SIMDATTN_I64;
}

void simdattn_exec_init(simdattn_exec* exec) {
  if (exec == nullptr) return;
  std::memset(exec, 0, sizeof(*exec));
  exec->struct_size = sizeof(*exec);
}

simdattn_pool* simdattn_pool_create(int32_t num_threads) {
  try {
    return new simdattn_pool(num_threads);
  } catch (...) {
    return nullptr;
  }
}

void simdattn_pool_destroy(simdattn_pool* pool) { delete pool; }

int32_t simdattn_pool_num_threads(const simdattn_pool* pool) {
  return pool != nullptr ? pool->pool.num_threads() : 0;
}

int simdattn_attention(const simdattn_tensor* q, const simdattn_tensor* k,
                       const simdattn_tensor* v, const simdattn_tensor* o,
                       const simdattn_options* options,
                       const simdattn_tensor* lse, const simdattn_exec* exec,
                       simdattn_run_info* info) {
  return simdattn::Guarded(
      [&] { return simdattn::CAttention(q, k, v, o, options, lse, exec, info); });
}

void simdattn_paged_cache_init(simdattn_paged_cache* cache) {
  if (cache == nullptr) return;
  std::memset(cache, 0, sizeof(*cache));
  cache->struct_size = sizeof(*cache);
}

int simdattn_paged_attention(const simdattn_tensor* q,
                             const simdattn_paged_cache* cache, int64_t num_seqs,
                             const int32_t* cu_seqlens_q, const simdattn_tensor* o,
                             const simdattn_options* options,
                             const simdattn_tensor* lse, const simdattn_exec* exec,
                             simdattn_run_info* info) {
  return simdattn::Guarded([&] {
    return simdattn::CPagedAttention(q, cache, num_seqs, cu_seqlens_q, o, options,
                                     lse, exec, info);
  });
}

int simdattn_workspace_size(const simdattn_tensor* q, const simdattn_tensor* k,
                            const simdattn_tensor* v,
                            const simdattn_options* options,
                            const simdattn_exec* exec, size_t* bytes) {
  return simdattn::Guarded(
      [&] { return simdattn::CWorkspaceSize(q, k, v, options, exec, bytes); });
}

void simdattn_release_thread_buffers(void) { simdattn::ReleaseThreadBuffers(); }

int simdattn_merge_states(const simdattn_tensor* outs,
                          const simdattn_tensor* lses, int64_t num_parts,
                          const simdattn_tensor* out,
                          const simdattn_tensor* lse,
                          const simdattn_exec* exec) {
  return simdattn::Guarded([&] {
    return simdattn::CMergeStates(outs, lses, num_parts, out, lse, exec);
  });
}

int simdattn_get_info(simdattn_info* info) {
  return simdattn::Guarded([&] { return simdattn::GetInfo(info); });
}

int simdattn_set_max_target(const char* name) {
  return simdattn::Guarded([&] { return simdattn::SetMaxTarget(name); });
}

simdattn_tensor simdattn_token_major(void* data, int32_t dtype, int64_t tokens,
                                     int64_t heads, int64_t d) {
  return simdattn::FromView(
      simdattn::MakeTokenMajor(data, static_cast<simdattn::DType>(dtype), tokens, heads, d),
      dtype);
}

simdattn_tensor simdattn_paged_nhd(void* data, int32_t dtype, int64_t num_blocks,
                                   int64_t block_size, int64_t heads, int64_t d) {
  return simdattn::FromView(simdattn::MakePagedNHD(data, static_cast<simdattn::DType>(dtype),
                                                   num_blocks, block_size, heads, d),
                            dtype);
}

simdattn_tensor simdattn_paged_hnd(void* data, int32_t dtype, int64_t num_blocks,
                                   int64_t block_size, int64_t heads, int64_t d) {
  return simdattn::FromView(simdattn::MakePagedHND(data, static_cast<simdattn::DType>(dtype),
                                                   num_blocks, block_size, heads, d),
                            dtype);
}

void simdattn_rotary_init(simdattn_rotary* rotary) {
  if (rotary == nullptr) return;
  std::memset(rotary, 0, sizeof(*rotary));
  rotary->struct_size = sizeof(*rotary);
}

int simdattn_append_kv(const simdattn_tensor* k_new, const simdattn_tensor* v_new,
                       const simdattn_tensor* k_cache, const simdattn_tensor* v_cache,
                       const int32_t* slot_mapping, const simdattn_rotary* rotary,
                       const simdattn_tensor* q, const simdattn_exec* exec) {
  return simdattn::Guarded([&] {
    return simdattn::CAppendKv(k_new, v_new, k_cache, v_cache, slot_mapping, rotary, q,
                               exec, nullptr);
  });
}

void simdattn_kv_scales_init(simdattn_kv_scales* scales) {
  if (scales == nullptr) return;
  std::memset(scales, 0, sizeof(*scales));
  scales->struct_size = sizeof(*scales);
  scales->k_scale = 1.0f;
  scales->v_scale = 1.0f;
}

int simdattn_append_kv_quantized(const simdattn_tensor* k_new,
                                 const simdattn_tensor* v_new,
                                 const simdattn_tensor* k_cache,
                                 const simdattn_tensor* v_cache,
                                 const int32_t* slot_mapping,
                                 const simdattn_rotary* rotary,
                                 const simdattn_tensor* q, const simdattn_exec* exec,
                                 const simdattn_kv_scales* scales) {
  return simdattn::Guarded([&] {
    return simdattn::CAppendKv(k_new, v_new, k_cache, v_cache, slot_mapping, rotary, q,
                               exec, scales);
  });
}

int simdattn_quantize_kv(const simdattn_tensor* x, const simdattn_tensor* out,
                         const simdattn_tensor* scales, float scale) {
  return simdattn::Guarded([&] {
    if (x == nullptr) return simdattn::Invalid("x is NULL");
    if (out == nullptr) return simdattn::Invalid("out is NULL");
    const simdattn::MutableTensorView sv =
        scales == nullptr ? simdattn::MutableTensorView{} : simdattn::ToMutableView(*scales);
    return simdattn::QuantizeKv(simdattn::ToView(*x), simdattn::ToMutableView(*out), sv,
                                scale);
  });
}

}  // extern "C"

// ------------------------------------------- multi-head attention layer
// The C API of MultiHeadAttention (simdattn.h's last section).

#include "simdattn/mha.h"

struct simdattn_mha {
  simdattn::MultiHeadAttention* layer;
};

namespace simdattn {
namespace {

MhaTensor ToMha(const simdattn_mha_tensor& t) {
  return {t.data, static_cast<DType>(t.dtype), t.batch, t.len, t.dim, t.batch_first != 0};
}

MhaMask ToMhaMask(const simdattn_mha_mask& m) {
  MhaMask r;
  r.data = m.data;
  r.dtype = static_cast<DType>(m.dtype);
  r.ndim = m.ndim;
  for (int i = 0; i < 3; ++i) r.shape[i] = m.shape[i];
  return r;
}

// The layer's options for a call of `batch` rows of Hq heads.
Status ConvertMhaOptions(const simdattn_mha_options* c, int64_t batch, int64_t heads,
                         MhaForwardOptions* out) {
  if (c == nullptr) return Status::Ok();
  Status s = CheckStructSize("simdattn_mha_options", c, c->struct_size,
                             sizeof(simdattn_mha_options));
  if (!s.ok()) return s;
  simdattn_tensor q{};
  q.shape[0] = batch;
  q.shape[1] = heads;
  s = ConvertOptions(&c->attention, q, &out->attention);
  if (!s.ok()) return s;
  out->key_padding_mask = ToMhaMask(c->key_padding_mask);
  out->attn_mask = ToMhaMask(c->attn_mask);
  out->weights = c->weights;
  out->average_weights = c->average_weights != 0;
  return Status::Ok();
}

Status CMhaCreate(const simdattn_mha_config* c, simdattn_mha** out) {
  if (out == nullptr) return Invalid("out is NULL");
  *out = nullptr;
  if (c == nullptr) return Invalid("config is NULL");
  Status s = CheckStructSize("simdattn_mha_config", c, c->struct_size,
                             sizeof(simdattn_mha_config));
  if (!s.ok()) return s;
  MhaConfig config;
  config.embed_dim = c->embed_dim;
  config.num_heads = c->num_heads;
  config.num_kv_heads = c->num_kv_heads;
  config.head_dim = c->head_dim;
  config.kdim = c->kdim;
  config.vdim = c->vdim;
  config.bias = c->bias != 0;
  config.add_bias_kv = c->add_bias_kv != 0;
  config.dtype = static_cast<DType>(c->dtype);
  MultiHeadAttention* layer = nullptr;
  s = MultiHeadAttention::Create(config, &layer);
  if (!s.ok()) return s;
  *out = new (std::nothrow) simdattn_mha{layer};
  if (*out == nullptr) {
    delete layer;
    s.code = StatusCode::kOutOfMemory;
    s.message = "cannot allocate the layer's handle";
  }
  return s;
}

Status CMhaLoad(simdattn_mha* layer, const simdattn_named_tensor* tensors, int64_t num,
                const simdattn_exec* exec) {
  if (layer == nullptr) return Invalid("layer is NULL");
  if (tensors == nullptr && num > 0) return Invalid("tensors is NULL");
  ExecutionOptions ex;
  Status s = ConvertExec(exec, &ex);
  if (!s.ok()) return s;
  std::vector<NamedTensor> named(static_cast<size_t>(num < 0 ? 0 : num));
  for (size_t i = 0; i < named.size(); ++i) {
    const simdattn_named_tensor& t = tensors[i];
    named[i].name = t.name;
    named[i].data = t.data;
    named[i].dtype = static_cast<DType>(t.dtype);
    named[i].ndim = t.ndim;
    for (int d = 0; d < 4; ++d) named[i].shape[d] = t.shape[d];
  }
  return layer->layer->LoadWeights(named.data(), num, ex);
}

Status CMhaForward(simdattn_mha* layer, const simdattn_mha_tensor* query,
                   const simdattn_mha_tensor* key, const simdattn_mha_tensor* value,
                   const simdattn_mha_tensor* out, const simdattn_mha_options* options,
                   const simdattn_exec* exec, simdattn_run_info* info) {
  if (layer == nullptr) return Invalid("layer is NULL");
  if (query == nullptr) return Invalid("query is NULL");
  if (out == nullptr) return Invalid("out is NULL");
  if (info != nullptr && info->struct_size < sizeof(simdattn_run_info)) {
    return Invalid("info->struct_size = " + std::to_string(info->struct_size) +
                   ": must be sizeof(simdattn_run_info)");
  }
  MhaForwardOptions opt;
  Status s = ConvertMhaOptions(options, query->batch, layer->layer->config().num_heads, &opt);
  ExecutionOptions ex;
  if (s.ok()) s = ConvertExec(exec, &ex);
  if (!s.ok()) return s;
  const MhaTensor k = key != nullptr ? ToMha(*key) : MhaTensor();
  const MhaTensor v = value != nullptr ? ToMha(*value) : MhaTensor();
  const simdattn_mha_tensor& o = *out;
  RunInfo run;
  s = layer->layer->Forward(ToMha(*query), key != nullptr ? &k : nullptr,
                            value != nullptr ? &v : nullptr,
                            {o.data, static_cast<DType>(o.dtype), o.batch, o.len, o.dim,
                             o.batch_first != 0},
                            opt, ex, &run);
  if (s.ok()) CopyRunInfo(run, info);
  return s;
}

Status CMhaStep(simdattn_mha* layer, const simdattn_mha_tensor* x, const simdattn_tensor* kc,
                const simdattn_tensor* vc, int64_t* length, const simdattn_mha_tensor* out,
                const simdattn_mha_options* options, const simdattn_exec* exec,
                simdattn_run_info* info) {
  if (layer == nullptr) return Invalid("layer is NULL");
  if (x == nullptr) return Invalid("x is NULL");
  if (kc == nullptr) return Invalid("k_cache is NULL");
  if (vc == nullptr) return Invalid("v_cache is NULL");
  if (length == nullptr) return Invalid("length is NULL");
  if (out == nullptr) return Invalid("out is NULL");
  MhaForwardOptions opt;
  Status s = ConvertMhaOptions(options, x->batch, layer->layer->config().num_heads, &opt);
  ExecutionOptions ex;
  if (s.ok()) s = ConvertExec(exec, &ex);
  if (!s.ok()) return s;
  MhaKvCache cache;
  cache.k = ToMutableView(*kc);
  cache.v = ToMutableView(*vc);
  cache.length = *length;
  const simdattn_mha_tensor& o = *out;
  RunInfo run;
  s = layer->layer->Step(ToMha(*x), &cache,
                         {o.data, static_cast<DType>(o.dtype), o.batch, o.len, o.dim,
                          o.batch_first != 0},
                         opt, ex, &run);
  if (s.ok()) {
    *length = cache.length;
    CopyRunInfo(run, info);
  }
  return s;
}

Status ConvertRotary(const simdattn_mha_rotary* c, MhaRotary* out) {
  if (c == nullptr) return Status::Ok();
  const Status s = CheckStructSize("simdattn_mha_rotary", c, c->struct_size,
                                   sizeof(simdattn_mha_rotary));
  if (!s.ok()) return s;
  out->enabled = c->enabled != 0;
  out->rotary_dim = c->rotary_dim;
  out->interleaved = c->interleaved != 0;
  out->cos = c->cos;
  out->sin = c->sin;
  out->max_position = c->max_position;
  out->theta = c->theta;
  return Status::Ok();
}

struct CPagedStep {
  const simdattn_tensor* k_cache;
  const simdattn_tensor* v_cache;
  const int32_t* block_table;
  int64_t max_blocks_per_seq, block_table_stride;
  int32_t* seq_lens;
  const simdattn_mha_rotary* rotary;
};

Status CMhaStepPaged(simdattn_mha* layer, const simdattn_mha_tensor* x, const CPagedStep& p,
                     const simdattn_mha_tensor* out, const simdattn_mha_options* options,
                     const simdattn_exec* exec, simdattn_run_info* info) {
  if (layer == nullptr) return Invalid("layer is NULL");
  if (x == nullptr) return Invalid("x is NULL");
  if (p.k_cache == nullptr) return Invalid("k_cache is NULL");
  if (p.v_cache == nullptr) return Invalid("v_cache is NULL");
  if (out == nullptr) return Invalid("out is NULL");
  if (info != nullptr && info->struct_size < sizeof(simdattn_run_info)) {
    return Invalid("info->struct_size = " + std::to_string(info->struct_size) +
                   ": must be sizeof(simdattn_run_info)");
  }
  MhaForwardOptions opt;
  Status s = ConvertMhaOptions(options, x->batch, layer->layer->config().num_heads, &opt);
  if (s.ok()) s = ConvertRotary(p.rotary, &opt.rotary);
  ExecutionOptions ex;
  if (s.ok()) s = ConvertExec(exec, &ex);
  if (!s.ok()) return s;
  MhaPagedKvCache cache;
  cache.k = ToMutableView(*p.k_cache);
  cache.v = ToMutableView(*p.v_cache);
  cache.block_table = p.block_table;
  cache.max_blocks_per_seq = p.max_blocks_per_seq;
  cache.block_table_stride = p.block_table_stride;
  cache.seq_lens = p.seq_lens;
  const simdattn_mha_tensor& o = *out;
  RunInfo run;
  s = layer->layer->StepPaged(ToMha(*x), &cache,
                              {o.data, static_cast<DType>(o.dtype), o.batch, o.len, o.dim,
                               o.batch_first != 0},
                              opt, ex, &run);
  if (s.ok()) CopyRunInfo(run, info);
  return s;
}

}  // namespace
}  // namespace simdattn

extern "C" {

void simdattn_mha_rotary_init(simdattn_mha_rotary* rotary) {
  if (rotary == nullptr) return;
  std::memset(rotary, 0, sizeof(*rotary));
  rotary->struct_size = sizeof(*rotary);
  rotary->theta = 10000.0;
}

int simdattn_mha_step_paged(simdattn_mha* layer, const simdattn_mha_tensor* x,
                            const simdattn_tensor* k_cache, const simdattn_tensor* v_cache,
                            const int32_t* block_table, int64_t max_blocks_per_seq,
                            int64_t block_table_stride, int32_t* seq_lens,
                            const simdattn_mha_rotary* rotary, const simdattn_mha_tensor* out,
                            const simdattn_mha_options* options, const simdattn_exec* exec,
                            simdattn_run_info* info) {
  const simdattn::CPagedStep p{k_cache, v_cache, block_table, max_blocks_per_seq,
                               block_table_stride, seq_lens, rotary};
  return simdattn::Guarded([&] {
    return simdattn::CMhaStepPaged(layer, x, p, out, options, exec, info);
  });
}

void simdattn_mha_config_init(simdattn_mha_config* config) {
  if (config == nullptr) return;
  std::memset(config, 0, sizeof(*config));
  config->struct_size = sizeof(*config);
  config->bias = 1;
  config->dtype = SIMDATTN_F32;
}

int simdattn_mha_create(const simdattn_mha_config* config, simdattn_mha** out) {
  return simdattn::Guarded([&] { return simdattn::CMhaCreate(config, out); });
}

void simdattn_mha_destroy(simdattn_mha* layer) {
  if (layer == nullptr) return;
  delete layer->layer;
  delete layer;
}

int simdattn_mha_load(simdattn_mha* layer, const simdattn_named_tensor* tensors, int64_t num,
                      const simdattn_exec* exec) {
  return simdattn::Guarded([&] { return simdattn::CMhaLoad(layer, tensors, num, exec); });
}

void simdattn_mha_options_init(simdattn_mha_options* options) {
  if (options == nullptr) return;
  std::memset(options, 0, sizeof(*options));
  options->struct_size = sizeof(*options);
  simdattn_options_init(&options->attention);
  options->average_weights = 1;
}

int simdattn_mha_forward(simdattn_mha* layer, const simdattn_mha_tensor* query,
                         const simdattn_mha_tensor* key, const simdattn_mha_tensor* value,
                         const simdattn_mha_tensor* out, const simdattn_mha_options* options,
                         const simdattn_exec* exec, simdattn_run_info* info) {
  return simdattn::Guarded([&] {
    return simdattn::CMhaForward(layer, query, key, value, out, options, exec, info);
  });
}

int simdattn_mha_step(simdattn_mha* layer, const simdattn_mha_tensor* x,
                      const simdattn_tensor* k_cache, const simdattn_tensor* v_cache,
                      int64_t* length, const simdattn_mha_tensor* out,
                      const simdattn_mha_options* options, const simdattn_exec* exec,
                      simdattn_run_info* info) {
  return simdattn::Guarded([&] {
    return simdattn::CMhaStep(layer, x, k_cache, v_cache, length, out, options, exec, info);
  });
}

}  // extern "C"
