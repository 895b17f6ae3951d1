// Quantized KV caches (int8, q8_0, fp8 e4m3/e5m2; SEMANTICS.md "Quantized
// KV caches") on every target, decode and prefill, packed and in place,
// held to the double-precision reference on the dequantized values: every
// format for K and for V, mixes with the 16/32-bit types, odd head dims,
// GQA, scales of 0, every fp8 code, and NaN/Inf.

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/reference.h"
#include "tests/attention_harness.h"
#include "tests/quant_util.h"

namespace simdattn {
namespace test {
namespace {

// SEMANTICS.md: quantized K/V are dequantized within one f32 rounding, so
// the kernels meet the f32 bound against the reference on the dequantized
// values (when Q and O are f32).
constexpr double kQuantBound = 2e-5;

struct QuantCase {
  int64_t batch = 1, q_heads = 8, kv_heads = 2, q_len = 1, kv_len = 300;
  int64_t dk = 64, dv = 64;
  DType k_dtype = DType::kInt8, v_dtype = DType::kInt8;
  Layout layout = Layout::kBSHD;
  int64_t pad = 0;
  AttentionOptions options;
  float k_fp8_scale = 1.0f / 448.0f, v_fp8_scale = 1.0f / 448.0f;
};

std::string Describe(const QuantCase& c) {
  return std::string("K ") + DTypeName(c.k_dtype) + " V " + DTypeName(c.v_dtype) +
         " B" + std::to_string(c.batch) + " Hq" + std::to_string(c.q_heads) +
         " Hkv" + std::to_string(c.kv_heads) + " Lq" + std::to_string(c.q_len) +
         " Lk" + std::to_string(c.kv_len) + " Dk" + std::to_string(c.dk) + " Dv" +
         std::to_string(c.dv) + (c.options.causal ? " causal" : "");
}

struct QuantInputs {
  Tensor q;
  KvTensor k, v;
};

QuantInputs MakeQuantInputs(const QuantCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  Tensor q(DType::kF32, c.batch, c.q_heads, c.q_len, c.dk, c.layout);
  Tensor k(DType::kF32, c.batch, c.kv_heads, c.kv_len, c.dk);
  Tensor v(DType::kF32, c.batch, c.kv_heads, c.kv_len, c.dv);
  q.FillUniform(&rng, -1.0f, 1.0f);
  k.FillUniform(&rng, -1.0f, 1.0f);
  v.FillUniform(&rng, -1.0f, 1.0f);
  QuantInputs in;
  in.q = q;
  in.k = StoreKv(k, c.k_dtype, c.layout, c.k_fp8_scale, c.pad);
  in.v = StoreKv(v, c.v_dtype, c.layout, c.v_fp8_scale, c.pad);
  return in;
}

AttentionOptions OptionsOf(const QuantCase& c, const QuantInputs& in) {
  AttentionOptions o = c.options;
  SetScales(in.k, true, &o);
  SetScales(in.v, false, &o);
  return o;
}

struct QuantOutputs {
  Tensor o;
  std::vector<float> lse;
  RunInfo info;
};

// One call on `target`; fails the test if the call fails.
QuantOutputs RunQuant(const QuantCase& c, const QuantInputs& in,
                      const std::string& target) {
  QuantOutputs out;
  out.o = Tensor(DType::kF32, c.batch, c.q_heads, c.q_len, c.dv, c.layout);
  out.o.FillBytes(0xA5);
  out.lse.assign(static_cast<size_t>(c.batch * c.q_heads * c.q_len), 1234.0f);
  const MutableTensorView lse =
      MakeBHSD(out.lse.data(), DType::kF32, c.batch, c.q_heads, c.q_len, 1);
  ExecutionOptions exec;
  exec.max_target = target.c_str();
  const Status s = Attention(in.q.View(), in.k.View(), in.v.View(),
                             out.o.MutableView(), OptionsOf(c, in), lse, exec,
                             &out.info);
  EXPECT_TRUE(s.ok()) << s.message;
  if (s.ok()) RecordTargetRun(out.info.target);
  return out;
}

// Every target, packed and in place, against the reference.
void CheckQuant(const QuantCase& c, const QuantInputs& in,
                double bound = kQuantBound) {
  SCOPED_TRACE(Describe(c));
  std::vector<double> o_ref, lse_ref;
  const Status rs = ReferenceAttention(in.q.View(), in.k.View(), in.v.View(),
                                       OptionsOf(c, in), &o_ref, &lse_ref);
  ASSERT_TRUE(rs.ok()) << rs.message;
  const double max_v = in.v.MaxAbs();
  for (PackPolicy pack : {PackPolicy::kAuto, PackPolicy::kNever}) {
    // Quick mode (qemu): the packed path only.
    if (QuickMode() && pack == PackPolicy::kNever) continue;
    for (const std::string& target : TestTargets()) {
      SCOPED_TRACE(std::string(pack == PackPolicy::kNever ? "in place " : "packed ") +
                   target);
      ScopedPackPolicy policy(pack);
      const QuantOutputs out = RunQuant(c, in, target);
      EXPECT_EQ(std::string(out.info.target), target);
      EXPECT_LE(MaxError(out.o, o_ref, max_v), bound);
      ExpectPaddingUntouched(out.o);
      double lse_err = 0.0;
      for (size_t i = 0; i < lse_ref.size(); ++i) {
        const double e = std::fabs(out.lse[i] - lse_ref[i]);
        if (!(e <= lse_err)) lse_err = std::isnan(e) ? INFINITY : e;
      }
      EXPECT_LE(lse_err, kLseBound);
    }
  }
}

void CheckQuantCase(const QuantCase& c, uint32_t seed) {
  CheckQuant(c, MakeQuantInputs(c, seed));
}

const DType kQuantTypes[] = {DType::kInt8, DType::kQ8_0, DType::kFp8E4M3,
                             DType::kFp8E5M2};

// Each format for K and V alike: decode (GQA, Lq 1), speculative decode
// (Lq 3, causal) and prefill (causal, several query blocks), MHA and MQA.
TEST(QuantKvTest, EveryFormatDecodeAndPrefill) {
  uint32_t seed = 7000;
  for (DType t : kQuantTypes) {
    for (int shape = 0; shape < 4; ++shape) {
      QuantCase c;
      c.k_dtype = c.v_dtype = t;
      c.kv_heads = shape == 3 ? 1 : 2;
      c.q_len = shape == 0 ? 1 : shape == 1 ? 3 : 70;
      c.kv_len = shape == 0 ? (QuickMode() ? 300 : 1100) : 77;
      c.batch = shape == 2 ? 2 : 1;
      c.layout = shape % 2 ? Layout::kBHSD : Layout::kBSHD;
      c.pad = shape == 2 ? 5 : 0;
      c.options.causal = shape >= 1;
      c.options.alignment = Alignment::kBottomRight;
      CheckQuantCase(c, seed++);
    }
  }
}

// Decode without options on int8/q8_0/fp8 K/V runs the fused loop with the values
// widened in registers (every target that has it: not SCALAR, not SVE).
TEST(QuantKvTest, FusedDecodeRuns) {
  for (DType t : kQuantTypes) {
    QuantCase c;
    c.k_dtype = c.v_dtype = t;
    const QuantInputs in = MakeQuantInputs(c, 7050);
    for (const std::string& target : TestTargets()) {
      const QuantOutputs out = RunQuant(c, in, target);
      const bool fused = target != "SCALAR" && target.rfind("SVE", 0) != 0;
      EXPECT_EQ(std::string(out.info.path) == "fused decode", fused) << target;
    }
  }
}

// Head dims that are not whole vectors (q8_0 needs D % 32 == 0: 96 and 32).
TEST(QuantKvTest, OddHeadDims) {
  uint32_t seed = 7100;
  for (DType t : kQuantTypes) {
    for (int q_len : {1, 40}) {
      QuantCase c;
      c.k_dtype = c.v_dtype = t;
      const bool q8 = t == DType::kQ8_0;
      c.dk = q8 ? 96 : 41;
      c.dv = q8 ? 32 : 19;
      c.q_len = q_len;
      c.kv_len = 150;
      c.q_heads = 6;
      c.kv_heads = 3;
      CheckQuantCase(c, seed++);
    }
  }
}

// K and V in different formats, quantized and 16/32-bit.
TEST(QuantKvTest, MixedFormats) {
  const DType mixes[][2] = {
      {DType::kInt8, DType::kF16},     {DType::kQ8_0, DType::kFp8E4M3},
      {DType::kF32, DType::kInt8},     {DType::kFp8E5M2, DType::kBF16},
      {DType::kBF16, DType::kQ8_0},    {DType::kF16, DType::kBF16},
      {DType::kFp8E4M3, DType::kInt8}, {DType::kF32, DType::kF16}};
  uint32_t seed = 7200;
  for (const auto& mix : mixes) {
    for (int q_len : {1, 33}) {
      QuantCase c;
      c.k_dtype = mix[0];
      c.v_dtype = mix[1];
      c.q_len = q_len;
      c.kv_len = q_len == 1 ? 700 : 90;
      c.options.causal = q_len > 1;
      c.options.alignment = Alignment::kBottomRight;
      CheckQuantCase(c, seed++);
    }
  }
}

// Options on the decode path's dequantized tiles: softcap, ALiBi, a mask,
// kv lengths and a window.
TEST(QuantKvTest, WithOptions) {
  float slopes[8] = {0.1f, 0.2f, 0.05f, 0.3f, 0.01f, 0.02f, 0.4f, 0.15f};
  float sinks[8] = {0.5f, -1.0f, 1.0f, 0.0f, 2.0f, -3.0f, 0.25f, 1.5f};
  int64_t lens[2] = {500, 37};
  uint32_t seed = 7300;
  for (DType t : kQuantTypes) {
    QuantCase c;
    c.k_dtype = t;
    c.v_dtype = t == DType::kInt8 ? DType::kFp8E5M2 : DType::kInt8;
    c.batch = 2;
    c.kv_len = 500;
    c.options.softcap = 5.0f;
    c.options.alibi_slopes = slopes;
    c.options.sinks = sinks;
    c.options.kv_lengths = lens;
    c.options.window_left = 300;
    c.options.alignment = Alignment::kBottomRight;
    CheckQuantCase(c, seed++);
  }
}

// Scales of 0: int8 rows with scale 0 read as zeros, an fp8 tensor scale of
// 0 makes every key's value 0.
TEST(QuantKvTest, ZeroScales) {
  for (int q_len : {1, 20}) {
    QuantCase c;
    c.q_len = q_len;
    c.kv_len = 130;
    QuantInputs in = MakeQuantInputs(c, 7400 + q_len);
    for (size_t i = 0; i < in.k.scales.size(); i += 3) in.k.scales[i] = 0.0f;
    for (size_t i = 0; i < in.v.scales.size(); i += 5) in.v.scales[i] = 0.0f;
    CheckQuant(c, in);
    QuantCase f = c;
    f.k_dtype = DType::kFp8E4M3;
    f.v_dtype = DType::kFp8E5M2;
    f.k_fp8_scale = 0.0f;  // quantizes to NaN codes: overwritten below
    QuantInputs fin = MakeQuantInputs(f, 7410 + q_len);
    for (uint8_t& b : fin.k.bytes) b = static_cast<uint8_t>(b & 0x77);  // finite
    fin.v.scale = 0.0f;
    CheckQuant(f, fin);
  }
}

// EveryFp8Code's cases for format t with head dim `dim`.
void CheckEveryFp8Code(DType t, int64_t dim) {
  for (int q_len : {1, 20, -1}) {
    const uint8_t mask = q_len < 0 ? 0x0F : 0xFF;
    q_len = q_len < 0 ? 1 : q_len;
    QuantCase c;
    c.k_dtype = c.v_dtype = t;
    c.q_len = q_len;
    c.kv_len = 256;
    c.dk = c.dv = dim;
    QuantInputs in = MakeQuantInputs(c, 7500 + q_len);
    for (KvTensor* kv : {&in.k, &in.v}) {
      for (int64_t h = 0; h < c.kv_heads; ++h) {
        for (int64_t j = 0; j < c.kv_len; ++j) {
          uint8_t* row = kv->Row(0, h, j);
          for (int64_t e = 0; e < kv->shape[3]; ++e) {
            uint8_t code = static_cast<uint8_t>((j + e * 7 + h) & mask);
            const bool bad = t == DType::kFp8E4M3 ? (code & 0x7F) == 0x7F
                                                  : (code & 0x7F) >= 0x7C;
            row[e] = bad ? static_cast<uint8_t>(code & 0x80) : code;
          }
        }
      }
    }
    // Values up to 448 (57344): scaled so that scores stay moderate.
    in.k.scale = t == DType::kFp8E4M3 ? 1.0f / 448.0f : 1.0f / 57344.0f;
    in.v.scale = 0.5f;
    CheckQuant(c, in);
  }
}

// Every finite fp8 code (e4m3: all but S.1111.111; e5m2: all but exponent
// 31), subnormals and the saturated largest values included, as K and V;
// then only the positive codes below 16 (subnormals and the smallest
// normals): next to the largest values, and with both signs, their errors
// would hide or cancel. Head dims 37 and 80: decode with 80 runs the fused
// loop on x86 and NEON, which tests e4m3 bytes for NaN codes a whole
// vector at a time and the rest (16 bytes on AVX-512) one by one.
TEST(QuantKvTest, EveryFp8Code) {
  for (DType t : {DType::kFp8E4M3, DType::kFp8E5M2}) {
    for (int64_t dim : {37, 80}) {
      CheckEveryFp8Code(t, dim);
    }
  }
}

// NaN and Inf: an fp8 NaN in a V row and an int8 row whose scale is NaN or
// Inf reach exactly the rows that see the key (causal: the later queries).
TEST(QuantKvTest, NanAndInfPropagate) {
  for (DType t : {DType::kFp8E4M3, DType::kFp8E5M2, DType::kInt8}) {
    for (const std::string& target : TestTargets()) {
      SCOPED_TRACE(std::string(DTypeName(t)) + " " + target);
      QuantCase c;
      c.k_dtype = c.v_dtype = t;
      c.q_heads = c.kv_heads = 1;
      c.q_len = c.kv_len = 40;
      c.dk = c.dv = 32;
      c.options.causal = true;
      QuantInputs in = MakeQuantInputs(c, 7600);
      const int64_t bad = 25;
      if (t == DType::kInt8) {
        in.v.scales[bad] = std::numeric_limits<float>::quiet_NaN();
      } else {
        in.v.Row(0, 0, bad)[3] = t == DType::kFp8E4M3 ? 0x7F : 0x7E;
      }
      const QuantOutputs out = RunQuant(c, in, target);
      for (int64_t i = 0; i < c.q_len; ++i) {
        const float x = out.o.Get(0, 0, i, 3);
        EXPECT_EQ(std::isnan(x), i >= bad) << "row " << i << ": " << x;
      }
      if (t != DType::kInt8) continue;
      in.v.scales[bad] = 1.0f;
      in.k.scales[bad] = std::numeric_limits<float>::infinity();
      const QuantOutputs inf = RunQuant(c, in, target);
      for (int64_t i = 0; i < c.q_len; ++i) {
        const float x = inf.o.Get(0, 0, i, 0);
        EXPECT_EQ(std::isfinite(x), i < bad) << "row " << i << ": " << x;
      }
    }
  }
}


// e4m3 decode without options (the fused loop where the target has it):
// a NaN code (S.1111.111, both signs) in one K or V row of KV head 0, at
// the first, a middle or the last key. The fused loop converts e4m3 without
// testing each value, tests each group of keys' bytes instead and, meeting
// a NaN code, runs its keys again with the test per value: the query heads
// of KV head 0 read NaN where the code reaches them (every element for K,
// the code's element for V), and everything else is bit for bit the output
// without the code.
TEST(QuantKvTest, Fp8NanCodesInDecode) {
  QuantCase c;
  c.k_dtype = c.v_dtype = DType::kFp8E4M3;
  c.layout = Layout::kBHSD;
  const QuantInputs base = MakeQuantInputs(c, 7700);
  const int64_t group = c.q_heads / c.kv_heads;
  const int64_t code_elem = 5;
  for (const std::string& target : TestTargets()) {
    const QuantOutputs clean = RunQuant(c, base, target);
    for (bool in_k : {true, false}) {
      for (int64_t bad : {0, 150, 299}) {
        SCOPED_TRACE(target + (in_k ? " K" : " V") + " key " + std::to_string(bad));
        QuantInputs in = base;
        (in_k ? in.k : in.v).Row(0, 0, bad)[code_elem] = bad == 150 ? 0xFF : 0x7F;
        const QuantOutputs out = RunQuant(c, in, target);
        int64_t wrong = 0;
        for (int64_t h = 0; h < c.q_heads; ++h) {
          for (int64_t e = 0; e < c.dv; ++e) {
            const float x = out.o.Get(0, h, 0, e);
            const bool nan = h < group && (in_k || e == code_elem);
            const bool ok = nan ? std::isnan(x) : x == clean.o.Get(0, h, 0, e);
            if (!ok && wrong++ < 4) ADD_FAILURE() << "head " << h << " elem " << e << ": " << x;
          }
        }
        EXPECT_EQ(wrong, 0);
      }
    }
  }
}

}  // namespace
}  // namespace test
}  // namespace simdattn
