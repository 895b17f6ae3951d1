// Bad input (SEMANTICS.md): every invalid call returns its error with a
// message naming the argument, and leaves the output untouched; target caps.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/kernels/kernels.h"
#include "lib/reference.h"
#include "simdattn/attention.h"
#include "tests/test_util.h"

namespace simdattn {
namespace test {
namespace {

// A valid GQA call (B2 Hq4 Hkv2 Lq5 Lk7 Dk8 Dv6) that each test breaks once.
struct Call {
  std::vector<float> q, k, v, o, lse;
  TensorView qv, kv, vv;
  MutableTensorView ov, lsev;
  AttentionOptions options;
  float mask_data[64] = {};
  int64_t kv_lengths[2] = {7, 7};
  float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f};

  Call() {
    q.assign(2 * 4 * 5 * 8, 0.25f);
    k.assign(2 * 2 * 7 * 8, 0.5f);
    v.assign(2 * 2 * 7 * 6, 1.0f);
    o.assign(2 * 4 * 5 * 6, -7.0f);
    lse.assign(2 * 4 * 5, -9.0f);
    qv = MakeBHSD(q.data(), DType::kF32, 2, 4, 5, 8);
    kv = MakeBHSD(k.data(), DType::kF32, 2, 2, 7, 8);
    vv = MakeBHSD(v.data(), DType::kF32, 2, 2, 7, 6);
    ov = MakeBHSD(o.data(), DType::kF32, 2, 4, 5, 6);
    lsev = MakeBHSD(lse.data(), DType::kF32, 2, 4, 5, 1);
  }

  Status Run() { return Attention(qv, kv, vv, ov, options, lsev); }

  bool OutputsUntouched() const {
    for (float x : o) if (x != -7.0f) return false;
    for (float x : lse) if (x != -9.0f) return false;
    return true;
  }
};

void ExpectInvalid(Call& c, const std::string& needle) {
  const Status s = c.Run();
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument) << s.message;
  EXPECT_NE(s.message.find(needle), std::string::npos)
      << "message '" << s.message << "' should mention '" << needle << "'";
  EXPECT_TRUE(c.OutputsUntouched());
}

TEST(ValidateTest, ValidCallSucceeds) {
  Call c;
  const Status s = c.Run();
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_FALSE(c.OutputsUntouched());
  EXPECT_NEAR(c.o[0], 1.0f, 1e-6);  // V is all ones
}

TEST(ValidateTest, NullPointers) {
  { Call c; c.qv.data = nullptr; ExpectInvalid(c, "q.data is null"); }
  { Call c; c.kv.data = nullptr; ExpectInvalid(c, "k.data is null"); }
  { Call c; c.vv.data = nullptr; ExpectInvalid(c, "v.data is null"); }
  { Call c; c.ov.data = nullptr; ExpectInvalid(c, "o.data is null"); }
}

TEST(ValidateTest, NonPositiveExtents) {
  { Call c; c.qv.shape[2] = 0; ExpectInvalid(c, "q.shape[2] (Lq) = 0"); }
  { Call c; c.kv.shape[3] = -1; ExpectInvalid(c, "k.shape[3] (Dk) = -1"); }
  { Call c; c.vv.shape[1] = 0; ExpectInvalid(c, "v.shape[1] (Hkv) = 0"); }
  { Call c; c.ov.shape[0] = 0; ExpectInvalid(c, "o.shape[0] (B) = 0"); }
}

TEST(ValidateTest, MismatchedExtents) {
  { Call c; c.kv.shape[0] = 1; ExpectInvalid(c, "batch mismatch"); }
  { Call c; c.kv.shape[3] = 4; ExpectInvalid(c, "head dim mismatch"); }
  { Call c; c.vv.shape[2] = 6; ExpectInvalid(c, "must agree in Hkv and Lk"); }
  { Call c; c.ov.shape[3] = 5; ExpectInvalid(c, "o.shape"); }
  { Call c; c.ov.shape[2] = 4; ExpectInvalid(c, "o.shape"); }
  {
    Call c;  // Hq = 4, Hkv = 3
    c.kv.shape[1] = 3;
    c.vv.shape[1] = 3;
    ExpectInvalid(c, "Hq = 4 is not a multiple of Hkv = 3");
  }
}

TEST(ValidateTest, NonUnitLastStride) {
  Call c;
  c.kv.strides[3] = 2;
  ExpectInvalid(c, "k.strides[3] = 2");
}

TEST(ValidateTest, OverflowingExtentsAndOffsets) {
  {
    Call c;
    c.qv.shape[0] = int64_t{1} << 40;
    c.qv.shape[2] = int64_t{1} << 40;
    ExpectInvalid(c, "overflows int64");
  }
  {
    Call c;
    c.vv.strides[1] = std::numeric_limits<int64_t>::max() / 2;
    ExpectInvalid(c, "overflow int64");
  }
}

TEST(ValidateTest, OutputOverlappingInput) {
  {
    Call c;
    c.ov.data = c.q.data();  // o over q
    ExpectInvalid(c, "o overlaps input q");
    // q was the "output": make sure it is unchanged too.
    for (float x : c.q) EXPECT_EQ(x, 0.25f);
  }
  {
    Call c;
    c.lsev.data = c.v.data() + 3;
    ExpectInvalid(c, "lse overlaps input v");
  }
  {
    Call c;
    c.lsev.data = c.o.data() + 10;
    const Status s = c.Run();
    EXPECT_EQ(s.code, StatusCode::kInvalidArgument);
    EXPECT_NE(s.message.find("lse overlaps o"), std::string::npos) << s.message;
    for (float x : c.o) EXPECT_EQ(x, -7.0f);
  }
  {
    Call c;  // o rows written twice through a zero head stride
    c.ov.strides[1] = 0;
    ExpectInvalid(c, "share memory");
  }
}

TEST(ValidateTest, UnsupportedDtypes) {
  { Call c; c.qv.dtype = DType::kBool; ExpectInvalid(c, "q.dtype = bool"); }
  { Call c; c.kv.dtype = static_cast<DType>(42); ExpectInvalid(c, "k.dtype = unknown"); }
  { Call c; c.qv.dtype = DType::kInt8; ExpectInvalid(c, "q.dtype = int8: must be f32, f16 or bf16"); }
  { Call c; c.ov.dtype = DType::kFp8E4M3; ExpectInvalid(c, "o.dtype = fp8_e4m3"); }
  { Call c; c.lsev.dtype = DType::kF16; ExpectInvalid(c, "lse.dtype = f16"); }
}

TEST(ValidateTest, BadScaleSoftcapDropout) {
  { Call c; c.options.scale = -1.0f; ExpectInvalid(c, "scale = -1"); }
  { Call c; c.options.scale = std::numeric_limits<float>::infinity(); ExpectInvalid(c, "scale = inf"); }
  { Call c; c.options.scale = std::nanf(""); ExpectInvalid(c, "scale = nan"); }
  { Call c; c.options.softcap = -2.0f; ExpectInvalid(c, "softcap = -2"); }
  { Call c; c.options.softcap = std::nanf(""); ExpectInvalid(c, "softcap = nan"); }
  { Call c; c.options.dropout_p = 1.0f; ExpectInvalid(c, "dropout_p = 1"); }
  { Call c; c.options.dropout_p = -0.1f; ExpectInvalid(c, "dropout_p = -0.1"); }
  { Call c; c.options.dropout_p = std::nanf(""); ExpectInvalid(c, "dropout_p = nan"); }
}

TEST(ValidateTest, MaskThatCannotBroadcast) {
  Call c;
  c.options.mask = MakeBHSD(c.mask_data, DType::kF32, 1, 1, 5, 6);  // Lk = 7
  ExpectInvalid(c, "mask.shape[3] = 6 cannot broadcast to Lk = 7");
  Call c2;
  c2.options.mask = MakeBHSD(c2.mask_data, DType::kBF16, 1, 1, 1, 7);
  ExpectInvalid(c2, "mask.dtype = bf16");
}

TEST(ValidateTest, MaskLastStrideAndNullViews) {
  {
    Call c;  // rows of 7 keys read every other float
    c.options.mask = MakeBHSD(c.mask_data, DType::kF32, 1, 1, 1, 7);
    c.options.mask.strides[3] = 2;
    ExpectInvalid(c, "mask.strides[3] = 2");
  }
  {
    Call c;
    c.options.mask = MakeBHSD(static_cast<const void*>(nullptr), DType::kF32, 1, 1, 1, 7);
    ExpectInvalid(c, "mask.data is null");
  }
  {
    Call c;
    c.lsev.data = nullptr;  // extents still [2, 4, 5, 1]
    ExpectInvalid(c, "lse.data is null");
  }
  {
    Call c;  // a broadcast Lk (stride 0) is valid
    c.options.mask = MakeBHSD(c.mask_data, DType::kF32, 1, 1, 1, 7);
    c.options.mask.strides[3] = 0;
    EXPECT_TRUE(c.Run().ok());
  }
}

TEST(ValidateTest, KvLengthsOutOfRange) {
  Call c;
  c.kv_lengths[1] = 8;
  c.options.kv_lengths = c.kv_lengths;
  ExpectInvalid(c, "kv_lengths[1] = 8");
  Call c2;
  c2.kv_lengths[0] = -1;
  c2.options.kv_lengths = c2.kv_lengths;
  ExpectInvalid(c2, "kv_lengths[0] = -1");
}

TEST(ValidateTest, KvLengthsInt32) {
  Call c;
  const int32_t lens[2] = {7, 8};
  c.options.kv_lengths_i32 = lens;
  ExpectInvalid(c, "kv_lengths[1] = 8");
  Call both;
  const int32_t ok[2] = {7, 3};
  both.options.kv_lengths_i32 = ok;
  both.options.kv_lengths = both.kv_lengths;
  ExpectInvalid(both, "kv_lengths and kv_lengths_i32 are both set");
}

// SEMANTICS.md: causal, windows and ALiBi place query rows on the key axis,
// where top-left and bottom-right disagree unless Lq = Lk without kv
// lengths. There the alignment must be named: an error naming it and the
// option that needs it, from Attention() and from the reference alike.
TEST(ValidateTest, AlignmentRequiredWhereTheConventionsDisagree) {
  const auto expect_unset = [](Call& c, const char* user) {
    SCOPED_TRACE(user);
    ExpectInvalid(c, std::string("alignment is unset, but ") + user);
    std::vector<double> o, lse;
    const Status r = ReferenceAttention(c.qv, c.kv, c.vv, c.options, &o, &lse);
    EXPECT_EQ(r.code, StatusCode::kInvalidArgument);
    EXPECT_NE(r.message.find("Lq = 5, Lk = 7"), std::string::npos) << r.message;
    for (Alignment a : {Alignment::kTopLeft, Alignment::kBottomRight}) {
      c.options.alignment = a;
      EXPECT_TRUE(c.Run().ok());
    }
  };
  Call causal;  // Lq = 5, Lk = 7
  causal.options.causal = true;
  expect_unset(causal, "causal");
  Call left;
  left.options.window_left = 2;
  expect_unset(left, "window_left");
  Call right;
  right.options.window_right = 0;
  expect_unset(right, "window_right");
  Call alibi;
  alibi.options.alibi_slopes = alibi.slopes;
  expect_unset(alibi, "alibi_slopes");

  // Lq = Lk: the same unless kv lengths move the bottom-right rows.
  std::vector<float> k(2 * 2 * 5 * 8, 0.5f), v(2 * 2 * 5 * 6, 1.0f);
  const int32_t lens[2] = {5, 3};
  for (bool with_lengths : {false, true}) {
    Call square;
    square.kv = MakeBHSD(k.data(), DType::kF32, 2, 2, 5, 8);
    square.vv = MakeBHSD(v.data(), DType::kF32, 2, 2, 5, 6);
    square.options.causal = true;
    square.options.window_left = 1;
    square.options.alibi_slopes = square.slopes;
    if (!with_lengths) {
      EXPECT_TRUE(square.Run().ok());
      continue;
    }
    square.options.kv_lengths_i32 = lens;
    ExpectInvalid(square, "Lq = 5, Lk = 5 with kv lengths");
  }
  // Nothing that uses p(i): no alignment needed whatever the lengths.
  Call plain;
  plain.options.kv_lengths = plain.kv_lengths;
  EXPECT_TRUE(plain.Run().ok());
}

TEST(ValidateTest, LseShape) {
  Call c;
  c.lsev.shape[2] = 4;
  ExpectInvalid(c, "lse.shape");
}

// The fast path takes head dims up to 1024; beyond is valid but unimplemented.
TEST(ValidateTest, UnimplementedHeadDimWritesNothing) {
  const int64_t D = 1025;
  std::vector<float> q(2 * 4 * 5 * D, 0.25f), k(2 * 2 * 7 * D, 0.5f);
  Call c;
  c.qv = MakeBHSD(q.data(), DType::kF32, 2, 4, 5, D);
  c.kv = MakeBHSD(k.data(), DType::kF32, 2, 2, 7, D);
  const Status s = c.Run();
  EXPECT_EQ(s.code, StatusCode::kUnimplemented) << s.message;
  EXPECT_NE(s.message.find("1024"), std::string::npos) << s.message;
  EXPECT_TRUE(c.OutputsUntouched());

  c.options.scale = -3.0f;  // invalid as well: validation comes first
  const Status s2 = c.Run();
  EXPECT_EQ(s2.code, StatusCode::kInvalidArgument) << s2.message;
  EXPECT_NE(s2.message.find("scale = -3"), std::string::npos) << s2.message;
  EXPECT_TRUE(c.OutputsUntouched());
}

TEST(TargetTest, CapLandsOnEachTarget) {
  for (const std::string& target : AvailableTargets()) {
    ASSERT_TRUE(SetMaxTarget(target.c_str()).ok());
    std::string selected;
    ASSERT_TRUE(SelectedTarget(&selected).ok());
    EXPECT_EQ(selected, target);
    Call c;
    RunInfo info;
    ASSERT_TRUE(Attention(c.qv, c.kv, c.vv, c.ov, c.options, c.lsev, {}, &info).ok());
    EXPECT_EQ(std::string(info.target), target);
  }
  SetMaxTarget(nullptr);
}

TEST(TargetTest, EnvironmentVariableCapsAndBadNamesFail) {
  const std::vector<std::string> avail = AvailableTargets();
  ASSERT_FALSE(avail.empty());
  SetMaxTarget(nullptr);
  ASSERT_EQ(setenv("SIMDATTN_MAX_TARGET", avail.back().c_str(), 1), 0);
  std::string selected;
  ASSERT_TRUE(SelectedTarget(&selected).ok());
  EXPECT_EQ(selected, avail.back());
  // The API cap overrides the environment.
  ASSERT_TRUE(SetMaxTarget(avail.front().c_str()).ok());
  ASSERT_TRUE(SelectedTarget(&selected).ok());
  EXPECT_EQ(selected, avail.front());
  SetMaxTarget(nullptr);

  // A name that is no target: SelectedTarget reports it every time, the
  // first call once (naming the variable and the known targets), and later
  // calls ignore it.
  ASSERT_EQ(setenv("SIMDATTN_MAX_TARGET", "NOT_A_TARGET", 1), 0);
  for (int i = 0; i < 2; ++i) {
    selected.clear();
    const Status sel = SelectedTarget(&selected);
    EXPECT_EQ(sel.code, StatusCode::kInvalidArgument);
    EXPECT_NE(sel.message.find("SIMDATTN_MAX_TARGET = 'NOT_A_TARGET'"), std::string::npos)
        << sel.message;
    EXPECT_EQ(selected, ExpectedDefaultTarget());
  }
  Call c;
  const Status s = c.Run();
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument);
  EXPECT_NE(s.message.find("SIMDATTN_MAX_TARGET = 'NOT_A_TARGET'"), std::string::npos)
      << s.message;
  EXPECT_NE(s.message.find("SCALAR"), std::string::npos) << s.message;
  EXPECT_TRUE(c.OutputsUntouched());
  RunInfo info;
  for (int i = 0; i < 2; ++i) {
    Call later;
    ASSERT_TRUE(Attention(later.qv, later.kv, later.vv, later.ov, later.options,
                          later.lsev, {}, &info).ok());
    EXPECT_EQ(std::string(info.target), ExpectedDefaultTarget());
  }
  unsetenv("SIMDATTN_MAX_TARGET");

  const Status bad = SetMaxTarget("AVX9000");
  EXPECT_EQ(bad.code, StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message.find("AVX9000"), std::string::npos);
  ASSERT_TRUE(SelectedTarget(&selected).ok());
  EXPECT_EQ(selected, ExpectedDefaultTarget());  // unchanged, no cap
}

// ExecutionOptions::max_target caps one call, over SetMaxTarget's cap.
TEST(TargetTest, CallCapLandsOnEachTarget) {
  ASSERT_TRUE(SetMaxTarget(AvailableTargets().front().c_str()).ok());
  for (const std::string& target : AvailableTargets()) {
    Call c;
    ExecutionOptions exec;
    exec.max_target = target.c_str();
    RunInfo info;
    ASSERT_TRUE(Attention(c.qv, c.kv, c.vv, c.ov, c.options, c.lsev, exec, &info).ok());
    EXPECT_EQ(std::string(info.target), target);
  }
  SetMaxTarget(nullptr);
  Call c;
  ExecutionOptions exec;
  exec.max_target = "AVX9000";
  const Status s = Attention(c.qv, c.kv, c.vv, c.ov, c.options, c.lsev, exec);
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument);
  EXPECT_NE(s.message.find("max_target = 'AVX9000'"), std::string::npos) << s.message;
  EXPECT_TRUE(c.OutputsUntouched());
}

TEST(TargetTest, CompiledTargetsIncludeAvailableOnes) {
  const std::vector<std::string> compiled = CompiledTargets();
  for (const std::string& t : AvailableTargets()) {
    EXPECT_NE(std::find(compiled.begin(), compiled.end(), t), compiled.end()) << t;
  }
  EXPECT_EQ(compiled.back(), "SCALAR");
}

// The AMX entry (AVX3_AMX) and then the native bf16 entry (AVX3_BF16) lead
// the x86 table; AVX3_BF16 is available exactly when the kernel reports
// avx512_bf16 for this CPU (a second opinion on our CPUID check). Capping
// at AVX3_DL selects something else.
TEST(TargetTest, NativeBf16EntryFollowsTheCpu) {
#if defined(__x86_64__)
  const std::vector<std::string> compiled = CompiledTargets();
  ASSERT_FALSE(compiled.empty());
  // Built wherever the compiler can and Highway's AVX3 target is compiled.
  const bool avx3 = std::find(compiled.begin(), compiled.end(), "AVX3") != compiled.end();
  if (SIMDATTN_NATIVE_BF16_COMPILER && avx3) {
    ASSERT_GE(compiled.size(), 2u);
    EXPECT_EQ(compiled[0], "AVX3_AMX");
    EXPECT_EQ(compiled[1], "AVX3_BF16");
  }
  std::ifstream cpuinfo("/proc/cpuinfo");
  if (!cpuinfo) GTEST_SKIP() << "no /proc/cpuinfo to compare with";
  std::string line;
  bool flag = false, avx512f = false;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line);
    for (std::string w; words >> w;) {
      flag |= w == "avx512_bf16";
      avx512f |= w == "avx512f";
    }
    break;
  }
  const std::vector<std::string> avail = AvailableTargets();
  const bool listed = std::find(avail.begin(), avail.end(), "AVX3_BF16") != avail.end();
  EXPECT_EQ(listed, SIMDATTN_NATIVE_BF16_COMPILER && avx3 && flag && avx512f);
  if (listed) {
    const bool amx = avail.front() == "AVX3_AMX";
    EXPECT_EQ(avail[amx ? 1 : 0], "AVX3_BF16");
    // Named, it runs on any CPU that has it; capped at AVX3_DL, never.
    ASSERT_TRUE(SetMaxTarget("AVX3_BF16").ok());
    std::string selected;
    ASSERT_TRUE(SelectedTarget(&selected).ok());
    EXPECT_EQ(selected, "AVX3_BF16");
    ASSERT_TRUE(SetMaxTarget("AVX3_DL").ok());
    ASSERT_TRUE(SelectedTarget(&selected).ok());
    EXPECT_NE(selected, "AVX3_BF16");
    SetMaxTarget(nullptr);
    // Without a cap: on AMD only (vdpbf16ps measured slower than the f32
    // FMAs on an Intel core).
    ASSERT_TRUE(SelectedTarget(&selected).ok());
    EXPECT_EQ(selected, ExpectedDefaultTarget());
  }
#else
  const std::vector<std::string> compiled = CompiledTargets();
  EXPECT_EQ(std::find(compiled.begin(), compiled.end(), "AVX3_BF16"), compiled.end());
  EXPECT_FALSE(SetMaxTarget("AVX3_BF16").ok());
#endif
}

}  // namespace
}  // namespace test
}  // namespace simdattn
