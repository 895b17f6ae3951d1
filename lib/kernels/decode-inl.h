// Decode micro-path: the few query rows of a KV group (its G heads, times
// Lq for speculative decoding) against a tile of keys, vectorized along the
// head dimension.
// Per-target code (include from a foreach_target translation unit).

#if defined(SIMDATTN_LIB_KERNELS_DECODE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SIMDATTN_LIB_KERNELS_DECODE_INL_H_
#undef SIMDATTN_LIB_KERNELS_DECODE_INL_H_
#else
#define SIMDATTN_LIB_KERNELS_DECODE_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "hwy/highway.h"
#include "lib/dtype.h"
#include "lib/kernels/convert-inl.h"
#include "lib/kernels/exp-inl.h"
#include "lib/kernels/online_softmax-inl.h"

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Why a separate path: the tiled kernel puts queries along the lanes, and a
// decode group has only G of them (4 of 16 lanes for 32/8 heads), so it
// computes mostly padding. Here lanes run along the head dimension, and the
// cost grows with the rows rather than the vectors they fill.
//   Q·K: 4 keys x 4 rows of dot products share their loads (each K vector
//        feeds 4 rows, each Q vector 4 keys): 16 accumulators.
//   P·V: 4 rows x 4 vectors of the output stay in registers across the whole
//        tile (16 accumulators); each V vector feeds the 4 rows.
// 16-bit K/V with at most 4 rows take DecodeFused instead (end of this
// file): the same Q·K steps, then for each group of 4 keys at once its
// softmax step and its P·V products, with the output rows in L1.
// Contract: q: rows of dk floats (pre-scaled), row g at q + g * dk; k, v:
// nk rows (stored as KvElem<kKv>) with strides k_row, v_row; s: scratch of 4 * nk floats.
// m, l, o (o row g at o + g * dv) carry the online softmax of
// online_softmax-inl.h across tiles (-inf max while nothing is seen).

// K/V elements as stored: kKv 0 = f32, 1 = f16, 2 = bf16 (the Storage
// codes), widened to f32 in registers as they are loaded. f16 is only used
// this way where the target converts it in hardware (kKvF16InRegisters).
template <int kKv>
using KvElem = std::conditional_t<kKv == 0, float, uint16_t>;

constexpr bool kKvF16InRegisters = SIMDATTN_HW_F16 != 0;

template <int kKv, class D>
HWY_INLINE hn::VFromD<D> LoadKv(D d, const KvElem<kKv>* HWY_RESTRICT p) {
  if constexpr (kKv == 0) {
    return hn::LoadU(d, p);
  } else if constexpr (kKv == 1) {
#if SIMDATTN_HW_F16
    const hn::Rebind<hwy::float16_t, D> dh;
    return hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
#else
    (void)p;
    return hn::Zero(d);  // not used: these targets widen f16 tiles first
#endif
  } else {
    const hn::Rebind<hwy::bfloat16_t, D> dbf;
    return hn::PromoteTo(d, hn::LoadU(dbf, reinterpret_cast<const hwy::bfloat16_t*>(p)));
  }
}

// Software prefetch a fixed distance ahead in each stream: as the dot
// products read a line of K row j, the same line of row j + k_ahead is
// prefetched; as the first pass of the P·V products reads V row j, all of
// row j + v_ahead (for the passes after it too). About kPrefetchBytes
// ahead, past the tile and the chunk wherever the rows exist (the next task
// streams on from there). Without software prefetch the hardware
// prefetchers alone reached about a quarter of the streaming bandwidth on
// this tile path (DecodeFused, which reads K and V side by side as two
// sequential streams, reads faster without it).
// It replaced spreading the next whole tile's lines over the current
// tile's steps into L2 (hint T1), which was tuned on an Intel VM. On the
// 2-core Zen 5 (1 thread, D128, 4 rows, Lk 16384 from memory on 2 MiB
// pages, medians of 30 calls, the two builds' processes alternating):
// bf16 13.9 -> 17.6 GB/s, f16 16.9 -> 18.5, f32 16.7 -> 17.1; distances
// of 1 to 16 KiB and hints T0, T1 and NTA were compared in one process
// there: 4-8 KiB with NTA (into L1, not kept in L2) best, T0 within 3%,
// T1 5-10% slower. In simdattn_bench (two runs before and after, % of
// the run's read_bw, Lk 4096-65536) the 16-bit entries moved -1 to +12
// points with 1 thread and +1 to +10 with 2, f32 -4 to +5 and -2 to +7.
// Later, with chunks of 2048 keys (1 thread, Lk 16384, one process
// alternating, medians of 40-60 calls): without any software prefetch f16
// / bf16 / f32 read 10.9 / 10.4 / 12.2 GB/s against 17.7 / 17.6 / 17.4
// with it; prefetching only every other K line, or no V rows, 27-31%
// slower; prefetching a whole tile ahead instead (the tile's V during its
// Q·K, the next tile's K during its P·V) 1-2% slower with 1 and 2 threads.
constexpr int64_t kPrefetchBytes = 8192;

// For f32 K/V (kKv 0), the same lines are also prefetched into L2 (hint T1)
// about kFarPrefetchBytes ahead, so that the prefetches into L1 find them
// there.
// On the Zen 5, in one process alternating with the plain form (B1 Hq32
// Hkv8 D128, K/V from memory, medians of 30 calls): 1 thread +4% (Lk
// 16384) and +11% (Lk 65536), 2 threads +4% and +7%; 64 KiB ahead +5% and
// +7% with 1 thread; an earlier set of 1-thread runs gave +5%, +11%, +15%
// and -7%. With f16 and bf16 K/V it measured -9% to -18% in six runs, so
// those take only the prefetches into L1.
constexpr int64_t kFarPrefetchBytes = 32768;

// Row of the tile's key j, counted from the tile's first. kRuns = 1: the
// tile is one run of consecutive keys (row j). kRuns > 1: the tile
// interleaves kRuns runs of consecutive keys, run_rows rows apart: key j is
// row j / kRuns of run j % kRuns. The hardware prefetchers follow several
// runs read side by side better than one: a loop reading 4 sequences at
// once with the dot products' arithmetic read 39-43 GB/s on the Zen 5 with
// 1 thread, one sequence 29-33, 4 adjacent rows at a time (as tiles of
// consecutive keys do) 19-25 (synthetic loops, 4 FMAs per vector read).
template <int kRuns>
HWY_INLINE int64_t RunRow(int64_t j, int64_t run_rows) {
  if constexpr (kRuns == 1) {
    (void)run_rows;
    return j;
  } else {
    return (j % kRuns) * run_rows + j / kRuns;
  }
}

// Key j's row at p (row: elements between rows).
template <int kRuns, class T>
HWY_INLINE const T* KeyAt(const T* HWY_RESTRICT p, int64_t j, int64_t row,
                          int64_t run_rows) {
  return p + RunRow<kRuns>(j, run_rows) * row;
}

// With the tile's keys in runs (kRuns > 1, see KeyAt; only f32 K/V), each
// run is its own stream of K rows and of V rows, prefetched this far ahead
// along it: kRunPrefetchBytes into L1, kRunFarPrefetchBytes into L2. On the
// Zen 5 (1 thread, 4 runs, D128, Lk 16384 from memory, one process
// alternating with tiles of consecutive keys at 18.4-18.8 GB/s): 512 B /
// 1 KiB into L1 with 2-8 KiB into L2 22.8-24.4 GB/s, without the L2
// prefetches 20.5-22.6, 4 KiB into L1 with 16 KiB into L2 17.2 (16.5 there
// with consecutive keys).
constexpr int64_t kRunPrefetchBytes = 1024;
constexpr int64_t kRunFarPrefetchBytes = 4096;

// The prefetches of K/V elements stored as KvElem<kKv>, for a tile of
// kRuns runs (KeyAt).
template <int kKv, int kRuns = 1>
class RowPrefetch {
 public:
  RowPrefetch() = default;  // prefetches nothing

  // K and V rows from the tile's first: base pointers and row strides in
  // bytes, V's row length in bytes, and how many rows exist (`rows`; 0:
  // none is prefetched); with kRuns > 1, the rows between runs.
  RowPrefetch(const void* k, int64_t k_stride, const void* v, int64_t v_stride,
              int64_t v_bytes, int64_t rows, int64_t run_rows = 0)
      : k_(static_cast<const char*>(k)),
        v_(static_cast<const char*>(v)),
        k_stride_(k_stride),
        v_stride_(v_stride),
        v_bytes_(v_bytes),
        rows_(rows),
        run_rows_(run_rows),
        k_ahead_(Rows(kNear, k_stride)),
        v_ahead_(Rows(kNear, v_stride)),
        k_far_(kFar ? Rows(kFarBytes, k_stride) : 0),
        v_far_(kFar ? Rows(kFarBytes, v_stride) : 0) {}

  // The lines of bytes [offset, offset + bytes) of K row `row` + k_ahead
  // (and of row + k_far into L2); rows counted along the run.
  HWY_INLINE void K(int64_t row, int64_t offset, int64_t bytes) const {
    const int64_t r = Ahead(row, k_ahead_);
    if (k_ == nullptr || r >= rows_) return;
    const char* p = k_ + r * k_stride_ + offset;
    for (int64_t b = 0; b < bytes; b += 64) Line(p + b);
    if constexpr (kFar) {
      const int64_t f = Ahead(row, k_far_);
      if (f >= rows_) return;
      const char* pf = k_ + f * k_stride_ + offset;
      for (int64_t b = 0; b < bytes; b += 64) Far(pf + b);
    }
  }

  // All lines of V row `row` + v_ahead (and of row + v_far into L2).
  HWY_INLINE void V(int64_t row) const {
    const int64_t r = Ahead(row, v_ahead_);
    if (v_ == nullptr || r >= rows_) return;
    const char* p = v_ + r * v_stride_;
    for (int64_t b = 0; b < v_bytes_; b += 64) Line(p + b);
    if constexpr (kFar) {
      const int64_t f = Ahead(row, v_far_);
      if (f >= rows_) return;
      const char* pf = v_ + f * v_stride_;
      for (int64_t b = 0; b < v_bytes_; b += 64) Far(pf + b);
    }
  }

 private:
  static constexpr bool kFar = kKv == 0;
  static constexpr int64_t kNear = kRuns == 1 ? kPrefetchBytes : kRunPrefetchBytes;
  static constexpr int64_t kFarBytes =
      kRuns == 1 ? kFarPrefetchBytes : kRunFarPrefetchBytes;
  // Rows of `stride` bytes in about `bytes` (at least 1).
  static int64_t Rows(int64_t bytes, int64_t stride) {
    return std::max<int64_t>(1, bytes / std::max<int64_t>(1, stride));
  }
  // The row `ahead` rows past the tile's key j along its run.
  HWY_INLINE int64_t Ahead(int64_t j, int64_t ahead) const {
    return RunRow<kRuns>(j, run_rows_) + ahead;
  }
  static HWY_INLINE void Line(const char* p) { __builtin_prefetch(p, 0, 0); }
  static HWY_INLINE void Far(const char* p) { __builtin_prefetch(p, 0, 2); }

  const char* k_ = nullptr;
  const char* v_ = nullptr;
  int64_t k_stride_ = 0, v_stride_ = 0, v_bytes_ = 0, rows_ = 0;
  int64_t run_rows_ = 0;  // only with kRuns > 1
  int64_t k_ahead_ = 1, v_ahead_ = 1;
  int64_t k_far_ = 0, v_far_ = 0;  // only with kFar
};

// A compiler barrier for memory: values just stored are read back from
// memory after it. DecodeFused's 16 weights are stored and then broadcast
// one by one; without it GCC broadcasts them out of the stored vector with
// a lane permute each (vpermd), on the shuffle ports its score reductions
// need, instead of a broadcast load. With it the fused loop ran 7-11%
// faster with K/V in L2 (f16, bf16, 1 thread, one process alternating) and
// -3% to +14% from memory (Lk 4096-65536, 1 and 2 threads, a plain read
// at 16-30 GB/s with 1 thread). Only where measured (AVX-512).
HWY_INLINE void ReloadFromMemory() {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 && \
    (defined(__GNUC__) || defined(__clang__))
  asm volatile("" ::: "memory");
#endif
}

// Keeps v in a register. GCC otherwise folds a vector load that several FMAs
// use into each of them as a memory operand: the f32 decode loaded each K,
// Q and V vector 4 times and was bound by the load ports. Only where there
// are 32 vector registers (the 16 accumulators and the shared operands fit).
template <class V>
HWY_INLINE void InRegister(V& v) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 && \
    (defined(__GNUC__) || defined(__clang__))
  asm("" : "+v"(v.raw));
#else
  (void)v;
#endif
}

HWY_INLINE uint32_t BitCastScalar(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
}

template <int kKv>
HWY_INLINE float KvToF32(KvElem<kKv> x) {
  if constexpr (kKv == 0) {
    return x;
  } else if constexpr (kKv == 1) {
    return F16ToF32(x);
  } else {
    return BF16ToF32(x);
  }
}

// The dot products of 4 keys for one row end as 4 vectors of partial sums.
// Reducing each with SumOfLanes costs a full shuffle tree per key; instead
// the 4 are reduced together: interleaving within 128-bit blocks leaves each
// block holding [k0, k1, k2, k3] partial sums, and adding the blocks gives
// the 4 sums in one 128-bit vector (2 + 2 + fold steps for all 4 keys).
// Highway's InterleaveLower/Upper work per 128-bit block on every target;
// SVE keeps SumOfLanes (its fold over a scalable length is not static, and
// it has a native add reduction). SCALAR has 1 lane.
#undef SIMDATTN_DECODE_BLOCK_REDUCE
#undef SIMDATTN_HAVE_DECODE_FUSED
#if HWY_TARGET != HWY_SCALAR && \
    (HWY_TARGET & (HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128)) == 0
#define SIMDATTN_DECODE_BLOCK_REDUCE 1
#else
#define SIMDATTN_DECODE_BLOCK_REDUCE 0
#endif

#if SIMDATTN_DECODE_BLOCK_REDUCE
// Adds the 128-bit blocks of v: a vector of 4 lanes.
template <class D, class V>
HWY_INLINE auto FoldBlocks(D d, V v) {
  if constexpr (hn::MaxLanes(d) > 4) {
    const hn::Half<D> dh;
    return FoldBlocks(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  } else {
    return v;
  }
}

// sum(a0), sum(a1), sum(a2), sum(a3) as a vector of 4 lanes.
template <class D, class V>
HWY_INLINE auto Sums4(D d, V a0, V a1, V a2, V a3) {
  const hn::Repartition<uint64_t, D> d64;
  // [a0 (0+2), a1 (0+2), a0 (1+3), a1 (1+3)] per block, lanes 0..3.
  const V t01 = hn::Add(hn::InterleaveLower(d, a0, a1), hn::InterleaveUpper(d, a0, a1));
  const V t23 = hn::Add(hn::InterleaveLower(d, a2, a3), hn::InterleaveUpper(d, a2, a3));
  const auto w01 = hn::BitCast(d64, t01), w23 = hn::BitCast(d64, t23);
  const V sums = hn::Add(hn::BitCast(d, hn::InterleaveLower(d64, w01, w23)),
                         hn::BitCast(d, hn::InterleaveUpper(d64, w01, w23)));
  return FoldBlocks(d, sums);
}

// Stores sum(a0), sum(a1), sum(a2), sum(a3) to out[0..3].
template <class D, class V>
HWY_INLINE void StoreSums4(D d, V a0, V a1, V a2, V a3, float* HWY_RESTRICT out) {
  const auto folded = Sums4(d, a0, a1, a2, a3);
  hn::StoreU(folded, hn::DFromV<decltype(folded)>(), out);
}
#endif

// The dot products of 4 keys (rows k0..k3) with rows [0, kRows) of q over
// the head dimension's whole vectors, into accumulators aRC (row R, key C),
// and the prefetches pf.K(j + C, ...) of the lines read. Shared by
// DecodeScores and DecodeFused; SIMDATTN_Q_AT(R) is where row R's vector
// at step i is.
#define SIMDATTN_DOT_ROW(R)                                   \
  if (R < kRows) {                                            \
    auto y = hn::LoadU(d, SIMDATTN_Q_AT(R));                  \
    InRegister(y);                                            \
    a##R##0 = hn::MulAdd(y, x0, a##R##0);                     \
    a##R##1 = hn::MulAdd(y, x1, a##R##1);                     \
    a##R##2 = hn::MulAdd(y, x2, a##R##2);                     \
    a##R##3 = hn::MulAdd(y, x3, a##R##3);                     \
  }
#define SIMDATTN_DOT_STEPS(j)                                              \
  auto a00 = hn::Zero(d), a01 = a00, a02 = a00, a03 = a00;                 \
  auto a10 = a00, a11 = a00, a12 = a00, a13 = a00;                         \
  auto a20 = a00, a21 = a00, a22 = a00, a23 = a00;                         \
  auto a30 = a00, a31 = a00, a32 = a00, a33 = a00;                         \
  SIMDATTN_DOT_UNROLL                                                      \
  for (int64_t i = 0; i < dk_vec; i += N) {                                \
    /* Each line once: a step reads N * kElem bytes of a row (a power of  \
       two), half a line for 16-bit K on AVX-512. */                       \
    if ((i * kElem) % 64 == 0) {                                           \
      const int64_t bytes = std::max<int64_t>(64, N * kElem);              \
      pf.K(j, i * kElem, bytes);                                           \
      pf.K(j + 1, i * kElem, bytes);                                       \
      pf.K(j + 2, i * kElem, bytes);                                       \
      pf.K(j + 3, i * kElem, bytes);                                       \
    }                                                                      \
    auto x0 = LoadKv<kKv>(d, k0 + i), x1 = LoadKv<kKv>(d, k1 + i);         \
    auto x2 = LoadKv<kKv>(d, k2 + i), x3 = LoadKv<kKv>(d, k3 + i);         \
    InRegister(x0), InRegister(x1), InRegister(x2), InRegister(x3);        \
    SIMDATTN_DOT_ROW(0) SIMDATTN_DOT_ROW(1) SIMDATTN_DOT_ROW(2)            \
    SIMDATTN_DOT_ROW(3)                                                    \
  }

// Scores of up to 4 rows (kRows) against the tile's keys into s[r * nk + j].
// `pf` prefetches K rows ahead of those read.
// The loads go across 4 rows, not along one row in address order: a
// synthetic loop without arithmetic read 16-bit K and V 27-33% faster in
// address order (no software prefetch) than in this kernel's order (with
// it), but in this kernel reading each K row whole (the 4 Q vectors of a
// step loaded again per key) cost 12% (f16, bf16, 1 thread, Lk 16384, one
// process alternating), and reading V rows whole (2 rows per pass) 4-7%.
template <int kRows, int kKv, int kRuns, class D, class Prefetch>
HWY_INLINE void DecodeScores(D d, const float* HWY_RESTRICT q, int64_t dk,
                             const KvElem<kKv>* HWY_RESTRICT k, int64_t k_row,
                             int64_t run_rows, int64_t nk, const Prefetch& pf,
                             float* HWY_RESTRICT s) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t dk_vec = dk / N * N;
  constexpr int64_t kElem = static_cast<int64_t>(sizeof(KvElem<kKv>));
  int64_t j = 0;
  for (; j + 4 <= nk; j += 4) {
    const KvElem<kKv>* k0 = KeyAt<kRuns>(k, j, k_row, run_rows);
    const KvElem<kKv>* k1 = KeyAt<kRuns>(k, j + 1, k_row, run_rows);
    const KvElem<kKv>* k2 = KeyAt<kRuns>(k, j + 2, k_row, run_rows);
    const KvElem<kKv>* k3 = KeyAt<kRuns>(k, j + 3, k_row, run_rows);
#define SIMDATTN_Q_AT(R) (q + R * dk + i)
#define SIMDATTN_DOT_UNROLL
    SIMDATTN_DOT_STEPS(j)
#undef SIMDATTN_DOT_UNROLL
#undef SIMDATTN_Q_AT
#if SIMDATTN_DECODE_BLOCK_REDUCE
#define SIMDATTN_SUM_DOTS(R) \
  StoreSums4(d, a##R##0, a##R##1, a##R##2, a##R##3, s + R * nk + j);
#else
#define SIMDATTN_SUM_DOTS(R)                                      \
  s[R * nk + j] = hn::GetLane(hn::SumOfLanes(d, a##R##0));        \
  s[R * nk + j + 1] = hn::GetLane(hn::SumOfLanes(d, a##R##1));    \
  s[R * nk + j + 2] = hn::GetLane(hn::SumOfLanes(d, a##R##2));    \
  s[R * nk + j + 3] = hn::GetLane(hn::SumOfLanes(d, a##R##3));
#endif
#define SIMDATTN_STORE_DOTS(R)                                 \
  if (R < kRows) {                                             \
    SIMDATTN_SUM_DOTS(R)                                       \
    const float* qr = q + R * dk;                              \
    for (int64_t i = dk_vec; i < dk; ++i) {                    \
      s[R * nk + j] += qr[i] * KvToF32<kKv>(k0[i]);            \
      s[R * nk + j + 1] += qr[i] * KvToF32<kKv>(k1[i]);        \
      s[R * nk + j + 2] += qr[i] * KvToF32<kKv>(k2[i]);        \
      s[R * nk + j + 3] += qr[i] * KvToF32<kKv>(k3[i]);        \
    }                                                          \
  }
    SIMDATTN_STORE_DOTS(0) SIMDATTN_STORE_DOTS(1) SIMDATTN_STORE_DOTS(2)
    SIMDATTN_STORE_DOTS(3)
#undef SIMDATTN_STORE_DOTS
#undef SIMDATTN_SUM_DOTS
  }
  for (; j < nk; ++j) {  // leftover keys: one at a time
    const KvElem<kKv>* kj = KeyAt<kRuns>(k, j, k_row, run_rows);
    for (int r = 0; r < kRows; ++r) {
      auto acc = hn::Zero(d);
      int64_t i = 0;
      for (; i < dk_vec; i += N) {
        acc = hn::MulAdd(hn::LoadU(d, q + r * dk + i), LoadKv<kKv>(d, kj + i), acc);
      }
      float t = hn::GetLane(hn::SumOfLanes(d, acc));
      for (; i < dk; ++i) t += q[r * dk + i] * KvToF32<kKv>(kj[i]);
      s[r * nk + j] = t;
    }
  }
}

// Whether 16 accumulators hold only finite values (x * 0 is +-0 for finite
// x and NaN for Inf/NaN).
template <class D, class V>
HWY_INLINE bool AllFinite16(D d, V x0, V x1, V x2, V x3, V x4, V x5, V x6, V x7,
                            V x8, V x9, V x10, V x11, V x12, V x13, V x14, V x15) {
  const hn::RebindToUnsigned<D> du;
  const V z = hn::Zero(d);
  const auto t0 = hn::Or(hn::Or(hn::Mul(x0, z), hn::Mul(x1, z)),
                         hn::Or(hn::Mul(x2, z), hn::Mul(x3, z)));
  const auto t1 = hn::Or(hn::Or(hn::Mul(x4, z), hn::Mul(x5, z)),
                         hn::Or(hn::Mul(x6, z), hn::Mul(x7, z)));
  const auto t2 = hn::Or(hn::Or(hn::Mul(x8, z), hn::Mul(x9, z)),
                         hn::Or(hn::Mul(x10, z), hn::Mul(x11, z)));
  const auto t3 = hn::Or(hn::Or(hn::Mul(x12, z), hn::Mul(x13, z)),
                         hn::Or(hn::Mul(x14, z), hn::Mul(x15, z)));
  const auto all = hn::BitCast(du, hn::Or(hn::Or(t0, t1), hn::Or(t2, t3)));
  const auto magnitude = hn::And(all, hn::Set(du, 0x7FFFFFFFu));
  return hn::AllTrue(du, hn::Eq(magnitude, hn::Zero(du)));
}

// The 4N elements at p as 4 vectors of f32.
template <int kKv, class D, class V>
HWY_INLINE void LoadKv4(D d, const KvElem<kKv>* HWY_RESTRICT p, V& x0, V& x1,
                        V& x2, V& x3) {
  const size_t N = hn::Lanes(d);
  x0 = LoadKv<kKv>(d, p);
  x1 = LoadKv<kKv>(d, p + N);
  x2 = LoadKv<kKv>(d, p + 2 * N);
  x3 = LoadKv<kKv>(d, p + 3 * N);
}

#define SIMDATTN_LOAD_O(R)                                        \
  if (R < kRows) {                                                \
    const auto c = hn::Set(d, scale[R]);                          \
    a##R##0 = hn::Mul(c, hn::LoadU(d, o + R * dv + e));           \
    a##R##1 = hn::Mul(c, hn::LoadU(d, o + R * dv + e + N));       \
    a##R##2 = hn::Mul(c, hn::LoadU(d, o + R * dv + e + 2 * N));   \
    a##R##3 = hn::Mul(c, hn::LoadU(d, o + R * dv + e + 3 * N));   \
  }
#define SIMDATTN_PV_ROW(R, GUARD)                                      \
  if (R < kRows && (!GUARD || BitCastScalar(p[R * nk + j]) != 0)) {    \
    auto w = hn::Set(d, p[R * nk + j]);                                \
    InRegister(w);                                                     \
    a##R##0 = hn::MulAdd(w, x0, a##R##0);                              \
    a##R##1 = hn::MulAdd(w, x1, a##R##1);                              \
    a##R##2 = hn::MulAdd(w, x2, a##R##2);                              \
    a##R##3 = hn::MulAdd(w, x3, a##R##3);                              \
  }
#define SIMDATTN_PV_KEYS(GUARD)                                                  \
  for (int64_t j = 0; j < nk; ++j) {                                             \
    const KvElem<kKv>* vj = KeyAt<kRuns>(v, j, v_row, run_rows) + e;              \
    if (!GUARD && e == 0) pf.V(j);                                               \
    hn::VFromD<D> x0, x1, x2, x3;                                                \
    LoadKv4<kKv>(d, vj, x0, x1, x2, x3);                                         \
    InRegister(x0), InRegister(x1), InRegister(x2), InRegister(x3);              \
    SIMDATTN_PV_ROW(0, GUARD) SIMDATTN_PV_ROW(1, GUARD)                          \
    SIMDATTN_PV_ROW(2, GUARD) SIMDATTN_PV_ROW(3, GUARD)                          \
  }
#define SIMDATTN_STORE_O(R)                                  \
  if (R < kRows) {                                           \
    hn::StoreU(a##R##0, d, o + R * dv + e);                  \
    hn::StoreU(a##R##1, d, o + R * dv + e + N);              \
    hn::StoreU(a##R##2, d, o + R * dv + e + 2 * N);          \
    hn::StoreU(a##R##3, d, o + R * dv + e + 3 * N);          \
  }
#define SIMDATTN_PV_ACCUMULATORS                   \
  auto a00 = hn::Zero(d), a01 = a00, a02 = a00, a03 = a00; \
  auto a10 = a00, a11 = a00, a12 = a00, a13 = a00; \
  auto a20 = a00, a21 = a00, a22 = a00, a23 = a00; \
  auto a30 = a00, a31 = a00, a32 = a00, a33 = a00;

// DecodeValues for output columns [e, e + 4N) skipping +0.0 weights (hidden
// keys): the rare redo when the plain product was not finite. Out of line,
// so the plain loop's code stays as it is without options.
template <int kRows, int kKv, int kRuns, class D>
HWY_NOINLINE void DecodeValuesGuarded(D d, const float* HWY_RESTRICT p,
                                      int64_t nk,
                                      const KvElem<kKv>* HWY_RESTRICT v,
                                      int64_t v_row, int64_t run_rows, int64_t dv,
                                      int64_t e,
                                      const float* HWY_RESTRICT scale,
                                      float* HWY_RESTRICT o) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const RowPrefetch<kKv, kRuns> pf;  // none on this rare path
  SIMDATTN_PV_ACCUMULATORS
  SIMDATTN_LOAD_O(0) SIMDATTN_LOAD_O(1) SIMDATTN_LOAD_O(2) SIMDATTN_LOAD_O(3)
  SIMDATTN_PV_KEYS(true)
  SIMDATTN_STORE_O(0) SIMDATTN_STORE_O(1) SIMDATTN_STORE_O(2) SIMDATTN_STORE_O(3)
}

// o[r] = scale[r] * o[r] + sum_j p[r * nk + j] * v_j for up to 4 rows; 4
// output vectors per row in registers, then the head-dim tail in scalar code.
// `pf` prefetches V rows ahead of those read (in the first pass).
// kMayHide: some weight may be +0.0 for a hidden key, whose V row must take
// no part (0 * Inf would be NaN). The plain product runs first; only if its
// result is not finite is it redone skipping +0.0 weights (dropped keys are
// -0.0 and still take part, as in the reference).
template <int kRows, int kKv, int kRuns, bool kMayHide, class D>
HWY_INLINE void DecodeValues(D d, const float* HWY_RESTRICT p, int64_t nk,
                             const KvElem<kKv>* HWY_RESTRICT v, int64_t v_row,
                             int64_t run_rows, int64_t dv,
                             const RowPrefetch<kKv, kRuns>& pf,
                             const float* HWY_RESTRICT scale,
                             float* HWY_RESTRICT o) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t e = 0;
  for (; e + 4 * N <= dv; e += 4 * N) {
    SIMDATTN_PV_ACCUMULATORS
    SIMDATTN_LOAD_O(0) SIMDATTN_LOAD_O(1) SIMDATTN_LOAD_O(2) SIMDATTN_LOAD_O(3)
    SIMDATTN_PV_KEYS(false)
    if (kMayHide && !AllFinite16(d, a00, a01, a02, a03, a10, a11, a12, a13, a20,
                                 a21, a22, a23, a30, a31, a32, a33)) {
      DecodeValuesGuarded<kRows, kKv, kRuns>(d, p, nk, v, v_row, run_rows, dv, e,
                                             scale, o);
      continue;
    }
    SIMDATTN_STORE_O(0) SIMDATTN_STORE_O(1) SIMDATTN_STORE_O(2) SIMDATTN_STORE_O(3)
  }
  // Head-dim tail (none when Dv is a multiple of 4 vectors: then the key
  // loop below, with its data-dependent branch, must not run at all).
  for (int r = 0; r < kRows && e < dv; ++r) {
    for (int64_t t = e; t < dv; ++t) o[r * dv + t] *= scale[r];
    for (int64_t j = 0; j < nk; ++j) {
      const float w = p[r * nk + j];
      if (kMayHide && BitCastScalar(w) == 0) continue;  // a hidden key
      const KvElem<kKv>* vj = KeyAt<kRuns>(v, j, v_row, run_rows);
      for (int64_t t = e; t < dv; ++t) o[r * dv + t] += w * KvToF32<kKv>(vj[t]);
    }
  }
}
#undef SIMDATTN_PV_ACCUMULATORS
#undef SIMDATTN_STORE_O
#undef SIMDATTN_PV_KEYS
#undef SIMDATTN_PV_ROW
#undef SIMDATTN_LOAD_O

template <int kKv, int kRuns, bool kMayHide, class D>
HWY_INLINE void DecodeValuesRows(D d, int64_t n, const float* HWY_RESTRICT p,
                                 int64_t nk, const KvElem<kKv>* HWY_RESTRICT v,
                                 int64_t v_row, int64_t run_rows, int64_t dv,
                                 const RowPrefetch<kKv, kRuns>& pf,
                                 const float* HWY_RESTRICT scale,
                                 float* HWY_RESTRICT o) {
  switch (n) {
    case 4:
      DecodeValues<4, kKv, kRuns, kMayHide>(d, p, nk, v, v_row, run_rows, dv, pf,
                                            scale, o);
      break;
    case 3:
      DecodeValues<3, kKv, kRuns, kMayHide>(d, p, nk, v, v_row, run_rows, dv, pf,
                                            scale, o);
      break;
    case 2:
      DecodeValues<2, kKv, kRuns, kMayHide>(d, p, nk, v, v_row, run_rows, dv, pf,
                                            scale, o);
      break;
    default:
      DecodeValues<1, kKv, kRuns, kMayHide>(d, p, nk, v, v_row, run_rows, dv, pf,
                                            scale, o);
      break;
  }
}

// Out of line for f32 K/V: inlined into the task, GCC kept one or two of
// the products' 16 accumulators on the stack (with the runs' pointers, f32
// K/V from memory, 1 thread: 17.1 GB/s inlined, 23.5 out of line). The
// 16-bit loops keep theirs in registers and stay inlined.
template <int kKv, int kRuns, bool kMayHide, class D>
HWY_NOINLINE void DecodeValuesRowsOutOfLine(
    D d, int64_t n, const float* HWY_RESTRICT p, int64_t nk,
    const KvElem<kKv>* HWY_RESTRICT v, int64_t v_row, int64_t run_rows, int64_t dv,
    const RowPrefetch<kKv, kRuns>& pf, const float* HWY_RESTRICT scale,
    float* HWY_RESTRICT o) {
  DecodeValuesRows<kKv, kRuns, kMayHide>(d, n, p, nk, v, v_row, run_rows, dv, pf,
                                         scale, o);
}

template <int kKv, int kRuns, class D>
HWY_INLINE void DecodeScoresRows(D d, int64_t n, const float* HWY_RESTRICT q,
                                 int64_t dk, const KvElem<kKv>* HWY_RESTRICT k,
                                 int64_t k_row, int64_t run_rows, int64_t nk,
                                 const RowPrefetch<kKv, kRuns>& pf,
                                 float* HWY_RESTRICT s) {
  switch (n) {
    case 4: DecodeScores<4, kKv, kRuns>(d, q, dk, k, k_row, run_rows, nk, pf, s); break;
    case 3: DecodeScores<3, kKv, kRuns>(d, q, dk, k, k_row, run_rows, nk, pf, s); break;
    case 2: DecodeScores<2, kKv, kRuns>(d, q, dk, k, k_row, run_rows, nk, pf, s); break;
    default: DecodeScores<1, kKv, kRuns>(d, q, dk, k, k_row, run_rows, nk, pf, s); break;
  }
}

template <int kKv, int kRuns, class D>
HWY_NOINLINE void DecodeScoresRowsOutOfLine(
    D d, int64_t n, const float* HWY_RESTRICT q, int64_t dk,
    const KvElem<kKv>* HWY_RESTRICT k, int64_t k_row, int64_t run_rows, int64_t nk,
    const RowPrefetch<kKv, kRuns>& pf, float* HWY_RESTRICT s) {
  DecodeScoresRows<kKv, kRuns>(d, n, q, dk, k, k_row, run_rows, nk, pf, s);
}

// Score and weight options of the decode path: none.
struct NoDecodeMods {
  static constexpr bool kActive = false;
  bool may_hide() const { return false; }
  void Scores(int64_t /* row */, int64_t /* nk */, float* /* s */) const {}
  void Weights(int64_t /* row */, int64_t /* nk */, float* /* p */) const {}
};

// One tile for `rows` rows (any count): scores, online softmax, values.
// From memory, 1, 2 and 4 rows (query heads per KV head at Lq 1) read K/V
// at the same rate (within 5%, f32, f16 and bf16, 1 and 2 threads, Lk
// 16384, one process alternating), so up to 4 rows the arithmetic does not
// bound the decode; 8 rows (two groups of 4; f16 K/V from L2 took 30 ns a
// key against 17 for 4 rows) read 18% (f32) to 36% (16-bit) slower than 4
// with 1 thread.
// K/V rows below `prefetch_end` (counted from the tile's first; 0 for none)
// exist: pf prefetches among them, about kPrefetchBytes ahead of the rows
// read (RowPrefetch). kRuns > 1: the keys come from kRuns runs, run_rows
// rows apart (KeyAt).
// Mods (NoDecodeMods's interface) changes block row r's scores of the tile
// before the softmax (Scores) and its weights after it (Weights); may_hide()
// says whether some key of the tile may be hidden from a row.
template <int kKv, int kRuns = 1, class D, class Mods = NoDecodeMods>
HWY_INLINE void DecodeTile(D d, int64_t rows, const float* HWY_RESTRICT q,
                           int64_t dk, const KvElem<kKv>* HWY_RESTRICT k,
                           int64_t k_row, const KvElem<kKv>* HWY_RESTRICT v,
                           int64_t v_row, int64_t dv, int64_t nk,
                           int64_t prefetch_end, float* HWY_RESTRICT s,
                           float* HWY_RESTRICT m, float* HWY_RESTRICT l,
                           float* HWY_RESTRICT o, const Mods& mods = Mods(),
                           int64_t run_rows = 0) {
  constexpr int64_t kElem = static_cast<int64_t>(sizeof(KvElem<kKv>));
  // Only the first group of 4 rows streams the tile from memory and
  // prefetches ahead; the groups after it read the tile again from cache.
  const RowPrefetch<kKv, kRuns> first(k, k_row * kElem, v, v_row * kElem,
                                      dv * kElem, prefetch_end,
                                      run_rows);
  const RowPrefetch<kKv, kRuns> none;
  for (int64_t r0 = 0; r0 < rows; r0 += 4) {
    const RowPrefetch<kKv, kRuns>& pf = r0 == 0 ? first : none;
    const int64_t n = std::min<int64_t>(4, rows - r0);
    const float* qr = q + r0 * dk;
    float scale[4];  // per row: factor of the output so far (online softmax)
    if constexpr (kKv == 0) {
      DecodeScoresRowsOutOfLine<kKv, kRuns>(d, n, qr, dk, k, k_row, run_rows, nk, pf, s);
    } else {
      DecodeScoresRows<kKv, kRuns>(d, n, qr, dk, k, k_row, run_rows, nk, pf, s);
    }
    // Online softmax per row (SoftmaxRow, online_softmax-inl.h).
    for (int64_t t = 0; t < n; ++t) {
      const int64_t r = r0 + t;
      float* HWY_RESTRICT sr = s + t * nk;
      if constexpr (Mods::kActive) mods.Scores(r, nk, sr);
      scale[t] = SoftmaxRow(d, sr, nk, m[r], l[r]);
      if constexpr (Mods::kActive) mods.Weights(r, nk, sr);
    }
    float* orows = o + r0 * dv;
    if (mods.may_hide()) {
      if constexpr (kKv == 0) {
        DecodeValuesRowsOutOfLine<kKv, kRuns, true>(d, n, s, nk, v, v_row, run_rows,
                                                    dv, pf, scale, orows);
      } else {
        DecodeValuesRows<kKv, kRuns, true>(d, n, s, nk, v, v_row, run_rows, dv, pf,
                                           scale, orows);
      }
    } else if constexpr (kKv == 0) {
      DecodeValuesRowsOutOfLine<kKv, kRuns, false>(d, n, s, nk, v, v_row, run_rows,
                                                   dv, pf, scale, orows);
    } else {
      DecodeValuesRows<kKv, kRuns, false>(d, n, s, nk, v, v_row, run_rows, dv, pf,
                                          scale, orows);
    }
  }
}

#if SIMDATTN_DECODE_BLOCK_REDUCE
#define SIMDATTN_HAVE_DECODE_FUSED 1

// The exact online-softmax step (ScalarStep) of rows [0, kRows) for a group
// of 4 keys (scores s[r * 4 + c]) up to the weights: the rows' new maxima
// into m and mrep (repeated per key), l and the rows of o scaled by alpha,
// and the maxima to subtract into msub. The fused loop's rare path:
// the first group, a rising maximum, NaN or infinite scores.
template <int kRows, class D>
HWY_NOINLINE void FusedGroupMaxima(D d, const float* HWY_RESTRICT s, int64_t dv,
                                   float* HWY_RESTRICT m, float* HWY_RESTRICT l,
                                   float* HWY_RESTRICT o, float* HWY_RESTRICT mrep,
                                   float* HWY_RESTRICT msub) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t r = 0; r < kRows; ++r) {
    const float* sr = s + r * 4;
    float mx = -std::numeric_limits<float>::infinity();
    bool nan = false;
    for (int64_t c = 0; c < 4; ++c) {
      if (std::isnan(sr[c])) nan = true;
      mx = std::max(mx, sr[c]);
    }
    const ScalarStep step = OnlineStep(m[r], mx, nan);
    for (int64_t c = 0; c < 4; ++c) {
      mrep[r * 4 + c] = step.m_new;
      msub[r * 4 + c] = step.m_sub;
    }
    m[r] = step.m_new;
    if (step.m_new == step.m_old) continue;  // alpha is 1
    const float alpha = step.Alpha();
    l[r] *= alpha;
    float* HWY_RESTRICT orow = o + r * dv;
    const auto va = hn::Set(d, alpha);
    int64_t e = 0;
    for (; e + N <= dv; e += N) hn::StoreU(hn::Mul(va, hn::LoadU(d, orow + e)), d, orow + e);
    for (; e < dv; ++e) orow[e] *= alpha;
  }
}

// DecodeFused's stand-in for the prefetcher of the dot steps: DecodeFused
// leaves K and V to the hardware prefetchers.
struct NoPrefetch {
  HWY_INLINE void K(int64_t, int64_t, int64_t) const {}
};

// DecodeFused's largest Dk (its packed Q is on the stack).
constexpr int64_t kFusedMaxDk = 256;

// Decode without score or weight options, rows [0, kRows) (kRows <= 4) over
// nk keys (a multiple of 4) of 16-bit K/V, Dk and Dv whole vectors, fused:
// each group of 4 keys gets its scores, its online-softmax step and its P·V
// products, so K and V are read side by side, a few rows of each at a time
// (the tile path reads a tile's K, then works on its scores alone, then
// reads its V twice, the second time from L1). Software-pipelined: the next
// group's dot products are issued before this group's P·V products, so its
// K loads and its score reduction overlap them. o stays in L1: each group
// loads, updates and stores the rows' outputs. The 16 scores [row][key],
// the rows' maxima (repeated per key) and the sums of the weights not yet
// in l stay in registers. While every score of a group is at most its
// row's finite maximum, the weights are exp(s - m) and l and o need no
// scaling (the factor would be exactly 1); otherwise FusedGroupMaxima
// takes the exact step first. No software prefetch: K and V are two
// sequential streams, which the hardware prefetchers follow.
// Same contract for m, l and o as DecodeTile.
// On the Zen 5 (B1 Hq32 Hkv8 D128, K/V from memory on 2 MiB pages, one
// process alternating call by call, medians of 10-60 calls):
// - Against the tile path (the first version, with software prefetch like
//   the tiles): 5-24% faster from memory with 1 and 2 threads at Lk
//   4096-65536; from L2/L3 the tiles were about 25-40% faster.
// - Tried against that first version: f32 K/V fused 7-14% slower than
//   f32's 4 runs (so f32 keeps them); a group's keys from 4 runs of the
//   chunk, -3% to +3%; loops blocked by cache line, the output rows in a
//   stack buffer: within 3%.
// - Its Q·K and P·V loops unrolled (`GCC unroll`; the runtime trip counts
//   had kept loops with a prefetch branch per step): -2% to +25% from
//   memory, 1 and 2 threads, Lk 4096-65536, in several minutes; head dims
//   as compile-time constants on top of it: within 5% either way.
// - Then, in minutes when a plain read loop streamed 15-17 GB/s with 1
//   thread (f16, Lk 16384, 1 / 2 threads, each line one process): pipelined
//   with the old prefetches (8 KiB ahead, NTA) 8.3 / 15.7 GB/s, unrolled
//   without software prefetch 10.8 / 20.6, pipelined without it 17.0 /
//   33.1; pipelined with NTA 8.3 / 14.6, with T0 13.3 / 26.2, without 17.0
//   / 31.7. This version against the one before the unrolling, f16 and
//   bf16, Lk 4096-65536: 16.4-19.6 / 27.9-31.9 GB/s against 5.6-8.7 /
//   10.8-19.0. With K/V in L2 (compute alone) it runs about 28 GB/s per
//   core, 10% faster than before.

template <int kRows, int kKv, class D>
HWY_INLINE void DecodeFused(D d, const float* HWY_RESTRICT q, int64_t dk,
                            const KvElem<kKv>* HWY_RESTRICT k, int64_t k_row,
                            const KvElem<kKv>* HWY_RESTRICT v, int64_t v_row,
                            int64_t dv, int64_t nk, float* HWY_RESTRICT m,
                            float* HWY_RESTRICT l, float* HWY_RESTRICT o) {
  static_assert(kKv != 0 && kRows >= 1 && kRows <= 4, "16-bit K/V, 1-4 rows");
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t dk_vec = dk;  // whole vectors (the caller checks)
  constexpr int64_t kElem = static_cast<int64_t>(sizeof(KvElem<kKv>));
  // The group's 16 values [row][key] as kParts vectors of dc.
  const hn::CappedTag<float, 16> dc;
  using VC = hn::VFromD<decltype(dc)>;
  constexpr size_t kLanes = hn::MaxLanes(dc);
  constexpr size_t kParts = 16 / kLanes;
  static_assert(kLanes >= 4 && kParts * kLanes == 16, "4, 8 or 16 lanes");
  const hn::CappedTag<float, 4> d4;
  // Q packed step by step ([dk / N][4][N]): one pointer for the 4 rows.
  HWY_ALIGN float qp[4 * kFusedMaxDk];
  for (int64_t i = 0; i < dk; i += N) {
    for (int64_t r = 0; r < 4; ++r) {
      const auto y = r < kRows ? hn::LoadU(d, q + r * dk + i) : hn::Zero(d);
      hn::Store(y, d, qp + i * 4 + r * N);
    }
  }
  HWY_ALIGN float buf[16] = {};   // scores (rare path), sums of weights
  HWY_ALIGN float p[16];          // weights [row][key]
  HWY_ALIGN float mrep[16] = {};  // maxima per [row][key] (0 past kRows)
  HWY_ALIGN float msub[16] = {};  // the maxima to subtract
  bool fast = true;  // every row's maximum is finite
  for (int64_t r = 0; r < kRows; ++r) {
    fast = fast && std::isfinite(m[r]);
    for (int64_t c = 0; c < 4; ++c) mrep[r * 4 + c] = msub[r * 4 + c] = m[r];
  }
  VC vm[kParts], vsub[kParts], vl[kParts];
  const auto load_maxima = [&]() {
    for (size_t i = 0; i < kParts; ++i) {
      vm[i] = hn::Load(dc, mrep + i * kLanes);
      vsub[i] = hn::Load(dc, msub + i * kLanes);
    }
  };
  const auto fold_sums = [&]() {  // the weights' sums into l
    for (size_t i = 0; i < kParts; ++i) {
      hn::Store(vl[i], dc, buf + i * kLanes);
      vl[i] = hn::Zero(dc);
    }
    for (int64_t r = 0; r < kRows; ++r) {
      l[r] += (buf[r * 4] + buf[r * 4 + 1]) + (buf[r * 4 + 2] + buf[r * 4 + 3]);
    }
  };
  load_maxima();
  for (size_t i = 0; i < kParts; ++i) vl[i] = hn::Zero(dc);
  // The scores of the group at key J into SC (kParts vectors).
#define SIMDATTN_FUSED_SCORES(J, SC)                                           \
  {                                                                            \
    const NoPrefetch pf;                                                       \
    const KvElem<kKv>* HWY_RESTRICT k0 = k + (J) * k_row;                      \
    const KvElem<kKv>* HWY_RESTRICT k1 = k0 + k_row;                           \
    const KvElem<kKv>* HWY_RESTRICT k2 = k1 + k_row;                           \
    const KvElem<kKv>* HWY_RESTRICT k3 = k2 + k_row;                           \
    SIMDATTN_DOT_STEPS(0)                                                      \
    const auto z4 = hn::Zero(d4);                                              \
    const auto s0 = Sums4(d, a00, a01, a02, a03);                              \
    const auto s1 = kRows > 1 ? Sums4(d, a10, a11, a12, a13) : z4;             \
    const auto s2 = kRows > 2 ? Sums4(d, a20, a21, a22, a23) : z4;             \
    const auto s3 = kRows > 3 ? Sums4(d, a30, a31, a32, a33) : z4;             \
    if constexpr (kParts == 1) {                                               \
      const hn::Half<decltype(dc)> d8;                                         \
      SC[0] = hn::Combine(dc, hn::Combine(d8, s3, s2), hn::Combine(d8, s1, s0)); \
    } else if constexpr (kParts == 2) {                                        \
      SC[0] = hn::Combine(dc, s1, s0);                                         \
      SC[1] = hn::Combine(dc, s3, s2);                                         \
    } else {                                                                   \
      SC[0] = s0, SC[1] = s1, SC[2] = s2, SC[3] = s3;                          \
    }                                                                          \
  }
#define SIMDATTN_Q_AT(R) (qp + (i * 4 + R * N))
#define SIMDATTN_DOT_UNROLL _Pragma("GCC unroll 16")
  VC sc[kParts];
  if (nk >= 4) SIMDATTN_FUSED_SCORES(0, sc)
  for (int64_t j = 0; j + 4 <= nk; j += 4) {
    bool below = fast;
    for (size_t i = 0; i < kParts; ++i) below = below && hn::AllTrue(dc, hn::Le(sc[i], vm[i]));
    if (HWY_UNLIKELY(!below)) {
      fold_sums();
      for (size_t i = 0; i < kParts; ++i) hn::Store(sc[i], dc, buf + i * kLanes);
      FusedGroupMaxima<kRows>(d, buf, dv, m, l, o, mrep, msub);
      load_maxima();
      fast = true;
      for (int64_t r = 0; r < kRows; ++r) fast = fast && std::isfinite(m[r]);
    }
    for (size_t i = 0; i < kParts; ++i) {
      const VC w = ExpNonPositive(dc, hn::Sub(sc[i], vsub[i]));
      hn::Store(w, dc, p + i * kLanes);
      vl[i] = hn::Add(vl[i], w);
    }
    // The next group's scores before this group's products, so that their
    // reduction overlaps the products.
    VC sn[kParts];
    if (j + 8 <= nk) {
      SIMDATTN_FUSED_SCORES(j + 4, sn)
    } else {
      for (size_t i = 0; i < kParts; ++i) sn[i] = sc[i];
    }
    ReloadFromMemory();  // the weights broadcast from p
    // o[r] += sum_c p[r][c] * v_{j+c}, the 4 V rows read side by side.
    const KvElem<kKv>* HWY_RESTRICT vj = v + j * v_row;
#define SIMDATTN_FUSED_WEIGHTS(R)                                   \
  auto w##R##0 = hn::Set(d, p[R * 4]), w##R##1 = hn::Set(d, p[R * 4 + 1]); \
  auto w##R##2 = hn::Set(d, p[R * 4 + 2]), w##R##3 = hn::Set(d, p[R * 4 + 3]); \
  InRegister(w##R##0), InRegister(w##R##1), InRegister(w##R##2), InRegister(w##R##3);
    SIMDATTN_FUSED_WEIGHTS(0)
    SIMDATTN_FUSED_WEIGHTS(1)
    SIMDATTN_FUSED_WEIGHTS(2)
    SIMDATTN_FUSED_WEIGHTS(3)
#undef SIMDATTN_FUSED_WEIGHTS
#pragma GCC unroll 16
    for (int64_t e = 0; e < dv; e += N) {
      auto x0 = LoadKv<kKv>(d, vj + e), x1 = LoadKv<kKv>(d, vj + v_row + e);
      auto x2 = LoadKv<kKv>(d, vj + 2 * v_row + e), x3 = LoadKv<kKv>(d, vj + 3 * v_row + e);
      InRegister(x0), InRegister(x1), InRegister(x2), InRegister(x3);
#define SIMDATTN_FUSED_PV(R)                                    \
  if (R < kRows) {                                              \
    float* HWY_RESTRICT orow = o + R * dv + e;                  \
    auto acc = hn::LoadU(d, orow);                              \
    acc = hn::MulAdd(w##R##0, x0, acc);                         \
    acc = hn::MulAdd(w##R##1, x1, acc);                         \
    acc = hn::MulAdd(w##R##2, x2, acc);                         \
    acc = hn::MulAdd(w##R##3, x3, acc);                         \
    hn::StoreU(acc, d, orow);                                   \
  }
      SIMDATTN_FUSED_PV(0) SIMDATTN_FUSED_PV(1) SIMDATTN_FUSED_PV(2) SIMDATTN_FUSED_PV(3)
#undef SIMDATTN_FUSED_PV
    }
    for (size_t i = 0; i < kParts; ++i) sc[i] = sn[i];
  }
#undef SIMDATTN_DOT_UNROLL
#undef SIMDATTN_Q_AT
#undef SIMDATTN_FUSED_SCORES
  fold_sums();
}

// DecodeFused for `rows` (1-4) rows.
template <int kKv, class D>
HWY_NOINLINE void DecodeFusedRows(D d, int64_t rows, const float* HWY_RESTRICT q,
                                  int64_t dk, const KvElem<kKv>* HWY_RESTRICT k,
                                  int64_t k_row, const KvElem<kKv>* HWY_RESTRICT v,
                                  int64_t v_row, int64_t dv, int64_t nk,
                                  float* HWY_RESTRICT m, float* HWY_RESTRICT l,
                                  float* HWY_RESTRICT o) {
  switch (rows) {
    case 4:
      DecodeFused<4, kKv>(d, q, dk, k, k_row, v, v_row, dv, nk, m, l, o);
      break;
    case 3:
      DecodeFused<3, kKv>(d, q, dk, k, k_row, v, v_row, dv, nk, m, l, o);
      break;
    case 2:
      DecodeFused<2, kKv>(d, q, dk, k, k_row, v, v_row, dv, nk, m, l, o);
      break;
    default:
      DecodeFused<1, kKv>(d, q, dk, k, k_row, v, v_row, dv, nk, m, l, o);
      break;
  }
}
#endif  // SIMDATTN_DECODE_BLOCK_REDUCE
#undef SIMDATTN_DOT_STEPS
#undef SIMDATTN_DOT_ROW

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_DECODE_INL_H_
