// Machine limits for simdattn_bench's roofline entries: a register-resident
// FMA loop and a streaming read, on the widest vectors the CPU has.

#ifndef SIMDATTN_BENCH_ROOFLINE_H_
#define SIMDATTN_BENCH_ROOFLINE_H_

#include <cstddef>
#include <cstdint>

namespace simdattn {
namespace bench {

// Runs `iterations` rounds of 16 independent vector FMAs; returns the f32
// flops done (2 per lane per FMA). *sink receives a value that depends on
// every accumulator so the loop cannot be removed.
double FmaPeakLoop(int64_t iterations, float* sink);

// Runs `iterations` rounds of 16 independent vdpbf16ps (512-bit, counted as
// 64 flops each); only on a CPU with AVX512_BF16 (the AVX3_BF16 target).
// Returns the flops, 0 where this compiler cannot build it.
double DotBf16PeakLoop(int64_t iterations, float* sink);

// Sums n floats (n a multiple of 64) with independent accumulators; returns
// the sum so the reads cannot be removed.
float StreamRead(const float* data, size_t n);

// The arithmetic that an int8 decode with 4 query rows per KV head cannot
// avoid, over `keys` (a multiple of 4) rows of `dim` values (a multiple of
// 16) of K and of V: every K and V vector loaded and widened to f32 once,
// then per key and row one FMA per vector for Q·K (into accumulators, never
// reduced) and one for P·V (into the 4 output rows o, in L1). No softmax,
// score reductions or scales, so it is a lower bound on the time of that
// decode. q and o hold 4 rows of dim floats; K and V rows 64 keys ahead are
// prefetched, as the fused decode does. Returns a value of the accumulators.
float Int8DecodeFloor(const float* q, const int8_t* k, const int8_t* v, int64_t keys,
                      int64_t dim, float* o);

// Name of the Highway target these loops run on.
const char* RooflineTarget();

}  // namespace bench
}  // namespace simdattn

#endif  // SIMDATTN_BENCH_ROOFLINE_H_
