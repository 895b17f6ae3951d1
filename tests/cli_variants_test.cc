// `simdattn run` with every SEMANTICS.md option given as flags or .npy files
// (masks of each broadcast shape, kv lengths, windows, softcap, ALiBi
// slopes, sinks, dropout), alone, combined and on the decode path, compared
// with the reference.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "simdattn/attention.h"
#include "tests/cli_util.h"
#include "tests/test_util.h"
#include "tools/npy.h"

namespace simdattn {
namespace test {
namespace {

// The .npy bytes of a dense (pad 0) BHSD tensor stored under `file_shape`,
// which has the same elements (e.g. [Lq, Lk] for a [1, 1, Lq, Lk] tensor).
std::string NpyOf(const Tensor& t, const std::vector<int64_t>& file_shape) {
  const char* descr = t.dtype == DType::kBool  ? "|b1"
                      : t.dtype == DType::kF16 ? "<f2"
                                               : "<f4";
  return npy::MakeHeader(descr, file_shape, 1) +
         std::string(t.bytes.begin(), t.bytes.end());
}

std::string NpyF32(const std::vector<float>& values) {
  return npy::MakeHeader("<f4", {static_cast<int64_t>(values.size())}, 1) +
         std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(float));
}

const Layout kLayouts[] = {Layout::kBHSD, Layout::kBSHD};

TEST(CliVariantTest, BoolMaskLqLk) {
  // One [Lq, Lk] mask for every batch and head; row 3 hides every key.
  const Dims dims = {2, 4, 2, 7, 9, 16, 16};
  Tensor mask(DType::kBool, 1, 1, dims.lq, dims.lk);
  std::mt19937 rng(600);
  std::bernoulli_distribution attend(0.7);
  for (int64_t i = 0; i < dims.lq; ++i) {
    for (int64_t j = 0; j < dims.lk; ++j) {
      mask.Set(0, 0, i, j, i != 3 && attend(rng) ? 1.0f : 0.0f);
    }
  }
  uint32_t seed = 601;
  for (Layout layout : kLayouts) {
    RunSpec spec;
    spec.dims = dims;
    spec.layout = layout;
    spec.seed = seed++;
    spec.files = {{"--mask", "mask.npy", NpyOf(mask, {dims.lq, dims.lk})}};
    spec.options.mask = mask.View();
    RunAndCheck(spec);
  }
}

TEST(CliVariantTest, AdditiveF32PaddingMask) {
  // [B, 1, 1, Lk] additive mask: finite biases, -inf past each batch's
  // length (batch 2 hides everything: zero rows, LSE -inf).
  const Dims dims = {3, 4, 2, 5, 8, 16, 8};
  const int64_t lens[] = {8, 5, 0};
  Tensor mask(DType::kF32, dims.b, 1, 1, dims.lk);
  std::mt19937 rng(610);
  std::uniform_real_distribution<float> bias(-1.0f, 1.0f);
  for (int64_t b = 0; b < dims.b; ++b) {
    for (int64_t j = 0; j < dims.lk; ++j) {
      mask.Set(b, 0, 0, j, j < lens[b] ? bias(rng) : -INFINITY);
    }
  }
  uint32_t seed = 611;
  for (Layout layout : kLayouts) {
    RunSpec spec;
    spec.dims = dims;
    spec.layout = layout;
    spec.seed = seed++;
    spec.files = {{"--mask", "pad.npy", NpyOf(mask, {dims.b, 1, 1, dims.lk})}};
    spec.options.mask = mask.View();
    RunAndCheck(spec);
  }
}

TEST(CliVariantTest, AdditiveF16Mask) {
  // '<f2' masks hold the same values as the f16 view the reference reads.
  const Dims dims = {1, 2, 2, 6, 10, 8, 8};
  Tensor mask(DType::kF16, 1, 1, dims.lq, dims.lk);
  std::mt19937 rng(620);
  mask.FillUniform(&rng, -2.0f, 2.0f);
  mask.Set(0, 0, 1, 4, -INFINITY);
  mask.Set(0, 0, 2, 0, -INFINITY);
  RunSpec spec;
  spec.dims = dims;
  spec.seed = 621;
  spec.files = {{"--mask", "m16.npy", NpyOf(mask, {dims.lq, dims.lk})}};
  spec.options.mask = mask.View();
  RunAndCheck(spec);
}

TEST(CliVariantTest, BroadcastMaskShapes) {
  const Dims dims = {2, 4, 2, 5, 7, 16, 16};
  uint32_t seed = 630;
  // [1, Hq, 1, 1] boolean: head 2 sees nothing.
  Tensor heads(DType::kBool, 1, dims.hq, 1, 1);
  for (int64_t h = 0; h < dims.hq; ++h) heads.Set(0, h, 0, 0, h == 2 ? 0 : 1);
  // [Hq, 1, Lk] additive (rank 3: padded to [1, Hq, 1, Lk]).
  Tensor per_head(DType::kF32, 1, dims.hq, 1, dims.lk);
  std::mt19937 rng(631);
  per_head.FillUniform(&rng, -3.0f, 3.0f);
  per_head.Set(0, 1, 0, 6, -INFINITY);
  // [Lk] boolean (rank 1).
  Tensor keys(DType::kBool, 1, 1, 1, dims.lk);
  for (int64_t j = 0; j < dims.lk; ++j) keys.Set(0, 0, 0, j, j % 3 != 1);
  struct Case {
    const Tensor* mask;
    std::vector<int64_t> file_shape;
  };
  const Case cases[] = {{&heads, {1, dims.hq, 1, 1}},
                        {&heads, {dims.hq, 1, 1}},
                        {&per_head, {dims.hq, 1, dims.lk}},
                        {&keys, {dims.lk}},
                        {&keys, {1, 1, 1, dims.lk}}};
  for (Layout layout : kLayouts) {
    for (const Case& c : cases) {
      SCOPED_TRACE("mask file shape " + npy::ShapeString(c.file_shape));
      RunSpec spec;
      spec.dims = dims;
      spec.layout = layout;
      spec.seed = seed++;
      spec.files = {{"--mask", "mask.npy", NpyOf(*c.mask, c.file_shape)}};
      spec.options.mask = c.mask->View();
      RunAndCheck(spec);
    }
  }
}

TEST(CliVariantTest, KvLens) {
  const Dims dims = {3, 4, 2, 5, 9, 16, 16};
  const int64_t lens[] = {9, 4, 0};
  uint32_t seed = 640;
  for (Layout layout : kLayouts) {
    for (int causal = 0; causal < 2; ++causal) {
      RunSpec spec;
      spec.dims = dims;
      spec.layout = layout;
      spec.seed = seed++;
      spec.extra = "--kv-lens 9,4,0";
      spec.options.kv_lengths = lens;
      if (causal) {
        spec.extra += " --causal bottom-right";
        spec.options.causal = true;
        spec.options.alignment = Alignment::kBottomRight;
      }
      RunAndCheck(spec);
    }
  }
}

TEST(CliVariantTest, SlidingWindow) {
  struct Case {
    Dims dims;
    std::string extra;
    int64_t left, right;
    bool causal;
    Alignment align;
  };
  const Case cases[] = {
      {{1, 2, 2, 12, 12, 16, 16}, "--window-left 3 --window-right 0 "
       "--causal top-left", 3, 0, true, Alignment::kTopLeft},
      {{1, 2, 2, 12, 12, 16, 16}, "--window-left 2 --window-right 2",
       2, 2, false, Alignment::kTopLeft},
      {{2, 4, 2, 4, 11, 8, 8}, "--window-left 3 --align bottom-right",
       3, -1, false, Alignment::kBottomRight},
      {{2, 4, 2, 4, 11, 8, 8}, "--window-left 2 --causal bottom-right",
       2, -1, true, Alignment::kBottomRight},
      {{1, 2, 1, 9, 9, 16, 8}, "--window-left -1 --window-right 1",
       -1, 1, false, Alignment::kTopLeft},
      {{1, 2, 1, 9, 9, 16, 8}, "--window-left=0 --window-right=0",
       0, 0, false, Alignment::kTopLeft},
  };
  uint32_t seed = 650;
  for (Layout layout : kLayouts) {
    for (const Case& c : cases) {
      RunSpec spec;
      spec.dims = c.dims;
      spec.layout = layout;
      spec.seed = seed++;
      spec.extra = c.extra;
      spec.options.window_left = c.left;
      spec.options.window_right = c.right;
      spec.options.causal = c.causal;
      spec.options.alignment = c.align;
      RunAndCheck(spec);
    }
  }
}

TEST(CliVariantTest, Softcap) {
  uint32_t seed = 660;
  for (float cap : {0.5f, 3.0f, 30.0f}) {
    RunSpec spec;
    spec.dims = {2, 4, 2, 6, 9, 16, 16};
    spec.seed = seed++;
    spec.options.scale = 2.0f;  // scores large enough for the cap to matter
    spec.options.softcap = cap;
    char buf[64];
    std::snprintf(buf, sizeof(buf), "--scale 2 --softcap %.9g", cap);
    spec.extra = buf;
    RunAndCheck(spec);
  }
}

TEST(CliVariantTest, AlibiSlopes) {
  const std::vector<float> slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  const struct {
    std::string extra;
    bool causal;
    Alignment align;
  } cases[] = {{"--align top-left", false, Alignment::kTopLeft},
               {"--align bottom-right", false, Alignment::kBottomRight},
               {"--causal bottom-right", true, Alignment::kBottomRight},
               {"--causal top-left", true, Alignment::kTopLeft}};
  uint32_t seed = 670;
  for (Layout layout : kLayouts) {
    for (const auto& c : cases) {
      RunSpec spec;
      spec.dims = {2, 4, 2, 5, 9, 16, 16};
      spec.layout = layout;
      spec.seed = seed++;
      spec.extra = c.extra;
      spec.files = {{"--alibi-slopes", "slopes.npy", NpyF32(slopes)}};
      spec.options.alibi_slopes = slopes.data();
      spec.options.causal = c.causal;
      spec.options.alignment = c.align;
      RunAndCheck(spec);
    }
  }
}

TEST(CliVariantTest, Sinks) {
  const std::vector<float> sinks = {0.0f, 1.5f, -2.0f, -INFINITY};
  uint32_t seed = 680;
  for (Layout layout : kLayouts) {
    RunSpec spec;
    spec.dims = {2, 4, 1, 5, 7, 8, 16};
    spec.layout = layout;
    spec.seed = seed++;
    spec.files = {{"--sinks", "sinks.npy", NpyF32(sinks)}};
    spec.options.sinks = sinks.data();
    RunAndCheck(spec);
    // With causal bottom-right and Lq > Lk, some rows see only the sink.
    spec.dims = {1, 4, 2, 9, 4, 8, 8};
    spec.seed = seed++;
    spec.extra = "--causal bottom-right";
    spec.options.causal = true;
    spec.options.alignment = Alignment::kBottomRight;
    RunAndCheck(spec);
  }
}

TEST(CliVariantTest, DropoutMatchesReference) {
  uint32_t seed = 690;
  for (Layout layout : kLayouts) {
    for (const char* p : {"0.3", "0.75"}) {
      RunSpec spec;
      spec.dims = {2, 4, 2, 7, 11, 16, 16};
      spec.layout = layout;
      spec.seed = seed++;
      spec.extra = std::string("--dropout ") + p + " --seed 12345";
      spec.options.dropout_p = std::strtof(p, nullptr);
      spec.options.dropout_seed = 12345;
      RunAndCheck(spec);
    }
  }
  // p = 0 is no dropout, and --seed alone changes nothing.
  RunSpec spec;
  spec.dims = {1, 2, 2, 5, 6, 8, 8};
  spec.seed = 699;
  spec.extra = "--dropout 0 --seed 7";
  const std::string with_zero = RunAndCheck(spec).o_bytes;
  spec.extra = "--seed 18446744073709551615";
  const std::string with_seed = RunAndCheck(spec).o_bytes;
  spec.extra = "";
  const std::string plain = RunAndCheck(spec).o_bytes;
  ASSERT_FALSE(plain.empty());
  EXPECT_EQ(with_zero, plain);
  EXPECT_EQ(with_seed, plain);
}

TEST(CliVariantTest, DropoutSeedsDiffer) {
  // Two seeds keep different weights, so the outputs differ.
  RunSpec spec;
  spec.dims = {1, 2, 2, 6, 8, 8, 8};
  spec.seed = 700;
  spec.options.dropout_p = 0.5f;
  spec.options.dropout_seed = 1;
  spec.extra = "--dropout 0.5 --seed 1";
  const RunResult a = RunAndCheck(spec);
  spec.options.dropout_seed = 2;
  spec.extra = "--dropout 0.5 --seed 2";
  const RunResult b = RunAndCheck(spec);
  if (a.cli.code == 0 && b.cli.code == 0) {
    EXPECT_NE(a.o_bytes, b.o_bytes);
  }
}

TEST(CliVariantTest, Combinations) {
  const std::vector<float> sinks = {0.5f, -1.0f, 2.0f, 0.0f};
  const std::vector<float> slopes = {0.3f, 0.1f, 0.05f, 0.01f};
  const Dims dims = {2, 4, 2, 10, 10, 16, 16};
  std::mt19937 rng(710);
  Tensor mask(DType::kBool, 1, 1, dims.lq, dims.lk);
  std::bernoulli_distribution attend(0.8);
  for (int64_t i = 0; i < dims.lq; ++i) {
    for (int64_t j = 0; j < dims.lk; ++j) {
      mask.Set(0, 0, i, j, attend(rng) ? 1.0f : 0.0f);
    }
  }
  uint32_t seed = 711;
  for (Layout layout : kLayouts) {
    {
      SCOPED_TRACE("causal + window + sinks");
      RunSpec spec;
      spec.dims = dims;
      spec.layout = layout;
      spec.seed = seed++;
      spec.extra = "--causal top-left --window-left 3";
      spec.files = {{"--sinks", "sinks.npy", NpyF32(sinks)}};
      spec.options.causal = true;
      spec.options.window_left = 3;
      spec.options.sinks = sinks.data();
      RunAndCheck(spec);
    }
    {
      SCOPED_TRACE("mask + ALiBi + softcap");
      RunSpec spec;
      spec.dims = dims;
      spec.layout = layout;
      spec.seed = seed++;
      spec.extra = "--softcap 1.5";
      spec.files = {{"--mask", "mask.npy", NpyOf(mask, {dims.lq, dims.lk})},
                    {"--alibi-slopes", "slopes.npy", NpyF32(slopes)}};
      spec.options.mask = mask.View();
      spec.options.alibi_slopes = slopes.data();
      spec.options.softcap = 1.5f;
      RunAndCheck(spec);
    }
    {
      SCOPED_TRACE("GQA + kv_lens + dropout");
      static const int64_t lens[] = {7, 10};
      RunSpec spec;
      spec.dims = {2, 4, 1, 6, 10, 8, 8};
      spec.layout = layout;
      spec.seed = seed++;
      spec.extra = "--kv-lens 7,10 --dropout 0.2 --seed 99";
      spec.options.kv_lengths = lens;
      spec.options.dropout_p = 0.2f;
      spec.options.dropout_seed = 99;
      RunAndCheck(spec);
    }
  }
}

TEST(CliVariantTest, DecodeWithEachOption) {
  // Lq = 1 against a longer cache, bshd like an engine's KV cache.
  const Dims dims = {2, 4, 2, 1, 37, 32, 32};
  const std::vector<float> sinks = {0.5f, -1.0f, 2.0f, 0.0f};
  const std::vector<float> slopes = {0.3f, 0.1f, 0.05f, 0.01f};
  static const int64_t lens[] = {37, 20};
  Tensor mask(DType::kF32, dims.b, 1, 1, dims.lk);
  std::mt19937 rng(720);
  mask.FillUniform(&rng, -1.0f, 1.0f);
  mask.Set(1, 0, 0, 30, -INFINITY);
  uint32_t seed = 721;
  for (int option = 0; option < 7; ++option) {
    RunSpec spec;
    spec.dims = dims;
    spec.layout = Layout::kBSHD;
    spec.seed = seed++;
    spec.extra = "--causal bottom-right";
    spec.options.causal = true;
    spec.options.alignment = Alignment::kBottomRight;
    switch (option) {
      case 0:
        spec.files = {
            {"--mask", "mask.npy", NpyOf(mask, {dims.b, 1, 1, dims.lk})}};
        spec.options.mask = mask.View();
        break;
      case 1:
        spec.extra += " --kv-lens 37,20";
        spec.options.kv_lengths = lens;
        break;
      case 2:
        spec.extra += " --window-left 8";
        spec.options.window_left = 8;
        break;
      case 3:
        spec.extra += " --softcap 0.7";
        spec.options.softcap = 0.7f;
        break;
      case 4:
        spec.files = {{"--alibi-slopes", "slopes.npy", NpyF32(slopes)}};
        spec.options.alibi_slopes = slopes.data();
        break;
      case 5:
        spec.files = {{"--sinks", "sinks.npy", NpyF32(sinks)}};
        spec.options.sinks = sinks.data();
        break;
      case 6:
        spec.extra += " --dropout 0.1 --seed 5";
        spec.options.dropout_p = 0.1f;
        spec.options.dropout_seed = 5;
        break;
    }
    SCOPED_TRACE("decode option " + std::to_string(option));
    RunAndCheck(spec);
  }
}

}  // namespace
}  // namespace test
}  // namespace simdattn
