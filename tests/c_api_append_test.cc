// The C API's append (simdattn.h, section "append"): the view helpers equal
// the C++ ones, simdattn_append_kv writes the C++ call's bytes, and the
// checks only the C structs allow (NULL tensors, struct_size) name the
// field while the library's errors reach simdattn_last_error().

#include <cstdint>
#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "simdattn/serving.h"
#include "simdattn/simdattn.h"
#include "tests/append_util.h"
#include "tests/test_util.h"

namespace simdattn {
namespace test {
namespace {

void ExpectSameView(const simdattn_tensor& c, const TensorView& v) {
  EXPECT_EQ(c.data, v.data);
  EXPECT_EQ(c.dtype, static_cast<int32_t>(v.dtype));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(c.shape[i], v.shape[i]) << i;
    EXPECT_EQ(c.strides[i], v.strides[i]) << i;
  }
}

TEST(CApiAppendTest, ViewHelpersEqualTheCppOnes) {
  float buf[4];
  ExpectSameView(simdattn_token_major(buf, SIMDATTN_BF16, 5, 3, 16),
                 MakeTokenMajor(static_cast<const void*>(buf), DType::kBF16, 5, 3, 16));
  ExpectSameView(simdattn_paged_nhd(buf, SIMDATTN_F16, 7, 16, 2, 64),
                 MakePagedNHD(static_cast<const void*>(buf), DType::kF16, 7, 16, 2, 64));
  ExpectSameView(simdattn_paged_hnd(buf, SIMDATTN_F32, 7, 16, 2, 64),
                 MakePagedHND(static_cast<const void*>(buf), DType::kF32, 7, 16, 2, 64));
}

// The arguments of AppendData's case as C structs.
struct CAppend {
  simdattn_tensor k_new, v_new, k_cache, v_cache, q;
  simdattn_rotary rotary;
  simdattn_exec exec;
  const int32_t* slots;

  explicit CAppend(AppendData* d)
      : k_new(ToC(d->KNew())), v_new(ToC(d->VNew())), k_cache(ToC(d->KCache())),
        v_cache(ToC(d->VCache())), q(ToC(d->Q())), slots(d->slots.data()) {
    simdattn_rotary_init(&rotary);
    const RotaryEmbedding r = d->Rotary();
    rotary.positions = r.positions;
    rotary.cos = r.cos;
    rotary.sin = r.sin;
    rotary.max_position = r.max_position;
    rotary.rotary_dim = r.rotary_dim;
    rotary.interleaved = r.interleaved;
    simdattn_exec_init(&exec);
  }
  int Run() const {
    return simdattn_append_kv(&k_new, &v_new, &k_cache, &v_cache, slots, &rotary, &q, &exec);
  }
};

TEST(CApiAppendTest, WritesTheCppCallsBytes) {
  for (bool interleaved : {false, true}) {
    AppendCase c;
    c.rotate = c.with_q = true;
    c.interleaved = interleaved;
    c.rotary_dim = 8;
    c.nhd = !interleaved;
    c.kc_dtype = DType::kBF16, c.vc_dtype = DType::kF16, c.q_dtype = DType::kBF16;
    c.exact_values = false;
    const AppendData before(c);
    AppendData cpp = before, capi = before;
    ASSERT_TRUE(cpp.Run().ok());
    ASSERT_EQ(CAppend(&capi).Run(), SIMDATTN_OK) << simdattn_last_error();
    EXPECT_STREQ(simdattn_last_error(), "");
    EXPECT_EQ(capi.k_cache.bytes, cpp.k_cache.bytes);
    EXPECT_EQ(capi.v_cache.bytes, cpp.v_cache.bytes);
    EXPECT_EQ(capi.q.bytes, cpp.q.bytes);
  }
}

TEST(CApiAppendTest, NullRotaryQAndExecMeanNone) {
  AppendCase c;
  const AppendData before(c);
  AppendData cpp = before, capi = before;
  ASSERT_TRUE(cpp.Run().ok());
  const CAppend a(&capi);
  ASSERT_EQ(simdattn_append_kv(&a.k_new, &a.v_new, &a.k_cache, &a.v_cache, a.slots, nullptr,
                               nullptr, nullptr),
            SIMDATTN_OK)
      << simdattn_last_error();
  EXPECT_EQ(capi.k_cache.bytes, cpp.k_cache.bytes);
  EXPECT_EQ(capi.v_cache.bytes, cpp.v_cache.bytes);
}

TEST(CApiAppendTest, ErrorsNameTheFieldAndWriteNothing) {
  AppendCase c;
  c.rotate = c.with_q = true;
  AppendData data(c);
  const AppendData before = data;
  CAppend a(&data);
  auto expect_error = [&](int status, const char* needle) {
    EXPECT_EQ(status, SIMDATTN_INVALID_ARGUMENT);
    EXPECT_NE(std::string(simdattn_last_error()).find(needle), std::string::npos)
        << simdattn_last_error();
    EXPECT_EQ(data.k_cache.bytes, before.k_cache.bytes);
    EXPECT_EQ(data.q.bytes, before.q.bytes);
  };
  expect_error(simdattn_append_kv(nullptr, &a.v_new, &a.k_cache, &a.v_cache, a.slots,
                                  &a.rotary, &a.q, &a.exec),
               "k_new is NULL");
  expect_error(simdattn_append_kv(&a.k_new, &a.v_new, &a.k_cache, nullptr, a.slots,
                                  &a.rotary, &a.q, &a.exec),
               "v_cache is NULL");
  a.rotary.struct_size = 8;
  expect_error(a.Run(), "simdattn_rotary->struct_size = 8");
  a.rotary.struct_size = sizeof(simdattn_rotary);
  a.exec.struct_size = 4;
  expect_error(a.Run(), "simdattn_exec->struct_size = 4");
  a.exec.struct_size = sizeof(simdattn_exec);
  data.slots[0] = data.slots[1] = 3;
  expect_error(a.Run(), "slot_mapping[0] and slot_mapping[1] are both 3");
}

TEST(CApiAppendTest, RotaryInitMeansNoRotation) {
  simdattn_rotary r;
  std::memset(&r, 0xFF, sizeof(r));
  simdattn_rotary_init(&r);
  EXPECT_EQ(r.struct_size, sizeof(simdattn_rotary));
  EXPECT_EQ(r.positions, nullptr);
  EXPECT_EQ(r.cos, nullptr);
  EXPECT_EQ(r.sin, nullptr);
  EXPECT_EQ(r.max_position, 0);
  EXPECT_EQ(r.rotary_dim, 0);
  EXPECT_EQ(r.interleaved, 0);
  simdattn_rotary_init(nullptr);  // does nothing
}

}  // namespace
}  // namespace test
}  // namespace simdattn
