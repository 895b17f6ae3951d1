// Shared test helpers (see test_util.h).

#include "tests/test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <numeric>
#include <sstream>

#include "gtest/gtest.h"
#include "lib/dtype.h"

namespace simdattn {
namespace test {

bool QuickMode() {
  const char* env = std::getenv("SIMDATTN_TEST_QUICK");
  return env != nullptr && env[0] != '\0' && env[0] != '0';
}

bool TargetsFromEnv(const char* name, std::set<std::string>* names) {
  const char* env = std::getenv(name);
  if (env == nullptr) return false;
  std::istringstream is(env);
  for (std::string t; is >> t;) names->insert(t);
  return true;
}

std::vector<std::string> TestTargets() {
  std::vector<std::string> targets = AvailableTargets();
  std::set<std::string> named;
  if (!TargetsFromEnv("SIMDATTN_TEST_TARGETS", &named)) return targets;
  targets.erase(std::remove_if(targets.begin(), targets.end(),
                               [&](const std::string& t) { return !named.count(t); }),
                targets.end());
  return targets;
}

namespace {
std::mutex& RunMutex() {
  static std::mutex m;
  return m;
}
std::set<std::string>& RunSet() {
  static std::set<std::string> s;
  return s;
}
}  // namespace

void RecordTargetRun(const std::string& target) {
  std::lock_guard<std::mutex> lock(RunMutex());
  RunSet().insert(target);
}

std::set<std::string> TargetsRun() {
  std::lock_guard<std::mutex> lock(RunMutex());
  return RunSet();
}

namespace {
bool g_amx_emulated = false;
}  // namespace

bool AmxEmulated() { return g_amx_emulated; }
void SetAmxEmulated(bool on) { g_amx_emulated = on; }

std::string ExpectedDefaultTarget() {
  const std::vector<std::string> avail = AvailableTargets();
  if (avail.empty()) return "";
  if (avail.front() != "AVX3_BF16" || avail.size() < 2) return avail.front();
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("vendor_id", 0) == 0) {
      return line.find("AuthenticAMD") != std::string::npos ? avail[0] : avail[1];
    }
  }
  return avail[1];
}

ScopedTarget::ScopedTarget(const std::string& name) {
  const Status s = SetMaxTarget(name.c_str());
  if (!s.ok()) std::abort();  // a target name from AvailableTargets() is valid
}
ScopedTarget::~ScopedTarget() { SetMaxTarget(nullptr); }

Tensor::Tensor(DType dt, int64_t b, int64_t h, int64_t s, int64_t d,
               Layout layout, int64_t pad, int64_t off)
    : dtype(dt), offset(off) {
  shape[0] = b;
  shape[1] = h;
  shape[2] = s;
  shape[3] = d;
  const int64_t row = d + pad;
  if (layout == Layout::kBHSD) {
    strides[3] = 1;
    strides[2] = row;
    strides[1] = (s + pad) * row;
    strides[0] = (h + pad) * strides[1];
  } else {
    strides[3] = 1;
    strides[1] = row;
    strides[2] = (h + pad) * row;
    strides[0] = (s + pad) * strides[2];
  }
  const int64_t total = offset + b * strides[0];
  bytes.assign(static_cast<size_t>(total * DTypeSize(dt)), 0);
}

int64_t Tensor::Index(int64_t i0, int64_t i1, int64_t i2, int64_t i3) const {
  return offset + i0 * strides[0] + i1 * strides[1] + i2 * strides[2] +
         i3 * strides[3];
}

float Tensor::Get(int64_t i0, int64_t i1, int64_t i2, int64_t i3) const {
  const int64_t i = Index(i0, i1, i2, i3);
  const uint8_t* p = bytes.data() + i * DTypeSize(dtype);
  switch (dtype) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return F16ToF32(h);
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return BF16ToF32(h);
    }
    case DType::kBool:
      return p[0] != 0 ? 1.0f : 0.0f;
  }
  return 0.0f;
}

void Tensor::Set(int64_t i0, int64_t i1, int64_t i2, int64_t i3, float x) {
  const int64_t i = Index(i0, i1, i2, i3);
  uint8_t* p = bytes.data() + i * DTypeSize(dtype);
  switch (dtype) {
    case DType::kF32:
      std::memcpy(p, &x, 4);
      break;
    case DType::kF16: {
      const uint16_t h = F32ToF16(x);
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::kBF16: {
      const uint16_t h = F32ToBF16(x);
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::kBool:
      p[0] = x != 0.0f ? 1 : 0;
      break;
  }
}

void Tensor::FillUniform(std::mt19937* rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t a = 0; a < shape[0]; ++a)
    for (int64_t b = 0; b < shape[1]; ++b)
      for (int64_t c = 0; c < shape[2]; ++c)
        for (int64_t d = 0; d < shape[3]; ++d) Set(a, b, c, d, dist(*rng));
}

void Tensor::FillBytes(uint8_t value) {
  std::fill(bytes.begin(), bytes.end(), value);
}

TensorView Tensor::View() const {
  TensorView v;
  v.data = bytes.data() + offset * DTypeSize(dtype);
  v.dtype = dtype;
  for (int i = 0; i < 4; ++i) {
    v.shape[i] = shape[i];
    v.strides[i] = strides[i];
  }
  return v;
}

MutableTensorView Tensor::MutableView() {
  MutableTensorView v;
  v.data = bytes.data() + offset * DTypeSize(dtype);
  v.dtype = dtype;
  for (int i = 0; i < 4; ++i) {
    v.shape[i] = shape[i];
    v.strides[i] = strides[i];
  }
  return v;
}

double MaxAbs(const Tensor& t) {
  double m = 0.0;
  for (int64_t a = 0; a < t.shape[0]; ++a)
    for (int64_t b = 0; b < t.shape[1]; ++b)
      for (int64_t c = 0; c < t.shape[2]; ++c)
        for (int64_t d = 0; d < t.shape[3]; ++d)
          m = std::max(m, std::fabs(static_cast<double>(t.Get(a, b, c, d))));
  return m;
}

void ExpectNanWhereReferenceIs(const Tensor& o, const std::vector<double>& o_ref,
                               double bound) {
  size_t i = 0;
  for (int64_t a = 0; a < o.shape[0]; ++a)
    for (int64_t b = 0; b < o.shape[1]; ++b)
      for (int64_t c = 0; c < o.shape[2]; ++c)
        for (int64_t d = 0; d < o.shape[3]; ++d, ++i) {
          const float got = o.Get(a, b, c, d);
          if (std::isnan(o_ref[i])) {
            EXPECT_TRUE(std::isnan(got)) << "at " << a << " " << b << " " << c << " " << d;
          } else {
            EXPECT_LE(std::fabs(got - o_ref[i]), bound)
                << "at " << a << " " << b << " " << c << " " << d;
          }
        }
}

double MaxError(const Tensor& o, const std::vector<double>& o_ref,
                double max_abs_v) {
  double err = 0.0;
  size_t n = 0;
  for (int64_t a = 0; a < o.shape[0]; ++a)
    for (int64_t b = 0; b < o.shape[1]; ++b)
      for (int64_t c = 0; c < o.shape[2]; ++c)
        for (int64_t d = 0; d < o.shape[3]; ++d) {
          const double diff = std::fabs(o.Get(a, b, c, d) - o_ref[n++]);
          // NaN never passes: std::max would drop it.
          if (!(diff <= err)) err = std::isnan(diff) ? INFINITY : diff;
        }
  return err / std::max(1.0, max_abs_v);
}

double OutputBound(DType narrowest) {
  switch (narrowest) {
    case DType::kF16:
      return 2e-3;
    case DType::kBF16:
      return 1.6e-2;
    default:
      return 2e-5;
  }
}

PageTable::PageTable(const std::vector<int64_t>& lq, const std::vector<int64_t>& lk,
                     int64_t block_size, int64_t spare_columns, int64_t spare_pages,
                     int32_t unused, std::mt19937* rng) {
  const int64_t n = static_cast<int64_t>(lk.size());
  cu.push_back(0);
  for (int64_t s = 0; s < n; ++s) {
    cu.push_back(static_cast<int32_t>(cu.back() + lq[s]));
    kv_lens.push_back(static_cast<int32_t>(lk[s]));
    max_blocks = std::max(max_blocks, (lk[s] + block_size - 1) / block_size);
  }
  max_blocks = std::max<int64_t>(max_blocks, 1) + spare_columns;
  total_q = cu.back();
  num_blocks = n * max_blocks + spare_pages;
  std::vector<int32_t> pages(static_cast<size_t>(num_blocks));
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), *rng);
  table.assign(static_cast<size_t>(n * max_blocks), unused);
  size_t next = 0;
  for (int64_t s = 0; s < n; ++s) {
    for (int64_t b = 0; b * block_size < lk[s]; ++b) table[s * max_blocks + b] = pages[next++];
  }
}

PagedKvCache PageTable::Cache(const TensorView& k, const TensorView& v) const {
  PagedKvCache cache;
  cache.k = k;
  cache.v = v;
  cache.block_table = table.data();
  cache.max_blocks_per_seq = max_blocks;
  cache.kv_lens = kv_lens.data();
  return cache;
}

simdattn_tensor ToC(const TensorView& v) {
  simdattn_tensor t;
  std::memset(&t, 0, sizeof(t));
  t.data = const_cast<void*>(v.data);
  t.dtype = static_cast<int32_t>(v.dtype);
  for (int i = 0; i < 4; ++i) {
    t.shape[i] = v.shape[i];
    t.strides[i] = v.strides[i];
  }
  return t;
}

}  // namespace test
}  // namespace simdattn
