// AppendKv against the double-precision reference of append_util: every
// dtype pairing rounded to nearest even (Inf, NaN and ties included), both
// rotary conventions with rotary_dim = Dk and < Dk, q rotated in place,
// NHD and HND pages of 8, 16 and 32 rows, skipped tokens, and the same
// bytes for any thread count.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "simdattn/serving.h"
#include "tests/append_util.h"

namespace simdattn {
namespace test {
namespace {

constexpr DType kTypes[3] = {DType::kF32, DType::kF16, DType::kBF16};

TEST(AppendKvTest, CopiesEveryDtypePairingRoundedToNearestEven) {
  for (DType in : kTypes) {
    for (DType cache : kTypes) {
      for (bool nhd : {true, false}) {
        AppendCase c;
        c.k_dtype = in, c.kc_dtype = cache;
        c.v_dtype = cache, c.vc_dtype = in;  // V converts the other way
        c.nhd = nhd;
        c.exact_values = false;  // uniform f32 values: real rounding
        SCOPED_TRACE(::testing::Message() << DTypeName(in) << " -> " << DTypeName(cache)
                                          << (nhd ? " NHD" : " HND"));
        const AppendData before(c);
        AppendData after = before;
        const Status s = after.Run();
        ASSERT_TRUE(s.ok()) << s.message;
        ExpectAppended(before, after);
      }
    }
  }
}

// Written bits for inputs that stress the conversion: ties, the f16
// overflow threshold, subnormals, Inf, NaN and signed zero.
TEST(AppendKvTest, ConvertsSpecialValuesBitExactly) {
  const float kSpecial[16] = {
      1.0f + 0x1p-8f,           // bf16 tie: rounds down to even
      1.0f + 3 * 0x1p-8f,       // bf16 tie: rounds up to even
      1.0f + 0x1p-11f,          // f16 tie
      65504.0f, 65519.0f, 65520.0f,  // f16 max, below and at the Inf threshold
      0x1p-24f, 0x1p-25f, 3 * 0x1p-26f,  // f16 subnormals and ties to 0 / 2^-24
      1e-40f,                   // f32 subnormal
      std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
      std::numeric_limits<float>::quiet_NaN(), -0.0f, 3.0e38f, -1.5f};
  for (DType cache : kTypes) {
    AppendCase c;
    c.tokens = 1, c.kv_heads = 1, c.q_heads = 1, c.dk = 16, c.dv = 16;
    c.num_blocks = 1, c.block_size = 8;
    c.kc_dtype = c.vc_dtype = cache;
    c.exact_values = false;
    SCOPED_TRACE(DTypeName(cache));
    AppendData before(c);
    before.slots[0] = 5;
    for (int i = 0; i < 16; ++i) {
      std::memcpy(&before.k_new.bytes[i * 4], &kSpecial[i], 4);
      std::memcpy(&before.v_new.bytes[i * 4], &kSpecial[15 - i], 4);
    }
    AppendData after = before;
    const Status s = after.Run();
    ASSERT_TRUE(s.ok()) << s.message;
    c.exact_values = true;  // compare bit for bit
    before.c = after.c = c;
    ExpectAppended(before, after);
  }
}

TEST(AppendKvTest, RotatesKAndQBothConventionsBitExactly) {
  for (bool interleaved : {false, true}) {
    for (int64_t rotary_dim : {0, 8, 2}) {  // Dk = 16, half of it, one pair
      for (DType t : kTypes) {
        AppendCase c;
        c.rotate = c.with_q = true;
        c.interleaved = interleaved;
        c.rotary_dim = rotary_dim;
        c.k_dtype = DType::kF32, c.kc_dtype = t, c.q_dtype = t;
        c.v_dtype = t, c.vc_dtype = DType::kF32;
        c.row_pad = 3;  // rows of a fused QKV buffer
        SCOPED_TRACE(::testing::Message() << (interleaved ? "GPT-J" : "NeoX")
                                          << " rotary_dim " << rotary_dim << " "
                                          << DTypeName(t));
        const AppendData before(c);
        AppendData after = before;
        const Status s = after.Run();
        ASSERT_TRUE(s.ok()) << s.message;
        ExpectAppended(before, after);
      }
    }
  }
}

TEST(AppendKvTest, RotatesWithARealTableWithinRounding) {
  for (bool interleaved : {false, true}) {
    for (DType t : kTypes) {
      AppendCase c;
      c.rotate = c.with_q = true;
      c.interleaved = interleaved;
      c.dk = 64, c.dv = 32, c.rotary_dim = 32;
      c.k_dtype = t, c.kc_dtype = t, c.q_dtype = t, c.v_dtype = t, c.vc_dtype = t;
      c.max_position = 4096;
      c.exact_values = false;
      c.seed = 7;
      SCOPED_TRACE(::testing::Message() << (interleaved ? "GPT-J " : "NeoX ") << DTypeName(t));
      const AppendData before(c);
      AppendData after = before;
      const Status s = after.Run();
      ASSERT_TRUE(s.ok()) << s.message;
      ExpectAppended(before, after);
    }
  }
}

TEST(AppendKvTest, EveryBlockSizeAndLayout) {
  for (int64_t block_size : {8, 16, 32}) {
    for (bool nhd : {true, false}) {
      AppendCase c;
      c.block_size = block_size, c.num_blocks = 3, c.tokens = 3 * block_size - 5;
      c.nhd = nhd;
      c.rotate = true;
      c.kc_dtype = DType::kBF16, c.vc_dtype = DType::kF16;
      SCOPED_TRACE(::testing::Message() << "block_size " << block_size << (nhd ? " NHD" : " HND"));
      const AppendData before(c);
      AppendData after = before;
      const Status s = after.Run();
      ASSERT_TRUE(s.ok()) << s.message;
      ExpectAppended(before, after);
    }
  }
}

TEST(AppendKvTest, NegativeSlotsWriteNothingButQIsRotated) {
  AppendCase c;
  c.rotate = c.with_q = true;
  AppendData before(c);
  for (int32_t& slot : before.slots) slot = -1;
  before.slots[2] = 17;
  AppendData after = before;
  const Status s = after.Run();
  ASSERT_TRUE(s.ok()) << s.message;
  ExpectAppended(before, after);  // every slot but 17 keeps its bytes
  EXPECT_NE(std::memcmp(after.q.data(), before.q.data(), before.q.bytes.size()), 0);
}

TEST(AppendKvTest, NoTokensIsANoOp) {
  AppendCase c;
  c.tokens = 0;
  c.rotate = c.with_q = true;
  AppendData before(c);
  AppendData after = before;
  const Status s = AppendKv(after.KNew(), after.VNew(), after.KCache(), after.VCache(),
                            nullptr, after.Rotary(), after.Q());
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(after.k_cache.bytes, before.k_cache.bytes);
  EXPECT_EQ(after.v_cache.bytes, before.v_cache.bytes);
}

// q, k and v as views of one fused [tokens, Hq + 2 Hkv, D] buffer, as an
// engine's QKV projection leaves them: their byte ranges overlap but their
// elements do not, so q is rotated in place next to the K it reads.
TEST(AppendKvTest, FusedQkvBufferWithQRotatedInPlace) {
  AppendCase c;
  c.rotate = c.with_q = true;
  c.dk = c.dv = 16;
  c.exact_values = false;
  const AppendData before(c);
  AppendData separate = before;
  ASSERT_TRUE(separate.Run().ok());
  const int64_t heads = c.q_heads + 2 * c.kv_heads, row = heads * c.dk;
  std::vector<float> fused(static_cast<size_t>(c.tokens * row));
  auto at = [&](int64_t t, int64_t h) { return &fused[static_cast<size_t>(t * row + h * c.dk)]; };
  for (int64_t t = 0; t < c.tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const Storage& src = h < c.q_heads ? before.q : h < c.q_heads + c.kv_heads ? before.k_new
                                                                                : before.v_new;
      const int64_t sh = h < c.q_heads ? h : (h - c.q_heads) % c.kv_heads;
      const int64_t sheads = h < c.q_heads ? c.q_heads : c.kv_heads;
      for (int64_t d = 0; d < c.dk; ++d) {
        at(t, h)[d] = static_cast<float>(src.Get(before.RowIndex(t, sh, d, sheads, c.dk)));
      }
    }
  }
  AppendData out = before;
  auto view = [&](int64_t first_head, int64_t n) {
    MutableTensorView v = MakeTokenMajor(static_cast<void*>(at(0, first_head)), DType::kF32,
                                         c.tokens, n, c.dk);
    v.strides[2] = row;
    return v;
  };
  const Status s = AppendKv(view(c.q_heads, c.kv_heads), view(c.q_heads + c.kv_heads, c.kv_heads),
                            out.KCache(), out.VCache(), out.slots.data(), out.Rotary(),
                            view(0, c.q_heads));
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(out.k_cache.bytes, separate.k_cache.bytes);
  EXPECT_EQ(out.v_cache.bytes, separate.v_cache.bytes);
  for (int64_t t = 0; t < c.tokens; ++t) {
    for (int64_t h = 0; h < c.q_heads; ++h) {
      for (int64_t d = 0; d < c.dk; ++d) {
        ASSERT_EQ(at(t, h)[d], separate.q.Get(before.RowIndex(t, h, d, c.q_heads, c.dk)))
            << t << " " << h << " " << d;
      }
    }
  }
}

// A host parallel-for that runs tasks in reverse order on the calling thread.
void Reversed(void*, int64_t n, void (*task)(void*, int64_t), void* arg) {
  for (int64_t i = n - 1; i >= 0; --i) task(arg, i);
}

TEST(AppendKvTest, AnyThreadCountWritesTheSameBytes) {
  AppendCase c;
  c.tokens = 3000, c.num_blocks = 400, c.block_size = 8;
  c.kv_heads = 2, c.q_heads = 4, c.dk = 64, c.dv = 64;
  c.rotate = c.with_q = true;
  c.kc_dtype = DType::kBF16, c.vc_dtype = DType::kBF16, c.q_dtype = DType::kF16;
  c.exact_values = false;
  const AppendData before(c);
  AppendData one = before, three = before, host = before;
  ThreadPool pool1(1), pool3(3);
  ExecutionOptions e1, e3, eh;
  e1.pool = &pool1;
  e3.pool = &pool3;
  eh.parallel_for = Reversed;
  eh.parallel_for_threads = 5;
  ASSERT_TRUE(one.Run(e1).ok());
  ASSERT_TRUE(three.Run(e3).ok());
  ASSERT_TRUE(host.Run(eh).ok());
  ExpectAppended(before, one);
  EXPECT_EQ(one.k_cache.bytes, three.k_cache.bytes);
  EXPECT_EQ(one.v_cache.bytes, three.v_cache.bytes);
  EXPECT_EQ(one.q.bytes, three.q.bytes);
  EXPECT_EQ(one.k_cache.bytes, host.k_cache.bytes);
  EXPECT_EQ(one.q.bytes, host.q.bytes);
}

}  // namespace
}  // namespace test
}  // namespace simdattn
