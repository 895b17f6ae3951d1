// Helpers of the AppendKv tests (append_util.h). The decoding and rounding
// of f16 and bf16 here are the test's own, from the formats' definitions.

#include "tests/append_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "gtest/gtest.h"

namespace simdattn {
namespace test {
namespace {

// Significand bits (with the implicit one) and the smallest normal
// exponent of each storage type.
int Precision(DType t) { return t == DType::kF32 ? 24 : t == DType::kF16 ? 11 : 8; }
int MinExponent(DType t) { return t == DType::kF16 ? -14 : -126; }
double MaxFinite(DType t) {
  return t == DType::kF32   ? std::numeric_limits<float>::max()
         : t == DType::kF16 ? 65504.0
                            : 0x1.FEp127;
}

double DecodeF16(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 31, mant = h & 1023;
  double v;
  if (exp == 31) {
    v = mant != 0 ? std::numeric_limits<double>::quiet_NaN()
                  : std::numeric_limits<double>::infinity();
  } else if (exp == 0) {
    v = std::ldexp(mant, -24);
  } else {
    v = std::ldexp(1024 + mant, exp - 25);
  }
  return sign ? -v : v;
}

// x is a value of f16 (after RoundTo).
uint16_t EncodeF16(double x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (std::isnan(x)) return 0x7E00;
  if (std::isinf(x)) return sign | 0x7C00;
  if (a < std::ldexp(1.0, -14)) return sign | static_cast<uint16_t>(std::ldexp(a, 24));
  int e;
  const double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  const int mant = static_cast<int>(std::ldexp(m, 11)) - 1024;
  return sign | static_cast<uint16_t>(((e - 1 + 15) << 10) | mant);
}

double DecodeBF16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

double RoundTo(double x, DType dtype) {
  if (!std::isfinite(x) || x == 0.0) return x;
  int e;
  std::frexp(x, &e);  // the leading bit of |x| is 2^(e - 1)
  const int lead = std::max(e - 1, MinExponent(dtype));
  const double ulp = std::ldexp(1.0, lead - (Precision(dtype) - 1));
  const double r = std::nearbyint(x / ulp) * ulp;  // ties to even
  return std::fabs(r) > MaxFinite(dtype)
             ? std::copysign(std::numeric_limits<double>::infinity(), x)
             : r;
}

double UlpOf(double x, DType dtype) {
  int e;
  std::frexp(x == 0.0 ? 1e-300 : x, &e);
  const int lead = std::max(e - 1, MinExponent(dtype));
  return std::ldexp(1.0, lead - (Precision(dtype) - 1));
}

Storage::Storage(DType t, int64_t count, uint8_t fill)
    : dtype(t), bytes(static_cast<size_t>(count * DTypeSize(t)), fill) {}

int64_t Storage::size() const {
  return static_cast<int64_t>(bytes.size()) / DTypeSize(dtype);
}

double Storage::Get(int64_t i) const {
  if (dtype == DType::kF32) {
    float f;
    std::memcpy(&f, &bytes[i * 4], 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, &bytes[i * 2], 2);
  return dtype == DType::kF16 ? DecodeF16(h) : DecodeBF16(h);
}

void Storage::Set(int64_t i, double x) {
  const double r = RoundTo(x, dtype);
  if (dtype == DType::kF32) {
    const float f = static_cast<float>(r);  // exact: r is an f32 value
    std::memcpy(&bytes[i * 4], &f, 4);
    return;
  }
  uint16_t h;
  if (dtype == DType::kF16) {
    h = EncodeF16(r);
  } else {
    const float f = static_cast<float>(r);  // exact: bf16 values are f32's
    uint32_t u;
    std::memcpy(&u, &f, 4);
    h = std::isnan(r) ? 0x7FC0 : static_cast<uint16_t>(u >> 16);
  }
  std::memcpy(&bytes[i * 2], &h, 2);
}

AppendData::AppendData(const AppendCase& cc) : c(cc) {
  EXPECT_LE(c.tokens, c.num_blocks * c.block_size) << "slots must be distinct";
  std::mt19937 rng(c.seed);
  const int64_t kw = c.kv_heads * c.dk + c.row_pad, vw = c.kv_heads * c.dv + c.row_pad;
  const int64_t qw = c.q_heads * c.dk + c.row_pad;
  k_new = Storage(c.k_dtype, c.tokens * kw, 0x7F);
  v_new = Storage(c.v_dtype, c.tokens * vw, 0x7F);
  q = Storage(c.q_dtype, c.tokens * qw, 0x7F);
  const int64_t slots_total = c.num_blocks * c.block_size;
  k_cache = Storage(c.kc_dtype, slots_total * c.kv_heads * c.dk, 0xA5);
  v_cache = Storage(c.vc_dtype, slots_total * c.kv_heads * c.dv, 0xA5);
  std::uniform_int_distribution<int> small(-128, 127), unit(-64, 64);
  std::uniform_real_distribution<double> uniform(-2.0, 2.0);
  auto value = [&] { return c.exact_values ? small(rng) / 16.0 : uniform(rng); };
  for (int64_t t = 0; t < c.tokens; ++t) {
    for (int64_t i = 0; i < c.kv_heads * c.dk; ++i) k_new.Set(t * kw + i, value());
    for (int64_t i = 0; i < c.kv_heads * c.dv; ++i) v_new.Set(t * vw + i, value());
    for (int64_t i = 0; i < c.q_heads * c.dk; ++i) q.Set(t * qw + i, value());
  }
  std::vector<int32_t> perm(static_cast<size_t>(slots_total));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::uniform_int_distribution<int> pos(0, static_cast<int>(c.max_position) - 1);
  for (int64_t t = 0; t < c.tokens; ++t) {
    slots.push_back(rng() % 5 == 0 ? -1 : perm[static_cast<size_t>(t % slots_total)]);
    positions.push_back(pos(rng));
  }
  const int64_t half = (c.rotary_dim == 0 ? c.dk : c.rotary_dim) / 2;
  for (int64_t p = 0; p < c.max_position; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = p * std::pow(10000.0, -static_cast<double>(i) / half);
      cos.push_back(c.exact_values ? unit(rng) / 64.0f : static_cast<float>(std::cos(angle)));
      sin.push_back(c.exact_values ? unit(rng) / 64.0f : static_cast<float>(std::sin(angle)));
    }
  }
}

int64_t AppendData::CacheIndex(int64_t block, int64_t h, int64_t row,
                               int64_t d, int64_t dim) const {
  return c.nhd ? ((block * c.block_size + row) * c.kv_heads + h) * dim + d
               : ((block * c.kv_heads + h) * c.block_size + row) * dim + d;
}

int64_t AppendData::RowIndex(int64_t t, int64_t h, int64_t d, int64_t heads,
                             int64_t dim) const {
  return t * (heads * dim + c.row_pad) + h * dim + d;
}

namespace {

// [1, heads, tokens, dim] over token rows of heads * dim + pad elements.
template <class View, class Ptr>
View TokenRows(Ptr data, DType dtype, int64_t tokens, int64_t heads,
               int64_t dim, int64_t pad) {
  View v = MakeTokenMajor(data, dtype, tokens, heads, dim);
  v.strides[2] = heads * dim + pad;
  return v;
}

}  // namespace

TensorView AppendData::KNew() const {
  return TokenRows<TensorView>(k_new.data(), c.k_dtype, c.tokens, c.kv_heads, c.dk, c.row_pad);
}
TensorView AppendData::VNew() const {
  return TokenRows<TensorView>(v_new.data(), c.v_dtype, c.tokens, c.kv_heads, c.dv, c.row_pad);
}
MutableTensorView AppendData::Q() {
  return TokenRows<MutableTensorView>(q.data(), c.q_dtype, c.tokens, c.q_heads, c.dk,
                                      c.row_pad);
}
MutableTensorView AppendData::KCache() {
  return c.nhd ? MakePagedNHD(k_cache.data(), c.kc_dtype, c.num_blocks, c.block_size,
                              c.kv_heads, c.dk)
               : MakePagedHND(k_cache.data(), c.kc_dtype, c.num_blocks, c.block_size,
                              c.kv_heads, c.dk);
}
MutableTensorView AppendData::VCache() {
  return c.nhd ? MakePagedNHD(v_cache.data(), c.vc_dtype, c.num_blocks, c.block_size,
                              c.kv_heads, c.dv)
               : MakePagedHND(v_cache.data(), c.vc_dtype, c.num_blocks, c.block_size,
                              c.kv_heads, c.dv);
}

RotaryEmbedding AppendData::Rotary() const {
  RotaryEmbedding r;
  if (!c.rotate) return r;
  r.positions = positions.data();
  r.cos = cos.data();
  r.sin = sin.data();
  r.max_position = c.max_position;
  r.rotary_dim = c.rotary_dim;
  r.interleaved = c.interleaved;
  return r;
}

Status AppendData::Run(const ExecutionOptions& exec) {
  return AppendKv(KNew(), VNew(), KCache(), VCache(), slots.data(), Rotary(),
                  c.with_q ? Q() : MutableTensorView(), exec);
}

double ReferenceDim(const AppendCase& c, const AppendData& data,
                    const std::vector<double>& x, int64_t d, int32_t position,
                    double* magnitude) {
  const int64_t dim = c.rotary_dim == 0 ? c.dk : c.rotary_dim;
  *magnitude = std::fabs(x[d]);
  if (!c.rotate || d >= dim) return x[d];
  const int64_t half = dim / 2;
  // The pair of d, and whether d is its first (x) or second (y) member.
  const int64_t pair = c.interleaved ? d / 2 : d % half;
  const bool first = c.interleaved ? d % 2 == 0 : d < half;
  const int64_t partner = c.interleaved ? (first ? d + 1 : d - 1)
                                        : (first ? d + half : d - half);
  const double cs = data.cos[position * half + pair];
  const double sn = data.sin[position * half + pair];
  *magnitude += std::fabs(x[partner]);
  return first ? x[d] * cs - x[partner] * sn : x[d] * cs + x[partner] * sn;
}

namespace {

// Whether the case rotates dim d. Other dims are only converted, which must
// be bit-exact for any value.
bool Rotated(const AppendCase& c, int64_t d) {
  return c.rotate && d < (c.rotary_dim == 0 ? c.dk : c.rotary_dim);
}

// Counts mismatches and reports the first few.
struct Checker {
  int failures = 0;

  void Value(double got, double ref, double magnitude, DType dtype, bool exact,
             const char* what, int64_t a, int64_t b, int64_t d) {
    const double want = RoundTo(ref, dtype);
    bool ok;
    if (std::isnan(want)) {
      ok = std::isnan(got);
    } else if (exact) {
      ok = got == want && std::signbit(got) == std::signbit(want);
    } else {
      ok = std::fabs(got - ref) <= UlpOf(ref, dtype) + 0x1p-22 * magnitude;
    }
    if (!ok && ++failures <= 5) {
      ADD_FAILURE() << what << " (" << a << ", " << b << ", " << d << "): got "
                    << got << ", reference " << ref << " rounds to " << want;
    }
  }

  void Bytes(const Storage& got, const Storage& before, int64_t i,
             const char* what, int64_t slot) {
    const int64_t size = DTypeSize(got.dtype);
    if (std::memcmp(&got.bytes[i * size], &before.bytes[i * size], size) != 0 &&
        ++failures <= 5) {
      ADD_FAILURE() << what << " slot " << slot << " was written but no token maps to it";
    }
  }
};

// One cache (K when `is_k`) against the reference.
void CheckCache(const AppendData& before, const AppendData& after, bool is_k,
                const std::vector<int64_t>& token_of_slot, Checker* check) {
  const AppendCase& c = before.c;
  const int64_t dim = is_k ? c.dk : c.dv;
  const Storage& in = is_k ? before.k_new : before.v_new;
  const Storage& got = is_k ? after.k_cache : after.v_cache;
  const Storage& old = is_k ? before.k_cache : before.v_cache;
  AppendCase rc = c;
  rc.rotate = is_k && c.rotate;
  for (int64_t slot = 0; slot < c.num_blocks * c.block_size; ++slot) {
    const int64_t t = token_of_slot[static_cast<size_t>(slot)];
    const int64_t block = slot / c.block_size, row = slot % c.block_size;
    for (int64_t h = 0; h < c.kv_heads; ++h) {
      std::vector<double> x(static_cast<size_t>(dim));
      for (int64_t d = 0; d < dim && t >= 0; ++d) {
        x[d] = in.Get(before.RowIndex(t, h, d, c.kv_heads, dim));
      }
      for (int64_t d = 0; d < dim; ++d) {
        const int64_t i = before.CacheIndex(block, h, row, d, dim);
        if (t < 0) {
          check->Bytes(got, old, i, is_k ? "k_cache" : "v_cache", slot);
          continue;
        }
        double mag;
        const double ref = ReferenceDim(rc, before, x, d, before.positions[t], &mag);
        check->Value(got.Get(i), ref, mag, got.dtype, c.exact_values || !Rotated(rc, d),
                     is_k ? "k_cache (token, head, dim)" : "v_cache (token, head, dim)",
                     t, h, d);
      }
    }
  }
}

}  // namespace

void ExpectAppended(const AppendData& before, const AppendData& after) {
  const AppendCase& c = before.c;
  std::vector<int64_t> token_of_slot(static_cast<size_t>(c.num_blocks * c.block_size), -1);
  for (int64_t t = 0; t < c.tokens; ++t) {
    if (before.slots[t] >= 0) token_of_slot[static_cast<size_t>(before.slots[t])] = t;
  }
  Checker check;
  CheckCache(before, after, true, token_of_slot, &check);
  CheckCache(before, after, false, token_of_slot, &check);
  for (int64_t t = 0; t < c.tokens; ++t) {
    for (int64_t h = 0; h < c.q_heads; ++h) {
      std::vector<double> x(static_cast<size_t>(c.dk));
      for (int64_t d = 0; d < c.dk; ++d) x[d] = before.q.Get(before.RowIndex(t, h, d, c.q_heads, c.dk));
      for (int64_t d = 0; d < c.dk; ++d) {
        double mag = 0.0;
        const double ref = c.with_q ? ReferenceDim(c, before, x, d, before.positions[t], &mag) : x[d];
        const int64_t i = before.RowIndex(t, h, d, c.q_heads, c.dk);
        check.Value(after.q.Get(i), ref, mag, c.q_dtype,
                    c.exact_values || !c.with_q || !Rotated(c, d),
                    "q (token, head, dim)", t, h, d);
      }
    }
  }
  EXPECT_EQ(check.failures, 0);
}

}  // namespace test
}  // namespace simdattn
