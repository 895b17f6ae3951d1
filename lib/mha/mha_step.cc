// MultiHeadAttention::Step: one decoding step against a dense KV cache, as
// an engine's decoder layer runs it per token.

#include <string>

#include "lib/dtype.h"
#include "lib/mha/mha_internal.h"

namespace simdattn {
namespace {

float LoadF(const void* data, DType t, int64_t i) {
  if (t == DType::kF32) return static_cast<const float*>(data)[i];
  const uint16_t h = static_cast<const uint16_t*>(data)[i];
  return t == DType::kBF16 ? BF16ToF32(h) : F16ToF32(h);
}

void StoreF(void* data, DType t, int64_t i, float x) {
  if (t == DType::kF32) {
    static_cast<float*>(data)[i] = x;
  } else {
    static_cast<uint16_t*>(data)[i] = t == DType::kBF16 ? F32ToBF16(x) : F32ToF16(x);
  }
}

Status CheckCache(const MhaConfig& c, const MhaKvCache* cache, int64_t batch, int64_t tokens) {
  if (cache == nullptr) return Invalid("cache is null");
  const MutableTensorView* views[2] = {&cache->k, &cache->v};
  const char* names[2] = {"cache.k", "cache.v"};
  for (int i = 0; i < 2; ++i) {
    const MutableTensorView& t = *views[i];
    const std::string n = names[i];
    if (t.data == nullptr) return Invalid(n + ".data is null");
    if (t.dtype != DType::kF32 && t.dtype != DType::kF16 && t.dtype != DType::kBF16) {
      return Invalid(n + ".dtype = " + DTypeName(t.dtype));
    }
    if (t.shape[0] != batch || t.shape[1] != c.num_kv_heads || t.shape[3] != c.head_dim) {
      return Invalid(n + ": shape [" + std::to_string(t.shape[0]) + ", " +
                     std::to_string(t.shape[1]) + ", " + std::to_string(t.shape[2]) + ", " +
                     std::to_string(t.shape[3]) + "], want [" + std::to_string(batch) +
                     ", " + std::to_string(c.num_kv_heads) + ", capacity, " +
                     std::to_string(c.head_dim) + "]");
    }
  }
  if (cache->length < 0 || cache->length + tokens > cache->k.shape[2] ||
      cache->length + tokens > cache->v.shape[2]) {
    return Invalid("cache->length = " + std::to_string(cache->length) + " + " +
                   std::to_string(tokens) + " new tokens exceeds the capacity " +
                   std::to_string(cache->k.shape[2]));
  }
  return Status::Ok();
}

}  // namespace

Status MultiHeadAttention::Step(const MhaTensor& x, MhaKvCache* cache,
                                const MutableMhaTensor& out, const MhaForwardOptions& options,
                                const ExecutionOptions& exec, RunInfo* info) {
  Impl& m = *impl_;
  const MhaConfig& c = m.config;
  if (!m.loaded) return Invalid("layer: weights not loaded (LoadWeights)");
  if (!m.fused || c.add_bias_kv) {
    return Unimplemented("Step needs kdim = vdim = embed_dim and no add_bias_kv");
  }
  if (options.key_padding_mask.data != nullptr || options.attn_mask.data != nullptr ||
      options.weights != nullptr) {
    return Unimplemented("Step: key_padding_mask, attn_mask and weights (use attention.*)");
  }
  if (options.rotary.enabled) return Unimplemented("options.rotary: StepPaged only");
  if (x.data == nullptr || x.batch < 1 || x.len < 1 || x.dim != c.embed_dim) {
    return Invalid("x: want [batch >= 1, tokens >= 1, " + std::to_string(c.embed_dim) + "]");
  }
  if (out.data == nullptr || out.batch != x.batch || out.len != x.len ||
      out.dim != c.embed_dim || out.batch_first != x.batch_first) {
    return Invalid("out: want the shape and layout of x");
  }
  Status s = CheckCache(c, cache, x.batch, x.len);
  if (!s.ok()) return s;
  std::lock_guard<std::mutex> lock(m.mutex);
  const DType dt = c.dtype;
  const int64_t B = x.batch, T = x.len, D = c.head_dim, ld = m.nq + 2 * m.nkv;
  s = MhaReserve(&m.qkv, size_t(B * T * ld * DTypeSize(dt)), "the projected Q, K, V");
  if (s.ok()) s = MhaReserve(&m.o, size_t(B * T * m.nq * DTypeSize(dt)), "the attention output");
  if (s.ok()) s = Gemm({x.data, x.dtype, B * T, x.dim}, m.in_packs[0], 0, 3, m.qkv.data(), dt, ld, exec);
  if (!s.ok()) return s;
  const int64_t start = cache->length;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t row = MhaRow(x.batch_first, B, T, b, t) * ld;
      for (int64_t h = 0; h < c.num_kv_heads; ++h) {
        for (int64_t d = 0; d < D; ++d) {
          const MutableTensorView& kc = cache->k;
          const MutableTensorView& vc = cache->v;
          const int64_t ki = b * kc.strides[0] + h * kc.strides[1] + (start + t) * kc.strides[2] + d;
          const int64_t vi = b * vc.strides[0] + h * vc.strides[1] + (start + t) * vc.strides[2] + d;
          StoreF(kc.data, kc.dtype, ki, LoadF(m.qkv.data(), dt, row + m.nq + h * D + d));
          StoreF(vc.data, vc.dtype, vi, LoadF(m.qkv.data(), dt, row + m.nq + m.nkv + h * D + d));
        }
      }
    }
  }
  TensorView kv = cache->k, vv = cache->v;
  kv.shape[2] = vv.shape[2] = start + T;
  const TensorView qv = MhaHeadsView(m.qkv.data(), dt, ld, 0, x.batch_first, B, c.num_heads, T, D);
  TensorView o = MhaHeadsView(m.o.data(), dt, m.nq, 0, x.batch_first, B, c.num_heads, T, D);
  MutableTensorView ov;
  ov.data = m.o.data();
  ov.dtype = dt;
  for (int i = 0; i < 4; ++i) ov.shape[i] = o.shape[i], ov.strides[i] = o.strides[i];
  AttentionOptions opts = options.attention;
  opts.causal = true;
  if (!opts.alignment.has_value()) opts.alignment = Alignment::kBottomRight;
  s = Attention(qv, kv, vv, ov, opts, {}, exec, info);
  if (s.ok()) s = Gemm({m.o.data(), dt, B * T, m.nq}, m.out_pack, 0, 1, out.data, out.dtype, c.embed_dim, exec);
  if (s.ok()) cache->length = start + T;
  return s;
}

}  // namespace simdattn
