// AppendKv's bad input: every error is kInvalidArgument, its message names
// the argument and the value, and nothing is written (caches and q keep
// their sentinel bytes), duplicate slots included, among thousands of
// tokens too.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "simdattn/serving.h"
#include "tests/append_util.h"

namespace simdattn {
namespace test {
namespace {

// The arguments of one call, to be spoiled one at a time.
struct Call {
  TensorView k_new, v_new;
  MutableTensorView k_cache, v_cache, q;
  const int32_t* slots = nullptr;
  RotaryEmbedding rotary;
  ExecutionOptions exec;

  explicit Call(AppendData* d)
      : k_new(d->KNew()), v_new(d->VNew()), k_cache(d->KCache()),
        v_cache(d->VCache()), q(d->Q()), slots(d->slots.data()),
        rotary(d->Rotary()) {}
  Status Run() const {
    return AppendKv(k_new, v_new, k_cache, v_cache, slots, rotary, q, exec);
  }
};

struct BadCase {
  const char* what;
  std::function<void(Call*, AppendData*)> spoil;
  const char* message;  // a substring of the expected message
};

AppendCase BaseCase() {
  AppendCase c;  // 6 tokens, Hkv 2, Hq 4, Dk 16, Dv 8, 4 pages of 8 rows
  c.rotate = c.with_q = true;
  c.kc_dtype = DType::kBF16;
  return c;
}

// Five tokens written, the last one skipped.
const std::vector<int32_t> kSlots = {3, 9, 17, 30, 22, -1};

void ExpectRejected(const BadCase& bad) {
  SCOPED_TRACE(bad.what);
  AppendData data(BaseCase());
  data.slots = kSlots;
  Call call(&data);
  bad.spoil(&call, &data);
  const AppendData before = data;
  const Status s = call.Run();
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument) << s.message;
  EXPECT_NE(s.message.find(bad.message), std::string::npos)
      << "message: " << s.message << "\nexpected to contain: " << bad.message;
  EXPECT_EQ(data.k_cache.bytes, before.k_cache.bytes) << "k_cache written";
  EXPECT_EQ(data.v_cache.bytes, before.v_cache.bytes) << "v_cache written";
  EXPECT_EQ(data.q.bytes, before.q.bytes) << "q written";
}

TEST(AppendKvValidateTest, BaseCaseIsValid) {
  AppendData data(BaseCase());
  data.slots = kSlots;
  const Status s = Call(&data).Run();
  EXPECT_TRUE(s.ok()) << s.message;
}

TEST(AppendKvValidateTest, SlotsMustBeInRangeAndDistinct) {
  const BadCase cases[] = {
      {"duplicate", [](Call*, AppendData* d) { d->slots[1] = d->slots[4] = 9; },
       "slot_mapping[1] and slot_mapping[4] are both 9: two tokens may not map to one slot"},
      {"past the cache", [](Call*, AppendData* d) { d->slots[2] = 32; },
       "slot_mapping[2] = 32: must be < num_blocks * block_size = 32"},
      {"null", [](Call* c, AppendData*) { c->slots = nullptr; },
       "slot_mapping is null with 6 tokens"},
  };
  for (const BadCase& c : cases) ExpectRejected(c);
}

TEST(AppendKvValidateTest, DuplicateAmongThousandsOfTokens) {
  AppendCase c;
  c.tokens = 3000, c.num_blocks = 500, c.block_size = 8;
  c.kv_heads = c.q_heads = 1, c.dk = c.dv = 8;
  AppendData data(c);
  for (int64_t t = 0; t < c.tokens; ++t) data.slots[t] = static_cast<int32_t>(3999 - t);
  data.slots[17] = -1;
  data.slots[2950] = data.slots[18];
  const AppendData before = data;
  const Status s = data.Run();
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument);
  EXPECT_NE(s.message.find("slot_mapping[18] and slot_mapping[2950] are both 3981"),
            std::string::npos)
      << s.message;
  EXPECT_EQ(data.k_cache.bytes, before.k_cache.bytes);
  EXPECT_EQ(data.v_cache.bytes, before.v_cache.bytes);
}

TEST(AppendKvValidateTest, ExtentsMustAgree) {
  const BadCase cases[] = {
      {"block size", [](Call* c, AppendData* d) {
         c->k_cache = MakePagedNHD(d->k_cache.data(), DType::kBF16, 2, 12, 2, 16);
         c->v_cache = MakePagedNHD(d->v_cache.data(), DType::kF32, 2, 12, 2, 8);
       }, "k_cache.shape[2] (block_size) = 12: must be a multiple of 8"},
      {"cache heads", [](Call* c, AppendData*) { c->k_cache.shape[1] = 1; },
       "k_cache.shape[1] (Hkv) = 1 but k_new.shape[1] (Hkv) = 2"},
      {"cache Dk", [](Call* c, AppendData*) { c->k_cache.shape[3] = 8; },
       "k_cache.shape[3] (Dk) = 8 but k_new.shape[3] (Dk) = 16"},
      {"cache Dv", [](Call* c, AppendData*) { c->v_cache.shape[3] = 4; },
       "v_cache.shape[3] (Dv) = 4 but v_new.shape[3] (Dv) = 8"},
      {"cache blocks", [](Call* c, AppendData*) { c->v_cache.shape[0] = 3; },
       "v_cache.shape[0] (num_blocks) = 3 but k_cache.shape[0] (num_blocks) = 4"},
      {"v tokens", [](Call* c, AppendData*) { c->v_new.shape[2] = 5; },
       "v_new.shape[2] (tokens) = 5 but k_new.shape[2] (tokens) = 6"},
      {"k batch", [](Call* c, AppendData*) { c->k_new.shape[0] = 2; },
       "k_new.shape[0] = 2: must be 1"},
      {"zero heads", [](Call* c, AppendData*) { c->k_new.shape[1] = 0; },
       "k_new.shape[1] (Hkv) = 0: must be positive"},
      {"q heads", [](Call* c, AppendData*) { c->q.shape[1] = 3; },
       "q.shape[1] (Hq) = 3 is not a multiple of Hkv = 2"},
      {"q tokens", [](Call* c, AppendData*) { c->q.shape[2] = 5; },
       "q.shape[2] (tokens) = 5 but k_new.shape[2] (tokens) = 6"},
      {"q Dk", [](Call* c, AppendData*) { c->q.shape[3] = 8; },
       "q.shape[3] (Dk) = 8 but k_new.shape[3] (Dk) = 16"},
  };
  for (const BadCase& c : cases) ExpectRejected(c);
}

TEST(AppendKvValidateTest, ViewsMustBeUsable) {
  const BadCase cases[] = {
      {"null k_new", [](Call* c, AppendData*) { c->k_new.data = nullptr; },
       "k_new.data is null with shape [1, 2, 6, 16]"},
      {"last stride", [](Call* c, AppendData*) { c->v_new.strides[3] = 2; },
       "v_new.strides[3] = 2: the last dimension must be contiguous"},
      {"dtype", [](Call* c, AppendData*) { c->k_cache.dtype = DType::kBool; },
       "k_cache.dtype = bool: must be f32, f16, bf16, int8, q8_0, fp8_e4m3 or fp8_e5m2"},
      {"overflow", [](Call* c, AppendData*) { c->k_cache.strides[0] = int64_t{1} << 62; },
       "k_cache: offsets of shape [4, 2, 8, 16] with its strides overflow int64"},
      {"cache rows share memory", [](Call* c, AppendData*) { c->v_cache.strides[1] = 0; },
       "v_cache.strides make distinct elements of v_cache share memory"},
      {"q rows share memory", [](Call* c, AppendData*) { c->q.strides[2] = 0; },
       "q.strides make distinct elements of q share memory"},
      {"threads", [](Call* c, AppendData*) { c->exec.parallel_for_threads = -1; },
       "exec.parallel_for_threads = -1"},
  };
  for (const BadCase& c : cases) ExpectRejected(c);
}

TEST(AppendKvValidateTest, RotaryMustBeComplete) {
  const BadCase cases[] = {
      {"position too large", [](Call*, AppendData* d) { d->positions[3] = 40; },
       "rotary.positions[3] = 40: must be in [0, rotary.max_position = 40)"},
      {"negative position", [](Call*, AppendData* d) { d->positions[0] = -1; },
       "rotary.positions[0] = -1"},
      {"cos", [](Call* c, AppendData*) { c->rotary.cos = nullptr; },
       "rotary.cos is null but rotary.positions is set"},
      {"sin", [](Call* c, AppendData*) { c->rotary.sin = nullptr; },
       "rotary.sin is null but rotary.positions is set"},
      {"max_position", [](Call* c, AppendData*) { c->rotary.max_position = 0; },
       "rotary.max_position = 0: must be positive"},
      {"odd rotary_dim", [](Call* c, AppendData*) { c->rotary.rotary_dim = 7; },
       "rotary.rotary_dim = 7: must be even and in [2, Dk = 16]"},
      {"rotary_dim above Dk", [](Call* c, AppendData*) { c->rotary.rotary_dim = 18; },
       "rotary.rotary_dim = 18"},
      {"negative rotary_dim", [](Call* c, AppendData*) { c->rotary.rotary_dim = -2; },
       "rotary.rotary_dim = -2"},
      {"q without rotation", [](Call* c, AppendData*) { c->rotary.positions = nullptr; },
       "q.data is set but rotary.positions is null"},
  };
  for (const BadCase& c : cases) ExpectRejected(c);
}

TEST(AppendKvValidateTest, OutputsMustNotAlias) {
  const BadCase cases[] = {
      {"caches", [](Call* c, AppendData*) { c->v_cache.data = c->k_cache.data; },
       "k_cache overlaps v_cache"},
      {"cache and input", [](Call* c, AppendData*) { c->k_new.data = c->k_cache.data; },
       "k_cache overlaps input k_new"},
      {"slots in the cache", [](Call* c, AppendData*) {
         c->slots = static_cast<const int32_t*>(c->v_cache.data);  // sentinels: < 0
       }, "v_cache overlaps input slot_mapping"},
      {"q and cos", [](Call* c, AppendData*) {
         c->rotary.cos = static_cast<const float*>(c->q.data);
       }, "q overlaps input rotary.cos"},
      {"q and v_new", [](Call* c, AppendData* d) {
         c->v_new = MakeTokenMajor(static_cast<const void*>(d->q.data()), DType::kF32,
                                   6, 2, 8);
       }, "q overlaps input v_new"},
  };
  for (const BadCase& c : cases) ExpectRejected(c);
}

// Views of one buffer that interleave without sharing an element pass (see
// FusedQkvBufferWithQRotatedInPlace); shifted by one element they share
// one and are rejected.
TEST(AppendKvValidateTest, InterleavedViewsMustNotShareAnElement) {
  std::vector<float> fused(6 * 8 * 16);  // [tokens, Hq + 2 Hkv, Dk]
  auto view = [&](int64_t first, int64_t heads) {
    MutableTensorView v = MakeTokenMajor(static_cast<void*>(&fused[first]), DType::kF32, 6,
                                         heads, 16);
    v.strides[2] = 8 * 16;
    return v;
  };
  const BadCase bad[] = {
      {"k one element into q", [&](Call* c, AppendData*) {
         c->q = view(0, 4);
         c->k_new = view(4 * 16 - 1, 2);
       }, "q overlaps input k_new"},
      {"v_new over q's rows", [&](Call* c, AppendData*) {
         c->q = view(0, 4);
         c->v_new = MakeTokenMajor(static_cast<const void*>(&fused[128 - 8]), DType::kF32, 6,
                                   2, 8);
       }, "q overlaps input v_new"},
  };
  for (const BadCase& c : bad) ExpectRejected(c);
  AppendData data(BaseCase());
  data.slots = kSlots;
  Call call(&data);
  call.q = view(0, 4);
  call.k_new = view(4 * 16, 2);
  const Status s = call.Run();
  EXPECT_TRUE(s.ok()) << s.message;
}

}  // namespace
}  // namespace test
}  // namespace simdattn
