// The projections' GEMM driver: validation, blocking, widening 16-bit A,
// and the split of C into tasks over the executor (see gemm.h).

#include "lib/gemm/gemm.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>

#include "lib/dtype.h"
#include "lib/parallel.h"
#include "lib/status.h"

namespace simdattn {
namespace {

Status OutOfMemory(const std::string& what) {
  return Error(StatusCode::kOutOfMemory, "cannot allocate " + what);
}

// Rows of C per task: about 64 (a multiple of the row tile); their kc
// chunk of A (32 KiB at kc 128) stays in L2 while the task's panels pass.
constexpr int64_t kRowsPerTask = 64;
// Bytes of a panel's chunk of reduction steps (kc x panel_cols floats),
// inside a 48 KiB L1 with the packed rows of A beside it: kc 128 for the
// 64-column panels of AVX-512.
constexpr int64_t kChunkBytes = int64_t{32} << 10;
// Bytes of W per task: 512 KiB (4 panels at k 1024 on AVX-512), so that
// a task's panels stay in a 2 MiB L2 while consecutive tasks (the row
// blocks of one panel block) read them again.
constexpr int64_t kPanelBytesPerTask = int64_t{512} << 10;

// Per-thread accumulator tile, sized on first use and kept.
struct AccScratch {
  float* data = nullptr;
  size_t floats = 0;
  ~AccScratch() { std::free(data); }
  float* Get(size_t n) {
    if (n > floats) {
      std::free(data);
      data = static_cast<float*>(std::aligned_alloc(256, (n * 4 + 255) / 256 * 256));
      floats = data == nullptr ? 0 : n;
    }
    return data;
  }
};
thread_local AccScratch t_acc;

struct GemmJob {
  GemmArgs args;
  const GemmKernels* kernels;
  size_t acc_floats;  // mc x panel_cols
  std::atomic<bool> out_of_memory{false};
};

void RunGemmTask(void* arg, int64_t task) {
  GemmJob* job = static_cast<GemmJob*>(arg);
  float* acc = t_acc.Get(job->acc_floats);
  if (acc == nullptr) {
    job->out_of_memory.store(true);
    return;
  }
  job->kernels->task(job->args, task, acc);
}

// The calling thread's packed A, kept between calls (a fresh 8 MiB buffer
// per call would spend milliseconds on first touches of its pages).
thread_local AccScratch t_packed_a;

struct PackAJob {
  GemmInput a;
  int64_t k, row_tile, rows_per_task;  // rows_per_task: a multiple of row_tile
  float* dst;
};

// Rows [r0, r0 + rows) of A widened to f32 as one packed group [k][rows]:
// the stores go in order while the reads follow `rows` streams.
void PackGroup(const GemmInput& a, int64_t r0, int64_t rows, int64_t k, float* dst) {
  if (a.dtype == DType::kF32) {
    const float* src = static_cast<const float*>(a.data) + r0 * a.lda;
    for (int64_t t = 0; t < k; ++t) {
      for (int64_t r = 0; r < rows; ++r) dst[t * rows + r] = src[r * a.lda + t];
    }
    return;
  }
  const uint16_t* src = static_cast<const uint16_t*>(a.data) + r0 * a.lda;
  const bool bf16 = a.dtype == DType::kBF16;
  for (int64_t t = 0; t < k; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      const uint16_t h = src[r * a.lda + t];
      dst[t * rows + r] = bf16 ? BF16ToF32(h) : F16ToF32(h);
    }
  }
}

// Row block i of 16-bit A widened to f32 and packed as GemmArgs::a
// describes (f32 A is read in place: packing it cost more than the
// broadcasts' reads of row_tile rows lda apart saved).
// Group g (rows [g R, g R + R)) lies at g R k, the m % R last rows at
// (m / R) R k: both at r0 k for the group's first row r0.
void PackRows(void* arg, int64_t i) {
  const PackAJob* job = static_cast<const PackAJob*>(arg);
  const int64_t m = job->a.m, k = job->k, R = job->row_tile;
  const int64_t end = std::min(m, (i + 1) * job->rows_per_task);
  for (int64_t r0 = i * job->rows_per_task; r0 < end; r0 += R) {
    PackGroup(job->a, r0, std::min(R, m - r0), k, job->dst + r0 * k);
  }
}

Status CheckGemm(const GemmInput& a, const PackedWeights& w, int first, int end,
                 const void* c, DType c_type, int64_t ldc) {
  if (w.kernels == nullptr || w.data == nullptr) return Invalid("w: weights not packed");
  const int num = static_cast<int>(w.segments.size());
  if (first < 0 || end > num || first >= end) {
    return Invalid("segments [" + std::to_string(first) + ", " + std::to_string(end) +
                   ") outside the " + std::to_string(num) + " packed");
  }
  if (a.data == nullptr) return Invalid("a.data is null");
  if (a.m < 1) return Invalid("a.m = " + std::to_string(a.m) + " (want >= 1)");
  if (a.lda < w.k) {
    return Invalid("a.lda = " + std::to_string(a.lda) + " < k = " + std::to_string(w.k));
  }
  if (a.dtype != DType::kF32 && a.dtype != DType::kF16 && a.dtype != DType::kBF16) {
    return Invalid(std::string("a.dtype = ") + DTypeName(a.dtype));
  }
  if (c == nullptr) return Invalid("c is null");
  if (c_type != DType::kF32 && c_type != DType::kF16 && c_type != DType::kBF16) {
    return Invalid(std::string("c_type = ") + DTypeName(c_type));
  }
  if (ldc < w.Cols(first, end)) {
    return Invalid("ldc = " + std::to_string(ldc) + " < the " +
                   std::to_string(w.Cols(first, end)) + " columns");
  }
  return Status::Ok();
}

}  // namespace

Status Gemm(const GemmInput& a, const PackedWeights& w, int first, int end,
            void* c, DType c_type, int64_t ldc, const ExecutionOptions& exec) {
  Status s = CheckGemm(a, w, first, end, c, c_type, ldc);
  if (!s.ok()) return s;
  GemmJob job;
  GemmArgs& g = job.args;
  job.kernels = w.kernels;
  g.m = a.m;
  g.k = w.k;
  if (a.dtype == DType::kF32) {
    g.a = static_cast<const float*>(a.data);  // read in place: no copy of A
    g.lda = a.lda;
  } else {
    float* packed_a = t_packed_a.Get(static_cast<size_t>(a.m * w.k));
    if (packed_a == nullptr) return OutOfMemory("the packed rows of a");
    g.a = packed_a;
    g.lda = 0;
  }
  g.packed = w.data.get();
  g.bias = w.bias.get();
  g.panel_col = w.panel_col.data();
  g.panel_valid = w.panel_valid.data();
  const auto& s0 = w.segments[static_cast<size_t>(first)];
  const auto& s1 = w.segments[static_cast<size_t>(end - 1)];
  g.panel_first = s0.first_panel;
  g.panel_end = s1.first_panel + s1.panels;
  g.col_base = s0.first_col;
  g.c = c;
  g.c_type = c_type;
  g.ldc = ldc;
  const int64_t row_tile = w.kernels->row_tile();
  g.mc = row_tile * std::max<int64_t>(1, kRowsPerTask / row_tile);
  if (g.lda == 0) {
    PackAJob pj{a, w.k, row_tile, g.mc, const_cast<float*>(g.a)};
    RunTasks(exec, (a.m + g.mc - 1) / g.mc, &PackRows, &pj);
  }
  g.kc = std::max<int64_t>(16, kChunkBytes / (w.panel_cols * 4));
  g.nc_panels = std::max<int64_t>(1, kPanelBytesPerTask / (w.k * w.panel_cols * 4));
  job.acc_floats = static_cast<size_t>(g.mc * w.panel_cols);
  g.m_blocks = (a.m + g.mc - 1) / g.mc;
  const int64_t n_blocks = (g.panel_end - g.panel_first + g.nc_panels - 1) / g.nc_panels;
  RunTasks(exec, g.m_blocks * n_blocks, &RunGemmTask, &job);
  if (job.out_of_memory.load()) return OutOfMemory("a thread's accumulator tile (C partly written)");
  return Status::Ok();
}

}  // namespace simdattn
