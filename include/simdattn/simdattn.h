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
  SIMDATTN_I64 = 5,  /* kv lengths only */
  /* Quantized K/V (SEMANTICS.md "Quantized KV caches"), K and V only: */
  SIMDATTN_INT8 = 6,     /* x = scale * q, options->k_scales / v_scales */
  SIMDATTN_Q8_0 = 7,     /* ggml blocks of 32 (f16 scale, 32 int8): 34
                            bytes; strides[0..2] of its view in bytes */
  SIMDATTN_FP8_E4M3 = 8, /* OCP e4m3, x = k_scale (v_scale) * value */
  SIMDATTN_FP8_E5M2 = 9  /* OCP e5m2, likewise */
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
  /* Quantized K/V: int8's per-token f32 scales [B, Hkv, Lk, 1] (paged:
   * [num_blocks, Hkv, block_size, 1]); data NULL for other formats. */
  simdattn_tensor k_scales;
  simdattn_tensor v_scales;
  /* fp8's per-tensor scales, read only when has_fp8_scales is non-zero
   * (otherwise both are 1); finite, >= 0. */
  int32_t has_fp8_scales;
  float k_scale;
  float v_scale;
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
  /* Non-zero: f32 and f16 Q, K and V may be rounded to bf16 for the
   * products on targets with bf16 matrix units (AVX3_AMX), held to the
   * bf16 bound of SEMANTICS.md. 0 (default): never rounded. */
  int32_t allow_bf16_compute;
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

/* The scales of quantized caches for simdattn_append_kv_quantized
 * (serving.h's QuantizedCacheScales): an int8 cache's scale cache, f32
 * [num_blocks, Hkv, block_size, 1] (the view simdattn_options' k_scales /
 * v_scales take for paged attention), written at each written slot, data
 * NULL for other caches; an fp8 cache's per-tensor scale (finite, > 0), 1
 * for other caches. simdattn_kv_scales_init() sets struct_size, empty
 * scale caches and scales of 1. */
typedef struct simdattn_kv_scales {
  size_t struct_size; /* sizeof(simdattn_kv_scales) */
  simdattn_tensor k_scales;
  simdattn_tensor v_scales;
  float k_scale;
  float v_scale;
} simdattn_kv_scales;

SIMDATTN_C_API void simdattn_kv_scales_init(simdattn_kv_scales* scales);

/* simdattn_append_kv into caches of any K/V dtype: f32, f16, bf16 as
 * there, and SIMDATTN_INT8, _Q8_0, _FP8_E4M3, _FP8_E5M2, whose rows are
 * computed in f32 (K rotated) and quantized as simdattn_quantize_kv does
 * (int8: scale max|x| / 127 per row into scales->k_scales / v_scales;
 * q8_0: per block of 32, D % 32 == 0, byte strides; fp8: x / k_scale
 * (v_scale), saturating). scales may be NULL (no quantized cache).
 * Returns as simdattn_append_kv; a missing, misshaped or superfluous scale
 * is SIMDATTN_INVALID_ARGUMENT naming it, with nothing written. */
SIMDATTN_C_API int simdattn_append_kv_quantized(
    const simdattn_tensor* k_new, const simdattn_tensor* v_new,
    const simdattn_tensor* k_cache, const simdattn_tensor* v_cache,
    const int32_t* slot_mapping, const simdattn_rotary* rotary,
    const simdattn_tensor* q, const simdattn_exec* exec,
    const simdattn_kv_scales* scales);

/* ---------------------------------------------------------- quantize */

/* Stores x (F32, F16 or BF16, logical [d0, d1, d2, D]) in out's quantized
 * format (SIMDATTN_INT8, _Q8_0, _FP8_E4M3, _FP8_E5M2; the same logical
 * shape) with round to nearest even: int8 writes one f32 scale per row
 * (max|x| / 127) to scales ([d0, d1, d2, 1]), q8_0 keeps its scales in its
 * blocks (scales NULL), fp8 stores x / scale (finite, > 0; saturating).
 * scale is 1 except for fp8. Returns SIMDATTN_OK or
 * SIMDATTN_INVALID_ARGUMENT (simdattn_last_error() names the argument;
 * nothing written). SEMANTICS.md, "Quantized KV caches". */
SIMDATTN_C_API int simdattn_quantize_kv(const simdattn_tensor* x,
                                        const simdattn_tensor* out,
                                        const simdattn_tensor* scales,
                                        float scale);

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

/* ------------------------------------------- multi-head attention layer */
/* The C API of simdattn::MultiHeadAttention (simdattn/mha.h): a layer
 * with learned Q, K, V and output projections around the fused attention.
 * Its masks follow PyTorch: a bool mask is non-zero where a key is masked
 * OUT (the opposite of simdattn_options.mask). */

#ifndef SIMDATTN_SIMDATTN_H_MHA_
#define SIMDATTN_SIMDATTN_H_MHA_

#ifdef __cplusplus
extern "C" {
#endif

typedef struct simdattn_mha simdattn_mha;

/* simdattn_mha_config_init(): 0 for every size (0 = the default: Hkv = Hq,
 * D = E / Hq, kdim = vdim = E), bias on, no bias_kv, f32. */
typedef struct simdattn_mha_config {
  size_t struct_size;
  int64_t embed_dim, num_heads, num_kv_heads, head_dim, kdim, vdim;
  int32_t bias;        /* non-zero: the projections have biases */
  int32_t add_bias_kv; /* non-zero: learned bias_k / bias_v key */
  int32_t dtype;       /* storage of the projected Q, K, V inside */
} simdattn_mha_config;

SIMDATTN_C_API void simdattn_mha_config_init(simdattn_mha_config* config);
/* A layer without weights in *out. SIMDATTN_INVALID_ARGUMENT naming the
 * field; *out is NULL on error. */
SIMDATTN_C_API int simdattn_mha_create(const simdattn_mha_config* config,
                                       simdattn_mha** out);
SIMDATTN_C_API void simdattn_mha_destroy(simdattn_mha* layer);

/* A dense row-major weight under its PyTorch or Llama name (mha.h). */
typedef struct simdattn_named_tensor {
  const char* name;
  const void* data;
  int32_t dtype;
  int32_t ndim;
  int64_t shape[4];
} simdattn_named_tensor;

/* Loads and packs every weight (mha.h's LoadWeights): errors name the
 * tensor; on error the layer is unchanged. */
SIMDATTN_C_API int simdattn_mha_load(simdattn_mha* layer,
                                     const simdattn_named_tensor* tensors,
                                     int64_t num, const simdattn_exec* exec);

/* Activations: dense [batch, len, dim] when batch_first, else
 * [len, batch, dim]. */
typedef struct simdattn_mha_tensor {
  void* data;
  int32_t dtype;
  int32_t batch_first;
  int64_t batch, len, dim;
} simdattn_mha_tensor;

/* A PyTorch-convention mask (bool: non-zero = masked out; or f32 added):
 * key_padding_mask [B, Lk]; attn_mask [Lq, Lk] or [B * Hq, Lq, Lk]. */
typedef struct simdattn_mha_mask {
  const void* data; /* NULL: none */
  int32_t dtype;
  int32_t ndim;
  int64_t shape[3];
} simdattn_mha_mask;

/* simdattn_mha_options_init(): no masks, simdattn_options_init()'s
 * attention options, no weights, averaged. weights (f32) receives the
 * softmax weights, [B, Hq, Lq, Lk'] or averaged [B, Lq, Lk'], computed
 * after the attention from its LSE. */
typedef struct simdattn_mha_options {
  size_t struct_size;
  simdattn_mha_mask key_padding_mask;
  simdattn_mha_mask attn_mask;
  simdattn_options attention;
  float* weights;
  int32_t average_weights;
} simdattn_mha_options;

SIMDATTN_C_API void simdattn_mha_options_init(simdattn_mha_options* options);

/* out = the layer over query, key, value (key and value NULL:
 * self-attention). options, exec, info may be NULL. Returns as
 * simdattn_attention(). */
SIMDATTN_C_API int simdattn_mha_forward(
    simdattn_mha* layer, const simdattn_mha_tensor* query,
    const simdattn_mha_tensor* key, const simdattn_mha_tensor* value,
    const simdattn_mha_tensor* out, const simdattn_mha_options* options,
    const simdattn_exec* exec, simdattn_run_info* info);

/* One decoding step: x's tokens appended to the dense cache k_cache,
 * v_cache [B, Hkv, capacity, D] at *length, attended causally
 * (bottom-right) over all *length + T keys; *length advances. */
SIMDATTN_C_API int simdattn_mha_step(simdattn_mha* layer,
                                     const simdattn_mha_tensor* x,
                                     const simdattn_tensor* k_cache,
                                     const simdattn_tensor* v_cache,
                                     int64_t* length,
                                     const simdattn_mha_tensor* out,
                                     const simdattn_mha_options* options,
                                     const simdattn_exec* exec,
                                     simdattn_run_info* info);

/* RoPE of simdattn_mha_step_paged (mha.h's MhaRotary).
 * simdattn_mha_rotary_init(): off, rotary_dim 0 (= D), NeoX pairs, no
 * tables (built from theta), theta 10000. */
typedef struct simdattn_mha_rotary {
  size_t struct_size;
  int32_t enabled;
  int32_t interleaved;  /* non-zero: pairs (2i, 2i + 1) (GPT-J) */
  int64_t rotary_dim;
  const float* cos;     /* [max_position, rotary_dim / 2], or NULL */
  const float* sin;
  int64_t max_position;
  double theta;
} simdattn_mha_rotary;

SIMDATTN_C_API void simdattn_mha_rotary_init(simdattn_mha_rotary* rotary);

/* One decoding step on a paged cache (mha.h's StepPaged): k_cache and
 * v_cache [num_blocks, Hkv, block_size, D] (simdattn_paged_nhd or _hnd),
 * entry b's token j in page block_table[b * block_table_stride + j /
 * block_size] (stride 0: max_blocks_per_seq); x's T tokens of entry b go to
 * positions [seq_lens[b], seq_lens[b] + T), rotated by rotary (NULL: none),
 * and seq_lens advances by T. options, exec, info may be NULL. */
SIMDATTN_C_API int simdattn_mha_step_paged(
    simdattn_mha* layer, const simdattn_mha_tensor* x,
    const simdattn_tensor* k_cache, const simdattn_tensor* v_cache,
    const int32_t* block_table, int64_t max_blocks_per_seq,
    int64_t block_table_stride, int32_t* seq_lens,
    const simdattn_mha_rotary* rotary, const simdattn_mha_tensor* out,
    const simdattn_mha_options* options, const simdattn_exec* exec,
    simdattn_run_info* info);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SIMDATTN_SIMDATTN_H_MHA_ */
