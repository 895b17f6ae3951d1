// simdattn_bench's entries of the multi-head attention layer (issue #41):
//
//   gemm/{simdattn,onednn}/f32/M<m>_N<n>_K<k>/threads:<n>       gemm_bench.cc
//   mha/{simdattn,onednn}/f32/<shape>/<mask>/threads:<n>        mha_bench.cc

#ifndef SIMDATTN_BENCH_MHA_ENTRIES_H_
#define SIMDATTN_BENCH_MHA_ENTRIES_H_

#include "bench/entries.h"

namespace simdattn {
namespace bench {

void RegisterGemmEntries(const BenchConfig& config);
void RegisterMhaEntries(const BenchConfig& config);

}  // namespace bench
}  // namespace simdattn

#endif  // SIMDATTN_BENCH_MHA_ENTRIES_H_
