// Argument checking for AppendKv: the views, their agreement, the rotary
// tables, the slots (in range, no two tokens on one slot) and aliasing.
// Every error names the argument and the offending value.

#include "lib/append_validate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "lib/quant.h"
#include "lib/status.h"
#include "lib/validate.h"

namespace simdattn {
namespace {

// Names of the logical dimensions, for messages.
using DimNames = const char* const[4];
constexpr DimNames kNewK = {"1", "Hkv", "tokens", "Dk"};
constexpr DimNames kNewV = {"1", "Hkv", "tokens", "Dv"};
constexpr DimNames kCacheK = {"num_blocks", "Hkv", "block_size", "Dk"};
constexpr DimNames kCacheV = {"num_blocks", "Hkv", "block_size", "Dv"};
constexpr DimNames kQ = {"1", "Hq", "tokens", "Dk"};

// One view alone: storage dtype (any K/V dtype for a cache), positive
// extents (extent 2 may be 0 when `tokens_dim`: no new tokens), data for a
// non-empty view, unit last stride, q8_0's D % 32 == 0, offsets within
// int64. *range is empty for an empty view.
Status CheckView(const char* name, DimNames& dims, const TensorView& v,
                 bool tokens_dim, ByteRange* range, bool cache = false) {
  std::ostringstream os;
  if (cache ? !IsKvType(v.dtype) : !IsStorageType(v.dtype)) {
    os << name << ".dtype = "
       << (KnownDType(v.dtype) ? DTypeName(v.dtype) : "unknown")
       << (cache ? ": must be f32, f16, bf16, int8, q8_0, fp8_e4m3 or fp8_e5m2"
                 : ": must be f32, f16 or bf16");
    return Invalid(os.str());
  }
  for (int i = 0; i < 4; ++i) {
    if (v.shape[i] > 0 || (tokens_dim && i == 2 && v.shape[i] == 0)) continue;
    os << name << ".shape[" << i << "] (" << dims[i] << ") = " << v.shape[i]
       << ": must be positive";
    return Invalid(os.str());
  }
  int64_t count = 1;
  for (int i = 0; i < 4; ++i) {
    if (__builtin_mul_overflow(count, v.shape[i], &count)) {
      return Invalid(std::string(name) + ".shape " + ShapeString(v.shape) +
                     ": element count overflows int64");
    }
  }
  *range = ByteRange();
  if (count == 0) return Status::Ok();
  if (v.data == nullptr) {
    return Invalid(std::string(name) + ".data is null with shape " +
                   ShapeString(v.shape));
  }
  if (v.strides[3] != 1) {
    os << name << ".strides[3] = " << v.strides[3]
       << ": the last dimension must be contiguous (stride 1)";
    return Invalid(os.str());
  }
  if (v.dtype == DType::kQ8_0 && v.shape[3] % kQ8Block != 0) {
    os << name << ".shape[3] (" << dims[3] << ") = " << v.shape[3]
       << ": q8_0 needs a multiple of 32 (its blocks of 32 values)";
    return Invalid(os.str());
  }
  if (!ComputeRange(v.data, v.dtype, v.shape, v.strides, range)) {
    return Invalid(std::string(name) + ": offsets of shape " +
                   ShapeString(v.shape) + " with its strides overflow int64");
  }
  return Status::Ok();
}

// A view as the bytes it covers: a q8_0 view (strides[0..2] already in
// bytes) as one of int8 bytes whose rows are its D / 32 blocks of 34
// bytes; any other view unchanged. For the overlap checks.
TensorView AsBytes(const TensorView& v) {
  if (v.dtype != DType::kQ8_0) return v;
  TensorView b = v;
  b.dtype = DType::kInt8;
  b.shape[3] = Q8_0RowBytes(v.shape[3]);
  return b;
}

// One extent of `name` against the value `want` it must have.
Status CheckExtent(const char* name, DimNames& dims, const TensorView& v,
                   int i, int64_t want, const char* why) {
  if (v.shape[i] == want) return Status::Ok();
  std::ostringstream os;
  os << name << ".shape[" << i << "] (" << dims[i] << ") = " << v.shape[i]
     << " but " << why << " = " << want;
  return Invalid(os.str());
}

// Token-major views have one batch entry: their tokens are extent 2.
Status CheckUnitBatch(const char* name, const char* shape, const TensorView& v) {
  if (v.shape[0] == 1) return Status::Ok();
  return Invalid(std::string(name) + ".shape[0] = " + std::to_string(v.shape[0]) +
                 ": must be 1 (the logical shape is " + shape + ")");
}

// The four K/V views against each other; fills the extents of *p.
Status CheckKvExtents(const TensorView& kn, const TensorView& vn,
                      const TensorView& kc, const TensorView& vc,
                      AppendProblem* p) {
  const struct {
    const char* name;
    DimNames& dims;
    const TensorView& v;
    int i;
    int64_t want;
    const char* why;
  } checks[] = {
      {"v_new", kNewV, vn, 1, kn.shape[1], "k_new.shape[1] (Hkv)"},
      {"v_new", kNewV, vn, 2, kn.shape[2], "k_new.shape[2] (tokens)"},
      {"k_cache", kCacheK, kc, 1, kn.shape[1], "k_new.shape[1] (Hkv)"},
      {"k_cache", kCacheK, kc, 3, kn.shape[3], "k_new.shape[3] (Dk)"},
      {"v_cache", kCacheV, vc, 0, kc.shape[0], "k_cache.shape[0] (num_blocks)"},
      {"v_cache", kCacheV, vc, 1, kn.shape[1], "k_new.shape[1] (Hkv)"},
      {"v_cache", kCacheV, vc, 2, kc.shape[2], "k_cache.shape[2] (block_size)"},
      {"v_cache", kCacheV, vc, 3, vn.shape[3], "v_new.shape[3] (Dv)"},
  };
  Status s = CheckUnitBatch("k_new", "[1, Hkv, tokens, Dk]", kn);
  if (s.ok()) s = CheckUnitBatch("v_new", "[1, Hkv, tokens, Dv]", vn);
  if (!s.ok()) return s;
  for (const auto& c : checks) {
    s = CheckExtent(c.name, c.dims, c.v, c.i, c.want, c.why);
    if (!s.ok()) return s;
  }
  if (kc.shape[2] % 8 != 0) {
    return Invalid("k_cache.shape[2] (block_size) = " +
                   std::to_string(kc.shape[2]) + ": must be a multiple of 8");
  }
  const TensorView kb = AsBytes(kc), vb = AsBytes(vc);
  if (SelfOverlaps(kb.shape, kb.strides)) {
    return Invalid("k_cache.strides make distinct elements of k_cache share memory");
  }
  if (SelfOverlaps(vb.shape, vb.strides)) {
    return Invalid("v_cache.strides make distinct elements of v_cache share memory");
  }
  p->tokens = kn.shape[2];
  p->kv_heads = kn.shape[1];
  p->head_dim_k = kn.shape[3];
  p->head_dim_v = vn.shape[3];
  p->num_blocks = kc.shape[0];
  p->block_size = kc.shape[2];
  return Status::Ok();
}

// The rotary tables and positions; sets p->rotary_dim (0: no rotation).
// *table_bytes is the size of each of cos and sin.
Status CheckRotary(const RotaryEmbedding& r, AppendProblem* p,
                   int64_t* table_bytes) {
  std::ostringstream os;
  *table_bytes = 0;
  p->rotary_dim = 0;
  if (r.positions == nullptr) return Status::Ok();
  if (r.cos == nullptr) return Invalid("rotary.cos is null but rotary.positions is set");
  if (r.sin == nullptr) return Invalid("rotary.sin is null but rotary.positions is set");
  if (r.max_position <= 0) {
    os << "rotary.max_position = " << r.max_position << ": must be positive";
    return Invalid(os.str());
  }
  const int64_t dim = r.rotary_dim == 0 ? p->head_dim_k : r.rotary_dim;
  if (dim < 2 || dim > p->head_dim_k || dim % 2 != 0) {
    os << "rotary.rotary_dim = " << r.rotary_dim
       << (r.rotary_dim == 0 ? " (Dk)" : "") << ": must be even and in [2, Dk = "
       << p->head_dim_k << "] (0: Dk)";
    return Invalid(os.str());
  }
  if (__builtin_mul_overflow(r.max_position, dim / 2 * 4, table_bytes)) {
    os << "rotary.max_position = " << r.max_position << " with rotary_dim = "
       << dim << ": the size of the cos/sin tables overflows int64";
    return Invalid(os.str());
  }
  for (int64_t t = 0; t < p->tokens; ++t) {
    const int32_t pos = r.positions[t];
    if (pos < 0 || pos >= r.max_position) {
      os << "rotary.positions[" << t << "] = " << pos
         << ": must be in [0, rotary.max_position = " << r.max_position << ")";
      return Invalid(os.str());
    }
  }
  p->rotary_dim = dim;
  return Status::Ok();
}

// The optional q ([1, Hq, tokens, Dk], rotated in place); sets p->q_heads
// and p->rotate_q.
Status CheckQ(const MutableTensorView& q, AppendProblem* p, ByteRange* range) {
  *range = ByteRange();
  const bool absent = q.shape[0] == 0 && q.shape[1] == 0 && q.shape[2] == 0 &&
                      q.shape[3] == 0;
  if (q.data == nullptr && absent) return Status::Ok();
  Status s = CheckView("q", kQ, q, true, range);
  if (!s.ok()) return s;
  if (q.data == nullptr) return Status::Ok();  // no tokens: nothing to rotate
  if (p->rotary_dim == 0) {
    return Invalid("q.data is set but rotary.positions is null: q is only "
                   "written to rotate it");
  }
  const TensorView v = q;
  s = CheckUnitBatch("q", "[1, Hq, tokens, Dk]", v);
  if (s.ok()) s = CheckExtent("q", kQ, v, 2, p->tokens, "k_new.shape[2] (tokens)");
  if (s.ok()) s = CheckExtent("q", kQ, v, 3, p->head_dim_k, "k_new.shape[3] (Dk)");
  if (!s.ok()) return s;
  if (q.shape[1] % p->kv_heads != 0) {
    return Invalid("q.shape[1] (Hq) = " + std::to_string(q.shape[1]) +
                   " is not a multiple of Hkv = " + std::to_string(p->kv_heads));
  }
  if (SelfOverlaps(q.shape, q.strides)) {
    return Invalid("q.strides make distinct elements of q share memory");
  }
  p->q_heads = q.shape[1];
  p->rotate_q = true;
  return Status::Ok();
}

// The scales of one cache (`side` "k" or "v"): an int8 cache's scale
// cache, f32 [num_blocks, Hkv, block_size, 1] written per slot (else it
// must be empty), an fp8 cache's per-tensor scale, finite and > 0 (else it
// must be 1). *range is the scale cache's bytes (empty when none).
Status CheckCacheScales(const std::string& side, DType cache,
                        const MutableTensorView& scales, float scale,
                        const AppendProblem& p, ByteRange* range) {
  static constexpr DimNames kScaleDims = {"num_blocks", "Hkv", "block_size", "1"};
  const std::string name = side + "_scales", cache_name = side + "_cache";
  *range = ByteRange();
  std::ostringstream os;
  if (cache != DType::kInt8) {
    if (scales.data != nullptr || scales.shape[0] != 0 || scales.shape[1] != 0 ||
        scales.shape[2] != 0 || scales.shape[3] != 0) {
      return Invalid(name + " is set but " + cache_name + ".dtype = " +
                     DTypeName(cache) + ": only an int8 cache has a scale cache "
                     "(leave it empty)");
    }
  } else {
    if (scales.data == nullptr) {
      return Invalid(name + ".data is null: an int8 " + cache_name +
                     " needs its scale cache, f32 [num_blocks, Hkv, block_size, 1]");
    }
    if (scales.dtype != DType::kF32) {
      return Invalid(name + ".dtype = " +
                     (KnownDType(scales.dtype) ? DTypeName(scales.dtype) : "unknown") +
                     ": must be f32");
    }
    const TensorView v = scales;
    const Status s = CheckView(name.c_str(), kScaleDims, v, false, range);
    if (!s.ok()) return s;
    const int64_t want[4] = {p.num_blocks, p.kv_heads, p.block_size, 1};
    for (int i = 0; i < 4; ++i) {
      if (v.shape[i] != want[i]) {
        return Invalid(name + ".shape " + ShapeString(v.shape) + " must be " +
                       ShapeString(want) + " ([num_blocks, Hkv, block_size, 1])");
      }
    }
    if (SelfOverlaps(v.shape, v.strides)) {
      return Invalid(name + ".strides make distinct slots share a scale");
    }
  }
  const bool fp8 = cache == DType::kFp8E4M3 || cache == DType::kFp8E5M2;
  if (fp8 && !(std::isfinite(scale) && scale > 0.0f)) {
    os << side << "_scale = " << scale << ": must be finite and > 0 (the fp8 "
       << cache_name << "'s per-tensor scale)";
    return Invalid(os.str());
  }
  if (!fp8 && scale != 1.0f) {
    os << side << "_scale = " << scale << " but " << cache_name << ".dtype = "
       << DTypeName(cache) << ": only an fp8 cache takes a scale (leave it 1)";
    return Invalid(os.str());
  }
  return Status::Ok();
}

// Every slot below num_blocks * block_size (negative ones skip their token).
Status CheckSlotRange(const int32_t* slots, const AppendProblem& p) {
  const int64_t num_slots = p.num_blocks * p.block_size;  // fits: k_cache's count does
  for (int64_t t = 0; t < p.tokens; ++t) {
    if (slots[t] >= num_slots) {
      std::ostringstream os;
      os << "slot_mapping[" << t << "] = " << slots[t]
         << ": must be < num_blocks * block_size = " << num_slots
         << " (a negative slot skips the token)";
      return Invalid(os.str());
    }
  }
  return Status::Ok();
}

// No two tokens on one non-negative slot. Sorts a copy of the slots
// (O(T log T)); the copy's buffer is kept per thread, so steady-state calls
// allocate nothing.
Status CheckSlotsUnique(const int32_t* slots, int64_t tokens) {
  thread_local std::vector<int32_t> sorted;
  sorted.clear();
  for (int64_t t = 0; t < tokens; ++t) {
    if (slots[t] >= 0) sorted.push_back(slots[t]);
  }
  std::sort(sorted.begin(), sorted.end());
  const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  if (dup == sorted.end()) return Status::Ok();
  int64_t first = -1;
  for (int64_t t = 0; t < tokens; ++t) {
    if (slots[t] != *dup) continue;
    if (first >= 0) {
      std::ostringstream os;
      os << "slot_mapping[" << first << "] and slot_mapping[" << t
         << "] are both " << *dup << ": two tokens may not map to one slot";
      return Invalid(os.str());
    }
    first = t;
  }
  return Invalid("slot_mapping has a duplicate slot");  // not reached
}

// A view or a plain array and the bytes it touches.
struct Named {
  const char* name;
  ByteSet bytes;
};

ByteSet BytesOf(const TensorView& v) {
  return ViewBytes(v.data, v.dtype, v.shape, v.strides);
}

// No output shares an element with an input or another output.
Status CheckAliasing(const Named* outputs, int num_outputs,
                     const Named* inputs, int num_inputs) {
  for (int o = 0; o < num_outputs; ++o) {
    for (int i = 0; i < num_inputs; ++i) {
      if (SharesBytes(outputs[o].bytes, inputs[i].bytes)) {
        return Invalid(std::string(outputs[o].name) + " overlaps input " +
                       inputs[i].name + ": outputs must not alias inputs");
      }
    }
    for (int j = o + 1; j < num_outputs; ++j) {
      if (SharesBytes(outputs[o].bytes, outputs[j].bytes)) {
        return Invalid(std::string(outputs[o].name) + " overlaps " +
                       outputs[j].name + ": outputs must not share memory");
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Status ValidateAppend(const TensorView& k_new, const TensorView& v_new,
                      const MutableTensorView& k_cache,
                      const MutableTensorView& v_cache,
                      const int32_t* slot_mapping,
                      const RotaryEmbedding& rotary,
                      const MutableTensorView& q,
                      const QuantizedCacheScales& scales, AppendProblem* p) {
  ByteRange rkn, rvn, rkc, rvc, rq, rks, rvs;
  Status s = CheckView("k_new", kNewK, k_new, true, &rkn);
  if (s.ok()) s = CheckView("v_new", kNewV, v_new, true, &rvn);
  if (s.ok()) s = CheckView("k_cache", kCacheK, k_cache, false, &rkc, true);
  if (s.ok()) s = CheckView("v_cache", kCacheV, v_cache, false, &rvc, true);
  AppendProblem out;
  if (s.ok()) s = CheckKvExtents(k_new, v_new, k_cache, v_cache, &out);
  if (s.ok()) {
    s = CheckCacheScales("k", k_cache.dtype, scales.k_scales, scales.k_scale, out, &rks);
  }
  if (s.ok()) {
    s = CheckCacheScales("v", v_cache.dtype, scales.v_scales, scales.v_scale, out, &rvs);
  }
  if (!s.ok()) return s;
  if (slot_mapping == nullptr && out.tokens > 0) {
    return Invalid("slot_mapping is null with " + std::to_string(out.tokens) +
                   " tokens");
  }
  int64_t table_bytes = 0;
  s = CheckRotary(rotary, &out, &table_bytes);
  if (s.ok()) s = CheckQ(q, &out, &rq);
  if (s.ok()) s = CheckSlotRange(slot_mapping, out);
  if (s.ok()) s = CheckSlotsUnique(slot_mapping, out.tokens);
  if (!s.ok()) return s;
  // Views of one buffer that interleave without sharing an element (q, k
  // and v inside a fused QKV projection) are apart (SharesBytes).
  const bool rotary_used = out.rotary_dim > 0;
  const Named outputs[] = {{"k_cache", BytesOf(AsBytes(k_cache))},
                           {"v_cache", BytesOf(AsBytes(v_cache))},
                           {"q", BytesOf(q)},
                           {"k_scales", BytesOf(scales.k_scales)},
                           {"v_scales", BytesOf(scales.v_scales)}};
  const Named inputs[] = {
      {"k_new", BytesOf(k_new)},
      {"v_new", BytesOf(v_new)},
      {"slot_mapping", ArrayBytes(slot_mapping, out.tokens, 4)},
      {"rotary.positions",
       ArrayBytes(rotary_used ? rotary.positions : nullptr, out.tokens, 4)},
      {"rotary.cos", ArrayBytes(rotary_used ? rotary.cos : nullptr, table_bytes, 1)},
      {"rotary.sin", ArrayBytes(rotary_used ? rotary.sin : nullptr, table_bytes, 1)},
  };
  s = CheckAliasing(outputs, 5, inputs, 6);
  if (!s.ok()) return s;
  *p = out;
  return Status::Ok();
}

}  // namespace simdattn
