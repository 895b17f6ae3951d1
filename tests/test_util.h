// Shared test helpers: random tensors in any layout, comparison against the
// double-precision reference, the error bounds of SEMANTICS.md, and the record
// of which targets actually ran.

#ifndef SIMDATTN_TESTS_TEST_UTIL_H_
#define SIMDATTN_TESTS_TEST_UTIL_H_

#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "lib/cache_line_allocator.h"
#include "simdattn/attention.h"
#include "simdattn/serving.h"
#include "simdattn/simdattn.h"

namespace simdattn {
namespace test {

// The block table of a paged cache for sequences of lq[s] queries and lk[s]
// keys, pages of block_size tokens: the pages the sequences use are handed
// out in a random order (from rng) among num_blocks, spare_pages of which no
// sequence uses; table entries past a sequence's pages hold `unused` (a
// page out of range, which must never be read), and spare_columns columns
// past the longest sequence's pages are unused in every row.
struct PageTable {
  std::vector<int32_t> table, kv_lens, cu;  // cu: cu_seqlens_q
  int64_t max_blocks = 0, num_blocks = 0, total_q = 0;
  PageTable() = default;
  PageTable(const std::vector<int64_t>& lq, const std::vector<int64_t>& lk,
            int64_t block_size, int64_t spare_columns, int64_t spare_pages,
            int32_t unused, std::mt19937* rng);
  // The cache of K and V pages [num_blocks, Hkv, block_size, D] over it.
  PagedKvCache Cache(const TensorView& k, const TensorView& v) const;
};

// The C API's tensor for a C++ view (the same data, shape and strides).
simdattn_tensor ToC(const TensorView& v);

// True when SIMDATTN_TEST_QUICK is set (under qemu): sweeps use fewer shapes.
bool QuickMode();

// Whether this run's AVX3_AMX entry is the tile emulator (test_main.cc).
bool AmxEmulated();
void SetAmxEmulated(bool on);

// The targets the correctness tests run on: AvailableTargets(), or when
// SIMDATTN_TEST_TARGETS is set (a space-separated list, as each qemu CPU model
// in tests/CMakeLists.txt sets it), only the available ones it names. Names it
// gives that are not available are reported by test_main as not run.
std::vector<std::string> TestTargets();

// The space-separated target names in environment variable `name` into
// *names; false (and *names untouched) when it is not set.
bool TargetsFromEnv(const char* name, std::set<std::string>* names);

// Called with RunInfo::target after every successful fast-path call.
void RecordTargetRun(const std::string& target);
std::set<std::string> TargetsRun();

// The target a call without a cap should run, worked out independently of
// the library: the first available one, except AVX3_BF16 on a CPU whose
// /proc/cpuinfo vendor is not AuthenticAMD (it runs there only when named).
std::string ExpectedDefaultTarget();

// Sets the target cap for its lifetime (SetMaxTarget), restoring "no cap".
class ScopedTarget {
 public:
  explicit ScopedTarget(const std::string& name);
  ~ScopedTarget();
};

enum class Layout { kBHSD, kBSHD };

// Owns the bytes of one 4-D tensor in a given dtype, layout and padding.
// Logical shape is [b, h, s, d]; `pad` extra elements are added to the row
// stride (d) and `pad` rows to the head/sequence strides so that no view is
// dense.
struct Tensor {
  // Starts on a cache line (as an engine's buffers do): the data is aligned
  // unless `offset` moves it.
  std::vector<uint8_t, CacheLineAllocator<uint8_t>> bytes;
  DType dtype = DType::kF32;
  int64_t shape[4] = {0, 0, 0, 0};
  int64_t strides[4] = {0, 0, 0, 0};
  int64_t offset = 0;  // first element index inside bytes (misaligned base)

  Tensor() = default;
  Tensor(DType dtype, int64_t b, int64_t h, int64_t s, int64_t d,
         Layout layout = Layout::kBHSD, int64_t pad = 0, int64_t offset = 0);

  int64_t Index(int64_t i0, int64_t i1, int64_t i2, int64_t i3) const;
  float Get(int64_t i0, int64_t i1, int64_t i2, int64_t i3) const;
  // Stores x rounded to the dtype.
  void Set(int64_t i0, int64_t i1, int64_t i2, int64_t i3, float x);
  // Fills every logical element with uniform values in [lo, hi).
  void FillUniform(std::mt19937* rng, float lo, float hi);
  // Fills the padding (non-logical bytes) with a sentinel pattern.
  void FillBytes(uint8_t value);

  TensorView View() const;
  MutableTensorView MutableView();
};

// max|O - O_ref| / max(1, max|V|) over all logical elements of o.
double MaxError(const Tensor& o, const std::vector<double>& o_ref,
                double max_abs_v);
double MaxAbs(const Tensor& t);

// Each logical element of o (in o_ref's order) is NaN where o_ref is NaN,
// and elsewhere within `bound` of it (absolute).
void ExpectNanWhereReferenceIs(const Tensor& o, const std::vector<double>& o_ref,
                               double bound);

// SEMANTICS.md bounds for the narrowest storage type.
double OutputBound(DType narrowest);

// SEMANTICS.md's bounds on the absolute LSE error: Q and K both f32, or
// either of them f16 or bf16.
constexpr double kLseBound = 1e-4;
constexpr double kLseBound16 = 1e-2;

}  // namespace test
}  // namespace simdattn

#endif  // SIMDATTN_TESTS_TEST_UTIL_H_
