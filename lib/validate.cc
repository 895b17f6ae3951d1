// Argument checking for Attention() and the reference (SEMANTICS.md "Bad
// input"): every error names the argument and the offending value.

#include "lib/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>

#include "lib/status.h"

namespace simdattn {
namespace {

const char* const kDimNames[4][4] = {
    {"B", "Hq", "Lq", "Dk"},   // q
    {"B", "Hkv", "Lk", "Dk"},  // k
    {"B", "Hkv", "Lk", "Dv"},  // v
    {"B", "Hq", "Lq", "Dv"},   // o
};

}  // namespace

bool IsStorageType(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

bool IsQuantizedType(DType t) {
  return t == DType::kInt8 || t == DType::kQ8_0 || t == DType::kFp8E4M3 ||
         t == DType::kFp8E5M2;
}

bool IsKvType(DType t) { return IsStorageType(t) || IsQuantizedType(t); }

bool KnownDType(DType t) {
  return IsKvType(t) || t == DType::kBool;
}

bool ComputeRange(const void* data, DType dtype, const int64_t* shape,
                  const int64_t* strides, ByteRange* r) {
  int64_t min_off = 0, max_off = 0;  // in elements
  // q8_0: strides[0..2] in bytes, a row of shape[3] values is one unit of
  // shape[3] / 32 blocks.
  const bool q8 = dtype == DType::kQ8_0;
  for (int i = 0; i < (q8 ? 3 : 4); ++i) {
    if (shape[i] <= 0) continue;
    int64_t span;
    if (__builtin_mul_overflow(shape[i] - 1, strides[i], &span)) return false;
    if (span < 0) {
      if (__builtin_add_overflow(min_off, span, &min_off)) return false;
    } else {
      if (__builtin_add_overflow(max_off, span, &max_off)) return false;
    }
  }
  const int64_t size = q8 ? 1 : DTypeSize(dtype);
  int64_t lo_b, hi_b;
  if (__builtin_mul_overflow(min_off, size, &lo_b)) return false;
  if (__builtin_mul_overflow(max_off, size, &hi_b)) return false;
  const int64_t last = q8 ? std::max<int64_t>(shape[3], 32) / 32 * DTypeSize(dtype) : size;
  if (__builtin_add_overflow(hi_b, last, &hi_b)) return false;
  const int64_t base = static_cast<int64_t>(reinterpret_cast<uintptr_t>(data));
  if (__builtin_add_overflow(base, lo_b, &r->lo)) return false;
  if (__builtin_add_overflow(base, hi_b, &r->hi)) return false;
  return true;
}

bool Overlap(const ByteRange& a, const ByteRange& b) {
  return a.lo < b.hi && b.lo < a.hi;
}

std::string ShapeString(const int64_t* shape) {
  std::ostringstream os;
  os << "[" << shape[0] << ", " << shape[1] << ", " << shape[2] << ", "
     << shape[3] << "]";
  return os.str();
}

namespace {

// Common checks of one Q/K/V/O view: dtype, positive extents, data pointer,
// unit last stride, no int64 overflow. `which` indexes kDimNames.
Status CheckView(const char* name, int which, const void* data, DType dtype,
                 const int64_t* shape, const int64_t* strides,
                 ByteRange* range) {
  const bool kv = which == 1 || which == 2;
  if (kv ? !IsKvType(dtype) : !IsStorageType(dtype)) {
    return Invalid(std::string(name) + ".dtype = " +
                   (KnownDType(dtype) ? DTypeName(dtype) : "unknown") +
                   (kv ? ": must be f32, f16, bf16, int8, q8_0, fp8_e4m3 or fp8_e5m2"
                       : ": must be f32, f16 or bf16"));
  }
  for (int i = 0; i < 4; ++i) {
    if (shape[i] <= 0) {
      std::ostringstream os;
      os << name << ".shape[" << i << "] (" << kDimNames[which][i]
         << ") = " << shape[i] << ": extents must be positive";
      return Invalid(os.str());
    }
  }
  if (data == nullptr) {
    return Invalid(std::string(name) + ".data is null with shape " +
                   ShapeString(shape));
  }
  if (strides[3] != 1) {
    std::ostringstream os;
    os << name << ".strides[3] = " << strides[3]
       << ": the last dimension must be contiguous (stride 1)";
    return Invalid(os.str());
  }
  if (dtype == DType::kQ8_0 && shape[3] % 32 != 0) {
    std::ostringstream os;
    os << name << ".shape[3] (" << kDimNames[which][3] << ") = " << shape[3]
       << ": q8_0 needs a multiple of 32 (its blocks of 32 values)";
    return Invalid(os.str());
  }
  int64_t count = 1;
  for (int i = 0; i < 4; ++i) {
    if (__builtin_mul_overflow(count, shape[i], &count)) {
      return Invalid(std::string(name) + ".shape " + ShapeString(shape) +
                     ": element count overflows int64");
    }
  }
  if (!ComputeRange(data, dtype, shape, strides, range)) {
    return Invalid(std::string(name) + ": offsets of shape " +
                   ShapeString(shape) + " with its strides overflow int64");
  }
  return Status::Ok();
}

// |x| without overflow for INT64_MIN.
uint64_t Magnitude(int64_t x) {
  return x < 0 ? 0 - static_cast<uint64_t>(x) : static_cast<uint64_t>(x);
}

}  // namespace

bool SelfOverlaps(const int64_t* shape, const int64_t* strides) {
  int idx[4] = {0, 1, 2, 3};
  std::sort(idx, idx + 4, [&](int a, int b) {
    return Magnitude(strides[a]) < Magnitude(strides[b]);
  });
  uint64_t span = 0;  // max element offset covered by the inner dimensions
  for (int n = 0; n < 4; ++n) {
    const int i = idx[n];
    if (shape[i] <= 1) continue;
    if (Magnitude(strides[i]) <= span) return true;
    span += Magnitude(strides[i]) * static_cast<uint64_t>(shape[i] - 1);
  }
  return false;
}

ByteSet ViewBytes(const void* data, DType dtype, const int64_t* shape,
                  const int64_t* strides) {
  ByteSet set;
  if (data == nullptr) return set;
  for (int i = 0; i < 4; ++i) {
    if (shape[i] <= 0) return set;
  }
  if (dtype == DType::kQ8_0) {  // strides[0..2] in bytes, rows of D / 32 blocks
    const int64_t bytes[4] = {shape[0], shape[1], shape[2], shape[3] / 32 * 34};
    return ViewBytes(data, DType::kInt8, bytes, strides);
  }
  set.base = static_cast<int64_t>(reinterpret_cast<uintptr_t>(data));
  set.size = DTypeSize(dtype);
  for (int i = 0; i < 4; ++i) {
    if (shape[i] == 1 || strides[i] == 0) continue;
    int64_t stride = strides[i] * set.size;  // fits: ComputeRange succeeded
    if (stride < 0) {
      set.base += stride * (shape[i] - 1);
      stride = -stride;
    }
    int d = set.num_dims++;
    for (; d > 0 && set.stride[d - 1] < stride; --d) {
      set.stride[d] = set.stride[d - 1];
      set.extent[d] = set.extent[d - 1];
    }
    set.stride[d] = stride;
    set.extent[d] = shape[i];
  }
  return set;
}

ByteSet ArrayBytes(const void* ptr, int64_t count, int64_t elem_bytes) {
  ByteSet set;
  int64_t bytes;
  if (__builtin_mul_overflow(count, elem_bytes, &bytes)) bytes = INT64_MAX;
  if (ptr == nullptr || bytes <= 0) return set;
  set.base = static_cast<int64_t>(reinterpret_cast<uintptr_t>(ptr));
  set.size = bytes;
  return set;
}

namespace {

// Addresses and offsets in 128 bits: no sum or difference here overflows.
using Wide = __int128;

// The bytes from a set's first byte to past its last.
Wide Span(const ByteSet& s) {
  Wide span = s.size;
  for (int i = 0; i < s.num_dims; ++i) span += Wide{s.stride[i]} * (s.extent[i] - 1);
  return span;
}

// `s` without its outermost dimension.
ByteSet Inner(const ByteSet& s) {
  ByteSet in = s;
  in.num_dims = s.num_dims - 1;
  for (int i = 0; i < in.num_dims; ++i) {
    in.stride[i] = s.stride[i + 1];
    in.extent[i] = s.extent[i + 1];
  }
  return in;
}

// Floor of n / d for d > 0.
Wide FloorDiv(Wide n, Wide d) {
  Wide q = n / d;
  if (n % d != 0 && n < 0) --q;
  return q;
}

bool SharesAt(const ByteSet& a, Wide a0, const ByteSet& b, Wide b0, int64_t* budget);

// Whether any block of s along its outer dimension (s placed at s0) shares a
// byte with `other` (at o0): only the blocks whose range meets other's.
bool AnyBlock(const ByteSet& s, Wide s0, const ByteSet& other, Wide o0, int64_t* budget) {
  const ByteSet in = Inner(s);
  const Wide step = s.stride[0];
  const Wide first = std::max<Wide>(0, FloorDiv(o0 - s0 - Span(in), step) + 1);
  const Wide last = std::min<Wide>(s.extent[0] - 1, FloorDiv(o0 + Span(other) - 1 - s0, step));
  for (Wide k = first; k <= last; ++k) {
    if (SharesAt(in, s0 + k * step, other, o0, budget)) return true;
  }
  return false;
}

// Whether a placed at byte a0 and b at byte b0 share a byte (their own
// base fields are not read). The set with the largest outer stride P is
// a row of blocks k P apart; when its inner dimensions span at most P, each
// block lies in its own window [k P, k P + P). The other set is the same
// with P (its outer dimension, when its stride is P) or a single block
// (when it spans at most P). Block m of b then meets only blocks q + m and
// q + m + 1 of a, at offsets r and r - P (b0 - a0 = q P + r), and the
// question recurses on the inner dimensions. A set that does not nest so
// is split into its blocks (AnyBlock). Each step spends one unit of
// *budget; past it, the answer is true.
bool SharesAt(const ByteSet& a, Wide a0, const ByteSet& b, Wide b0, int64_t* budget) {
  if (a.size == 0 || b.size == 0) return false;
  if (!(a0 < b0 + Span(b) && b0 < a0 + Span(a))) return false;
  if (a.num_dims == 0 && b.num_dims == 0) return true;
  if (--*budget < 0) return true;
  if (a.num_dims == 0 || (b.num_dims > 0 && b.stride[0] > a.stride[0])) {
    return SharesAt(b, b0, a, a0, budget);
  }
  const int64_t period = a.stride[0];
  const ByteSet a_in = Inner(a);
  if (Span(a_in) > period) return AnyBlock(a, a0, b, b0, budget);
  ByteSet b_in = b;
  int64_t b_blocks = 1;
  if (b.num_dims > 0 && b.stride[0] == period) {
    b_in = Inner(b);
    b_blocks = b.extent[0];
  }
  if (Span(b_in) > period) {
    return b.num_dims > 0 ? AnyBlock(b, b0, a, a0, budget) : AnyBlock(a, a0, b, b0, budget);
  }
  Wide q = FloorDiv(b0 - a0, period);
  const Wide r = b0 - a0 - q * period;
  // Some block m < b_blocks of b lands on a block shift + m < a.extent[0].
  const auto lands = [&](Wide shift) { return shift < a.extent[0] && shift + b_blocks > 0; };
  return (lands(q) && SharesAt(a_in, 0, b_in, r, budget)) ||
         (lands(q + 1) && SharesAt(a_in, 0, b_in, r - period, budget));
}

}  // namespace

bool SharesBytes(const ByteSet& a, const ByteSet& b) {
  // A budget of steps keeps validation cheap whatever the strides; views
  // that nest decide in a few steps per dimension.
  int64_t budget = 4096;
  return SharesAt(a, a.base, b, b.base, &budget);
}

namespace {

// True when a view's extents are all zero (the "absent" optional view).
bool AllZero(const int64_t* shape) {
  return shape[0] == 0 && shape[1] == 0 && shape[2] == 0 && shape[3] == 0;
}

// Q, K and V against each other (each view already checked alone).
Status CheckShapes(const TensorView& q, const TensorView& k,
                   const TensorView& v) {
  std::ostringstream os;
  if (k.shape[0] != q.shape[0] || v.shape[0] != q.shape[0]) {
    os << "batch mismatch: q.shape[0] = " << q.shape[0]
       << ", k.shape[0] = " << k.shape[0] << ", v.shape[0] = " << v.shape[0];
    return Invalid(os.str());
  }
  if (v.shape[1] != k.shape[1] || v.shape[2] != k.shape[2]) {
    os << "k.shape " << ShapeString(k.shape) << " and v.shape "
       << ShapeString(v.shape) << " must agree in Hkv and Lk";
    return Invalid(os.str());
  }
  if (k.shape[3] != q.shape[3]) {
    os << "head dim mismatch: q.shape[3] = " << q.shape[3]
       << " but k.shape[3] = " << k.shape[3];
    return Invalid(os.str());
  }
  if (q.shape[1] % k.shape[1] != 0) {
    os << "Hq = " << q.shape[1] << " is not a multiple of Hkv = "
       << k.shape[1];
    return Invalid(os.str());
  }
  return Status::Ok();
}

// SEMANTICS.md: a call that uses p(i) (causal, a window or ALiBi) where the
// two alignments disagree (Lq != Lk, or kv lengths) must name one.
Status CheckAlignmentGiven(const AttentionOptions& options, const Problem& p) {
  if (options.alignment.has_value()) return Status::Ok();
  if (p.q_len == p.kv_len && !HasKvLengths(options)) return Status::Ok();
  const char* user = options.causal                     ? "causal"
                     : options.window_left >= 0          ? "window_left"
                     : options.window_right >= 0         ? "window_right"
                     : options.alibi_slopes != nullptr   ? "alibi_slopes"
                                                         : nullptr;
  if (user == nullptr) return Status::Ok();
  std::ostringstream os;
  os << "alignment is unset, but " << user << " places query rows on the key "
     << "axis and Lq = " << p.q_len << ", Lk = " << p.kv_len
     << (HasKvLengths(options) ? " with kv lengths" : "")
     << ": set alignment to top-left (PyTorch is_causal: p(i) = i) or "
        "bottom-right (KV cache: the last query at the last key)";
  return Invalid(os.str());
}

// The scalar options and kv_lengths; sets out->scale.
Status CheckScalarOptions(const AttentionOptions& options, Problem* out) {
  std::ostringstream os;
  if (options.scale.has_value()) {
    const float sc = *options.scale;
    if (!std::isfinite(sc) || sc < 0.0f) {
      os << "scale = " << sc << ": must be finite and >= 0";
      return Invalid(os.str());
    }
    out->scale = sc;
  } else {
    out->scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(out->head_dim_qk)));
  }
  if (!std::isfinite(options.softcap) || options.softcap < 0.0f) {
    os << "softcap = " << options.softcap << ": must be finite and >= 0";
    return Invalid(os.str());
  }
  if (!(options.dropout_p >= 0.0f && options.dropout_p < 1.0f)) {
    os << "dropout_p = " << options.dropout_p << ": must be in [0, 1)";
    return Invalid(os.str());
  }
  if (options.alignment.has_value() &&
      *options.alignment != Alignment::kTopLeft &&
      *options.alignment != Alignment::kBottomRight) {
    os << "alignment = " << static_cast<int>(*options.alignment)
       << ": must be kTopLeft or kBottomRight";
    return Invalid(os.str());
  }
  if (options.kv_lengths != nullptr && options.kv_lengths_i32 != nullptr) {
    return Invalid("kv_lengths and kv_lengths_i32 are both set: give one");
  }
  for (int64_t b = 0; b < out->batch && HasKvLengths(options); ++b) {
    const int64_t len = KvLength(options, b, out->kv_len);
    if (len < 0 || len > out->kv_len) {
      os << "kv_lengths[" << b << "] = " << len << ": must be in [0, Lk = "
         << out->kv_len << "]";
      return Invalid(os.str());
    }
  }
  return CheckAlignmentGiven(options, *out);
  return Status::Ok();
}

// The optional mask: dtype, broadcast to [B, Hq, Lq, Lk], a contiguous or
// broadcast last dimension, offsets that fit int64. Sets out's mask fields.
Status CheckMask(const TensorView& m, Problem* out, ByteRange* r) {
  std::ostringstream os;
  if (m.data == nullptr && !AllZero(m.shape)) {
    return Invalid("mask.data is null with shape " + ShapeString(m.shape) +
                   " (leave every extent 0 for no mask)");
  }
  if (m.data == nullptr) return Status::Ok();
  if (m.dtype != DType::kBool && m.dtype != DType::kF32 &&
      m.dtype != DType::kF16) {
    os << "mask.dtype = "
       << (KnownDType(m.dtype) ? DTypeName(m.dtype) : "unknown")
       << ": must be bool (1 = attend), f32 or f16 (additive)";
    return Invalid(os.str());
  }
  const int64_t full[4] = {out->batch, out->q_heads, out->q_len, out->kv_len};
  const char* const names[4] = {"B", "Hq", "Lq", "Lk"};
  int64_t eff_shape[4];
  for (int i = 0; i < 4; ++i) {
    if (m.shape[i] != full[i] && m.shape[i] != 1) {
      os << "mask.shape[" << i << "] = " << m.shape[i]
         << " cannot broadcast to " << names[i] << " = " << full[i]
         << " (mask must broadcast to [B, Hq, Lq, Lk] = "
         << ShapeString(full) << ")";
      return Invalid(os.str());
    }
    out->mask_strides[i] = m.shape[i] == 1 ? 0 : m.strides[i];
    eff_shape[i] = m.shape[i];
  }
  if (out->mask_strides[3] != 0 && out->mask_strides[3] != 1) {
    os << "mask.strides[3] = " << m.strides[3]
       << ": the last dimension must be contiguous (stride 1) or broadcast "
          "(stride 0 or extent 1)";
    return Invalid(os.str());
  }
  if (!ComputeRange(m.data, m.dtype, eff_shape, out->mask_strides, r)) {
    return Invalid("mask: offsets of shape " + ShapeString(m.shape) +
                   " with its strides overflow int64");
  }
  out->has_mask = true;
  return Status::Ok();
}

// The scales of quantized K or V (`which` "k" or "v"; SEMANTICS.md
// "Quantized KV caches"): int8 needs its per-token f32 view of [B, Hkv,
// Lk, 1], fp8 a finite per-tensor scale >= 0; every other dtype neither.
Status CheckScalesOf(const char* which, DType dtype, const TensorView& scales,
                     float scale, const Problem& p) {
  const std::string tensor = std::string(which) + "_scales";
  const std::string scalar = std::string(which) + "_scale";
  std::ostringstream os;
  if (dtype != DType::kInt8 && (scales.data != nullptr || !AllZero(scales.shape))) {
    return Invalid(tensor + " is set but " + which + ".dtype = " +
                   DTypeName(dtype) +
                   ": only int8 takes per-token scales (leave it empty)");
  }
  if (dtype == DType::kInt8) {
    if (scales.data == nullptr) {
      return Invalid(tensor + ".data is null: an int8 " + which +
                     " needs one f32 scale per token and KV head, [B, Hkv, Lk, 1]");
    }
    if (scales.dtype != DType::kF32) {
      return Invalid(tensor + ".dtype = " +
                     (KnownDType(scales.dtype) ? DTypeName(scales.dtype) : "unknown") +
                     ": must be f32");
    }
    const int64_t want[4] = {p.batch, p.kv_heads, p.kv_len, 1};
    for (int i = 0; i < 4; ++i) {
      if (scales.shape[i] != want[i]) {
        return Invalid(tensor + ".shape " + ShapeString(scales.shape) +
                       " must be [B, Hkv, Lk, 1] = " + ShapeString(want));
      }
    }
    ByteRange r;
    if (!ComputeRange(scales.data, scales.dtype, scales.shape, scales.strides, &r)) {
      return Invalid(tensor + ": offsets of shape " + ShapeString(scales.shape) +
                     " with its strides overflow int64");
    }
  }
  const bool fp8 = dtype == DType::kFp8E4M3 || dtype == DType::kFp8E5M2;
  if (fp8 && !(std::isfinite(scale) && scale >= 0.0f)) {
    os << scalar << " = " << scale << ": must be finite and >= 0";
    return Invalid(os.str());
  }
  if (!fp8 && scale != 1.0f) {
    os << scalar << " = " << scale << " but " << which << ".dtype = "
       << DTypeName(dtype) << ": only fp8 takes a per-tensor scale (leave it 1)";
    return Invalid(os.str());
  }
  return Status::Ok();
}

}  // namespace

Status ValidateInputs(const TensorView& q, const TensorView& k,
                      const TensorView& v, const AttentionOptions& options,
                      Problem* p) {
  ByteRange r;
  Status s = CheckView("q", 0, q.data, q.dtype, q.shape, q.strides, &r);
  if (!s.ok()) return s;
  s = CheckView("k", 1, k.data, k.dtype, k.shape, k.strides, &r);
  if (!s.ok()) return s;
  s = CheckView("v", 2, v.data, v.dtype, v.shape, v.strides, &r);
  if (!s.ok()) return s;
  s = CheckShapes(q, k, v);
  if (!s.ok()) return s;

  Problem out;
  out.batch = q.shape[0];
  out.q_heads = q.shape[1];
  out.kv_heads = k.shape[1];
  out.q_len = q.shape[2];
  out.kv_len = k.shape[2];
  out.head_dim_qk = q.shape[3];
  out.head_dim_v = v.shape[3];
  out.group = out.q_heads / out.kv_heads;
  s = CheckScalarOptions(options, &out);
  if (!s.ok()) return s;
  s = CheckMask(options.mask, &out, &r);
  if (!s.ok()) return s;
  s = CheckScalesOf("k", k.dtype, options.k_scales, options.k_scale, out);
  if (!s.ok()) return s;
  s = CheckScalesOf("v", v.dtype, options.v_scales, options.v_scale, out);
  if (!s.ok()) return s;
  *p = out;
  return Status::Ok();
}

Status ValidateOutputs(const Problem& p, const TensorView& q,
                       const TensorView& k, const TensorView& v,
                       const AttentionOptions& options,
                       const MutableTensorView& o,
                       const MutableTensorView& lse) {
  ByteRange ro;
  Status s = CheckView("o", 3, o.data, o.dtype, o.shape, o.strides, &ro);
  if (!s.ok()) return s;
  const int64_t want[4] = {p.batch, p.q_heads, p.q_len, p.head_dim_v};
  for (int i = 0; i < 4; ++i) {
    if (o.shape[i] != want[i]) {
      return Invalid("o.shape " + ShapeString(o.shape) + " must be [B, Hq, Lq, Dv] = " +
                     ShapeString(want));
    }
  }
  if (SelfOverlaps(o.shape, o.strides)) {
    return Invalid("o.strides make distinct elements of o share memory");
  }

  // Every input's bytes, to reject outputs that share a byte with one.
  struct Named {
    const char* name;
    ByteSet bytes;
  };
  Named inputs[10];
  int n = 0;
  inputs[n++] = {"q", ViewBytes(q.data, q.dtype, q.shape, q.strides)};
  inputs[n++] = {"k", ViewBytes(k.data, k.dtype, k.shape, k.strides)};
  inputs[n++] = {"v", ViewBytes(v.data, v.dtype, v.shape, v.strides)};
  if (p.has_mask) {
    const TensorView& m = options.mask;
    inputs[n++] = {"mask", ViewBytes(m.data, m.dtype, m.shape, p.mask_strides)};
  }
  for (const TensorView* sc : {&options.k_scales, &options.v_scales}) {
    if (sc->data == nullptr) continue;
    inputs[n++] = {sc == &options.k_scales ? "k_scales" : "v_scales",
                   ViewBytes(sc->data, sc->dtype, sc->shape, sc->strides)};
  }
  inputs[n++] = {"alibi_slopes", ArrayBytes(options.alibi_slopes, p.q_heads, 4)};
  inputs[n++] = {"sinks", ArrayBytes(options.sinks, p.q_heads, 4)};
  inputs[n++] = {"kv_lengths", ArrayBytes(options.kv_lengths, p.batch, 8)};
  inputs[n++] = {"kv_lengths_i32", ArrayBytes(options.kv_lengths_i32, p.batch, 4)};

  const ByteSet bo = ViewBytes(o.data, o.dtype, o.shape, o.strides);
  for (int i = 0; i < n; ++i) {
    if (SharesBytes(bo, inputs[i].bytes)) {
      return Invalid(std::string("o overlaps input ") + inputs[i].name +
                     ": outputs must not alias inputs");
    }
  }

  if (lse.data == nullptr && !AllZero(lse.shape)) {
    return Invalid("lse.data is null with shape " + ShapeString(lse.shape) +
                   " (leave every extent 0 for no LSE)");
  }
  if (lse.data != nullptr) {
    if (lse.dtype != DType::kF32) {
      return Invalid(std::string("lse.dtype = ") +
                     (KnownDType(lse.dtype) ? DTypeName(lse.dtype) : "unknown") +
                     ": must be f32");
    }
    const int64_t want_lse[4] = {p.batch, p.q_heads, p.q_len, 1};
    for (int i = 0; i < 4; ++i) {
      if (lse.shape[i] != want_lse[i]) {
        return Invalid("lse.shape " + ShapeString(lse.shape) +
                       " must be [B, Hq, Lq, 1] = " + ShapeString(want_lse));
      }
    }
    ByteRange rl;
    int64_t strides[4] = {lse.strides[0], lse.strides[1], lse.strides[2], 1};
    if (!ComputeRange(lse.data, lse.dtype, lse.shape, strides, &rl)) {
      return Invalid("lse: offsets overflow int64");
    }
    if (SelfOverlaps(lse.shape, strides)) {
      return Invalid("lse.strides make distinct elements of lse share memory");
    }
    const ByteSet bl = ViewBytes(lse.data, lse.dtype, lse.shape, strides);
    if (SharesBytes(bl, bo)) return Invalid("lse overlaps o");
    for (int i = 0; i < n; ++i) {
      if (SharesBytes(bl, inputs[i].bytes)) {
        return Invalid(std::string("lse overlaps input ") + inputs[i].name +
                       ": outputs must not alias inputs");
      }
    }
  }
  return Status::Ok();
}

}  // namespace simdattn
