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

struct RunSpec {
  Dims dims;
  Layout layout = Layout::kBHSD;
  DType q_dtype = DType::kF32;
  DType kv_dtype = DType::kF32;
  bool lse = true;
  std::string extra;         // further CLI arguments
  AttentionOptions options;  // what `extra` should mean, for the reference
  uint32_t seed = 1;
};

struct RunResult {
  CliResult cli;
  std::string o_bytes;  // the O file as written
};

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
  args += " " + spec.extra;
  RunResult result;
  result.cli = RunCli(args);
  EXPECT_EQ(result.cli.code, 0) << result.cli.err;
  EXPECT_EQ(result.cli.out, "");
  if (spec.extra.find("--verbose") == std::string::npos) {
    EXPECT_EQ(result.cli.err, "");
  }
  if (result.cli.code != 0) return result;

  std::vector<double> o_ref, lse_ref;
  const Status s = ReferenceAttention(q.View(), k.View(), v.View(),
                                      spec.options, &o_ref, &lse_ref);
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
  const double err = test::MaxError(o, o_ref, test::MaxAbs(v));
  EXPECT_LE(err, kOutputBound);

  std::set<std::string> expect_files = {"q.npy", "k.npy", "v.npy", "o.npy"};
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
          EXPECT_LE(std::fabs(lse.f32[i] - lse_ref[i]), kLseBound)
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
  EXPECT_NE(r.out.find("selected target: " + available.front() + "\n"),
            std::string::npos)
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
  EXPECT_NE(RunCli("run --help").out.find("--causal"), std::string::npos);
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
