/* One decode step through the C API, as an engine makes it: f32 queries
 * against a KV cache stored [B, S, Hkv, D] (BSHD) whose sequences hold
 * different numbers of tokens (int32 lengths), grouped-query heads, the
 * engine's own memory for every buffer (a workspace: the call allocates
 * nothing) and a thread pool. It checks O against a plain loop in double.
 * Build: cc -std=c99 decode.c $(pkg-config --cflags --libs --static simdattn) */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <simdattn/simdattn.h>

enum { B = 2, HQ = 8, HKV = 2, LK = 300, D = 64 };

/* Element (b, h, s, d) of a BSHD cache. */
static size_t Bshd(int b, int h, int s, int d) {
  return (((size_t)b * LK + (size_t)s) * HKV + (size_t)h) * D + (size_t)d;
}

/* O[b, h, 0, :] in double: softmax over the first len keys of KV head
 * h / (HQ / HKV), scale 1/sqrt(D). */
static double MaxError(const float* q, const float* k, const float* v,
                       const float* o, const int32_t* lens) {
  double worst = 0.0;
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < HQ; ++h) {
      const int hkv = h / (HQ / HKV);
      double s[LK], m = -INFINITY, z = 0.0;
      for (int j = 0; j < lens[b]; ++j) {
        double dot = 0.0;
        for (int d = 0; d < D; ++d) {
          dot += (double)q[((size_t)b * HQ + h) * D + d] * k[Bshd(b, hkv, j, d)];
        }
        s[j] = dot / sqrt((double)D);
        if (s[j] > m) m = s[j];
      }
      for (int j = 0; j < lens[b]; ++j) z += exp(s[j] - m);
      for (int d = 0; d < D; ++d) {
        double acc = 0.0;
        for (int j = 0; j < lens[b]; ++j) acc += exp(s[j] - m) / z * v[Bshd(b, hkv, j, d)];
        const double err = fabs(acc - o[((size_t)b * HQ + h) * D + d]);
        if (err > worst) worst = err;
      }
    }
  }
  return worst;
}

static int Fail(const char* what, int status) {
  fprintf(stderr, "decode: %s: %s: %s\n", what, simdattn_status_name(status),
          simdattn_last_error());
  return 1;
}

int main(void) {
  static float q[B * HQ * D], k[B * LK * HKV * D], v[B * LK * HKV * D], o[B * HQ * D];
  const int32_t lens[B] = {300, 123}; /* tokens in each sequence's cache */
  size_t i;
  for (i = 0; i < sizeof(q) / sizeof(q[0]); ++i) q[i] = (float)sin(0.1 * (double)i);
  for (i = 0; i < sizeof(k) / sizeof(k[0]); ++i) {
    k[i] = (float)cos(0.37 * (double)i);
    v[i] = (float)sin(0.011 * (double)i);
  }

  const simdattn_tensor tq = simdattn_bhsd(q, SIMDATTN_F32, B, HQ, 1, D);
  const simdattn_tensor tk = simdattn_bshd(k, SIMDATTN_F32, B, HKV, LK, D);
  const simdattn_tensor tv = simdattn_bshd(v, SIMDATTN_F32, B, HKV, LK, D);
  const simdattn_tensor to = simdattn_bhsd(o, SIMDATTN_F32, B, HQ, 1, D);

  simdattn_options options;
  simdattn_options_init(&options);
  options.causal = 1; /* the last query sits at its sequence's last key */
  options.alignment = SIMDATTN_ALIGN_BOTTOM_RIGHT;
  options.kv_lengths = lens;
  options.kv_lengths_dtype = SIMDATTN_I32;
  options.num_kv_lengths = B;

  simdattn_exec exec;
  simdattn_exec_init(&exec);
  exec.pool = simdattn_pool_create(2);
  if (exec.pool == NULL) return Fail("simdattn_pool_create", SIMDATTN_OUT_OF_MEMORY);
  int status = simdattn_workspace_size(&tq, &tk, &tv, &options, &exec, &exec.workspace_bytes);
  if (status != SIMDATTN_OK) return Fail("simdattn_workspace_size", status);
  exec.workspace = malloc(exec.workspace_bytes);
  if (exec.workspace == NULL) return Fail("malloc", SIMDATTN_OUT_OF_MEMORY);

  simdattn_run_info info;
  info.struct_size = sizeof(info);
  status = simdattn_attention(&tq, &tk, &tv, &to, &options, NULL, &exec, &info);
  if (status != SIMDATTN_OK) return Fail("simdattn_attention", status);
  const double err = MaxError(q, k, v, o, lens);
  printf("decode: simdattn %s (ABI %d) ran %s on %s; workspace %zu bytes; "
         "max |O - O_ref| = %.2e\n",
         simdattn_version(), simdattn_abi_version(), info.path, info.target,
         exec.workspace_bytes, err);

  /* A bad call: a length that is not in [0, Lk]. */
  int32_t bad[B] = {301, 1};
  options.kv_lengths = bad;
  status = simdattn_attention(&tq, &tk, &tv, &to, &options, NULL, &exec, NULL);
  printf("decode: a length of 301 gives '%s': %s\n", simdattn_status_name(status),
         simdattn_last_error());

  free(exec.workspace);
  simdattn_pool_destroy(exec.pool);
  return err < 2e-5 && status == SIMDATTN_INVALID_ARGUMENT ? 0 : 1;
}
