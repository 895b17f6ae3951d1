// The C API (simdattn.h): every option reaches the C++ API unchanged (the
// same bits on every target), the checks only the C structs allow (struct
// sizes, enum values, lengths of the option arrays) name the field, errors
// are per thread and write nothing, and the info, version, pool, host
// parallel-for and target caps work as documented.

#include "simdattn/simdattn.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/attention_harness.h"

namespace simdattn {
namespace test {
namespace {

// A call through the C API: the case's inputs, options given in C.
struct CCall {
  simdattn_tensor q, k, v, o, lse;
  simdattn_options options;
  simdattn_exec exec;
  simdattn_run_info info;

  CCall(const Inputs& in, Outputs* out) {
    q = ToC(in.q.View());
    k = ToC(in.k.View());
    v = ToC(in.v.View());
    o = ToC(out->o.MutableView());
    lse = ToC(MakeBHSD(out->lse.data(), DType::kF32, in.q.shape[0], in.q.shape[1],
                       in.q.shape[2], 1));
    simdattn_options_init(&options);
    simdattn_exec_init(&exec);
    info.struct_size = sizeof(info);
  }
  int Run() { return simdattn_attention(&q, &k, &v, &o, &options, &lse, &exec, &info); }
};

// Fresh outputs for case c, as RunFast makes them.
Outputs FreshOutputs(const Case& c) {
  Outputs out;
  out.o = Tensor(c.o_dtype, c.batch, c.q_heads, c.q_len, c.dv, c.layout, c.pad, c.offset);
  out.o.FillBytes(0xA5);
  out.lse.assign(static_cast<size_t>(c.batch * c.q_heads * c.q_len), 12345.0f);
  return out;
}

TEST(CApiTest, EveryOptionGivesTheCppApisBitsOnEveryTarget) {
  Case c;
  c.batch = 2, c.q_heads = 4, c.kv_heads = 2, c.q_len = 37, c.kv_len = 80;
  c.dk = 24, c.dv = 16;
  c.layout = Layout::kBSHD;
  c.kv_dtype = DType::kF16;
  const Inputs in = MakeInputs(c, 6100);
  Tensor mask(DType::kBool, 1, 1, c.q_len, c.kv_len);
  for (int64_t i = 0; i < c.q_len; ++i)
    for (int64_t j = 0; j < c.kv_len; ++j) mask.Set(0, 0, i, j, (i + j) % 5 != 0);
  const float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
  const float sinks[4] = {0.0f, 1.0f, -1.0f, 2.0f};
  const int64_t lens64[2] = {80, 51};
  const int32_t lens32[2] = {80, 51};
  for (int variant = 0; variant < 4; ++variant) {
    SCOPED_TRACE(variant);
    Case cc = c;
    AttentionOptions& o = cc.options;
    o.alignment = variant % 2 ? Alignment::kBottomRight : Alignment::kTopLeft;
    o.causal = variant != 1;
    if (variant == 0) o.scale = 0.3f, o.softcap = 4.0f, o.alibi_slopes = slopes;
    if (variant == 1) o.window_left = 9, o.window_right = 3, o.sinks = sinks;
    if (variant == 2) o.mask = mask.View(), o.kv_lengths = lens64;
    if (variant == 3) o.kv_lengths = lens64, o.dropout_p = 0.2f, o.dropout_seed = 77;
    for (const std::string& target : TestTargets()) {
      SCOPED_TRACE(target);
      const Outputs cpp = RunFast(cc, in, target);
      ASSERT_TRUE(cpp.status.ok()) << cpp.status.message;
      Outputs out = FreshOutputs(cc);
      CCall call(in, &out);
      call.exec.max_target = target.c_str();
      simdattn_options& co = call.options;
      co.alignment = variant % 2 ? SIMDATTN_ALIGN_BOTTOM_RIGHT : SIMDATTN_ALIGN_TOP_LEFT;
      co.causal = o.causal;
      co.has_scale = o.scale.has_value();
      co.scale = o.scale.value_or(0.0f);
      co.softcap = o.softcap;
      co.window_left = o.window_left;
      co.window_right = o.window_right;
      co.dropout_p = o.dropout_p;
      co.dropout_seed = o.dropout_seed;
      if (o.alibi_slopes) co.alibi_slopes = slopes, co.num_alibi_slopes = 4;
      if (o.sinks) co.sinks = sinks, co.num_sinks = 4;
      if (variant == 2) co.mask = ToC(mask.View());
      if (o.kv_lengths) {
        co.kv_lengths = variant == 2 ? static_cast<const void*>(lens64) : lens32;
        co.kv_lengths_dtype = variant == 2 ? SIMDATTN_I64 : SIMDATTN_I32;
        co.num_kv_lengths = 2;
      }
      ASSERT_EQ(call.Run(), SIMDATTN_OK) << simdattn_last_error();
      EXPECT_STREQ(simdattn_last_error(), "");
      EXPECT_EQ(out.o.bytes, cpp.o.bytes);
      EXPECT_EQ(out.lse, cpp.lse);
      EXPECT_STREQ(call.info.target, cpp.info.target);
      EXPECT_STREQ(call.info.path, cpp.info.path);
      EXPECT_EQ(call.info.num_tasks, cpp.info.num_tasks);
    }
  }
}

// A small valid call (B2 Hq4 Hkv2 Lq5 Lk7 D8) for the error tests.
struct Small {
  Case c;
  Inputs in;
  Outputs out;
  Small() {
    c.batch = 2, c.q_heads = 4, c.kv_heads = 2, c.q_len = 5, c.kv_len = 7;
    in = MakeInputs(c, 6200);
    out = FreshOutputs(c);
  }
  bool Untouched() const {
    for (uint8_t b : out.o.bytes) if (b != 0xA5) return false;
    for (float x : out.lse) if (x != 12345.0f) return false;
    return true;
  }
};

// Each broken call fails with SIMDATTN_INVALID_ARGUMENT, a message holding
// `needle`, and nothing written.
template <class Break>
void ExpectInvalid(const char* needle, const Break& brk) {
  SCOPED_TRACE(needle);
  Small s;
  CCall call(s.in, &s.out);
  brk(&call);
  EXPECT_EQ(call.Run(), SIMDATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(simdattn_last_error()).find(needle), std::string::npos)
      << simdattn_last_error();
  EXPECT_TRUE(s.Untouched());
}

TEST(CApiTest, CFieldsAreCheckedAndNamed) {
  const float four[4] = {1, 2, 3, 4};
  const int32_t lens[3] = {1, 2, 3};
  ExpectInvalid("simdattn_options->struct_size = 8", [](CCall* c) { c->options.struct_size = 8; });
  ExpectInvalid("simdattn_exec->struct_size = 0", [](CCall* c) { c->exec.struct_size = 0; });
  ExpectInvalid("info->struct_size = 4", [](CCall* c) { c->info.struct_size = 4; });
  ExpectInvalid("options->alignment = 7", [](CCall* c) { c->options.alignment = 7; });
  ExpectInvalid("options->num_alibi_slopes = 3 but Hq = 4", [&](CCall* c) {
    c->options.alibi_slopes = four;
    c->options.num_alibi_slopes = 3;
  });
  ExpectInvalid("options->sinks is NULL with options->num_sinks = 4",
                [](CCall* c) { c->options.num_sinks = 4; });
  ExpectInvalid("options->num_kv_lengths = 3 but B = 2", [&](CCall* c) {
    c->options.kv_lengths = lens;
    c->options.kv_lengths_dtype = SIMDATTN_I32;
    c->options.num_kv_lengths = 3;
  });
  ExpectInvalid("options->kv_lengths_dtype = 0", [&](CCall* c) {
    c->options.kv_lengths = lens;
    c->options.kv_lengths_dtype = SIMDATTN_F32;
    c->options.num_kv_lengths = 2;
  });
  ExpectInvalid("alignment is unset, but causal", [](CCall* c) { c->options.causal = 1; });
  ExpectInvalid("k.shape [2, 3, 7, 8] and v.shape [2, 2, 7, 8] must agree",
                [](CCall* c) { c->k.shape[1] = 3; });
  ExpectInvalid("max_target = 'AVX9000'", [](CCall* c) { c->exec.max_target = "AVX9000"; });
  ExpectInvalid("exec.workspace_bytes = 10", [](CCall* c) {
    static char small[16];
    c->exec.workspace = small;
    c->exec.workspace_bytes = 10;
  });
  // A newer header's larger struct is accepted while its new fields are 0.
  struct Newer {
    simdattn_options options;
    int64_t added;
  } newer;
  simdattn_options_init(&newer.options);
  newer.options.struct_size = sizeof(newer);
  newer.added = 0;
  Small s;
  CCall call(s.in, &s.out);
  EXPECT_EQ(simdattn_attention(&call.q, &call.k, &call.v, &call.o, &newer.options,
                               nullptr, nullptr, nullptr),
            SIMDATTN_OK);
  newer.added = 1;
  EXPECT_EQ(simdattn_attention(&call.q, &call.k, &call.v, &call.o, &newer.options,
                               nullptr, nullptr, nullptr),
            SIMDATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(simdattn_last_error()).find("cannot honor"), std::string::npos);
  EXPECT_EQ(simdattn_attention(nullptr, &call.k, &call.v, &call.o, nullptr, nullptr,
                               nullptr, nullptr),
            SIMDATTN_INVALID_ARGUMENT);
  EXPECT_STREQ(simdattn_last_error(), "q is NULL");
  EXPECT_EQ(simdattn_attention(&call.q, &call.k, &call.v, nullptr, nullptr, nullptr,
                               nullptr, nullptr),
            SIMDATTN_INVALID_ARGUMENT);
  EXPECT_STREQ(simdattn_last_error(), "o is NULL");
}

TEST(CApiTest, LastErrorIsPerThread) {
  Small s;
  CCall call(s.in, &s.out);
  call.options.alignment = 9;
  ASSERT_EQ(call.Run(), SIMDATTN_INVALID_ARGUMENT);
  const std::string mine = simdattn_last_error();
  std::string other = "unset";
  std::thread t([&] {
    Small s2;
    CCall ok(s2.in, &s2.out);
    other = ok.Run() == SIMDATTN_OK ? simdattn_last_error() : "failed";
  });
  t.join();
  EXPECT_EQ(other, "");
  EXPECT_EQ(std::string(simdattn_last_error()), mine);
  EXPECT_EQ(call.Run(), SIMDATTN_INVALID_ARGUMENT);
}

TEST(CApiTest, StatusNamesVersionAndInfo) {
  EXPECT_STREQ(simdattn_status_name(SIMDATTN_OK), "ok");
  EXPECT_STREQ(simdattn_status_name(SIMDATTN_INVALID_ARGUMENT), "invalid argument");
  EXPECT_STREQ(simdattn_status_name(SIMDATTN_UNIMPLEMENTED), "unimplemented");
  EXPECT_STREQ(simdattn_status_name(SIMDATTN_OUT_OF_MEMORY), "out of memory");
  EXPECT_STREQ(simdattn_status_name(SIMDATTN_INTERNAL), "internal");
  EXPECT_STREQ(simdattn_status_name(99), "unknown");
  EXPECT_EQ(static_cast<int>(StatusCode::kOutOfMemory), SIMDATTN_OUT_OF_MEMORY);
  EXPECT_EQ(static_cast<int>(StatusCode::kInternal), SIMDATTN_INTERNAL);
  // The library's version is the header's and the build's (CMake reads it
  // from the header; SOVERSION is the ABI version).
  EXPECT_STREQ(simdattn_version(), SIMDATTN_CMAKE_VERSION);
  EXPECT_EQ(simdattn_abi_version(), SIMDATTN_ABI_VERSION);
  EXPECT_EQ(SIMDATTN_CMAKE_ABI_VERSION, SIMDATTN_ABI_VERSION);

  simdattn_info info;
  std::memset(&info, 0, sizeof(info));
  EXPECT_EQ(simdattn_get_info(&info), SIMDATTN_INVALID_ARGUMENT);
  info.struct_size = sizeof(info);
  ASSERT_EQ(simdattn_get_info(&info), SIMDATTN_OK);
  std::vector<std::string> compiled(info.compiled, info.compiled + info.num_compiled);
  std::vector<std::string> available(info.available, info.available + info.num_available);
  EXPECT_EQ(compiled, CompiledTargets());
  EXPECT_EQ(available, AvailableTargets());
  EXPECT_EQ(std::string(info.selected), ExpectedDefaultTarget());
  EXPECT_EQ(info.max_target_error, nullptr);

  const std::string last = available.back();
  ASSERT_EQ(simdattn_set_max_target(last.c_str()), SIMDATTN_OK);
  ASSERT_EQ(simdattn_get_info(&info), SIMDATTN_OK);
  EXPECT_EQ(std::string(info.selected), last);
  EXPECT_EQ(simdattn_set_max_target("NOPE"), SIMDATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(simdattn_last_error()).find("NOPE"), std::string::npos);
  ASSERT_EQ(simdattn_set_max_target(nullptr), SIMDATTN_OK);

  // A SIMDATTN_MAX_TARGET naming no target: said in the info, which still
  // names the target that calls run.
  ASSERT_EQ(setenv("SIMDATTN_MAX_TARGET", "C_API_NO_SUCH_TARGET", 1), 0);
  ASSERT_EQ(simdattn_get_info(&info), SIMDATTN_OK);
  unsetenv("SIMDATTN_MAX_TARGET");
  ASSERT_NE(info.max_target_error, nullptr);
  EXPECT_NE(std::string(info.max_target_error).find("C_API_NO_SUCH_TARGET"),
            std::string::npos);
  EXPECT_EQ(std::string(info.selected), ExpectedDefaultTarget());
}

// A host parallel-for written in C style, counting its rounds.
void CountingParallelFor(void* user, int64_t n, simdattn_task_fn task, void* arg) {
  ++*static_cast<int*>(user);
  for (int64_t i = n - 1; i >= 0; --i) task(arg, i);
}

TEST(CApiTest, PoolsHostParallelForAndWorkspace) {
  Case c;
  c.q_heads = 8, c.kv_heads = 2, c.q_len = 1, c.kv_len = 2000, c.dk = 32, c.dv = 32;
  const Inputs in = MakeInputs(c, 6300);
  const Outputs cpp = RunFast(c, in, TestTargets().front());
  ASSERT_TRUE(cpp.status.ok());
  simdattn_pool* pool = simdattn_pool_create(3);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(simdattn_pool_num_threads(pool), 3);
  int rounds = 0;
  const std::string target = TestTargets().front();  // outlives the calls
  for (int executor = 0; executor < 2; ++executor) {
    Outputs out = FreshOutputs(c);
    CCall call(in, &out);
    call.exec.max_target = target.c_str();
    if (executor == 0) call.exec.pool = pool;
    if (executor == 1) {
      call.exec.parallel_for = &CountingParallelFor;
      call.exec.parallel_for_user = &rounds;
      call.exec.parallel_for_threads = 1;
    }
    size_t bytes = 0;
    ASSERT_EQ(simdattn_workspace_size(&call.q, &call.k, &call.v, &call.options,
                                      &call.exec, &bytes),
              SIMDATTN_OK);
    std::vector<char> workspace(bytes);
    call.exec.workspace = workspace.data();
    call.exec.workspace_bytes = bytes;
    ASSERT_EQ(call.Run(), SIMDATTN_OK) << simdattn_last_error();
    EXPECT_EQ(out.o.bytes, cpp.o.bytes);
    EXPECT_EQ(out.lse, cpp.lse);
  }
  EXPECT_GE(rounds, 2);  // split decode: attention, then combine
  simdattn_pool_destroy(pool);
  simdattn_release_thread_buffers();
  size_t bytes = 0;
  EXPECT_EQ(simdattn_workspace_size(nullptr, nullptr, nullptr, nullptr, nullptr, &bytes),
            SIMDATTN_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace test
}  // namespace simdattn
