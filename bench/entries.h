// simdattn_bench's entry families, each registered from a table of shapes at
// every thread count the run asks for (--threads):
//
//   roofline/{fma_f32,dot_bf16,read_bw}/threads:<n>     roofline_entries.cc
//   attention/{simdattn,onednn,naive}/<prefill>/...     prefill_entries.cc
//   attention/simdattn/f32/<shape>/<option>/...         prefill_entries.cc
//   attention/{simdattn,onednn}/<decode>/...            decode_entries.cc
//   attention/simdattn/qf32kv{i8,q80,e4m3}/...          quant_entries.cc
//   paired/...                                          paired_entries.cc
//   serving/{paged,dense,per_sequence}/...              serving_entries.cc
//
// --headline registers only the headline comparison: the rooflines, f32 and
// bf16 prefill of the headline shape and decode of the headline cache, each
// for simdattn and oneDNN.

#ifndef SIMDATTN_BENCH_ENTRIES_H_
#define SIMDATTN_BENCH_ENTRIES_H_

#include <cstdint>
#include <vector>

#include "bench/common.h"

namespace simdattn {
namespace bench {

struct BenchConfig {
  std::vector<int> threads = {1, 2};  // ascending, no duplicates
  bool headline = false;
};

// Prefill shapes, each run without and with a causal mask. The headline
// comparison runs the one marked headline.
struct PrefillShape {
  Shape shape;
  bool headline;
};
const std::vector<PrefillShape>& PrefillShapes();

// The option entries' shapes: prefill with each option, decode (f16 KV) with
// each option, and a 512-key sliding window against full causal.
constexpr Shape kOptionShape{1, 8, 8, 2048, 2048, 128};
constexpr Shape kOptionDecodeShape{1, 32, 8, 1, 16384, 128};
constexpr Shape kWindowShape{1, 8, 8, 8192, 8192, 128};
constexpr int64_t kWindowLeft = 511;
// Causal attention on kWindowShape, with the 512-key window or without.
Variant WindowShapeVariant(bool window);

// Decode shapes (Lq 1); the headline comparison runs the one marked headline.
struct DecodeShape {
  Shape shape;
  bool headline;
};
const std::vector<DecodeShape>& DecodeShapes();

// Whether a paired entry may set simdattn against oneDNN at this thread
// count: oneDNN's OpenMP workers spin after its call, so both sets of
// threads need cores of their own. With 2 threads on 2 cores simdattn took
// 6.9 ms after oneDNN against 5.1 after itself (B4 H16 L256 D64).
inline bool PairableWithOneDnn(int threads) { return 2 * threads <= HardwareThreads(); }

void RegisterRooflineEntries(const BenchConfig& config);
void RegisterPrefillEntries(const BenchConfig& config);
void RegisterOptionEntries(const BenchConfig& config);
void RegisterDecodeEntries(const BenchConfig& config);
void RegisterQuantEntries(const BenchConfig& config);
void RegisterPairedEntries(const BenchConfig& config);
void RegisterServingEntries(const BenchConfig& config);

// Checks simdattn and oneDNN against the double-precision reference on the
// prefill shapes the run registers, printing one line each.
bool VerifyPrefill(const BenchConfig& config);

}  // namespace bench
}  // namespace simdattn

#endif  // SIMDATTN_BENCH_ENTRIES_H_
