// The AVX3_AMX entry: it follows the CPU (or the emulator in tests), a cap
// turns it off, and the tile emulator computes what TDPBF16PS computes.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/kernels/amx_tiles.h"
#include "lib/reference.h"
#include "simdattn/attention.h"
#include "tests/attention_harness.h"
#include "tests/test_util.h"

namespace simdattn {
namespace test {
namespace {

bool CpuFlag(const std::string& name) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line);
    for (std::string w; words >> w;) {
      if (w == name) return true;
    }
    return false;
  }
  return false;
}

bool Listed(const std::string& target) {
  const std::vector<std::string> avail = AvailableTargets();
  return std::find(avail.begin(), avail.end(), target) != avail.end();
}

// Available exactly when the kernel reports AMX-TILE, AMX-BF16 and AVX-512
// for this CPU (or, emulated, AVX-512 alone); then chosen without a cap, and
// capped off by AVX3_BF16.
TEST(AmxTest, EntryFollowsTheCpu) {
#if defined(__x86_64__)
  const bool avx512 = CpuFlag("avx512f") && CpuFlag("avx512bw") &&
                      CpuFlag("avx512dq") && CpuFlag("avx512vl");
  const bool tiles = CpuFlag("amx_tile") && CpuFlag("amx_bf16");
  // A build without AVX3 (SIMDATTN_REDUCED_TARGETS) has no AMX entry.
  const std::vector<std::string> compiled = CompiledTargets();
  const bool avx3 = std::find(compiled.begin(), compiled.end(), "AVX3") != compiled.end();
  EXPECT_EQ(Listed("AVX3_AMX"), avx3 && avx512 && (tiles || AmxEmulated()));
  if (!Listed("AVX3_AMX")) return;
  std::string selected;
  ASSERT_TRUE(SelectedTarget(&selected).ok());
  EXPECT_EQ(selected, "AVX3_AMX");
  {
    ScopedTarget cap("AVX3_BF16");
    ASSERT_TRUE(SelectedTarget(&selected).ok());
    EXPECT_NE(selected, "AVX3_AMX");
  }
#else
  EXPECT_FALSE(Listed("AVX3_AMX"));
  EXPECT_FALSE(SetMaxTarget("AVX3_AMX").ok());
#endif
}

uint16_t Bf16Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<uint16_t>(u >> 16);
}

// Tiles A (16 x 32 bf16), B (16 rows of 16 bf16 pairs) and C (16 x 16 f32)
// with values that make the rounding of each addition visible: terms far
// below the accumulator, cancellations, denormals, Inf and NaN.
struct DotInputs {
  uint16_t a[16 * 32], b[16 * 32];
  float c[16 * 16];
};

DotInputs MakeDotInputs(uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 30);
  std::uniform_int_distribution<int> special(0, 199);
  DotInputs in;
  auto value = [&]() {
    switch (special(rng)) {
      case 0:
        return std::ldexp(1.0f, -130);  // denormal
      case 1:
        return INFINITY;
      case 2:
        return NAN;
      case 3:
        return -0.0f;
      default:
        return std::ldexp(unit(rng), exponent(rng));
    }
  };
  for (uint16_t& x : in.a) x = Bf16Bits(value());
  for (uint16_t& x : in.b) x = Bf16Bits(value());
  for (float& x : in.c) x = value() * 1e6f;
  return in;
}

template <class Tiles>
void RunDot(const DotInputs& in, float* out) {
  Tiles::Configure();
  Tiles::template Load<0>(in.c, 64);
  Tiles::template Load<4>(in.a, 64);
  Tiles::template Load<6>(in.b, 64);
  Tiles::template Dot<0>();
  Tiles::template Store<0>(out, 64);
  Tiles::Release();
}

// The emulator's order of additions (amx_tiles.h), on sums whose rounding
// tells the orders apart; a is [m][2k + h] and b [k][2n + h].
float EmulatedSum(float c, const std::vector<std::pair<int, float>>& terms) {
  DotInputs in{};
  in.c[0] = c;
  for (const auto& [i, x] : terms) {  // product i: element i of row 0 times 1
    in.a[i] = Bf16Bits(x);
    in.b[(i / 2) * 32 + i % 2] = Bf16Bits(1.0f);
  }
  float out[16 * 16];
  RunDot<amx::EmulatedTiles>(in, out);
  return out[0];
}

TEST(AmxTest, EmulatorSumsTwoChainsThenTheAccumulator) {
  const float t = std::ldexp(1.0f, 24);  // above it, f32 steps by 2
  // Even products 2^24 and 1 (k = 0, 1) round to 2^24 in their chain; the
  // odd chain's 1 + 1 = 2 is added after: 2^24 + 2, not 2^24 + 4.
  EXPECT_EQ(EmulatedSum(0.0f, {{0, t}, {2, 1.0f}, {1, 1.0f}, {3, 1.0f}}) - t, 2.0f);
  // Even 2^24 + 2, odd 1: their sum 2^24 + 3 rounds to even, 2^24 + 4.
  EXPECT_EQ(EmulatedSum(0.0f, {{0, t}, {2, 2.0f}, {1, 1.0f}}) - t, 4.0f);
  // C comes last: 2^24 + (1 + 2) rounds to 2^24 + 4 (C first: 2^24 + 2).
  EXPECT_EQ(EmulatedSum(t, {{0, 1.0f}, {2, 2.0f}}) - t, 4.0f);
  // k ascending in a chain: -2^24 + 1 is exact, then + 2^24 gives 1.
  EXPECT_EQ(EmulatedSum(0.0f, {{26, -t}, {28, 1.0f}, {30, t}}), 1.0f);
  DotInputs in{};
  float out[16 * 16];
  // Products exact in f32, denormal products flushed: 2^-70 * 2^-70.
  in.c[0] = 0.0f;
  in.a[0] = Bf16Bits(std::ldexp(1.0f, -70));
  in.b[0] = Bf16Bits(std::ldexp(1.0f, -70));
  in.a[1] = in.b[1] = 0;
  RunDot<amx::EmulatedTiles>(in, out);
  EXPECT_EQ(out[0], 0.0f);
}

// Where the CPU has the tiles: the emulator's results are the hardware's,
// bit for bit (NaN as NaN), on inputs that exercise every rounding.
TEST(AmxTest, EmulatorMatchesTheTiles) {
#if defined(__x86_64__)
  if (AmxEmulated() || !Listed("AVX3_AMX")) {
    GTEST_SKIP() << "no AMX tiles on this CPU to compare the emulator with";
  }
  for (uint32_t seed = 1; seed <= 200; ++seed) {
    const DotInputs in = MakeDotInputs(seed);
    float hw[16 * 16], emu[16 * 16];
    RunDot<amx::HardwareTiles>(in, hw);
    RunDot<amx::EmulatedTiles>(in, emu);
    for (int i = 0; i < 16 * 16; ++i) {
      if (std::isnan(hw[i])) {
        ASSERT_TRUE(std::isnan(emu[i])) << "seed " << seed << " element " << i;
        continue;
      }
      uint32_t h, e;
      std::memcpy(&h, &hw[i], 4);
      std::memcpy(&e, &emu[i], 4);
      ASSERT_EQ(h, e) << "seed " << seed << " element " << i << ": " << hw[i]
                      << " against " << emu[i];
    }
  }
#else
  GTEST_SKIP() << "AMX is x86-64 only";
#endif
}

// ExecutionOptions::allow_bf16_compute: f32 and f16 inputs run on the tiles
// of AVX3_AMX, rounded to bf16 (within the bf16 bound, and not the f32
// result), and every other target ignores it (the same bits as without).
TEST(AmxTest, AllowBf16ComputeRoundsOnlyOnTheTiles) {
  const DType types[][2] = {{DType::kF32, DType::kF32}, {DType::kF16, DType::kF16},
                            {DType::kF32, DType::kBF16}, {DType::kBF16, DType::kF16}};
  uint32_t seed = 900;
  for (const auto& t : types) {
    for (bool causal : {false, true}) {
      // Quick mode: f32 and mixed 16-bit inputs, causal only.
      const bool quick_case = causal && (t[0] == DType::kF32 ? t[1] == DType::kF32
                                                             : t[0] == DType::kBF16);
      if (QuickMode() && !quick_case) {
        ++seed;
        continue;
      }
      Case c;
      c.batch = 1, c.q_heads = 4, c.kv_heads = 2, c.q_len = 130, c.kv_len = 300;
      c.dk = 72, c.dv = 40;
      c.q_dtype = t[0];
      c.kv_dtype = t[1];
      c.options.causal = causal;
      c.options.alignment = Alignment::kBottomRight;
      SCOPED_TRACE(std::string(DTypeName(t[0])) + "/" + DTypeName(t[1]) +
                   (causal ? " causal" : ""));
      const Inputs in = MakeInputs(c, seed++);
      std::vector<double> o_ref, lse_ref;
      ASSERT_TRUE(ReferenceAttention(in.q.View(), in.k.View(), in.v.View(), c.options,
                                     &o_ref, &lse_ref).ok());
      const double max_v = std::max(1.0, MaxAbs(in.v));
      ExecutionOptions bf16;
      bf16.allow_bf16_compute = true;
      for (const std::string& target : TestTargets()) {
        SCOPED_TRACE(target);
        const Outputs exact = RunFast(c, in, target);
        const Outputs rounded = RunFast(c, in, target, bf16);
        ASSERT_TRUE(exact.status.ok() && rounded.status.ok());
        EXPECT_LE(MaxError(rounded.o, o_ref, max_v), OutputBound(DType::kBF16));
        for (size_t r = 0; r < lse_ref.size(); ++r) {
          ASSERT_NEAR(rounded.lse[r], lse_ref[r], kLseBound16) << "row " << r;
        }
        if (target == "AVX3_AMX") {
          EXPECT_NE(rounded.o.bytes, exact.o.bytes) << "the products were not rounded";
        } else {
          EXPECT_EQ(rounded.o.bytes, exact.o.bytes);
        }
      }
    }
  }
}

// K and V of different types (f32 K, f16 V) round each from its own type.
TEST(AmxTest, AllowBf16ComputeWithKAndVOfDifferentTypes) {
  std::mt19937 rng(950);
  Tensor q(DType::kF32, 1, 4, 96, 64), k(DType::kF32, 1, 2, 200, 64),
      v(DType::kF16, 1, 2, 200, 48);
  q.FillUniform(&rng, -1.0f, 1.0f);
  k.FillUniform(&rng, -1.0f, 1.0f);
  v.FillUniform(&rng, -1.0f, 1.0f);
  AttentionOptions options;
  options.causal = true;
  options.alignment = Alignment::kBottomRight;
  std::vector<double> o_ref, lse_ref;
  ASSERT_TRUE(ReferenceAttention(q.View(), k.View(), v.View(), options, &o_ref, &lse_ref).ok());
  ExecutionOptions exec;
  exec.allow_bf16_compute = true;
  for (const std::string& target : TestTargets()) {
    SCOPED_TRACE(target);
    ScopedTarget cap(target);
    Tensor o(DType::kF32, 1, 4, 96, 48);
    RunInfo info;
    ASSERT_TRUE(Attention(q.View(), k.View(), v.View(), o.MutableView(), options, {}, exec,
                          &info).ok());
    RecordTargetRun(info.target);
    EXPECT_LE(MaxError(o, o_ref, std::max(1.0, MaxAbs(v))), OutputBound(DType::kBF16));
  }
}

// Decode tasks of 5 to 32 rows with bf16 K/V in place (or f32 Q with
// allow_bf16_compute) run their keys on the tiles 32 at a time and leave
// the last ones to the decode path: against the reference on every target
// (GQA groups of 5 and 8, speculative decoding with causal cuts in the last
// chunk only, one and two halves of 16 rows, strided rows, several key
// chunks, Dv != Dk). Where they run on
// the tiles, AVX3_AMX rounds P to bf16 and so differs from AVX3_BF16, whose
// decode path keeps it f32; where they do not (4 rows, head dims that are
// not whole tiles, options) the two give the same bits.
TEST(AmxTest, DecodeOnTheTiles) {
  struct Shape {
    int64_t q_heads, kv_heads, q_len, dk, dv;
    bool causal, tiles;
    DType q;
  };
  const std::vector<Shape> shapes = {
      {16, 2, 1, 128, 128, false, true, DType::kBF16},  // GQA 8
      {10, 2, 1, 64, 96, false, true, DType::kBF16},    // 5 rows
      {8, 2, 2, 64, 64, true, true, DType::kBF16},      // Lq 2, GQA 4: 8 rows
      {8, 2, 4, 128, 64, true, true, DType::kF32},      // 16 rows, rounded
      {8, 2, 8, 64, 128, true, true, DType::kBF16},     // Lq 8: 32 rows
      {24, 2, 2, 96, 64, true, true, DType::kBF16},     // 24 rows
      {8, 2, 1, 64, 64, false, false, DType::kBF16},    // 4 rows: fused
      {16, 2, 1, 72, 72, false, false, DType::kBF16},   // Dk 72
      {16, 2, 1, 64, 64, true, false, DType::kF32},     // f32 Q, not allowed
  };
  uint32_t seed = 980;
  for (size_t n = 0; n < shapes.size(); ++n) {
    const Shape& shape = shapes[n];
    // Quick mode (qemu, no tiles): 8 and 32 rows only.
    if (QuickMode() && n != 0 && n != 4) {
      ++seed;
      continue;
    }
    Case c;
    c.batch = 2;
    c.q_heads = shape.q_heads;
    c.kv_heads = shape.kv_heads;
    c.q_len = shape.q_len;
    c.kv_len = QuickMode() ? 600 : 1300;
    c.dk = shape.dk;
    c.dv = shape.dv;
    c.q_dtype = shape.q;
    c.kv_dtype = DType::kBF16;
    c.layout = seed % 2 ? Layout::kBSHD : Layout::kBHSD;
    c.options.causal = shape.causal;
    c.options.alignment = Alignment::kBottomRight;
    c.bound = OutputBound(DType::kBF16);
    SCOPED_TRACE(Describe(c));
    const Inputs in = MakeInputs(c, seed++);
    const bool rounded = shape.q == DType::kF32 && shape.tiles;
    ExecutionOptions exec;
    exec.allow_bf16_compute = rounded;
    std::vector<double> o_ref, lse_ref;
    ASSERT_TRUE(ReferenceAttention(in.q.View(), in.k.View(), in.v.View(), c.options, &o_ref,
                                   &lse_ref)
                    .ok());
    const double max_v = std::max(1.0, MaxAbs(in.v));
    decltype(Tensor::bytes) amx, bf16;
    for (const std::string& target : TestTargets()) {
      SCOPED_TRACE(target);
      const Outputs out = RunFast(c, in, target, exec);
      ASSERT_TRUE(out.status.ok()) << out.status.message;
      EXPECT_LE(MaxError(out.o, o_ref, max_v), OutputBound(DType::kBF16));
      for (size_t r = 0; r < lse_ref.size(); ++r) {
        ASSERT_NEAR(out.lse[r], lse_ref[r], kLseBound16) << "row " << r;
      }
      if (target == "AVX3_AMX") amx = out.o.bytes;
      if (target == "AVX3_BF16") bf16 = out.o.bytes;
    }
    if (amx.empty() || bf16.empty()) continue;
    if (shape.tiles) {
      EXPECT_NE(amx, bf16) << "the keys did not run on the tiles";
    } else {
      EXPECT_EQ(amx, bf16);
    }
  }
}

// A NaN or infinite key on the tiles' decode: the 32 keys holding it, and
// every key after them, go to the decode path, which gives what the
// reference gives (NaN rows where it has them, the rest within the bound).
TEST(AmxTest, DecodeOnTheTilesWithNonFiniteKeys) {
  const float inf = std::numeric_limits<float>::infinity();
  for (int which = 0; which < 3; ++which) {
    Case c;
    c.q_dtype = c.kv_dtype = DType::kBF16;
    c.q_heads = 16;
    c.kv_heads = 2;
    c.kv_len = QuickMode() ? 300 : 1001;
    c.dk = c.dv = 64;
    Inputs in = MakeInputs(c, 990 + which);
    const float x = which == 0 ? std::numeric_limits<float>::quiet_NaN()
                               : (which == 1 ? inf : -inf);
    in.k.Set(0, 0, 100, 3, x);
    std::vector<double> o_ref, lse_ref;
    ASSERT_TRUE(ReferenceAttention(in.q.View(), in.k.View(), in.v.View(), c.options, &o_ref,
                                   &lse_ref)
                    .ok());
    const double bound = OutputBound(DType::kBF16) * std::max(1.0, MaxAbs(in.v));
    int nan_rows = 0;
    for (int64_t h = 0; h < 8; ++h) nan_rows += std::isnan(o_ref[h * c.dv]) ? 1 : 0;
    if (which == 0) EXPECT_EQ(nan_rows, 8);
    if (which == 1) EXPECT_GT(nan_rows, 0);
    for (const std::string& target : TestTargets()) {
      SCOPED_TRACE(testing::Message() << target << " " << x);
      const Outputs out = RunFast(c, in, target);
      ASSERT_TRUE(out.status.ok()) << out.status.message;
      ExpectNanWhereReferenceIs(out.o, o_ref, bound);
    }
  }
}

}  // namespace
}  // namespace test
}  // namespace simdattn
