// Packing the weights of the projections' GEMM into panels, once, for the
// target the calls will run (see gemm.h).

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "hwy/highway.h"
#include "hwy/targets.h"
#include "lib/dispatch.h"
#include "lib/dtype.h"
#include "lib/gemm/gemm.h"
#include "lib/parallel.h"
#include "lib/status.h"

namespace simdattn {

void FreeDeleter::operator()(float* p) const { std::free(p); }

int64_t PackedWeights::Cols(int first, int end) const {
  int64_t cols = 0;
  for (int s = first; s < end; ++s) cols += segments[static_cast<size_t>(s)].n;
  return cols;
}

namespace {

// Buffers of 2 MiB or more start on a 2 MiB page and are advised to huge
// pages: an M = 1 product streams the whole buffer once per call, and the
// read roofline measured 13.4-14.1 GB/s on 2 MiB pages against 12.0-12.7
// on 4 KiB ones (bench/common.h). Smaller ones start on 256 bytes (every
// vector size up to SVE-2048).
float* AllocPacked(size_t floats) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t bytes = floats * sizeof(float);
  const size_t align = bytes >= kHuge ? kHuge : 256;
  void* p = std::aligned_alloc(align, (bytes + align - 1) / align * align);
#ifdef MADV_HUGEPAGE
  if (p != nullptr && align == kHuge) madvise(p, bytes, MADV_HUGEPAGE);
#endif
  return static_cast<float*>(p);
}

float Widen(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(data)[i];
    case DType::kBF16: return BF16ToF32(static_cast<const uint16_t*>(data)[i]);
    default: return F16ToF32(static_cast<const uint16_t*>(data)[i]);
  }
}

bool IsFloatType(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

// The Highway target bit of a dispatch entry: its own name, or AVX3 for
// the entries built from AVX3's code (AVX3_BF16, AVX3_AMX).
int64_t TargetBitOf(const std::string& name) {
  if (name == "AVX3_BF16" || name == "AVX3_AMX") return HWY_AVX3;
  for (int64_t targets = HWY_TARGETS; targets != 0; targets &= targets - 1) {
    const int64_t bit = targets & -targets;
    if (name == hwy::TargetName(bit)) return bit;
  }
  return 0;
}

Status CheckMatrix(const WeightMatrix& w, int i, int64_t k) {
  const std::string name = "weights[" + std::to_string(i) + "]";
  if (w.data == nullptr) return Invalid(name + ".data is null");
  if (w.n < 1) return Invalid(name + ".n = " + std::to_string(w.n) + " (want >= 1)");
  if (w.ld < k) {
    return Invalid(name + ".ld = " + std::to_string(w.ld) + " < k = " + std::to_string(k));
  }
  if (!IsFloatType(w.dtype)) return Invalid(name + ".dtype = " + DTypeName(w.dtype));
  if (w.bias != nullptr && !IsFloatType(w.bias_dtype)) {
    return Invalid(name + ".bias_dtype = " + DTypeName(w.bias_dtype));
  }
  return Status::Ok();
}

struct PackJob {
  const WeightMatrix* matrices;
  PackedWeights* out;
  std::vector<int> segment_of_panel;
};

// Panel p: column c of the panel (row col + c of W) becomes the strided
// column [t][c] of the panel; reads go along W's rows.
void PackPanel(void* arg, int64_t p) {
  PackJob* job = static_cast<PackJob*>(arg);
  PackedWeights& w = *job->out;
  const int s = job->segment_of_panel[static_cast<size_t>(p)];
  const WeightMatrix& m = job->matrices[s];
  const int64_t nr = w.panel_cols, k = w.k;
  const int64_t row0 = (p - w.segments[static_cast<size_t>(s)].first_panel) * nr;
  float* dst = w.data.get() + p * k * nr;
  for (int64_t c = 0; c < nr; ++c) {
    const int64_t row = row0 + c;
    for (int64_t t = 0; t < k; ++t) {
      dst[t * nr + c] = row < m.n ? Widen(m.data, m.dtype, row * m.ld + t) : 0.0f;
    }
    if (w.bias != nullptr) {
      w.bias.get()[p * nr + c] =
          row < m.n && m.bias != nullptr ? Widen(m.bias, m.bias_dtype, row) : 0.0f;
    }
  }
}

}  // namespace

Status PackWeights(const WeightMatrix* matrices, int num, int64_t k,
                   const ExecutionOptions& exec, PackedWeights* out) {
  if (out == nullptr) return Invalid("out is null");
  if (matrices == nullptr || num < 1) return Invalid("matrices: want at least one");
  if (k < 1) return Invalid("k = " + std::to_string(k) + " (want >= 1)");
  bool any_bias = false;
  for (int i = 0; i < num; ++i) {
    Status s = CheckMatrix(matrices[i], i, k);
    if (!s.ok()) return s;
    any_bias = any_bias || matrices[i].bias != nullptr;
  }
  const TargetEntry* entry = nullptr;
  Status s = ChooseTarget(exec.max_target, &entry);
  if (!s.ok()) return s;
  PackedWeights w;
  w.kernels = GemmKernelsForTarget(TargetBitOf(entry->name));
  if (w.kernels == nullptr) {
    s.code = StatusCode::kInternal;
    s.message = std::string("no GEMM kernels for target ") + entry->name;
    return s;
  }
  w.target = entry->name;
  w.k = k;
  w.panel_cols = w.kernels->panel_cols();
  PackJob job{matrices, &w, {}};
  int64_t col = 0;
  for (int i = 0; i < num; ++i) {
    const int64_t panels = (matrices[i].n + w.panel_cols - 1) / w.panel_cols;
    w.segments.push_back({matrices[i].n, w.panels(), panels, col});
    for (int64_t p = 0; p < panels; ++p) {
      job.segment_of_panel.push_back(i);
      w.panel_col.push_back(col + p * w.panel_cols);
      w.panel_valid.push_back(std::min(w.panel_cols, matrices[i].n - p * w.panel_cols));
    }
    col += matrices[i].n;
  }
  const size_t panel_floats = static_cast<size_t>(k * w.panel_cols);
  w.data.reset(AllocPacked(panel_floats * static_cast<size_t>(w.panels())));
  if (any_bias) w.bias.reset(AllocPacked(static_cast<size_t>(w.panels() * w.panel_cols)));
  if (w.data == nullptr || (any_bias && w.bias == nullptr)) {
    s.code = StatusCode::kOutOfMemory;
    s.message = "cannot allocate the packed weights (" +
                std::to_string(panel_floats * static_cast<size_t>(w.panels()) * 4) + " bytes)";
    return s;
  }
  RunTasks(exec, w.panels(), &PackPanel, &job);
  *out = std::move(w);
  return Status::Ok();
}

}  // namespace simdattn
