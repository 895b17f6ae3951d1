// AppendKv (serving.h): new tokens' K and V rows, K (and q) optionally
// rotated by RoPE, converted to the caches' storage types (or computed in
// f32 and quantized with lib/quant.h's quantizers) and written at their
// slots. A memory-bound copy: a scalar loop per row, split over tokens on
// the executor's threads.

#include <algorithm>
#include <cstdint>
#include <new>
#include <string>
#include <vector>

#include "lib/append_validate.h"
#include "lib/dtype.h"
#include "lib/parallel.h"
#include "lib/quant.h"
#include "simdattn/serving.h"

namespace simdattn {
namespace {

// Scalar load (exact widening to f32) and store (round to nearest even,
// Inf and NaN kept) of one storage type.
struct F32Io {
  using T = float;
  static float Load(const T* p, int64_t i) { return p[i]; }
  static void Store(T* p, int64_t i, float x) { p[i] = x; }
};
struct F16Io {
  using T = uint16_t;
  static float Load(const T* p, int64_t i) { return F16ToF32(p[i]); }
  static void Store(T* p, int64_t i, float x) { p[i] = F32ToF16(x); }
};
struct BF16Io {
  using T = uint16_t;
  static float Load(const T* p, int64_t i) { return BF16ToF32(p[i]); }
  static void Store(T* p, int64_t i, float x) { p[i] = F32ToBF16(x); }
};

// The rotation of one token: the cos and sin rows of its position.
struct Rotation {
  const float* cos = nullptr;  // null: no rotation
  const float* sin = nullptr;
  int64_t half = 0;  // rotary_dim / 2
  bool interleaved = false;
};

// dst[0, d) = src[0, d) converted from In to Out, the first 2 * rot.half
// dims rotated in f32 when rot.cos is set: pair i is (2i, 2i + 1)
// (interleaved) or (i, i + half), and (x, y) becomes (x cos - y sin,
// y cos + x sin). src may be dst (q in place): each pair is read before it
// is written.
template <class In, class Out>
void ConvertRow(const void* src_bytes, void* dst_bytes, int64_t d,
                const Rotation& rot) {
  const auto* src = static_cast<const typename In::T*>(src_bytes);
  auto* dst = static_cast<typename Out::T*>(dst_bytes);
  int64_t begin = 0;
  if (rot.cos != nullptr) {
    const int64_t half = rot.half;
    const int64_t stride = rot.interleaved ? 2 : 1;
    const int64_t other = rot.interleaved ? 1 : half;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t a = i * stride;
      const float x = In::Load(src, a);
      const float y = In::Load(src, a + other);
      Out::Store(dst, a, x * rot.cos[i] - y * rot.sin[i]);
      Out::Store(dst, a + other, y * rot.cos[i] + x * rot.sin[i]);
    }
    begin = 2 * half;
  }
  for (int64_t i = begin; i < d; ++i) Out::Store(dst, i, In::Load(src, i));
}

using RowFn = void (*)(const void* src, void* dst, int64_t d,
                       const Rotation& rot);

template <class In>
RowFn RowTo(DType out) {
  switch (out) {
    case DType::kF16:
      return ConvertRow<In, F16Io>;
    case DType::kBF16:
      return ConvertRow<In, BF16Io>;
    default:
      return ConvertRow<In, F32Io>;
  }
}

// The row function from `in` to `out` (both validated storage types).
RowFn PickRow(DType in, DType out) {
  switch (in) {
    case DType::kF16:
      return RowTo<F16Io>(out);
    case DType::kBF16:
      return RowTo<BF16Io>(out);
    default:
      return RowTo<F32Io>(out);
  }
}

// A view as a base address and byte strides.
struct Rows {
  uint8_t* data = nullptr;
  int64_t stride[3] = {0, 0, 0};  // bytes per step of dimensions 0..2

  Rows() = default;
  explicit Rows(const TensorView& v)
      : data(static_cast<uint8_t*>(const_cast<void*>(v.data))) {
    // q8_0's strides are already in bytes.
    const int64_t unit = v.dtype == DType::kQ8_0 ? 1 : DTypeSize(v.dtype);
    for (int i = 0; i < 3; ++i) stride[i] = v.strides[i] * unit;
  }
  uint8_t* Row(int64_t i0, int64_t i1, int64_t i2) const {
    return data + i0 * stride[0] + i1 * stride[1] + i2 * stride[2];
  }
};

// How rows reach one cache: `row` converts a new row (rotating it) into
// the cache's dtype, or, for a quantized cache, into f32 scratch that
// Store() then quantizes into the cache.
struct CacheWriter {
  Rows cache;
  RowFn row = nullptr;
  DType dtype = DType::kF32;
  Rows scales;         // an int8 cache's scale cache
  float scale = 1.0f;  // an fp8 cache's per-tensor scale

  bool quantized() const {
    return dtype != DType::kF32 && dtype != DType::kF16 && dtype != DType::kBF16;
  }

  CacheWriter() = default;
  CacheWriter(const MutableTensorView& c, DType in, const MutableTensorView& s,
              float sc)
      : cache(c), dtype(c.dtype), scales(s), scale(sc) {
    row = PickRow(in, quantized() ? DType::kF32 : c.dtype);
  }

  // Row src of a new token (d values) into slot (block, h, r); `scratch`
  // holds d floats.
  void Write(const uint8_t* src, int64_t d, const Rotation& rot, int64_t block,
             int64_t h, int64_t r, float* scratch) const {
    uint8_t* dst = cache.Row(block, h, r);
    if (!quantized()) {
      row(src, dst, d, rot);
      return;
    }
    row(src, scratch, d, rot);
    if (dtype == DType::kInt8) {
      const float sc = QuantizeRowInt8(scratch, d, reinterpret_cast<int8_t*>(dst));
      *reinterpret_cast<float*>(scales.Row(block, h, r)) = sc;
    } else if (dtype == DType::kQ8_0) {
      QuantizeRowQ8_0(scratch, d, dst);
    } else {
      QuantizeRowFp8(scratch, d, scale, dtype == DType::kFp8E4M3, dst);
    }
  }
};

// Everything a task needs; tokens [i * tokens_per_task, ...) are task i's,
// floats [i * scratch_per_task, ...) of scratch its f32 rows.
struct AppendJob {
  AppendProblem p;
  Rows k_new, v_new, q;
  CacheWriter k, v;
  RowFn q_row = nullptr;
  const int32_t* slots = nullptr;
  RotaryEmbedding rotary;
  int64_t tokens_per_task = 1;
  float* scratch = nullptr;  // quantized caches only
  int64_t scratch_per_task = 0;

  Rotation RotationOf(int64_t t) const {
    Rotation r;
    if (p.rotary_dim == 0) return r;
    r.half = p.rotary_dim / 2;
    r.cos = rotary.cos + rotary.positions[t] * r.half;
    r.sin = rotary.sin + rotary.positions[t] * r.half;
    r.interleaved = rotary.interleaved;
    return r;
  }
};

// Token t: its K and V rows into their slot (none for a negative slot),
// its q rows rotated in place. scratch: the task's f32 rows.
void AppendToken(const AppendJob& job, int64_t t, float* scratch) {
  const AppendProblem& p = job.p;
  const Rotation rot = job.RotationOf(t);
  const int32_t slot = job.slots[t];
  if (slot >= 0) {
    const int64_t block = slot / p.block_size, row = slot % p.block_size;
    for (int64_t h = 0; h < p.kv_heads; ++h) {
      job.k.Write(job.k_new.Row(0, h, t), p.head_dim_k, rot, block, h, row,
                  scratch);
      job.v.Write(job.v_new.Row(0, h, t), p.head_dim_v, Rotation(), block, h,
                  row, scratch);
    }
  }
  if (p.rotate_q) {
    for (int64_t h = 0; h < p.q_heads; ++h) {
      uint8_t* row = job.q.Row(0, h, t);
      job.q_row(row, row, p.rotary_dim, rot);
    }
  }
}

void AppendTask(void* arg, int64_t i) {
  const AppendJob& job = *static_cast<const AppendJob*>(arg);
  const int64_t begin = i * job.tokens_per_task;
  const int64_t end = std::min(begin + job.tokens_per_task, job.p.tokens);
  float* scratch =
      job.scratch == nullptr ? nullptr : job.scratch + i * job.scratch_per_task;
  for (int64_t t = begin; t < end; ++t) AppendToken(job, t, scratch);
}

// Elements a task should at least move: about 64 KiB of f32, so that the
// pool's wake-up (a few microseconds) stays small against the copy.
constexpr int64_t kMinElementsPerTask = 16384;

// Tokens per task: at least kMinElementsPerTask elements each, and about
// four tasks per thread for balance.
int64_t TokensPerTask(const AppendProblem& p, int threads) {
  const int64_t per_token = p.kv_heads * (p.head_dim_k + p.head_dim_v) +
                            (p.rotate_q ? p.q_heads * p.rotary_dim : 0);
  const int64_t min_tokens = std::max<int64_t>(1, kMinElementsPerTask / per_token);
  const int64_t max_tasks = std::max<int64_t>(1, int64_t{4} * threads);
  const int64_t by_threads = (p.tokens + max_tasks - 1) / max_tasks;
  return std::max(min_tokens, by_threads);
}

Status Failure(StatusCode code, const std::string& message) {
  Status s;
  s.code = code;
  s.message = message;
  return s;
}

}  // namespace

Status AppendKv(const TensorView& k_new, const TensorView& v_new,
                const MutableTensorView& k_cache,
                const MutableTensorView& v_cache, const int32_t* slot_mapping,
                const RotaryEmbedding& rotary, const MutableTensorView& q,
                const ExecutionOptions& exec) {
  return AppendKv(k_new, v_new, k_cache, v_cache, slot_mapping, rotary, q, exec,
                  QuantizedCacheScales());
}

Status AppendKv(const TensorView& k_new, const TensorView& v_new,
                const MutableTensorView& k_cache,
                const MutableTensorView& v_cache, const int32_t* slot_mapping,
                const RotaryEmbedding& rotary, const MutableTensorView& q,
                const ExecutionOptions& exec, const QuantizedCacheScales& scales) {
  try {
    if (exec.parallel_for_threads < 0) {
      return Failure(StatusCode::kInvalidArgument,
                     "exec.parallel_for_threads = " +
                         std::to_string(exec.parallel_for_threads) +
                         ": must be >= 0 (0 = hardware_concurrency())");
    }
    AppendJob job;
    const Status s = ValidateAppend(k_new, v_new, k_cache, v_cache,
                                    slot_mapping, rotary, q, scales, &job.p);
    if (!s.ok() || job.p.tokens == 0) return s;
    job.k_new = Rows(k_new);
    job.v_new = Rows(v_new);
    job.k = CacheWriter(k_cache, k_new.dtype, scales.k_scales, scales.k_scale);
    job.v = CacheWriter(v_cache, v_new.dtype, scales.v_scales, scales.v_scale);
    if (job.p.rotate_q) {
      job.q = Rows(q);
      job.q_row = PickRow(q.dtype, q.dtype);
    }
    job.slots = slot_mapping;
    job.rotary = rotary;
    job.tokens_per_task = TokensPerTask(job.p, ExecutorThreads(exec));
    const int64_t num_tasks =
        (job.p.tokens + job.tokens_per_task - 1) / job.tokens_per_task;
    std::vector<float> scratch;
    if (job.k.quantized() || job.v.quantized()) {
      job.scratch_per_task = std::max(job.p.head_dim_k, job.p.head_dim_v);
      scratch.resize(static_cast<size_t>(num_tasks * job.scratch_per_task));
      job.scratch = scratch.data();
    }
    if (num_tasks == 1) {
      AppendTask(&job, 0);  // too little work to wake the pool
    } else {
      RunTasks(exec, num_tasks, AppendTask, &job);
    }
    return Status::Ok();
  } catch (const std::bad_alloc&) {
    return Failure(StatusCode::kOutOfMemory, "out of memory");
  } catch (...) {
    return Failure(StatusCode::kInternal, "unexpected exception");
  }
}

}  // namespace simdattn
