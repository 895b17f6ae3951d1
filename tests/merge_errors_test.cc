// MergeStates' bad input, through the C++ and the C API: every check
// returns kInvalidArgument with a message naming the argument and its value,
// and writes nothing (outputs keep their sentinel, inputs their bytes). The
// C API gives the C++ API's bits and reports its errors per thread.

#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "simdattn/serving.h"
#include "simdattn/simdattn.h"
#include "tests/test_util.h"

namespace simdattn {
namespace test {
namespace {

constexpr int64_t kB = 2, kH = 3, kL = 5, kDv = 8;
constexpr int kParts = 3;

// A valid call: three f32 parts, an f32 out and an LSE, all sentinel-filled
// outputs; mutate() breaks one argument.
struct Call {
  std::vector<Tensor> o;
  std::vector<std::vector<float>> lse_bytes;
  Tensor out{DType::kF32, kB, kH, kL, kDv};
  std::vector<float> lse_out = std::vector<float>(kB * kH * kL, 12345.0f);
  std::vector<TensorView> outs, lses;
  MutableTensorView out_view, lse_view;
  int64_t num_parts = kParts;
  bool null_outs = false, null_lses = false;
  ExecutionOptions exec;

  Call() {
    std::mt19937 rng(7);
    for (int i = 0; i < kParts; ++i) {
      o.emplace_back(DType::kF32, kB, kH, kL, kDv);
      o.back().FillUniform(&rng, -1.0f, 1.0f);
      lse_bytes.emplace_back(kB * kH * kL, 0.5f * static_cast<float>(i));
    }
    for (int i = 0; i < kParts; ++i) {
      outs.push_back(o[i].View());
      lses.push_back(MakeBHSD(lse_bytes[i].data(), DType::kF32, kB, kH, kL, 1));
    }
    out.FillBytes(0xA5);
    out_view = out.MutableView();
    lse_view = MakeBHSD(lse_out.data(), DType::kF32, kB, kH, kL, 1);
  }
  Status Run() {
    return MergeStates(null_outs ? nullptr : outs.data(),
                       null_lses ? nullptr : lses.data(), num_parts, out_view,
                       lse_view, exec);
  }
};

using Mutation = std::function<void(Call*)>;

struct ErrorCase {
  const char* needle;  // a part of the message
  Mutation mutate;
};

// Views whose data lies `elements` f32 elements into another's.
MutableTensorView Shifted(const TensorView& v, int64_t elements) {
  MutableTensorView m;
  m.data = const_cast<char*>(static_cast<const char*>(v.data)) + 4 * elements;
  m.dtype = DType::kF32;
  for (int i = 0; i < 4; ++i) m.shape[i] = v.shape[i], m.strides[i] = v.strides[i];
  return m;
}

std::vector<ErrorCase> ErrorCases() {
  constexpr int64_t kBig = int64_t{1} << 40;
  return {
      {"num_parts = 0: must be >= 1", [](Call* c) { c->num_parts = 0; }},
      {"outs is null with num_parts = 3", [](Call* c) { c->null_outs = true; }},
      {"lses is null with num_parts = 3", [](Call* c) { c->null_lses = true; }},
      {"outs[1].dtype = bool: must be f32, f16 or bf16", [](Call* c) { c->outs[1].dtype = DType::kBool; }},
      {"outs[0].shape[1] (H) = 0: extents must be positive", [](Call* c) { c->outs[0].shape[1] = 0; }},
      {"outs[2].shape[2] (L) = 6: must equal outs[0].shape[2] = 5", [](Call* c) { c->outs[2].shape[2] = 6; }},
      {"outs[1].data is null with shape [2, 3, 5, 8]", [](Call* c) { c->outs[1].data = nullptr; }},
      {"outs[1].strides[3] = 2: the last dimension must be contiguous", [](Call* c) { c->outs[1].strides[3] = 2; }},
      {"outs[1]: offsets of shape [2, 3, 5, 8] with its strides overflow int64",
       [](Call* c) { c->outs[1].strides[0] = std::numeric_limits<int64_t>::max() / 2; }},
      {"outs[0].shape [1099511627776, 1099511627776, 5, 8]: element count overflows int64",
       [](Call* c) { c->outs[0].shape[0] = c->outs[0].shape[1] = kBig; }},
      {"lses[1].dtype = f16: must be f32", [](Call* c) { c->lses[1].dtype = DType::kF16; }},
      {"lses[2].shape[3] = 2: must be 1", [](Call* c) { c->lses[2].shape[3] = 2; }},
      {"lses[0].shape[0] (B) = 3: must equal outs[0].shape[0] = 2", [](Call* c) { c->lses[0].shape[0] = 3; }},
      {"lses[1].data is null", [](Call* c) { c->lses[1].data = nullptr; }},
      {"out.dtype = bool", [](Call* c) { c->out_view.dtype = DType::kBool; }},
      {"out.shape[3] (Dv) = 9: must equal outs[0].shape[3] = 8", [](Call* c) { c->out_view.shape[3] = 9; }},
      {"out.strides[3] = 2", [](Call* c) { c->out_view.strides[3] = 2; }},
      {"out.strides make distinct elements of out share memory", [](Call* c) { c->out_view.strides[2] = 0; }},
      {"out.data is null", [](Call* c) { c->out_view.data = nullptr; }},
      {"lse.data is null with shape [2, 3, 5, 1] (leave every extent 0",
       [](Call* c) { c->lse_view.data = nullptr; }},
      {"lse.dtype = f16: must be f32", [](Call* c) { c->lse_view.dtype = DType::kF16; }},
      {"lse.shape[3] = 2: must be 1", [](Call* c) { c->lse_view.shape[3] = 2; }},
      {"lse.shape[2] (L) = 4: must equal outs[0].shape[2] = 5", [](Call* c) { c->lse_view.shape[2] = 4; }},
      {"lse.strides make distinct elements of lse share memory", [](Call* c) { c->lse_view.strides[2] = 0; }},
      {"out overlaps input outs[1]", [](Call* c) { c->out_view = Shifted(c->outs[1], 0); }},
      {"out overlaps input outs[0]", [](Call* c) { c->out_view = Shifted(c->outs[0], 1); }},
      {"out overlaps input outs[0]",  // same memory, another layout (BSHD)
       [](Call* c) {
         c->out_view = MakeBSHD(const_cast<void*>(c->outs[0].data), DType::kF32, kB, kH, kL, kDv);
       }},
      {"out overlaps input lses[2]",
       [](Call* c) {
         c->lse_bytes[2].resize(kB * kH * kL * kDv);
         c->lses[2].data = c->lse_bytes[2].data();
         c->out_view = MakeBHSD(c->lse_bytes[2].data(), DType::kF32, kB, kH, kL, kDv);
       }},
      {"lse overlaps out", [](Call* c) { c->lse_view.data = c->out_view.data; }},
      {"lse overlaps input lses[1]", [](Call* c) { c->lse_view.data = const_cast<void*>(c->lses[1].data); }},
      {"lse overlaps input outs[2]", [](Call* c) { c->lse_view.data = const_cast<void*>(c->outs[2].data); }},
      {"lse overlaps input lses[0]",  // lses[0] with other strides: not the same view
       [](Call* c) {
         c->lse_view.data = const_cast<void*>(c->lses[0].data);
         c->lse_view.strides[1] = kL * kB;
         c->lse_view.strides[0] = kL;
       }},
      {"exec.parallel_for_threads = -1", [](Call* c) { c->exec.parallel_for_threads = -1; }},
      {"max_target = 'AVX9000'", [](Call* c) { c->exec.max_target = "AVX9000"; }},
  };
}

TEST(MergeErrorsTest, EveryCheckNamesTheArgumentAndWritesNothing) {
  for (const ErrorCase& e : ErrorCases()) {
    SCOPED_TRACE(e.needle);
    Call c;
    e.mutate(&c);
    const std::vector<Tensor> inputs = c.o;
    const std::vector<std::vector<float>> input_lses = c.lse_bytes;
    const Status s = c.Run();
    EXPECT_EQ(s.code, StatusCode::kInvalidArgument);
    EXPECT_NE(s.message.find(e.needle), std::string::npos) << s.message;
    Call fresh;
    EXPECT_EQ(c.out.bytes, fresh.out.bytes) << "out written";
    EXPECT_EQ(c.lse_out, fresh.lse_out) << "lse written";
    for (int i = 0; i < kParts; ++i) {
      EXPECT_EQ(c.o[i].bytes, inputs[i].bytes) << "outs[" << i << "] written";
      EXPECT_EQ(c.lse_bytes[i], input_lses[i]) << "lses[" << i << "] written";
    }
  }
}

// The absent LSE (null data, all extents 0) is valid; out alone is written.
TEST(MergeErrorsTest, NoLseIsValid) {
  Call c;
  c.lse_view = {};
  ASSERT_TRUE(c.Run().ok());
  Call fresh;
  EXPECT_NE(c.out.bytes, fresh.out.bytes);
}

// ------------------------------------------------------------------ C API

// The C call of a Call, with the same views.
struct CCall {
  std::vector<simdattn_tensor> outs, lses;
  simdattn_tensor out, lse;
  simdattn_exec exec;

  explicit CCall(const Call& c) {
    for (int i = 0; i < kParts; ++i) outs.push_back(ToC(c.outs[i])), lses.push_back(ToC(c.lses[i]));
    out = ToC(c.out_view);
    lse = ToC(c.lse_view);
    simdattn_exec_init(&exec);
  }
  int Run(int64_t n = kParts, bool with_lse = true) {
    return simdattn_merge_states(outs.data(), lses.data(), n, &out, with_lse ? &lse : nullptr,
                                 &exec);
  }
};

TEST(MergeCApiTest, SameBitsAsTheCppApi) {
  for (const std::string& target : TestTargets()) {
    SCOPED_TRACE(target);
    Call cpp, c;
    cpp.exec.max_target = target.c_str();
    ASSERT_TRUE(cpp.Run().ok());
    CCall call(c);
    call.exec.max_target = target.c_str();
    ASSERT_EQ(call.Run(), SIMDATTN_OK) << simdattn_last_error();
    EXPECT_STREQ(simdattn_last_error(), "");
    EXPECT_EQ(c.out.bytes, cpp.out.bytes);
    EXPECT_EQ(c.lse_out, cpp.lse_out);
  }
  Call c;
  CCall call(c);
  ASSERT_EQ(call.Run(kParts, /*with_lse=*/false), SIMDATTN_OK) << simdattn_last_error();
  EXPECT_EQ(c.lse_out, Call().lse_out) << "lse written though NULL";
}

TEST(MergeCApiTest, ErrorsNameTheArgument) {
  Call c;
  CCall call(c);
  EXPECT_EQ(simdattn_merge_states(nullptr, call.lses.data(), 3, &call.out, nullptr, nullptr),
            SIMDATTN_INVALID_ARGUMENT);
  EXPECT_STREQ(simdattn_last_error(), "outs is NULL with num_parts = 3");
  EXPECT_EQ(simdattn_merge_states(call.outs.data(), nullptr, 3, &call.out, nullptr, nullptr),
            SIMDATTN_INVALID_ARGUMENT);
  EXPECT_STREQ(simdattn_last_error(), "lses is NULL with num_parts = 3");
  EXPECT_EQ(simdattn_merge_states(call.outs.data(), call.lses.data(), 3, nullptr, nullptr,
                                  nullptr),
            SIMDATTN_INVALID_ARGUMENT);
  EXPECT_STREQ(simdattn_last_error(), "out is NULL");
  EXPECT_EQ(call.Run(0), SIMDATTN_INVALID_ARGUMENT);
  EXPECT_STREQ(simdattn_last_error(), "num_parts = 0: must be >= 1");
  call.lses[2].shape[3] = 2;
  EXPECT_EQ(call.Run(), SIMDATTN_INVALID_ARGUMENT);
  EXPECT_STREQ(simdattn_last_error(), "lses[2].shape[3] = 2: must be 1");
  call.lses[2].shape[3] = 1;
  call.lse.dtype = 99;
  EXPECT_EQ(call.Run(), SIMDATTN_INVALID_ARGUMENT);
  EXPECT_STREQ(simdattn_last_error(), "lse.dtype = unknown: must be f32");
  call.lse.dtype = SIMDATTN_F32;
  call.exec.struct_size = 8;
  EXPECT_EQ(call.Run(), SIMDATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(simdattn_last_error()).find("simdattn_exec->struct_size = 8"),
            std::string::npos);
  EXPECT_EQ(c.out.bytes, Call().out.bytes) << "out written";
  EXPECT_EQ(c.lse_out, Call().lse_out) << "lse written";
}

// More parts than the C shim converts on its stack: the same bits as the
// C++ call.
TEST(MergeCApiTest, ManyParts) {
  constexpr int kMany = 40;
  std::vector<Tensor> o;
  std::vector<std::vector<float>> l;
  std::mt19937 rng(9);
  std::vector<TensorView> outs, lses;
  for (int i = 0; i < kMany; ++i) {
    o.emplace_back(DType::kF32, 1, 2, 3, 4);
    o.back().FillUniform(&rng, -1.0f, 1.0f);
    l.emplace_back(6, 0.1f * static_cast<float>(i % 7));
  }
  std::vector<simdattn_tensor> couts, clses;
  for (int i = 0; i < kMany; ++i) {
    outs.push_back(o[i].View());
    lses.push_back(MakeBHSD(l[i].data(), DType::kF32, 1, 2, 3, 1));
    couts.push_back(ToC(outs.back()));
    clses.push_back(ToC(lses.back()));
  }
  Tensor a(DType::kF32, 1, 2, 3, 4), b(DType::kF32, 1, 2, 3, 4);
  ASSERT_TRUE(MergeStates(outs.data(), lses.data(), kMany, a.MutableView(), {}).ok());
  const simdattn_tensor cb = ToC(b.MutableView());
  ASSERT_EQ(simdattn_merge_states(couts.data(), clses.data(), kMany, &cb, nullptr, nullptr),
            SIMDATTN_OK)
      << simdattn_last_error();
  EXPECT_EQ(a.bytes, b.bytes);
}

}  // namespace
}  // namespace test
}  // namespace simdattn
