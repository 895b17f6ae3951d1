// simdattn public C++ API: fused scaled dot-product attention on CPUs.
// The contract (every option, every error) is docs/SEMANTICS.md; this header
// documents the types and calls that carry it.

#ifndef SIMDATTN_ATTENTION_H_
#define SIMDATTN_ATTENTION_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#if defined(_WIN32) || defined(__CYGWIN__)
#define SIMDATTN_API
#else
#define SIMDATTN_API __attribute__((visibility("default")))
#endif

namespace simdattn {

// ---------------------------------------------------------------- Status

// The same numbers as the C API's SIMDATTN_OK ... SIMDATTN_INTERNAL.
enum class StatusCode : int32_t {
  kOk = 0,
  kInvalidArgument = 1,  // bad shapes, strides, pointers, option values
  kUnimplemented = 2,    // valid call that no fast path covers yet
  kOutOfMemory = 3,      // a buffer could not be allocated
  kInternal = 4,         // anything else that should not happen
};

// Result of every call that can fail. `message` names the offending argument
// and value; it is empty when ok().
struct Status {
  StatusCode code = StatusCode::kOk;
  std::string message;

  bool ok() const { return code == StatusCode::kOk; }
  static Status Ok() { return Status(); }
};

SIMDATTN_API const char* StatusCodeName(StatusCode code);

// ---------------------------------------------------------------- Tensors

enum class DType : int32_t {
  kF32 = 0,
  kF16 = 1,   // IEEE binary16
  kBF16 = 2,  // bfloat16
  kBool = 3,  // one byte per element, 0 = hidden, non-zero = attend (masks)
  // Quantized K/V caches (K and V only, each its own; SEMANTICS.md
  // "Quantized KV caches"). 4 and 5 are the C API's int32/int64 (lengths).
  kInt8 = 6,      // int8 q in [-127, 127], x = scale * q with one f32 scale
                  // per (token, KV head): AttentionOptions::k_scales/v_scales
  kQ8_0 = 7,      // ggml's q8_0: blocks of 32 values of a row, each an f16
                  // scale d and 32 int8 q (34 bytes), x = d * q; needs
                  // D % 32 == 0 and its view's strides[0..2] in bytes
  kFp8E4M3 = 8,   // OCP fp8 e4m3 (bias 7, no Inf, NaN S.1111.111, max 448),
                  // x = scale * value with one f32 scale per tensor
  kFp8E5M2 = 9,   // OCP fp8 e5m2 (bias 15, Inf and NaN, max 57344), likewise
};

// "f32", "f16", "bf16", "bool", "int8", "q8_0", "fp8_e4m3", "fp8_e5m2".
SIMDATTN_API const char* DTypeName(DType dtype);
// Bytes per element; for kQ8_0 bytes per block of 32 values (34).
SIMDATTN_API int64_t DTypeSize(DType dtype);

// A strided 4-D view of memory the caller owns. Extents and strides are in
// elements (not bytes), outermost first. The last stride must be 1; the others
// are free (0 broadcasts), so PyTorch's BHSD and the engines' BSHD layouts are
// both plain views. One exception: a kQ8_0 K or V, whose rows are D / 32
// blocks of 34 bytes, has strides[0..2] in bytes (strides[3] is still 1,
// the elements of a row are its blocks' values in order). Logical dimension order is always the one of
// SEMANTICS.md: Q [B, Hq, Lq, Dk], K [B, Hkv, Lk, Dk], V [B, Hkv, Lk, Dv],
// O [B, Hq, Lq, Dv], LSE [B, Hq, Lq, 1], mask [B, Hq, Lq, Lk].
struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t shape[4] = {0, 0, 0, 0};
  int64_t strides[4] = {0, 0, 0, 0};
};

// The same for outputs. Converts to a TensorView, so a view made from a
// non-const pointer also serves as an input.
struct MutableTensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t shape[4] = {0, 0, 0, 0};
  int64_t strides[4] = {0, 0, 0, 0};

  operator TensorView() const {  // NOLINT(google-explicit-constructor)
    TensorView v;
    v.data = data;
    v.dtype = dtype;
    for (int i = 0; i < 4; ++i) {
      v.shape[i] = shape[i];
      v.strides[i] = strides[i];
    }
    return v;
  }
};

// Logical [d0, d1, d2, d3] stored densely in that order (BHSD for Q/K/V/O).
SIMDATTN_API TensorView MakeBHSD(const void* data, DType dtype, int64_t b,
                                 int64_t h, int64_t s, int64_t d);
SIMDATTN_API MutableTensorView MakeBHSD(void* data, DType dtype, int64_t b,
                                        int64_t h, int64_t s, int64_t d);
// Logical [b, h, s, d] stored as [b, s, h, d] (BSHD, engines' KV caches).
SIMDATTN_API TensorView MakeBSHD(const void* data, DType dtype, int64_t b,
                                 int64_t h, int64_t s, int64_t d);
SIMDATTN_API MutableTensorView MakeBSHD(void* data, DType dtype, int64_t b,
                                        int64_t h, int64_t s, int64_t d);

// ---------------------------------------------------------------- Options

// Where query row i sits on the key axis (SEMANTICS.md "alignment").
enum class Alignment : int32_t {
  kTopLeft = 0,      // p(i) = i (PyTorch is_causal)
  kBottomRight = 1,  // p(i) = i + Lk_b - Lq (KV-cache convention)
};

// Every option of SEMANTICS.md. Defaults give plain softmax(Q Kᵀ/sqrt(Dk)) V.
struct AttentionOptions {
  // Multiplies Q·K. Unset: 1/sqrt(Dk). Must be finite and >= 0.
  std::optional<float> scale;
  // Hide keys j > p(i).
  bool causal = false;
  // Alignment used by causal, windows and ALiBi (with or without causal).
  // It may stay unset only where the two agree (Lq = Lk and no kv lengths)
  // or where nothing uses p(i); otherwise an unset alignment is
  // kInvalidArgument, since PyTorch (top-left) and the KV-cache engines
  // (bottom-right) disagree there.
  std::optional<Alignment> alignment;
  // Sliding window, FlashAttention 2 convention: key j is visible when
  // p(i) - window_left <= j <= p(i) + window_right. Negative: unbounded.
  int64_t window_left = -1;
  int64_t window_right = -1;
  // s = softcap * tanh(s / softcap) when > 0 (Gemma 2). 0 = off. Finite.
  float softcap = 0.0f;
  // Hq slopes: s -= slope[h] * |p(i) - j|. nullptr = off.
  const float* alibi_slopes = nullptr;
  // Hq sink logits that only enlarge the softmax denominator. nullptr = off.
  const float* sinks = nullptr;
  // Optional mask, logically [B, Hq, Lq, Lk]: kBool (1 = attend) or additive
  // kF32/kF16. Each extent equals the full one or is 1 (broadcast; its stride
  // is then ignored); stride 0 also broadcasts. The last stride is 1 (or 0 to
  // broadcast along Lk). Default (null data, all extents 0) = no mask; null
  // data with non-zero extents is an error.
  TensorView mask;
  // B valid key counts in [0, Lk]; keys j >= kv_lengths[b] are hidden.
  // nullptr = all Lk keys valid. kv_lengths_i32 is the same in int32 (as
  // engines keep them); at most one of the two is set.
  const int64_t* kv_lengths = nullptr;
  const int32_t* kv_lengths_i32 = nullptr;
  // Dropout on the normalized weights, p in [0, 1); the keep mask is a
  // Philox4x32-10 function of (seed, b, h, i, j), 16 random bits per key, so
  // a key is kept with probability 1 - floor(p * 2^16) / 2^16. 0 = off.
  float dropout_p = 0.0f;
  uint64_t dropout_seed = 0;
  // Scales of quantized K and V (SEMANTICS.md "Quantized KV caches").
  // kInt8 K (V): k_scales (v_scales) is required, f32, logically
  // [B, Hkv, Lk, 1] (PagedAttention: the cache pages' [num_blocks, Hkv,
  // block_size, 1]); strides are free (0 broadcasts). For every other
  // dtype it stays empty (null data, all extents 0). Its values are data:
  // a NaN or Inf scale makes that key's row NaN/Inf, which propagates like
  // NaN in K or V.
  TensorView k_scales;
  TensorView v_scales;
  // kFp8E4M3 / kFp8E5M2 K (V): the per-tensor scale, finite and >= 0 (0
  // gives zeros). For every other dtype it must stay 1.
  float k_scale = 1.0f;
  float v_scale = 1.0f;
};

// ---------------------------------------------------------------- Threads

// A pool of persistent worker threads. The calling thread takes part in the
// work, so a pool of N threads starts N - 1 workers. Results are bit-identical
// for any thread count. One pool serves one call at a time: concurrent calls
// from different threads are serialized, and a call made from inside one of
// the pool's own tasks runs its tasks inline on that thread. Between calls
// a worker spins for about 100 microseconds before it sleeps (so that calls
// in quick succession start on every thread at once), then waits without
// using the CPU. Never throws: if the system refuses some threads, the pool
// runs with the ones it got (num_threads() says how many).
class SIMDATTN_API ThreadPool {
 public:
  // num_threads <= 0: std::thread::hardware_concurrency().
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const;

  // Runs task(arg, i) for every i in [0, num_tasks) and returns when all have
  // finished. Tasks run in any order on any of the pool's threads; a null
  // task or num_tasks <= 0 does nothing.
  void ParallelFor(int64_t num_tasks, void (*task)(void* arg, int64_t i),
                   void* arg);

  struct Impl;

 private:
  Impl* impl_;
};

// A host engine's own parallel-for: must run task(task_arg, i) exactly once
// for every i in [0, num_tasks), on any threads, in any order, and return
// when all are done. `user` is passed through unchanged. One Attention() call
// may invoke it several times in sequence (a prefill packs K/V in one round,
// then computes against them in the next).
using ParallelForFn = void (*)(void* user, int64_t num_tasks,
                               void (*task)(void* task_arg, int64_t i),
                               void* task_arg);

// How a call runs. Priority: parallel_for, then pool, then a process-wide
// default pool with hardware_concurrency() threads, created on first use.
//
// Memory: without a workspace, every thread that runs a task keeps a
// scratch buffer (a few hundred KiB, sized for the largest head dimension it
// has seen) for its lifetime, and every calling thread a buffer for the
// packed K/V of the (batch, KV head) groups in flight (prefill: about
// 32 MiB, but at least one group's Lk x (Dk + Dv) floats per thread; groups
// above 256 MiB are not packed), one for the partial results of split
// calls and a spare scratch buffer, so that steady-state calls allocate
// nothing. ReleaseThreadBuffers() frees the calling thread's; a pool's
// workers free theirs when the pool is destroyed. With a workspace of
// WorkspaceSize() bytes, every one of these buffers, the workers' scratch
// included, lies in it and the call allocates nothing at all.
//
// The memory a call computes in besides its inputs and outputs
// (RunInfo::scratch_bytes) is bounded by a formula of its shapes, with
// T = the executor's threads and R = the rows of a query block (4 f32
// vectors: 64 on AVX-512, 32 on AVX2, 16 on NEON/SSE, 4 on SCALAR):
//
//   scratch_bytes <= (T + 1) S + P + W + L, where
//   S = 4 (R + 128)(Dk + Dv) + 1320 R + 4096   one thread's scratch
//   P = 4 B Hkv (Hq / Hkv Lq + R) C (Dv + 2) + 256, only when Lq <= 16
//       (split key chunks), C = min(256, ceil(Lk / 512)); else 0
//   W = min(B Hkv g, max(T g, 32 MiB)), g = 4 (Lk + 63)(Dk + Dv + 62),
//       only for a prefill whose K/V are packed (g <= 256 MiB); else 0
//   L = 8 B + 256 with kv_lengths_i32, else 0
//
// No term grows with Lq x Lk: scores are never materialized. A
// PagedAttention call is bounded by the same formula with B = 1 and the
// longest sequence's Lq and Lk, plus P summed over its sequences.
//
// Out of memory: every buffer that can fail to allocate is allocated before
// the first task runs (a worker whose own scratch cannot be allocated
// borrows the calling thread's spare), so kOutOfMemory leaves every output
// untouched.
struct ExecutionOptions {
  ThreadPool* pool = nullptr;
  ParallelForFn parallel_for = nullptr;
  void* parallel_for_user = nullptr;
  // How many tasks the host parallel-for runs at once (its threads);
  // 0 = hardware_concurrency(). It sizes the workspace's scratch slots:
  // a task that finds every slot taken waits for one.
  int parallel_for_threads = 0;
  // Caller-owned memory for all of the call's buffers, any alignment, at
  // least WorkspaceSize() bytes for the same call and executor (else
  // kInvalidArgument). One workspace serves one call at a time. Null: the
  // per-thread buffers above.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Caps the code path of this call only, as SetMaxTarget does for all
  // (a target name, case-insensitive); null or "": the process-wide cap.
  const char* max_target = nullptr;
  // Lets f32 and f16 Q, K and V be rounded to bf16 for the two products
  // where a target has bf16 matrix units (AVX3_AMX's tiles), as oneDNN's
  // fpmath mode and PyTorch's matmul precision do; the softmax and the
  // accumulation stay f32. The output is then held to the bf16 bound of
  // SEMANTICS.md ("Precision"). Off: those inputs are never rounded below
  // their storage type. Other targets ignore it.
  bool allow_bf16_compute = false;
};

// Filled by Attention() on success.
struct RunInfo {
  const char* target = "";  // the code path that ran, e.g. "AVX3_DL", "NEON"
  // The kernel that ran: "tiled" (queries along the vector lanes: prefill),
  // "decode" (head dims along the lanes: few queries per KV head, every
  // option) or "fused decode" (decode's fused loop for 16-bit, int8, q8_0
  // or fp8 K/V of one type, without options).
  const char* path = "";
  int64_t num_tasks = 0;    // independent work items handed to the threads
  // Memory ("Memory" above ExecutionOptions): the bytes of the buffers the
  // call computed in besides its inputs and outputs (at most the formula
  // there), and how many bytes it took from the heap for them (0 with a
  // workspace, and in steady state without one).
  size_t scratch_bytes = 0;
  size_t bytes_allocated = 0;
};

// ---------------------------------------------------------------- Calls

// Computes O = softmax(scale * Q Kᵀ + options) V and, when lse.data is not
// null, LSE = log-sum-exp of each row's scores (f32, shape [B, Hq, Lq, 1]).
// The default lse ({}: null data, all extents 0) asks for no LSE.
// Scores are computed in f32: inputs whose dot products overflow f32 (|q·k|
// above ~3e38) give Inf/NaN rows where the double reference would not.
//
// Returns:
//   kOk              O (and LSE) written.
//   kInvalidArgument a bad argument (SEMANTICS.md "Bad input"); the message
//                    names it. Nothing is written.
//   kUnimplemented   valid, but the fast path does not cover this option or
//                    dtype yet. Nothing is written.
//   kOutOfMemory     a buffer could not be allocated (never with a
//                    workspace). Nothing is written.
//   kInternal        an unexpected failure; the message says what.
// Never throws, aborts or prints.
SIMDATTN_API Status Attention(const TensorView& q, const TensorView& k,
                              const TensorView& v, const MutableTensorView& o,
                              const AttentionOptions& options = {},
                              const MutableTensorView& lse = {},
                              const ExecutionOptions& exec = {},
                              RunInfo* info = nullptr);

// The bytes of workspace (ExecutionOptions::workspace) that Attention() needs
// for these inputs and options on the executor `exec`, with the target a
// call would choose now (a different cap may need a different size). The
// outputs do not change it. Validates like Attention() and returns its
// kInvalidArgument errors.
SIMDATTN_API Status WorkspaceSize(const TensorView& q, const TensorView& k,
                                  const TensorView& v,
                                  const AttentionOptions& options,
                                  const ExecutionOptions& exec, size_t* bytes);

// Frees the buffers that calls without a workspace cached on the calling
// thread (its scratch, the spare scratch, packed K/V and partial results);
// the next such call allocates them again. Worker threads keep their own
// scratch until their pool is destroyed.
SIMDATTN_API void ReleaseThreadBuffers();

// ---------------------------------------------------------------- Targets

// Code paths compiled into this build that this CPU can run, best first
// (Highway's order of preference, after our own AVX3_BF16), e.g.
// {"AVX3_DL", "AVX3", ..., "SCALAR"}.
SIMDATTN_API std::vector<std::string> AvailableTargets();
// Every code path compiled into this build, best first, whether or not this
// CPU can run it.
SIMDATTN_API std::vector<std::string> CompiledTargets();

// Caps the code path: calls run the best available target that is not
// preferred over `name` (as ONEDNN_MAX_CPU_ISA does). nullptr or "" removes
// the cap set here and goes back to the environment variable
// SIMDATTN_MAX_TARGET (read at each call). kInvalidArgument for a name that is
// not a target of this architecture; the cap is then unchanged.
// Each call reads the cap once, when it starts, and runs on that target to
// its end: a cap changed from another thread while calls run applies to
// the calls that start after the change.
// A SIMDATTN_MAX_TARGET that names no target fails the first call that
// reads it (kInvalidArgument, naming the variable and the known targets);
// later calls ignore it and run uncapped.
// One exception to "best available": AVX3_BF16 (native bf16 products) runs
// without being named only on AMD CPUs; elsewhere (Intel, where vdpbf16ps
// measured slower than the f32 FMAs) only a cap naming it selects it.
SIMDATTN_API Status SetMaxTarget(const char* name);

// The target the next call will run, after caps. kInvalidArgument whenever
// SIMDATTN_MAX_TARGET names no target (and no SetMaxTarget cap hides it);
// *name is then still set, to the target that calls run once they have
// reported it.
SIMDATTN_API Status SelectedTarget(std::string* name);

}  // namespace simdattn

#endif  // SIMDATTN_ATTENTION_H_
