/* simdattn C API: fused scaled dot-product attention on CPUs, for C and for
 * any language with a C FFI. Plain C99; a thin shim over the C++ API
 * (attention.h). The contract, every option and every error, is
 * docs/SEMANTICS.md.
 *
 * Stability: every struct the caller fills starts with `struct_size`, set by
 * its *_init() function, so that later versions can append fields; a caller
 * built against an older header keeps working. SIMDATTN_ABI_VERSION is the
 * shared library's SOVERSION and changes only when a symbol or a struct
 * layout changes incompatibly.
 *
 * Errors: every function that can fail returns a simdattn_status code; the
 * message of the calling thread's last failed call is simdattn_last_error().
 * Nothing aborts, throws or prints, and a failed call writes no output. */

#ifndef SIMDATTN_SIMDATTN_H_
#define SIMDATTN_SIMDATTN_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32) || defined(__CYGWIN__)
#define SIMDATTN_C_API
#else
#define SIMDATTN_C_API __attribute__((visibility("default")))
#endif

#define SIMDATTN_VERSION_MAJOR 0
#define SIMDATTN_VERSION_MINOR 2
#define SIMDATTN_VERSION_PATCH 0
#define SIMDATTN_ABI_VERSION 1

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------- status */

typedef enum simdattn_status {
  SIMDATTN_OK = 0,
  SIMDATTN_INVALID_ARGUMENT = 1, /* bad shapes, strides, pointers, options */
  SIMDATTN_UNIMPLEMENTED = 2,    /* valid, but no fast path covers it yet */
  SIMDATTN_OUT_OF_MEMORY = 3,    /* a buffer could not be allocated */
  SIMDATTN_INTERNAL = 4          /* anything else that should not happen */
} simdattn_status;

/* The message of the calling thread's last call that failed, naming the
 * argument and value at fault; "" when its last call succeeded. Valid until
 * the thread's next call into the library. Never NULL. */
SIMDATTN_C_API const char* simdattn_last_error(void);

/* "ok", "invalid argument", "unimplemented", "out of memory", "internal". */
SIMDATTN_C_API const char* simdattn_status_name(int status);

/* The library's version, "MAJOR.MINOR.PATCH", and its ABI version; they
 * equal the header's macros when header and library match. */
SIMDATTN_C_API const char* simdattn_version(void);
SIMDATTN_C_API int simdattn_abi_version(void);

/* ------------------------------------------------------------ tensors */

typedef enum simdattn_dtype {
  SIMDATTN_F32 = 0,
  SIMDATTN_F16 = 1,  /* IEEE binary16 */
  SIMDATTN_BF16 = 2, /* bfloat16 */
  SIMDATTN_BOOL = 3, /* one byte, 0 = hidden, non-zero = attend (masks) */
  SIMDATTN_I32 = 4,  /* kv lengths only */
  SIMDATTN_I64 = 5   /* kv lengths only */
} simdattn_dtype;

/* A strided 4-D view of caller memory. Extents and strides in elements,
 * outermost first; the last stride is 1, the others free (0 broadcasts).
 * Logical order is SEMANTICS.md's: Q [B, Hq, Lq, Dk], K [B, Hkv, Lk, Dk],
 * V [B, Hkv, Lk, Dv], O [B, Hq, Lq, Dv], LSE [B, Hq, Lq, 1], mask
 * [B, Hq, Lq, Lk]. Inputs are never written through `data`. */
typedef struct simdattn_tensor {
  void* data;
  int32_t dtype; /* simdattn_dtype */
  int64_t shape[4];
  int64_t strides[4];
} simdattn_tensor;

/* Dense views: logical [b, h, s, d] stored in that order (BHSD), or stored
 * as [b, s, h, d] (BSHD, the engines' KV caches). */
SIMDATTN_C_API simdattn_tensor simdattn_bhsd(void* data, int32_t dtype,
                                             int64_t b, int64_t h, int64_t s,
                                             int64_t d);
SIMDATTN_C_API simdattn_tensor simdattn_bshd(void* data, int32_t dtype,
                                             int64_t b, int64_t h, int64_t s,
                                             int64_t d);

/* ------------------------------------------------------------ options */

typedef enum simdattn_alignment {
  /* Allowed only where the two agree (Lq = Lk without kv lengths) or where
   * nothing uses p(i); elsewhere SIMDATTN_INVALID_ARGUMENT. */
  SIMDATTN_ALIGN_UNSET = 0,
  SIMDATTN_ALIGN_TOP_LEFT = 1,    /* p(i) = i (PyTorch is_causal) */
  SIMDATTN_ALIGN_BOTTOM_RIGHT = 2 /* p(i) = i + Lk_b - Lq (KV cache) */
} simdattn_alignment;

/* Every option of SEMANTICS.md. simdattn_options_init() sets the defaults:
 * plain softmax(Q K^T / sqrt(Dk)) V. Arrays come with their lengths, which
 * must equal the extent they index (Hq for slopes and sinks, B for kv
 * lengths). */
typedef struct simdattn_options {
  size_t struct_size;     /* sizeof(simdattn_options) */
  int32_t has_scale;      /* 0: scale = 1/sqrt(Dk) */
  float scale;            /* finite, >= 0 */
  int32_t causal;         /* non-zero: hide keys j > p(i) */
  int32_t alignment;      /* simdattn_alignment, for causal, windows, ALiBi */
  int64_t window_left;    /* keys j >= p(i) - window_left; < 0: unbounded */
  int64_t window_right;   /* keys j <= p(i) + window_right; < 0: unbounded */
  float softcap;          /* s = softcap * tanh(s / softcap) when > 0 */
  const float* alibi_slopes; /* [Hq], s -= slope[h] * |p(i) - j|; or NULL */
  int64_t num_alibi_slopes;
  const float* sinks;     /* [Hq] sink logits; or NULL */
  int64_t num_sinks;
  simdattn_tensor mask;   /* bool or additive f32/f16; data NULL = none */
  const void* kv_lengths; /* [B] valid key counts in [0, Lk]; or NULL */
  int32_t kv_lengths_dtype; /* SIMDATTN_I32 or SIMDATTN_I64 */
  int64_t num_kv_lengths;
  float dropout_p;        /* in [0, 1); 0 = off */
  uint64_t dropout_seed;  /* Philox4x32-10 key of the keep mask */
} simdattn_options;

SIMDATTN_C_API void simdattn_options_init(simdattn_options* options);

/* ---------------------------------------------------------- execution */

/* A pool of persistent worker threads (the calling thread works too, so N
 * threads start N - 1 workers). NULL when it cannot be created. */
typedef struct simdattn_pool simdattn_pool;
SIMDATTN_C_API simdattn_pool* simdattn_pool_create(int32_t num_threads);
SIMDATTN_C_API void simdattn_pool_destroy(simdattn_pool* pool);
SIMDATTN_C_API int32_t simdattn_pool_num_threads(const simdattn_pool* pool);

/* A host engine's parallel-for: runs task(task_arg, i) exactly once for
 * every i in [0, num_tasks), on any threads, in any order, and returns when
 * all are done. One call may invoke it several times in sequence. */
typedef void (*simdattn_task_fn)(void* task_arg, int64_t i);
typedef void (*simdattn_parallel_for_fn)(void* user, int64_t num_tasks,
                                         simdattn_task_fn task,
                                         void* task_arg);

/* How a call runs. simdattn_exec_init() sets: the process-wide pool, no
 * workspace, no cap. Priority: parallel_for, then pool, then the
 * process-wide pool of hardware_concurrency() threads. */
typedef struct simdattn_exec {
  size_t struct_size; /* sizeof(simdattn_exec) */
  simdattn_pool* pool;
  simdattn_parallel_for_fn parallel_for;
  void* parallel_for_user;
  /* Tasks the parallel-for runs at once (its threads); 0 = the hardware's.
   * Sizes the workspace's scratch slots (a task finding none free waits). */
  int32_t parallel_for_threads;
  /* Caller memory for every buffer of the call, any alignment, at least
   * simdattn_workspace_size() bytes: the call then allocates nothing. One
   * workspace serves one call at a time. NULL: buffers cached per thread
   * (simdattn_release_thread_buffers() frees the calling thread's). */
  void* workspace;
  size_t workspace_bytes;
  /* Caps this call's code path (a name from simdattn_get_info), like
   * simdattn_set_max_target for all calls; NULL or "": no per-call cap. */
  const char* max_target;
} simdattn_exec;

SIMDATTN_C_API void simdattn_exec_init(simdattn_exec* exec);

/* Filled by simdattn_attention() on success when not NULL. A struct_size
 * that ends after num_tasks (a caller built against version 0.2.0's
 * header) gets the fields up to there; the later ones are filled when
 * struct_size covers them. */
typedef struct simdattn_run_info {
  size_t struct_size; /* set by the caller: sizeof(simdattn_run_info) */
  const char* target; /* the code path that ran, e.g. "AVX3_DL" */
  const char* path;   /* "tiled", "decode" or "fused decode" */
  int64_t num_tasks;  /* independent work items handed to the threads */
  /* Bytes of the buffers the call computed in besides its inputs and
   * outputs (bounded by attention.h's "Memory" formula of the shapes), and
   * how many of them it took from the heap (0 in steady state). */
  size_t scratch_bytes;
  size_t bytes_allocated;
} simdattn_run_info;

/* ------------------------------------------------------------- calls */

/* O = softmax(scale * Q K^T + options) V, and LSE (f32 [B, Hq, Lq, 1], the
 * natural-log log-sum-exp of each row) when lse is not NULL. options NULL:
 * the defaults; exec NULL: simdattn_exec_init()'s. info may be NULL.
 * Returns SIMDATTN_OK, or:
 *   SIMDATTN_INVALID_ARGUMENT  a bad argument, named by simdattn_last_error();
 *   SIMDATTN_UNIMPLEMENTED     valid but not covered yet (e.g. Dk > 1024);
 *   SIMDATTN_OUT_OF_MEMORY     never with a workspace; without one, when a
 *                              worker fails mid-call O may be partly written
 *                              (the message says so);
 *   SIMDATTN_INTERNAL          unexpected.
 * Otherwise nothing is written. */
SIMDATTN_C_API int simdattn_attention(const simdattn_tensor* q,
                                      const simdattn_tensor* k,
                                      const simdattn_tensor* v,
                                      const simdattn_tensor* o,
                                      const simdattn_options* options,
                                      const simdattn_tensor* lse,
                                      const simdattn_exec* exec,
                                      simdattn_run_info* info);

/* The workspace bytes simdattn_attention() needs for these inputs, options
 * and executor (outputs do not change it), with the target a call would
 * choose now. Validates like simdattn_attention(). */
SIMDATTN_C_API int simdattn_workspace_size(const simdattn_tensor* q,
                                           const simdattn_tensor* k,
                                           const simdattn_tensor* v,
                                           const simdattn_options* options,
                                           const simdattn_exec* exec,
                                           size_t* bytes);

/* Frees the buffers that calls without a workspace cached on the calling
 * thread; the next such call allocates them again. */
SIMDATTN_C_API void simdattn_release_thread_buffers(void);

/* ------------------------------------------------------------- paged */

/* A paged KV cache (serving.h's PagedKvCache): sequence s has kv_lens[s]
 * keys; its key j lies in page block_table[s * block_table_stride +
 * j / block_size], row j % block_size. k and v are [num_blocks, Hkv,
 * block_size, D] views (simdattn_paged_nhd / _hnd); block_size is a
 * multiple of 8. simdattn_paged_cache_init() sets struct_size and zeros
 * the rest. */
typedef struct simdattn_paged_cache {
  size_t struct_size; /* sizeof(simdattn_paged_cache) */
  simdattn_tensor k;
  simdattn_tensor v;
  const int32_t* block_table;  /* [num_seqs, block_table_stride] */
  int64_t max_blocks_per_seq;
  int64_t block_table_stride;  /* 0: max_blocks_per_seq */
  const int32_t* kv_lens;      /* [num_seqs] */
} simdattn_paged_cache;

SIMDATTN_C_API void simdattn_paged_cache_init(simdattn_paged_cache* cache);

/* Attention of a ragged batch against a paged cache (serving.h's
 * PagedAttention, SEMANTICS.md "Paged attention"): sequence s has queries
 * [cu_seqlens_q[s], cu_seqlens_q[s + 1]) of q [1, Hq, total_q, Dk]
 * (simdattn_token_major), or one query each when cu_seqlens_q is NULL.
 * Causal is bottom-right per sequence unless options->alignment says
 * otherwise; options->kv_lengths must be NULL; exec->workspace must be
 * NULL. Returns as simdattn_attention(). */
SIMDATTN_C_API int simdattn_paged_attention(
    const simdattn_tensor* q, const simdattn_paged_cache* cache,
    int64_t num_seqs, const int32_t* cu_seqlens_q, const simdattn_tensor* o,
    const simdattn_options* options, const simdattn_tensor* lse,
    const simdattn_exec* exec, simdattn_run_info* info);

/* ----------------------------------------------------------- targets */

/* The code paths of this build. Names are static strings, best first. */
typedef struct simdattn_info {
  size_t struct_size; /* set by the caller: sizeof(simdattn_info) */
  const char* const* compiled; /* every code path compiled in */
  int32_t num_compiled;
  const char* const* available; /* those this CPU runs */
  int32_t num_available;
  const char* selected; /* the one the next call runs, after caps */
  /* Why SIMDATTN_MAX_TARGET is ignored (it names no target), or NULL. Valid
   * until the thread's next call into the library. */
  const char* max_target_error;
} simdattn_info;

SIMDATTN_C_API int simdattn_get_info(simdattn_info* info);

/* Caps the code path of every call (as ONEDNN_MAX_CPU_ISA does): the best
 * available target not preferred over `name`. NULL or "" removes the cap
 * and goes back to the SIMDATTN_MAX_TARGET environment variable (a value
 * that names no target fails the first call that sees it; later calls
 * ignore it). SIMDATTN_INVALID_ARGUMENT for an unknown name. */
SIMDATTN_C_API int simdattn_set_max_target(const char* name);

/* ------------------------------------------------------------- append */

/* Views for the serving calls. Token-major [tokens, heads, d] storage (new
 * tokens, q) as the logical [1, heads, tokens, d]; a paged K or V cache as
 * the logical [num_blocks, heads, block_size, d], stored as
 * [num_blocks, block_size, heads, d] ("NHD", vLLM's and FlashAttention's)
 * or [num_blocks, heads, block_size, d] ("HND"). */
SIMDATTN_C_API simdattn_tensor simdattn_token_major(void* data, int32_t dtype,
                                                    int64_t tokens,
                                                    int64_t heads, int64_t d);
SIMDATTN_C_API simdattn_tensor simdattn_paged_nhd(void* data, int32_t dtype,
                                                  int64_t num_blocks,
                                                  int64_t block_size,
                                                  int64_t heads, int64_t d);
SIMDATTN_C_API simdattn_tensor simdattn_paged_hnd(void* data, int32_t dtype,
                                                  int64_t num_blocks,
                                                  int64_t block_size,
                                                  int64_t heads, int64_t d);

/* Rotary position embedding (RoPE) for simdattn_append_kv. Token t at
 * position p = positions[t] rotates the pairs of its first rotary_dim dims
 * by the angle whose cos and sin are cos[p * rotary_dim / 2 + i] and
 * sin[p * rotary_dim / 2 + i] (f32 tables [max_position, rotary_dim / 2]):
 * pair i is dims (2i, 2i + 1) when interleaved (GPT-J), (i, i + rotary_dim
 * / 2) otherwise (GPT-NeoX, Llama); (x, y) becomes (x cos - y sin,
 * y cos + x sin). simdattn_rotary_init() sets: no rotation. */
typedef struct simdattn_rotary {
  size_t struct_size;        /* sizeof(simdattn_rotary) */
  const int32_t* positions;  /* [tokens], each in [0, max_position); NULL: no rotation */
  const float* cos;          /* [max_position, rotary_dim / 2] */
  const float* sin;          /* [max_position, rotary_dim / 2] */
  int64_t max_position;
  int64_t rotary_dim;        /* even, in [2, Dk]; 0: Dk */
  int32_t interleaved;       /* non-zero: GPT-J pairs; 0: NeoX pairs */
} simdattn_rotary;

SIMDATTN_C_API void simdattn_rotary_init(simdattn_rotary* rotary);

/* Writes the K and V of `tokens` new tokens into paged caches: token t goes
 * to page slot_mapping[t] / block_size, row slot_mapping[t] % block_size
 * (vLLM's convention); a negative slot skips the token's K and V. k_new
 * [1, Hkv, tokens, Dk] and v_new [1, Hkv, tokens, Dv] (simdattn_token_major)
 * are converted to their cache's dtype (f32, f16, bf16; k_cache
 * [num_blocks, Hkv, block_size, Dk], v_cache [num_blocks, Hkv, block_size,
 * Dv], block_size a multiple of 8) with round to nearest even. With
 * rotary->positions set, K is rotated (in f32, rounded once) before it is
 * stored, and so is q ([1, Hq, tokens, Dk], in place, every token) when q
 * is not NULL. rotary, q and exec may be NULL; of exec only the executor
 * (pool or parallel-for) is used. Returns SIMDATTN_OK, or
 * SIMDATTN_INVALID_ARGUMENT (two tokens on one slot, a slot or position
 * out of range, mismatched extents, aliasing, ...: simdattn_last_error()
 * names it; nothing is written), SIMDATTN_OUT_OF_MEMORY, SIMDATTN_INTERNAL.
 * SEMANTICS.md, "Appending to a paged cache". */
SIMDATTN_C_API int simdattn_append_kv(const simdattn_tensor* k_new,
                                      const simdattn_tensor* v_new,
                                      const simdattn_tensor* k_cache,
                                      const simdattn_tensor* v_cache,
                                      const int32_t* slot_mapping,
                                      const simdattn_rotary* rotary,
                                      const simdattn_tensor* q,
                                      const simdattn_exec* exec);

/* ------------------------------------------------------------- merge */

/* Merges the results of attention over disjoint sets of keys (split KV
 * caches, context parallelism) into what one call over all the keys gives,
 * up to rounding (docs/SEMANTICS.md "Merging partial results"): outs[i]
 * [B, H, L, Dv] (f32, f16 or bf16, the parts' types may differ) with
 * lses[i] f32 [B, H, L, 1] (natural log, as simdattn_attention writes
 * them), i < num_parts, into out [B, H, L, Dv] (f32, f16 or bf16) and,
 * when lse is not NULL, lse f32 [B, H, L, 1]:
 *   lse = log(sum_i exp(lses[i])),  out = sum_i exp(lses[i] - lse) * outs[i].
 * A part whose LSE is -inf adds nothing (its row is not read); a row no
 * part saw gives out 0 and lse -inf; a NaN LSE gives a NaN row (out and
 * lse), a +inf one out NaN and lse +inf. out may be outs[0] exactly (same
 * data, dtype and strides), lse likewise lses[0]; any other overlap of an
 * output with an input is an error. exec NULL: simdattn_exec_init()'s (its
 * workspace is not used). The same bits for any thread count.
 * Returns SIMDATTN_OK, or SIMDATTN_INVALID_ARGUMENT (named by
 * simdattn_last_error(); nothing written), SIMDATTN_OUT_OF_MEMORY (more
 * than 32 parts are converted on the heap), SIMDATTN_INTERNAL. */
SIMDATTN_C_API int simdattn_merge_states(const simdattn_tensor* outs,
                                         const simdattn_tensor* lses,
                                         int64_t num_parts,
                                         const simdattn_tensor* out,
                                         const simdattn_tensor* lse,
                                         const simdattn_exec* exec);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SIMDATTN_SIMDATTN_H_ */
