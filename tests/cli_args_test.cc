// Bad input to `simdattn`: every unreadable file, shape mismatch, bad
// option value or unsafe output path exits 2 with a one-line message naming
// the problem, and leaves the outputs and their directory untouched.

#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/cli_util.h"
#include "tests/test_util.h"
#include "tools/npy.h"

namespace simdattn {
namespace test {
namespace {

namespace fs = std::filesystem;

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
  // Lq = 5 != Lk = 6: whatever uses p(i) needs --causal's or --align's
  // alignment.
  ExpectError(Args({}, "--window-left 2"), "alignment is unset, but window_left");
  ExpectError(Args({}, "--window-right 0"), "alignment is unset, but window_right");
  ExpectError(Args({}, "--alibi-slopes " + F("heads4.npy")),
              "alignment is unset, but alibi_slopes");
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

TEST_F(CliBadInputTest, NeutralVariantValuesAreAccepted) {
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
}  // namespace test
}  // namespace simdattn
