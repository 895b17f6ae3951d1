// End-to-end tests of the `simdattn` command-line tool: runs the binary on
// random .npy inputs and checks its output against the reference, and checks
// that every bad input exits 2 with a message and leaves outputs untouched.

#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lib/dtype.h"
#include "lib/reference.h"
#include "simdattn/attention.h"
#include "tests/test_util.h"
#include "tools/npy.h"

#ifndef SIMDATTN_CLI_PATH
#error "SIMDATTN_CLI_PATH must name the simdattn binary"
#endif

namespace simdattn {
namespace {

namespace fs = std::filesystem;
using test::Layout;
using test::Tensor;

// SEMANTICS.md bounds: output error for f32 storage (inputs given as '<f2'
// are widened exactly to f32 by the tool, so f32 is still the narrowest
// storage type of the computation), and LSE absolute error with f32 Q and K.
constexpr double kOutputBound = 2e-5;
constexpr double kLseBound = 1e-4;
// LSE absolute error when Q or K is stored in f16 or bf16.
constexpr double kLseBound16 = 1e-2;

class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base && *base ? base : "/tmp") +
                        "/simdattn_cli_test_XXXXXX";
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr) std::abort();
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string File(const std::string& name) const { return path_ + "/" + name; }
  std::set<std::string> Entries() const {
    std::set<std::string> out;
    for (const auto& e : fs::directory_iterator(path_)) {
      out.insert(e.path().filename().string());
    }
    return out;
  }

 private:
  std::string path_;
};

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in),
                     std::istreambuf_iterator<char>());
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

struct CliResult {
  int code = -1;
  std::string out, err;
};

// Runs `simdattn <args>` through the shell; `env` prefixes the command
// (e.g. "env -u SIMDATTN_MAX_TARGET ").
CliResult RunCli(const std::string& args, const std::string& env = "") {
  TempDir io;
  const std::string cmd = env + "'" SIMDATTN_CLI_PATH "' " + args + " >'" +
                          io.File("stdout") + "' 2>'" + io.File("stderr") +
                          "' </dev/null";
  const int status = std::system(cmd.c_str());
  CliResult r;
  if (status != -1 && WIFEXITED(status)) {
    r.code = WEXITSTATUS(status);
  } else if (status != -1 && WIFSIGNALED(status)) {
    r.code = 128 + WTERMSIG(status);
  }
  r.out = ReadBytes(io.File("stdout"));
  r.err = ReadBytes(io.File("stderr"));
  return r;
}

// Shape of the file holding a [b, h, s, d] tensor in `layout`.
std::vector<int64_t> FileShape(const Tensor& t, Layout layout) {
  return layout == Layout::kBHSD
             ? std::vector<int64_t>{t.shape[0], t.shape[1], t.shape[2],
                                    t.shape[3]}
             : std::vector<int64_t>{t.shape[0], t.shape[2], t.shape[1],
                                    t.shape[3]};
}

// Writes a dense test::Tensor (pad 0) as a .npy file ('<f4' or '<f2').
void WriteTensor(const std::string& path, const Tensor& t, Layout layout) {
  const char* descr = t.dtype == DType::kF16 ? "<f2" : "<f4";
  ASSERT_TRUE(t.dtype == DType::kF16 || t.dtype == DType::kF32);
  WriteBytes(path, npy::MakeHeader(descr, FileShape(t, layout), 1) +
                       std::string(t.bytes.begin(), t.bytes.end()));
}

struct Dims {
  int64_t b, hq, hkv, lq, lk, dk, dv;
};

std::string DimsString(const Dims& d) {
  return "B=" + std::to_string(d.b) + " Hq=" + std::to_string(d.hq) +
         " Hkv=" + std::to_string(d.hkv) + " Lq=" + std::to_string(d.lq) +
         " Lk=" + std::to_string(d.lk) + " Dk=" + std::to_string(d.dk) +
         " Dv=" + std::to_string(d.dv);
}

// An extra input file of a run, passed as `flag <dir>/<name>`.
struct InputFile {
  std::string flag;
  std::string name;
  std::string bytes;  // the complete .npy file
};

struct RunSpec {
  Dims dims;
  Layout layout = Layout::kBHSD;
  DType q_dtype = DType::kF32;
  DType kv_dtype = DType::kF32;
  bool lse = true;
  std::string extra;         // further CLI arguments
  std::vector<InputFile> files;  // further input files (mask, slopes, sinks)
  AttentionOptions options;  // what `extra` and `files` should mean
  uint32_t seed = 1;
  // Storage types the CLI is asked to round to (--dtype / --kv-dtype in
  // `extra`): the reference is given Q (and O's bound) and K/V rounded to
  // these with the same F32ToF16 / F32ToBF16, so it sees the values as stored.
  DType round_q = DType::kF32;
  DType round_kv = DType::kF32;
};

struct RunResult {
  CliResult cli;
  std::string o_bytes;  // the O file as written
};

// A dense copy of `t` (logical values as stored) in `dtype`, f16 or bf16
// values made with F32ToF16 / F32ToBF16 exactly as the CLI rounds its inputs;
// `t` itself when dtype is f32.
Tensor RoundedCopy(const Tensor& t, DType dtype, Layout layout) {
  if (dtype == DType::kF32) return t;
  Tensor out(dtype, t.shape[0], t.shape[1], t.shape[2], t.shape[3], layout);
  for (int64_t i0 = 0; i0 < t.shape[0]; ++i0) {
    for (int64_t i1 = 0; i1 < t.shape[1]; ++i1) {
      for (int64_t i2 = 0; i2 < t.shape[2]; ++i2) {
        for (int64_t i3 = 0; i3 < t.shape[3]; ++i3) {
          const float x = t.Get(i0, i1, i2, i3);
          const uint16_t h =
              dtype == DType::kF16 ? F32ToF16(x) : F32ToBF16(x);
          std::memcpy(out.bytes.data() + 2 * out.Index(i0, i1, i2, i3), &h,
                      2);
        }
      }
    }
  }
  return out;
}

// The narrowest of two storage types (bf16 < f16 < f32 in precision).
DType Narrowest(DType a, DType b) {
  if (a == DType::kBF16 || b == DType::kBF16) return DType::kBF16;
  if (a == DType::kF16 || b == DType::kF16) return DType::kF16;
  return DType::kF32;
}

// Runs the tool on random inputs and checks O (and LSE) against the
// reference. Checks that a successful run prints nothing unless --verbose.
RunResult RunAndCheck(const RunSpec& spec) {
  SCOPED_TRACE(DimsString(spec.dims) + " layout=" +
               (spec.layout == Layout::kBHSD ? "bhsd" : "bshd") + " " +
               spec.extra);
  const Dims& d = spec.dims;
  std::mt19937 rng(spec.seed);
  Tensor q(spec.q_dtype, d.b, d.hq, d.lq, d.dk, spec.layout);
  Tensor k(spec.kv_dtype, d.b, d.hkv, d.lk, d.dk, spec.layout);
  Tensor v(spec.kv_dtype, d.b, d.hkv, d.lk, d.dv, spec.layout);
  q.FillUniform(&rng, -1.0f, 1.0f);
  k.FillUniform(&rng, -1.0f, 1.0f);
  v.FillUniform(&rng, -2.0f, 2.0f);
  TempDir dir;
  WriteTensor(dir.File("q.npy"), q, spec.layout);
  WriteTensor(dir.File("k.npy"), k, spec.layout);
  WriteTensor(dir.File("v.npy"), v, spec.layout);
  std::string args = "run --q " + dir.File("q.npy") + " --k " +
                     dir.File("k.npy") + " --v " + dir.File("v.npy") +
                     " --out " + dir.File("o.npy") + " --layout " +
                     (spec.layout == Layout::kBHSD ? "bhsd" : "bshd");
  if (spec.lse) args += " --lse " + dir.File("lse.npy");
  for (const InputFile& f : spec.files) {
    WriteBytes(dir.File(f.name), f.bytes);
    args += " " + f.flag + " " + dir.File(f.name);
  }
  args += " " + spec.extra;
  RunResult result;
  result.cli = RunCli(args);
  EXPECT_EQ(result.cli.code, 0) << result.cli.err;
  EXPECT_EQ(result.cli.out, "");
  if (spec.extra.find("--verbose") == std::string::npos) {
    EXPECT_EQ(result.cli.err, "");
  }
  if (result.cli.code != 0) return result;

  // The values as stored after the CLI's rounding (the files themselves
  // stay '<f4' / '<f2').
  const Tensor q_ref = RoundedCopy(q, spec.round_q, spec.layout);
  const Tensor k_ref = RoundedCopy(k, spec.round_kv, spec.layout);
  const Tensor v_ref = RoundedCopy(v, spec.round_kv, spec.layout);
  std::vector<double> o_ref, lse_ref;
  const Status s = ReferenceAttention(q_ref.View(), k_ref.View(),
                                      v_ref.View(), spec.options, &o_ref,
                                      &lse_ref);
  EXPECT_TRUE(s.ok()) << s.message;
  if (!s.ok()) return result;

  npy::Array o_file;
  std::string error;
  EXPECT_TRUE(npy::Read(dir.File("o.npy"), &o_file, &error)) << error;
  result.o_bytes = ReadBytes(dir.File("o.npy"));
  Tensor o(DType::kF32, d.b, d.hq, d.lq, d.dv, spec.layout);
  EXPECT_EQ(o_file.descr, "<f4");
  EXPECT_EQ(o_file.shape, FileShape(o, spec.layout));
  if (o_file.shape != FileShape(o, spec.layout)) return result;
  std::memcpy(o.bytes.data(), o_file.f32.data(), o.bytes.size());
  // SEMANTICS.md: the bound of the narrowest storage type among Q, K, V and
  // O (O is stored in Q's type); f16 files are f32 once widened.
  const DType narrowest = Narrowest(spec.round_q, spec.round_kv);
  const double bound = test::OutputBound(narrowest);
  const double err = test::MaxError(o, o_ref, test::MaxAbs(v_ref));
  EXPECT_LE(err, bound) << "narrowest " << DTypeName(narrowest);
  const bool qk_f32 =
      spec.round_q == DType::kF32 && spec.round_kv == DType::kF32;
  const double lse_bound = qk_f32 ? kLseBound : kLseBound16;

  std::set<std::string> expect_files = {"q.npy", "k.npy", "v.npy", "o.npy"};
  for (const InputFile& f : spec.files) expect_files.insert(f.name);
  if (spec.lse) {
    expect_files.insert("lse.npy");
    npy::Array lse;
    EXPECT_TRUE(npy::Read(dir.File("lse.npy"), &lse, &error)) << error;
    EXPECT_EQ(lse.shape, (std::vector<int64_t>{d.b, d.hq, d.lq}));
    if (lse.f32.size() == lse_ref.size()) {
      for (size_t i = 0; i < lse_ref.size(); ++i) {
        if (std::isinf(lse_ref[i])) {
          EXPECT_EQ(lse.f32[i], static_cast<float>(lse_ref[i])) << i;
        } else {
          EXPECT_LE(std::fabs(lse.f32[i] - lse_ref[i]), lse_bound)
              << "lse[" << i << "] = " << lse.f32[i] << ", ref "
              << lse_ref[i];
        }
      }
    }
  }
  // No temporary file is left next to the outputs.
  EXPECT_EQ(dir.Entries(), expect_files);
  return result;
}

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

// ------------------------------------------------------------ storage types

const char* DTypeFlag(DType dtype) {
  return dtype == DType::kF16 ? "f16" : dtype == DType::kBF16 ? "bf16" : "f32";
}

// --kv-dtype f16|bf16: K and V rounded to that type, Q and O f32; compared
// with the reference on the same rounded K/V (bound of the KV type). These
// need the library's f32-Q / 16-bit-KV path: before it lands, the library
// answers kUnimplemented and these runs exit 2.
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

  // An unknown cap is an error.
  const CliResult bad = RunCli("info", "SIMDATTN_MAX_TARGET=FOO ");
  EXPECT_EQ(bad.code, 2);
  EXPECT_EQ(bad.err.rfind("simdattn: error: ", 0), 0u) << bad.err;
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

// ---------------------------------------------------------------- variants

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
  } cases[] = {{"", false, Alignment::kTopLeft},
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

TEST(CliVariantTest, DropoutMatchesReferenceOrIsReportedUnimplemented) {
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
  // p = 0 is no dropout, and --seed alone changes nothing: both run today.
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
  // Only meaningful once the fast path runs dropout.
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

// ---------------------------------------------------------------- bad input

class CliBadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Tensor q(DType::kF32, 1, 4, 5, 8), k(DType::kF32, 1, 2, 6, 8),
        v(DType::kF32, 1, 2, 6, 8);
    std::mt19937 rng(3);
    q.FillUniform(&rng, -1, 1);
    k.FillUniform(&rng, -1, 1);
    v.FillUniform(&rng, -1, 1);
    WriteTensor(dir_.File("q.npy"), q, Layout::kBHSD);
    WriteTensor(dir_.File("k.npy"), k, Layout::kBHSD);
    WriteTensor(dir_.File("v.npy"), v, Layout::kBHSD);
    const std::string q_bytes = ReadBytes(dir_.File("q.npy"));
    const std::string q_data = q_bytes.substr(q_bytes.size() - 4 * 160);
    WriteBytes(dir_.File("trunc.npy"), q_bytes.substr(0, q_bytes.size() - 5));
    std::string magic = q_bytes;
    magic[1] = 'X';
    WriteBytes(dir_.File("magic.npy"), magic);
    WriteBytes(dir_.File("be.npy"),
               npy::MakeHeader(">f4", {1, 4, 5, 8}, 1) + q_data);
    WriteBytes(dir_.File("f8.npy"),
               npy::MakeHeader("<f8", {1, 4, 5, 4}, 1) + q_data);
    WriteBytes(dir_.File("rank3.npy"),
               npy::MakeHeader("<f4", {4, 5, 8}, 1) + q_data);
    WriteBytes(dir_.File("bool.npy"),
               npy::MakeHeader("|b1", {1, 4, 5, 8}, 1) + std::string(160, 1));
    Tensor v7(DType::kF32, 1, 2, 7, 8), kv3(DType::kF32, 1, 3, 6, 8);
    v7.FillUniform(&rng, -1, 1);
    kv3.FillUniform(&rng, -1, 1);
    WriteTensor(dir_.File("v_lk7.npy"), v7, Layout::kBHSD);
    WriteTensor(dir_.File("kv_h3.npy"), kv3, Layout::kBHSD);
    // Variant inputs for B = 1, Hq = 4, Lq = 5, Lk = 6.
    WriteBytes(dir_.File("mask_ok.npy"),
               npy::MakeHeader("|b1", {5, 6}, 1) + std::string(30, 1));
    WriteBytes(dir_.File("mask_bad.npy"),
               npy::MakeHeader("|b1", {3, 6}, 1) + std::string(18, 1));
    WriteBytes(dir_.File("mask_lk.npy"),
               npy::MakeHeader("|b1", {5, 5}, 1) + std::string(25, 1));
    WriteBytes(dir_.File("mask_b2.npy"),
               npy::MakeHeader("|b1", {2, 1, 1, 6}, 1) + std::string(12, 1));
    WriteBytes(dir_.File("mask_rank5.npy"),
               npy::MakeHeader("|b1", {1, 1, 1, 5, 6}, 1) +
                   std::string(30, 1));
    WriteBytes(dir_.File("mask_u1.npy"),
               npy::MakeHeader("|u1", {5, 6}, 1) + std::string(30, 1));
    WriteBytes(dir_.File("mask_f8.npy"),
               npy::MakeHeader("<f8", {5, 6}, 1) + std::string(240, 0));
    WriteBytes(dir_.File("heads4.npy"),
               npy::MakeHeader("<f4", {4}, 1) + std::string(16, 0));
    WriteBytes(dir_.File("heads3.npy"),
               npy::MakeHeader("<f4", {3}, 1) + std::string(12, 0));
    WriteBytes(dir_.File("heads1x4.npy"),
               npy::MakeHeader("<f4", {1, 4}, 1) + std::string(16, 0));
    WriteBytes(dir_.File("heads4_f2.npy"),
               npy::MakeHeader("<f2", {4}, 1) + std::string(8, 0));
    WriteBytes(dir_.File("out.npy"), kOutSentinel);
    WriteBytes(dir_.File("lse.npy"), kLseSentinel);
    fs::create_directory(dir_.File("subdir"));
    entries_ = dir_.Entries();
  }

  std::string F(const std::string& name) const { return dir_.File(name); }

  // "run" with the good inputs and outputs, with `replace` substituted: each
  // "--flag value" in replace overrides the default for that flag.
  std::string Args(const std::vector<std::pair<std::string, std::string>>&
                       overrides,
                   const std::string& extra = "") const {
    std::vector<std::pair<std::string, std::string>> args = {
        {"--q", F("q.npy")},     {"--k", F("k.npy")},
        {"--v", F("v.npy")},     {"--out", F("out.npy")},
        {"--lse", F("lse.npy")}};
    for (const auto& o : overrides) {
      for (auto& a : args) {
        if (a.first == o.first) a.second = o.second;
      }
    }
    std::string s = "run";
    for (const auto& a : args) s += " " + a.first + " " + a.second;
    return s + " " + extra;
  }

  // Expects exit 2, a one-line message naming the problem, nothing on
  // stdout, both outputs unchanged and no new file.
  void ExpectError(const std::string& args, const std::string& expect,
                   const std::string& env = "") {
    SCOPED_TRACE(env + args);
    const CliResult r = RunCli(args, env);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err.rfind("simdattn: error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(expect), std::string::npos)
        << "stderr '" << r.err << "' lacks '" << expect << "'";
    EXPECT_EQ(ReadBytes(F("out.npy")), kOutSentinel);
    EXPECT_EQ(ReadBytes(F("lse.npy")), kLseSentinel);
    EXPECT_EQ(dir_.Entries(), entries_);
  }

  static constexpr const char* kOutSentinel = "existing output, keep me";
  static constexpr const char* kLseSentinel = "existing lse, keep me";
  TempDir dir_;
  std::set<std::string> entries_;
};

TEST_F(CliBadInputTest, GoodInputsSucceed) {
  // The fixture's inputs are valid, so every failure below is the one named.
  const CliResult r = RunCli(Args({}));
  EXPECT_EQ(r.code, 0) << r.err;
  npy::Array o;
  std::string error;
  ASSERT_TRUE(npy::Read(F("out.npy"), &o, &error)) << error;
  EXPECT_EQ(o.shape, (std::vector<int64_t>{1, 4, 5, 8}));
}

TEST_F(CliBadInputTest, UnreadableInputs) {
  ExpectError(Args({{"--q", F("missing.npy")}}), "missing.npy");
  ExpectError(Args({{"--k", F("missing.npy")}}), "No such file");
  ExpectError(Args({{"--q", F("subdir")}}), "not a regular file");
  ExpectError(Args({{"--v", F("trunc.npy")}}), "truncated");
  ExpectError(Args({{"--q", F("magic.npy")}}), "magic");
  ExpectError(Args({{"--q", F("be.npy")}}), "big-endian");
  ExpectError(Args({{"--k", F("f8.npy")}}), "'<f8'");
  ExpectError(Args({{"--q", F("bool.npy")}}), "'|b1' is not supported");
  ExpectError(Args({{"--q", F("rank3.npy")}}), "4-D");
}

TEST_F(CliBadInputTest, ShapeMismatches) {
  // Messages come from the library's validation.
  ExpectError(Args({{"--v", F("v_lk7.npy")}}), "Lk");
  ExpectError(Args({{"--k", F("kv_h3.npy")}, {"--v", F("kv_h3.npy")}}),
              "multiple");
  // Q's Dk (8) against V used as K with another Lk: still named.
  ExpectError(Args({{"--k", F("v_lk7.npy")}}), "Lk");
  ExpectError(Args({{"--v", F("v_lk7.npy")}}, "--layout bshd"), "bshd");
}

TEST_F(CliBadInputTest, BadOptions) {
  ExpectError(Args({}, "--bogus 1"), "--bogus");
  ExpectError(Args({}, "--layout foo"), "--layout");
  ExpectError(Args({}, "--threads 0"), "--threads");
  ExpectError(Args({}, "--threads 1025"), "--threads must be in 1..1024");
  ExpectError(Args({}, "--threads 100000"), "--threads");
  ExpectError(Args({}, "--threads -2"), "--threads");
  ExpectError(Args({}, "--threads abc"), "abc");
  ExpectError(Args({}, "--scale -1"), "--scale");
  ExpectError(Args({}, "--scale nan"), "--scale");
  ExpectError(Args({}, "--scale inf"), "--scale");
  ExpectError(Args({}, "--scale 1e99"), "--scale");
  ExpectError(Args({}, "--scale 0.5x"), "--scale");
  ExpectError(Args({}, "--causal foo"), "--causal");
  ExpectError(Args({}, "--align sideways"), "--align");
  ExpectError(Args({}, "--causal top-left --align bottom-right"),
              "conflicts");
  ExpectError(Args({}, "--target FOO"), "FOO");
  ExpectError(Args({{"--lse", F("out.npy")}}), "same file");
  ExpectError("run --q " + F("q.npy") + " --k " + F("k.npy") + " --v " +
                  F("v.npy"),
              "--out");
  ExpectError("", "subcommand");
  ExpectError("frobnicate", "frobnicate");
}

TEST_F(CliBadInputTest, BadMask) {
  ExpectError(Args({}, "--mask " + F("mask_bad.npy")), "--mask");
  ExpectError(Args({}, "--mask " + F("mask_bad.npy")), "broadcast");
  ExpectError(Args({}, "--mask " + F("mask_lk.npy")), "(5, 5)");
  ExpectError(Args({}, "--mask " + F("mask_b2.npy")), "--mask");
  ExpectError(Args({}, "--mask " + F("mask_rank5.npy")), "--mask");
  ExpectError(Args({}, "--mask " + F("mask_u1.npy")), "'|u1'");
  ExpectError(Args({}, "--mask " + F("mask_f8.npy")), "--mask");
  ExpectError(Args({}, "--mask " + F("missing.npy")), "--mask");
  ExpectError(Args({}, "--mask " + F("trunc.npy")), "--mask");
  ExpectError(Args({}, "--mask ''"), "--mask: empty path");
  // The mask is an input: never overwritten.
  ExpectError(Args({{"--out", F("mask_ok.npy")}}, "--mask " +
                   F("mask_ok.npy")),
              "--mask");
}

TEST_F(CliBadInputTest, BadKvLens) {
  ExpectError(Args({}, "--kv-lens 1,2"), "--kv-lens");
  ExpectError(Args({}, "--kv-lens 1,2"), "B = 1");
  ExpectError(Args({}, "--kv-lens abc"), "--kv-lens");
  ExpectError(Args({}, "--kv-lens ''"), "--kv-lens");
  ExpectError(Args({}, "--kv-lens 7"), "--kv-lens");
  ExpectError(Args({}, "--kv-lens -1"), "--kv-lens");
  ExpectError(Args({}, "--kv-lens 1.5"), "--kv-lens");
  ExpectError(Args({}, "--kv-lens 3,"), "--kv-lens");
  ExpectError(Args({}, "--kv-lens ,3"), "--kv-lens");
  ExpectError(Args({}, "--kv-lens 0x3"), "--kv-lens");
  ExpectError(Args({}, "--kv-lens +3"), "--kv-lens");
  ExpectError(Args({}, "--kv-lens 99999999999999999999"), "--kv-lens");
}

TEST_F(CliBadInputTest, BadWindow) {
  for (const char* flag : {"--window-left", "--window-right"}) {
    for (const char* value : {"abc", "1.5", "''", "1e3", "3x", "--",
                              "99999999999999999999",
                              "-99999999999999999999"}) {
      ExpectError(Args({}, std::string(flag) + " " + value), flag);
    }
  }
}

TEST_F(CliBadInputTest, BadSoftcap) {
  for (const char* value :
       {"-1", "nan", "inf", "-inf", "1e99", "x", "0.5x", "''"}) {
    ExpectError(Args({}, std::string("--softcap ") + value), "--softcap");
  }
}

TEST_F(CliBadInputTest, BadPerHeadArrays) {
  for (const char* flag : {"--alibi-slopes", "--sinks"}) {
    const std::string f = flag;
    ExpectError(Args({}, f + " " + F("heads3.npy")), f);
    ExpectError(Args({}, f + " " + F("heads3.npy")), "(4,)");
    ExpectError(Args({}, f + " " + F("heads1x4.npy")), f);
    ExpectError(Args({}, f + " " + F("heads4_f2.npy")), "'<f2'");
    ExpectError(Args({}, f + " " + F("mask_ok.npy")), f);
    ExpectError(Args({}, f + " " + F("missing.npy")), f);
    ExpectError(Args({}, f + " ''"), f + ": empty path");
    ExpectError(Args({{"--lse", F("heads4.npy")}}, f + " " + F("heads4.npy")),
                f);
  }
}

TEST_F(CliBadInputTest, BadStorageTypes) {
  ExpectError(Args({}, "--kv-dtype f64"), "--kv-dtype");
  ExpectError(Args({}, "--kv-dtype f64"), "'f64'");
  ExpectError(Args({}, "--dtype int8"), "--dtype");
  ExpectError(Args({}, "--dtype int8"), "'int8'");
  for (const char* value : {"''", "F16", "bfloat16", "f8", "fp16", "f16,"}) {
    ExpectError(Args({}, std::string("--dtype ") + value), "--dtype");
    ExpectError(Args({}, std::string("--kv-dtype ") + value), "--kv-dtype");
  }
  // A bad --kv-dtype is named even next to a good --dtype, and vice versa.
  ExpectError(Args({}, "--dtype f32 --kv-dtype f64"), "--kv-dtype");
  ExpectError(Args({}, "--dtype int8 --kv-dtype f16"), "--dtype");
  // A non-f32 --dtype sets K/V too: any other --kv-dtype conflicts.
  ExpectError(Args({}, "--dtype bf16 --kv-dtype f16"), "conflicts");
  ExpectError(Args({}, "--dtype f16 --kv-dtype bf16"), "conflicts");
  ExpectError(Args({}, "--dtype bf16 --kv-dtype f32"), "conflicts");
  ExpectError(Args({}, "--kv-dtype f16 --dtype bf16"), "--kv-dtype");
}

TEST_F(CliBadInputTest, BadDropout) {
  for (const char* value : {"1", "-0.1", "nan", "abc", "1.5", "inf",
                            "0.99999999999", "''"}) {
    ExpectError(Args({}, std::string("--dropout ") + value), "--dropout");
  }
  for (const char* value : {"abc", "-1", "1.5", "18446744073709551616", "''",
                            "+1"}) {
    ExpectError(Args({}, std::string("--seed ") + value), "--seed");
  }
  // Checked whether or not --dropout is given.
  ExpectError(Args({}, "--dropout 0.5 --seed abc"), "--seed");
}

TEST_F(CliBadInputTest, ValidDropoutRunsOrNamesDropout) {
  const CliResult r = RunCli(Args({}, "--dropout 0.5 --seed 3"));
  if (r.code == 0) {
    npy::Array o;
    std::string error;
    ASSERT_TRUE(npy::Read(F("out.npy"), &o, &error)) << error;
    EXPECT_EQ(o.shape, (std::vector<int64_t>{1, 4, 5, 8}));
  } else {
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("dropout"), std::string::npos) << r.err;
    EXPECT_EQ(ReadBytes(F("out.npy")), kOutSentinel);
  }
}

TEST_F(CliBadInputTest, NeutralVariantValuesRunToday) {
  // Values that leave the computation plain are parsed and accepted.
  for (const char* extra :
       {"--dropout 0", "--seed 18446744073709551615", "--softcap 0",
        "--window-left -1 --window-right -1", "--window-left=-5",
        "--dropout 0.0 --seed 0"}) {
    const CliResult r = RunCli(Args({}, extra));
    EXPECT_EQ(r.code, 0) << extra << ": " << r.err;
    EXPECT_EQ(r.err, "") << extra;
  }
}

TEST_F(CliBadInputTest, OutputIntoMissingDirectory) {
  ExpectError(Args({{"--out", F("nope/o.npy")}}), "nope/o.npy");
  EXPECT_FALSE(fs::exists(F("nope")));
  // O is only replaced once LSE is ready too.
  ExpectError(Args({{"--lse", F("nope/lse.npy")}}), "nope/lse.npy");
  // Output path is an existing directory.
  ExpectError(Args({{"--out", F("subdir")}}), "subdir");
}

TEST_F(CliBadInputTest, LseIntoDirectoryLeavesOutputUntouched) {
  // Both destinations are checked before either is replaced.
  ExpectError(Args({{"--lse", F("subdir")}}), "--lse");
  ExpectError(Args({{"--lse", F("subdir")}}), "directory");
  ExpectError(Args({{"--lse", F("subdir") + "/"}}), "--lse");
  ExpectError(Args({{"--lse", F("out.npy/x.npy")}}), "--lse");
  EXPECT_TRUE(fs::is_directory(F("subdir")));
}

TEST_F(CliBadInputTest, OutputsNamingTheSameFileAreRejected) {
  ExpectError(Args({{"--lse", F(".") + "/out.npy"}}), "same file");
  ExpectError(Args({{"--lse", F("subdir/../out.npy")}}), "same file");
  ExpectError(Args({{"--out", F("lse.npy")}}), "same file");
  // Relative spellings of one file.
  ExpectError("run --q q.npy --k k.npy --v v.npy --out out.npy --lse ./out.npy",
              "same file", "cd '" + F(".") + "' && ");
  ExpectError("run --q q.npy --k k.npy --v v.npy --out out.npy --lse " +
                  F("out.npy"),
              "same file", "cd '" + F(".") + "' && ");
}

TEST_F(CliBadInputTest, OutputNamingAnInputIsRejected) {
  const std::string q = ReadBytes(F("q.npy"));
  const std::string k = ReadBytes(F("k.npy"));
  const std::string v = ReadBytes(F("v.npy"));
  ExpectError(Args({{"--out", F("q.npy")}}), "--q");
  ExpectError(Args({{"--lse", F("k.npy")}}), "--k");
  ExpectError(Args({{"--out", F("subdir/../v.npy")}}), "--v");
  ExpectError("run --q q.npy --k k.npy --v v.npy --out ./q.npy",
              "same file as input --q", "cd '" + F(".") + "' && ");
  // An input reached through a symbolic link is still protected.
  fs::create_symlink(F("q.npy"), F("q_link.npy"));
  entries_ = dir_.Entries();
  ExpectError(Args({{"--q", F("q_link.npy")}, {"--out", F("q.npy")}}),
              "--q");
  ExpectError(Args({{"--q", F("q_link.npy")}, {"--out", F("q_link.npy")}}),
              "--q");
  EXPECT_EQ(ReadBytes(F("q.npy")), q);
  EXPECT_EQ(ReadBytes(F("k.npy")), k);
  EXPECT_EQ(ReadBytes(F("v.npy")), v);
  EXPECT_TRUE(fs::is_symlink(F("q_link.npy")));
}

TEST_F(CliBadInputTest, NonRegularDestinationIsRejected) {
  ASSERT_EQ(::mkfifo(F("fifo").c_str(), 0600), 0);
  entries_ = dir_.Entries();
  ExpectError(Args({{"--out", F("fifo")}}), "--out");
  ExpectError(Args({{"--out", F("fifo")}}), "not a regular file");
  ExpectError(Args({{"--lse", F("fifo")}}), "--lse");
  EXPECT_TRUE(fs::is_fifo(F("fifo")));
}

TEST_F(CliBadInputTest, EmptyPathsNameTheirOption) {
  ExpectError(Args({{"--out", "''"}}), "--out: empty path");
  ExpectError(Args({{"--lse", "''"}}), "--lse: empty path");
  ExpectError(Args({{"--q", "''"}}), "--q: empty path");
  ExpectError(Args({{"--v", "''"}}), "--v");
}

TEST_F(CliBadInputTest, SameBaseNameInAnotherDirectoryIsFine) {
  const CliResult r = RunCli(Args({{"--lse", F("subdir/out.npy")}}));
  EXPECT_EQ(r.code, 0) << r.err;
  npy::Array o, lse;
  std::string error;
  ASSERT_TRUE(npy::Read(F("out.npy"), &o, &error)) << error;
  ASSERT_TRUE(npy::Read(F("subdir/out.npy"), &lse, &error)) << error;
  EXPECT_EQ(o.shape, (std::vector<int64_t>{1, 4, 5, 8}));
  EXPECT_EQ(lse.shape, (std::vector<int64_t>{1, 4, 5}));
}

}  // namespace
}  // namespace simdattn
