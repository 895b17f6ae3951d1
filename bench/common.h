// Pieces shared by simdattn_bench's entry families: shapes and their inputs,
// the counters every entry reports, the options of the per-option entries,
// memory on 2 MiB pages, and the registration of one entry.
//
// Entry names: attention/<impl>/<dtype>/<shape>/<mask>/threads:<n>, with the
// counters FLOPS (4·B·Hq·Lq·Lk·D, causal: visible pairs only) and bytes
// (Q, K, V and O as stored), both as rates over wall-clock time.

#ifndef SIMDATTN_BENCH_COMMON_H_
#define SIMDATTN_BENCH_COMMON_H_

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lib/cache_line_allocator.h"
#include "simdattn/attention.h"

namespace simdattn {
namespace bench {

struct Shape {
  int64_t batch, q_heads, kv_heads, q_len, kv_len, head_dim;

  // e.g. B1_Hq8_Hkv8_Lq2048_Lk2048_D128, the <shape> field of entry names.
  std::string Name() const;
};

// Query-key pairs that take part (causal top-left: row i sees i + 1 keys;
// a left window keeps at most window_left + 1 of them).
double VisiblePairs(const Shape& s, bool causal, int64_t window_left = -1);

// Tensors start on a cache line, as an engine's buffers do (the library
// writes whole lines of O with streaming stores only when they are aligned).
using AlignedFloats = std::vector<float, CacheLineAllocator<float>>;

// Random f32 inputs in [-1, 1] of one shape (dense BHSD), and its output.
struct Problem {
  Shape shape;
  AlignedFloats q, k, v, o;

  explicit Problem(const Shape& s);
  TensorView Q() const;
  TensorView K() const;
  TensorView V() const;
  MutableTensorView O();
};

// The problem of shape s, made on first use and kept for the whole run, so
// that the trials and repetitions of an entry do not fill it again.
Problem& CachedProblem(const Shape& s);

// Rounds f32 values to f16 or bf16 bits.
std::vector<uint16_t> RoundTo16(const AlignedFloats& x, DType dtype);

// Sets the FLOPS and bytes rates of an entry that ran state.iterations()
// calls of shape s (elem_bytes: bytes per stored element).
void SetCounters(benchmark::State& state, const Shape& s, bool causal, int64_t window_left = -1,
                 double elem_bytes = 4.0);

// An option of SEMANTICS.md applied on top of plain or causal attention, for
// the per-option cost entries.
struct Variant {
  std::string name = "none";  // entry's mask field: none, causal, softcap...
  bool causal = false;
  int64_t window_left = -1;
  float softcap = 0.0f;
  bool alibi = false, sinks = false, mask_bool = false, mask_add = false;
  bool kv_lengths = false;
  float dropout = 0.0f;
  bool bottom_right = false;  // causal/window alignment (speculative decoding)
};

// The option entries' variants: softcap, alibi, sinks, mask_bool, mask_add,
// kv_lengths and dropout, each alone on plain attention.
const std::vector<Variant>& OptionVariants();

// The arrays a variant's options point into.
struct VariantData {
  std::vector<float> slopes, sinks, mask_f32;
  std::vector<uint8_t> mask_u8;
  std::vector<int64_t> lens;
};

AttentionOptions MakeOptions(const Shape& s, const Variant& v, VariantData* data);

// The options of two variants of one shape (a paired entry's A and B),
// with the data they point into.
struct OptionPair {
  VariantData data_a, data_b;
  AttentionOptions a, b;
  OptionPair(const Shape& s, const Variant& va, const Variant& vb)
      : a(MakeOptions(s, va, &data_a)), b(MakeOptions(s, vb, &data_b)) {}
  OptionPair(const OptionPair&) = delete;  // a and b point into the data
  OptionPair& operator=(const OptionPair&) = delete;
};

// The timed loop of the simdattn entries: one Attention() call per
// iteration; labels the entry with the target that ran. False (and the
// entry marked as an error) if a call fails.
bool TimeAttention(benchmark::State& state, const TensorView& q, const TensorView& k,
                   const TensorView& v, const MutableTensorView& o, const AttentionOptions& options,
                   const ExecutionOptions& exec);

// Memory that streams from DRAM (the read roofline's buffer, the decode K/V
// caches) is advised to 2 MiB pages, so that both read memory the same way:
// 13.4-14.1 GB/s against 12.0-12.7 on 4 KiB pages (roofline/read_bw/threads:1,
// 2-vCPU KVM guest). Null when the allocation fails.
void* AllocHugePages(size_t bytes);

// The read roofline's buffer: 1 GiB on 2 MiB pages, zeroed on first use (null
// if it cannot be had). Defined with the roofline entries.
constexpr size_t kReadBufferBytes = size_t{1} << 30;
const float* ReadBuffer();

// Reads the n floats at data, split evenly over `threads` tasks of the pool
// (the read roofline's loop).
void StreamReadThreads(ThreadPool& pool, int threads, const float* data, size_t n);

// std::thread::hardware_concurrency(), at least 1.
int HardwareThreads();

// Registers one entry timed on the wall clock, in milliseconds. min_time 0
// keeps --benchmark_min_time; repetitions 0 keeps --benchmark_repetitions.
void Register(const std::string& name, std::function<void(benchmark::State&)> run,
              double min_time = 0.0, int repetitions = 0);

// The median of x (empty: undefined).
double Median(std::vector<double> x);

// Paired timing (paired/... entries): calls a and b alternate inside every
// iteration (which goes first alternates too), each timed on its own; sets
// the counters ratio (median of time(b) / time(a)), a_ms and b_ms (median
// milliseconds). A call returns false after marking the entry as an error.
// `before_a`, when given, runs untimed just before each call of A.
void TimePairs(benchmark::State& state, const std::function<bool()>& a,
               const std::function<bool()>& b,
               const std::function<void()>& before_a = nullptr);

// "/threads:<n>", the last field of most entry names.
std::string ThreadsField(int threads);

}  // namespace bench
}  // namespace simdattn

#endif  // SIMDATTN_BENCH_COMMON_H_
