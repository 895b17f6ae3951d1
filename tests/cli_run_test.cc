// `simdattn run` and `simdattn info` end to end: shapes, layouts, causal
// alignments, scale, thread counts, targets and storage types, each run on
// random .npy inputs and compared with the reference; `info` and `--help`.

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/dtype.h"
#include "simdattn/attention.h"
#include "tests/cli_util.h"
#include "tests/test_util.h"
#include "tools/npy.h"

namespace simdattn {
namespace test {
namespace {

const Dims kShapes[] = {
    {1, 1, 1, 1, 1, 1, 1},      // smallest
    {2, 4, 4, 7, 7, 16, 16},    // MHA, Lq == Lk
    {1, 2, 2, 3, 19, 8, 8},     // Lq < Lk
    {2, 3, 3, 17, 5, 32, 32},   // Lq > Lk
    {1, 8, 2, 9, 13, 16, 16},   // GQA
    {2, 4, 1, 6, 6, 8, 8},      // MQA
    {1, 2, 2, 5, 7, 24, 12},    // Dk != Dv
    {1, 2, 1, 4, 33, 64, 128},  // wide V, Dk != Dv
};

TEST(CliTest, MatchesReferenceForShapesAndLayouts) {
  uint32_t seed = 10;
  for (Layout layout : {Layout::kBHSD, Layout::kBSHD}) {
    for (const Dims& dims : kShapes) {
      RunSpec spec;
      spec.dims = dims;
      spec.layout = layout;
      spec.seed = seed++;
      RunAndCheck(spec);
    }
  }
}

TEST(CliTest, CausalBothAlignments) {
  const Dims shapes[] = {
      {1, 2, 2, 6, 6, 16, 16},   // square
      {2, 4, 2, 3, 11, 8, 8},    // Lq < Lk (decode-like)
      {1, 2, 1, 9, 4, 8, 16},    // Lq > Lk: bottom-right leaves empty rows
  };
  uint32_t seed = 100;
  for (Layout layout : {Layout::kBHSD, Layout::kBSHD}) {
    for (const Dims& dims : shapes) {
      for (Alignment align : {Alignment::kTopLeft, Alignment::kBottomRight}) {
        RunSpec spec;
        spec.dims = dims;
        spec.layout = layout;
        spec.seed = seed++;
        spec.options.causal = true;
        spec.options.alignment = align;
        spec.extra = align == Alignment::kTopLeft ? "--causal top-left"
                                                  : "--causal bottom-right";
        RunAndCheck(spec);
      }
    }
  }
  // --align equal to --causal's alignment is accepted.
  RunSpec spec;
  spec.dims = shapes[1];
  spec.options.causal = true;
  spec.options.alignment = Alignment::kBottomRight;
  spec.extra = "--causal bottom-right --align bottom-right";
  RunAndCheck(spec);
}

TEST(CliTest, CausalDiffersFromNonCausal) {
  // Guards against --causal being ignored: the outputs must differ.
  RunSpec spec;
  spec.dims = {1, 2, 2, 8, 8, 16, 16};
  spec.seed = 5;
  const std::string plain = RunAndCheck(spec).o_bytes;
  spec.options.causal = true;
  spec.extra = "--causal top-left";
  const std::string causal = RunAndCheck(spec).o_bytes;
  ASSERT_FALSE(plain.empty());
  EXPECT_NE(plain, causal);
}

TEST(CliTest, AlignWithoutCausal) {
  RunSpec spec;
  spec.dims = {1, 2, 2, 4, 9, 8, 8};
  spec.options.alignment = Alignment::kBottomRight;
  spec.extra = "--align bottom-right";
  RunAndCheck(spec);
  spec.options.alignment = Alignment::kTopLeft;
  spec.extra = "--align top-left";
  RunAndCheck(spec);
}

TEST(CliTest, Scale) {
  uint32_t seed = 200;
  for (float scale : {0.0f, 0.3f, 2.5f}) {
    RunSpec spec;
    spec.dims = {2, 4, 2, 5, 9, 16, 8};
    spec.seed = seed++;
    spec.options.scale = scale;
    char buf[32];
    std::snprintf(buf, sizeof(buf), "--scale %.9g", scale);
    spec.extra = buf;
    RunAndCheck(spec);
  }
}

TEST(CliTest, ThreadCountsGiveIdenticalResults) {
  std::string first;
  for (int threads : {1, 2, 3}) {
    RunSpec spec;
    spec.dims = {2, 4, 2, 40, 50, 32, 32};
    spec.seed = 300;  // same inputs for every thread count
    spec.extra = "--threads " + std::to_string(threads);
    const RunResult r = RunAndCheck(spec);
    ASSERT_FALSE(r.o_bytes.empty());
    if (first.empty()) {
      first = r.o_bytes;
    } else {
      // SEMANTICS.md: bit-identical for any thread count.
      EXPECT_EQ(r.o_bytes, first) << "--threads " << threads;
    }
  }
}

TEST(CliTest, EveryAvailableTargetRunsAndIsReported) {
  const std::vector<std::string> targets = AvailableTargets();
  ASSERT_FALSE(targets.empty());
  uint32_t seed = 400;
  for (const std::string& target : targets) {
    for (Layout layout : {Layout::kBHSD, Layout::kBSHD}) {
      RunSpec spec;
      spec.dims = {1, 4, 2, 13, 21, 32, 16};
      spec.layout = layout;
      spec.seed = seed++;
      spec.options.causal = true;
      spec.options.alignment = Alignment::kBottomRight;
      spec.extra = "--causal bottom-right --verbose --target " + target;
      const RunResult r = RunAndCheck(spec);
      EXPECT_EQ(r.cli.err, "simdattn: ran on " + target + "\n");
    }
  }
}

TEST(CliTest, AcceptsF16Inputs) {
  uint32_t seed = 500;
  for (Layout layout : {Layout::kBHSD, Layout::kBSHD}) {
    RunSpec spec;
    spec.dims = {2, 4, 2, 6, 10, 16, 24};
    spec.layout = layout;
    spec.seed = seed++;
    spec.q_dtype = DType::kF16;
    spec.kv_dtype = DType::kF16;
    RunAndCheck(spec);
    // f32 queries with an f16 KV cache.
    spec.q_dtype = DType::kF32;
    spec.seed = seed++;
    RunAndCheck(spec);
  }
}

TEST(CliTest, OverwritesExistingOutput) {
  TempDir dir;
  Tensor q(DType::kF32, 1, 1, 2, 4), k(DType::kF32, 1, 1, 3, 4),
      v(DType::kF32, 1, 1, 3, 4);
  std::mt19937 rng(9);
  q.FillUniform(&rng, -1, 1);
  k.FillUniform(&rng, -1, 1);
  v.FillUniform(&rng, -1, 1);
  WriteTensor(dir.File("q.npy"), q, Layout::kBHSD);
  WriteTensor(dir.File("k.npy"), k, Layout::kBHSD);
  WriteTensor(dir.File("v.npy"), v, Layout::kBHSD);
  WriteBytes(dir.File("o.npy"), "previous contents");
  const CliResult r = RunCli("run --q " + dir.File("q.npy") + " --k " +
                             dir.File("k.npy") + " --v " + dir.File("v.npy") +
                             " --out " + dir.File("o.npy"));
  ASSERT_EQ(r.code, 0) << r.err;
  npy::Array o;
  std::string error;
  ASSERT_TRUE(npy::Read(dir.File("o.npy"), &o, &error)) << error;
  EXPECT_EQ(o.shape, (std::vector<int64_t>{1, 1, 2, 4}));
  EXPECT_EQ(dir.Entries(),
            (std::set<std::string>{"q.npy", "k.npy", "v.npy", "o.npy"}));
}

TEST(CliTest, InfoListsTargets) {
  const CliResult r = RunCli("info", "env -u SIMDATTN_MAX_TARGET ");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_NE(r.out.find("cpu features: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("compiled targets: "), std::string::npos) << r.out;
  const std::vector<std::string> available = AvailableTargets();
  ASSERT_FALSE(available.empty());
  std::string line = "available targets:";
  for (const std::string& t : available) line += " " + t;
  EXPECT_NE(r.out.find(line + "\n"), std::string::npos) << r.out;
  for (const std::string& t : CompiledTargets()) {
    EXPECT_NE(r.out.find(t), std::string::npos) << t;
  }
  EXPECT_NE(r.out.find("selected target: " + test::ExpectedDefaultTarget() + "\n"),
            std::string::npos)
      << r.out;
  // A CPU that has AVX3_BF16 without choosing it is told how to name it.
  EXPECT_EQ(r.out.find("SIMDATTN_MAX_TARGET=AVX3_BF16") != std::string::npos,
            test::ExpectedDefaultTarget() != available.front())
      << r.out;
#if defined(__x86_64__)
  // Every x86-64 CPU has SSE2, and /proc/cpuinfo lists it.
  if (std::ifstream("/proc/cpuinfo")) {
    EXPECT_NE(r.out.find("sse2"), std::string::npos) << r.out;
  }
#endif

  // The environment cap selects a lower target.
  const std::string last = available.back();
  const CliResult capped = RunCli("info", "SIMDATTN_MAX_TARGET=" + last + " ");
  ASSERT_EQ(capped.code, 0) << capped.err;
  EXPECT_NE(capped.out.find("selected target: " + last + "\n"),
            std::string::npos)
      << capped.out;

  // An unknown cap is an error that names the variable and the targets;
  // the target calls run after reporting it is still shown.
  const CliResult bad = RunCli("info", "SIMDATTN_MAX_TARGET=FOO ");
  EXPECT_EQ(bad.code, 2);
  EXPECT_EQ(bad.err.rfind("simdattn: error: SIMDATTN_MAX_TARGET = 'FOO' names no target", 0), 0u)
      << bad.err;
  EXPECT_NE(bad.err.find("SCALAR"), std::string::npos) << bad.err;
  EXPECT_NE(bad.out.find("selected target: " + test::ExpectedDefaultTarget() + "\n"),
            std::string::npos)
      << bad.out;
}

TEST(CliTest, HelpExitsZero) {
  for (const char* args : {"--help", "run --help", "info --help"}) {
    const CliResult r = RunCli(args);
    EXPECT_EQ(r.code, 0) << args << ": " << r.err;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << args;
  }
  const std::string help = RunCli("run --help").out;
  for (const char* flag :
       {"--causal", "--mask", "--kv-lens", "--window-left", "--window-right",
        "--softcap", "--alibi-slopes", "--sinks", "--dropout", "--seed",
        "--dtype", "--kv-dtype"}) {
    EXPECT_NE(help.find(flag), std::string::npos) << flag;
  }
}

// ------------------------------------------------------------ storage types

const char* DTypeFlag(DType dtype) {
  return dtype == DType::kF16 ? "f16" : dtype == DType::kBF16 ? "bf16" : "f32";
}

// --kv-dtype f16|bf16: K and V rounded to that type, Q and O f32; compared
// with the reference on the same rounded K/V (bound of the KV type).
TEST(CliStorageTypeTest, KvDTypeMatchesReference) {
  struct Case {
    Dims dims;
    bool causal;
    Alignment align;
  };
  const Case cases[] = {
      {{2, 4, 4, 7, 7, 16, 16}, false, Alignment::kTopLeft},     // MHA
      {{1, 8, 2, 9, 13, 16, 16}, false, Alignment::kTopLeft},    // GQA
      {{2, 8, 2, 1, 50, 64, 64}, false, Alignment::kTopLeft},    // decode
      {{1, 8, 1, 4, 37, 32, 16}, true, Alignment::kBottomRight}, // MQA, Dk!=Dv
      {{2, 6, 2, 5, 21, 24, 24}, true, Alignment::kBottomRight}, // GQA causal
      {{1, 4, 2, 12, 12, 16, 8}, true, Alignment::kTopLeft},     // causal TL
  };
  uint32_t seed = 1000;
  for (DType kv : {DType::kF16, DType::kBF16}) {
    for (Layout layout : {Layout::kBHSD, Layout::kBSHD}) {
      for (const Case& c : cases) {
        RunSpec spec;
        spec.dims = c.dims;
        spec.layout = layout;
        spec.seed = seed++;
        spec.round_kv = kv;
        spec.extra = std::string("--kv-dtype ") + DTypeFlag(kv);
        if (c.causal) {
          spec.options.causal = true;
          spec.options.alignment = c.align;
          spec.extra += c.align == Alignment::kTopLeft
                            ? " --causal top-left"
                            : " --causal bottom-right";
        }
        RunAndCheck(spec);
      }
    }
  }
}

TEST(CliStorageTypeTest, KvDTypeIsApplied) {
  // Guards against --kv-dtype being ignored (bf16's bound is loose enough to
  // admit unrounded K/V): the rounded runs differ from the f32 run and from
  // each other.
  RunSpec spec;
  spec.dims = {1, 4, 2, 6, 40, 32, 32};
  spec.seed = 1100;
  const std::string f32 = RunAndCheck(spec).o_bytes;
  spec.extra = "--kv-dtype f32";  // explicit default: the same bytes
  EXPECT_EQ(RunAndCheck(spec).o_bytes, f32);
  spec.round_kv = DType::kF16;
  spec.extra = "--kv-dtype f16";
  const std::string f16 = RunAndCheck(spec).o_bytes;
  spec.round_kv = DType::kBF16;
  spec.extra = "--kv-dtype bf16";
  const std::string bf16 = RunAndCheck(spec).o_bytes;
  ASSERT_FALSE(f32.empty());
  ASSERT_FALSE(f16.empty());
  ASSERT_FALSE(bf16.empty());
  EXPECT_NE(f16, f32);
  EXPECT_NE(bf16, f32);
  EXPECT_NE(bf16, f16);
}

TEST(CliStorageTypeTest, KvDTypeWithF16Files) {
  // '<f2' files are widened to f32 first, then rounded to --kv-dtype.
  RunSpec spec;
  spec.dims = {1, 4, 2, 5, 11, 16, 16};
  spec.seed = 1200;
  spec.q_dtype = DType::kF16;
  spec.kv_dtype = DType::kF16;
  spec.round_kv = DType::kBF16;
  spec.extra = "--kv-dtype bf16";
  RunAndCheck(spec);
}

TEST(CliStorageTypeTest, DTypeF32IsDefault) {
  RunSpec spec;
  spec.dims = {1, 8, 2, 5, 9, 16, 16};
  spec.seed = 1300;
  spec.extra = "--dtype f32";
  RunAndCheck(spec);
  // --dtype f32 leaves --kv-dtype free.
  spec.extra = "--dtype f32 --kv-dtype f32";
  RunAndCheck(spec);
}

// --dtype f16|bf16: Q, K, V and O in that type, O widened to '<f4'.
TEST(CliStorageTypeTest, DTypeMatchesReference) {
  struct Case {
    Dims dims;
    bool causal;
  };
  const Case cases[] = {
      {{1, 8, 2, 9, 13, 16, 16}, false},  // GQA
      {{2, 4, 1, 6, 6, 32, 16}, true},    // MQA, causal, Dk != Dv
      {{1, 8, 2, 1, 40, 64, 64}, false},  // decode
  };
  uint32_t seed = 1400;
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    for (Layout layout : {Layout::kBHSD, Layout::kBSHD}) {
      for (const Case& c : cases) {
        for (int repeat_kv = 0; repeat_kv < 2; ++repeat_kv) {
          RunSpec spec;
          spec.dims = c.dims;
          spec.layout = layout;
          spec.seed = seed++;
          spec.round_q = dtype;
          spec.round_kv = dtype;
          spec.extra = std::string("--dtype ") + DTypeFlag(dtype);
          // Repeating the same type in --kv-dtype is accepted.
          if (repeat_kv) spec.extra += std::string(" --kv-dtype ") +
                                       DTypeFlag(dtype);
          if (c.causal) {
            spec.options.causal = true;
            spec.options.alignment = Alignment::kBottomRight;
            spec.extra += " --causal bottom-right";
          }
          RunAndCheck(spec);
        }
      }
    }
  }
}

}  // namespace
}  // namespace test
}  // namespace simdattn
