// MultiHeadAttention::StepPaged: one decoding step against a paged KV cache,
// through the serving calls (AppendKv with RoPE, then PagedAttention).

#include <algorithm>
#include <cmath>
#include <string>

#include "lib/dtype.h"
#include "lib/mha/mha_internal.h"
#include "simdattn/serving.h"

namespace simdattn {
namespace {

Status CheckPagedStep(const MhaConfig& c, const MhaTensor& x, const MhaPagedKvCache* cache,
                      const MutableMhaTensor& out) {
  if (x.data == nullptr || x.batch < 1 || x.len < 1 || x.dim != c.embed_dim) {
    return Invalid("x: want [batch >= 1, tokens >= 1, " + std::to_string(c.embed_dim) + "]");
  }
  if (!x.batch_first && x.len > 1) {
    return Unimplemented("x: batch_first = false with " + std::to_string(x.len) +
                         " tokens (StepPaged takes one token per entry in that layout)");
  }
  if (out.data == nullptr || out.batch != x.batch || out.len != x.len ||
      out.dim != c.embed_dim || out.batch_first != x.batch_first) {
    return Invalid("out: want the shape and layout of x");
  }
  if (cache == nullptr) return Invalid("cache is null");
  if (cache->block_table == nullptr) return Invalid("cache->block_table is null");
  if (cache->seq_lens == nullptr) return Invalid("cache->seq_lens is null");
  if (cache->max_blocks_per_seq < 1) {
    return Invalid("cache->max_blocks_per_seq = " + std::to_string(cache->max_blocks_per_seq) +
                   " (want >= 1)");
  }
  const int64_t block_size = cache->k.shape[2];
  const int64_t capacity = cache->max_blocks_per_seq * block_size;
  for (int64_t b = 0; b < x.batch; ++b) {
    const int64_t len = cache->seq_lens[b];
    if (len < 0 || len + x.len > capacity) {
      return Invalid("cache->seq_lens[" + std::to_string(b) + "] = " + std::to_string(len) +
                     " + " + std::to_string(x.len) + " new tokens: want within [0, " +
                     std::to_string(capacity) + "] (max_blocks_per_seq x block_size)");
    }
  }
  return Status::Ok();
}

Status CheckRotary(const MhaRotary& r, int64_t head_dim) {
  const int64_t rd = r.rotary_dim == 0 ? head_dim : r.rotary_dim;
  if (rd < 2 || rd > head_dim || rd % 2 != 0) {
    return Invalid("options.rotary.rotary_dim = " + std::to_string(r.rotary_dim) +
                   ": want even, in [2, head_dim = " + std::to_string(head_dim) + "] or 0");
  }
  if ((r.cos == nullptr) != (r.sin == nullptr)) {
    return Invalid("options.rotary: give both cos and sin tables or neither");
  }
  if (r.cos == nullptr && !(r.theta > 0.0 && std::isfinite(r.theta))) {
    return Invalid("options.rotary.theta = " + std::to_string(r.theta) + " (want > 0)");
  }
  return Status::Ok();
}

// The layer's kept cos/sin tables for theta and rd, at least `positions`
// rows: rebuilt when theta or rd change or more rows are needed.
Status BuildRopeTables(MultiHeadAttention::Impl* m, double theta, int64_t rd,
                       int64_t positions) {
  if (m->rope_theta == theta && m->rope_dim == rd && m->rope_positions >= positions) {
    return Status::Ok();
  }
  const int64_t half = rd / 2;
  try {
    m->rope_cos.resize(size_t(positions * half));
    m->rope_sin.resize(size_t(positions * half));
  } catch (...) {
    Status s;
    s.code = StatusCode::kOutOfMemory;
    s.message = "cannot allocate the RoPE tables";
    return s;
  }
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq = std::pow(theta, -2.0 * double(i) / double(rd));
    for (int64_t p = 0; p < positions; ++p) {
      const double angle = double(p) * inv_freq;
      m->rope_cos[size_t(p * half + i)] = float(std::cos(angle));
      m->rope_sin[size_t(p * half + i)] = float(std::sin(angle));
    }
  }
  m->rope_theta = theta;
  m->rope_dim = rd;
  m->rope_positions = positions;
  return Status::Ok();
}

// Slots, positions, kv_lens and cu_seqlens_q of the step's B x T token
// rows (row b T + t: batch_first, or T = 1), in *m's kept vectors.
Status Placement(MultiHeadAttention::Impl* m, const MhaPagedKvCache& cache, int64_t B,
                 int64_t T) {
  const int64_t bs = cache.k.shape[2];
  const int64_t stride = cache.block_table_stride != 0 ? cache.block_table_stride
                                                       : cache.max_blocks_per_seq;
  try {
    m->slots.resize(size_t(B * T));
    m->positions.resize(size_t(B * T));
    m->kv_lens.resize(size_t(B));
    m->cu_q.resize(size_t(B + 1));
  } catch (...) {
    Status s;
    s.code = StatusCode::kOutOfMemory;
    s.message = "cannot allocate the step's slot mapping";
    return s;
  }
  m->cu_q[0] = 0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t pos = cache.seq_lens[b] + t;
      const int64_t entry = b * stride + pos / bs;
      const int64_t page = cache.block_table[entry];
      if (page < 0 || page >= cache.k.shape[0]) {  // a negative slot would skip the token
        return Invalid("cache->block_table[" + std::to_string(entry) + "] = " +
                       std::to_string(page) + ": want a page in [0, " +
                       std::to_string(cache.k.shape[0]) + ")");
      }
      m->positions[size_t(b * T + t)] = int32_t(pos);
      m->slots[size_t(b * T + t)] = int32_t(page * bs + pos % bs);
    }
    m->kv_lens[size_t(b)] = int32_t(cache.seq_lens[b] + T);
    m->cu_q[size_t(b + 1)] = int32_t((b + 1) * T);
  }
  return Status::Ok();
}

// [1, heads, rows, D] over columns [col, col + heads D) of rows ld apart.
MutableTensorView TokenRows(void* data, DType dt, int64_t ld, int64_t col, int64_t heads,
                            int64_t rows, int64_t d) {
  MutableTensorView v;
  v.data = static_cast<unsigned char*>(data) + col * DTypeSize(dt);
  v.dtype = dt;
  v.shape[0] = 1, v.shape[1] = heads, v.shape[2] = rows, v.shape[3] = d;
  v.strides[0] = heads * d, v.strides[1] = d, v.strides[2] = ld, v.strides[3] = 1;
  return v;
}

}  // namespace

Status MultiHeadAttention::StepPaged(const MhaTensor& x, MhaPagedKvCache* cache,
                                     const MutableMhaTensor& out,
                                     const MhaForwardOptions& options,
                                     const ExecutionOptions& exec, RunInfo* info) {
  Impl& m = *impl_;
  const MhaConfig& c = m.config;
  if (!m.loaded) return Invalid("layer: weights not loaded (LoadWeights)");
  if (!m.fused || c.add_bias_kv) {
    return Unimplemented("StepPaged needs kdim = vdim = embed_dim and no add_bias_kv");
  }
  if (options.key_padding_mask.data != nullptr || options.attn_mask.data != nullptr ||
      options.weights != nullptr) {
    return Unimplemented("StepPaged: key_padding_mask, attn_mask and weights");
  }
  Status s = CheckPagedStep(c, x, cache, out);
  if (s.ok() && options.rotary.enabled) s = CheckRotary(options.rotary, c.head_dim);
  if (!s.ok()) return s;
  std::lock_guard<std::mutex> lock(m.mutex);
  const DType dt = c.dtype;
  const int64_t B = x.batch, T = x.len, D = c.head_dim, ld = m.nq + 2 * m.nkv;
  s = Placement(&m, *cache, B, T);
  RotaryEmbedding rope;
  if (s.ok() && options.rotary.enabled) {
    const MhaRotary& r = options.rotary;
    rope.positions = m.positions.data();
    rope.rotary_dim = r.rotary_dim == 0 ? D : r.rotary_dim;
    rope.interleaved = r.interleaved;
    rope.cos = r.cos, rope.sin = r.sin, rope.max_position = r.max_position;
    if (r.cos == nullptr) {
      const int64_t needed = *std::max_element(m.kv_lens.begin(), m.kv_lens.end());
      s = BuildRopeTables(&m, r.theta, rope.rotary_dim, needed);
      rope.cos = m.rope_cos.data(), rope.sin = m.rope_sin.data();
      rope.max_position = m.rope_positions;
    }
  }
  if (s.ok()) s = MhaReserve(&m.qkv, size_t(B * T * ld * DTypeSize(dt)), "the projected Q, K, V");
  if (s.ok()) s = MhaReserve(&m.o, size_t(B * T * m.nq * DTypeSize(dt)), "the attention output");
  if (s.ok()) s = Gemm({x.data, x.dtype, B * T, x.dim}, m.in_packs[0], 0, 3, m.qkv.data(), dt, ld, exec);
  if (!s.ok()) return s;
  const MutableTensorView q = TokenRows(m.qkv.data(), dt, ld, 0, c.num_heads, B * T, D);
  const MutableTensorView k = TokenRows(m.qkv.data(), dt, ld, m.nq, c.num_kv_heads, B * T, D);
  const MutableTensorView v =
      TokenRows(m.qkv.data(), dt, ld, m.nq + m.nkv, c.num_kv_heads, B * T, D);
  s = AppendKv(k, v, cache->k, cache->v, m.slots.data(), rope,
               options.rotary.enabled ? q : MutableTensorView(), exec);
  if (!s.ok()) return s;
  PagedKvCache pc;
  pc.k = cache->k;
  pc.v = cache->v;
  pc.block_table = cache->block_table;
  pc.max_blocks_per_seq = cache->max_blocks_per_seq;
  pc.block_table_stride = cache->block_table_stride;
  pc.kv_lens = m.kv_lens.data();
  AttentionOptions opts = options.attention;
  opts.causal = true;
  const MutableTensorView o = TokenRows(m.o.data(), dt, m.nq, 0, c.num_heads, B * T, D);
  s = PagedAttention(q, pc, B, m.cu_q.data(), o, opts, {}, exec, info);
  if (s.ok()) s = Gemm({m.o.data(), dt, B * T, m.nq}, m.out_pack, 0, 1, out.data, out.dtype, c.embed_dim, exec);
  if (!s.ok()) return s;
  for (int64_t b = 0; b < B; ++b) cache->seq_lens[b] += int32_t(T);
  return Status::Ok();
}

}  // namespace simdattn
