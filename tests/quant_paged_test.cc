// PagedAttention against quantized paged caches (int8 with its scale pages,
// q8_0, fp8, mixes) on every target: ragged batches of decode steps and
// prefill chunks, held to the reference of each sequence (its pages
// gathered into a dense quantized K/V).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/reference.h"
#include "simdattn/serving.h"
#include "tests/quant_util.h"
#include "tests/test_util.h"

namespace simdattn {
namespace test {
namespace {

struct PagedQuantCase {
  std::vector<int64_t> lq, lk;  // per sequence
  int64_t q_heads = 4, kv_heads = 2, dk = 64, dv = 32, block_size = 16;
  DType k_dtype = DType::kInt8, v_dtype = DType::kInt8;
  Layout layout = Layout::kBSHD;  // NHD pages; kBHSD: HND
};

struct PagedQuantInputs : PageTable {
  Tensor q;
  KvTensor k, v;  // [num_blocks, Hkv, block_size, D]
};

PagedQuantInputs MakeInputs(const PagedQuantCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  PagedQuantInputs in;
  // 2 spare pages.
  static_cast<PageTable&>(in) = PageTable(c.lq, c.lk, c.block_size, 0, 2, -3, &rng);
  const int64_t num_blocks = in.num_blocks;
  in.q = Tensor(DType::kF32, 1, c.q_heads, in.total_q, c.dk, Layout::kBSHD);
  in.q.FillUniform(&rng, -1.0f, 1.0f);
  Tensor k(DType::kF32, num_blocks, c.kv_heads, c.block_size, c.dk);
  Tensor v(DType::kF32, num_blocks, c.kv_heads, c.block_size, c.dv);
  k.FillUniform(&rng, -1.0f, 1.0f);
  v.FillUniform(&rng, -1.0f, 1.0f);
  in.k = StoreKv(k, c.k_dtype, c.layout, 1.0f / 448.0f);
  in.v = StoreKv(v, c.v_dtype, c.layout, 1.0f / 448.0f);
  return in;
}

// Sequence s's rows of a paged K or V, dense [1, Hkv, lk, D] in its format.
KvTensor Gather(const PagedQuantCase& c, const PagedQuantInputs& in,
                const KvTensor& pages, int64_t s) {
  const int64_t lk = c.lk[s];
  Tensor zeros(DType::kF32, 1, c.kv_heads, lk, pages.shape[3]);
  KvTensor t = StoreKv(zeros, pages.dtype, Layout::kBHSD, pages.scale);
  for (int64_t h = 0; h < c.kv_heads; ++h) {
    for (int64_t j = 0; j < lk; ++j) {
      const int64_t page = in.table[s * in.max_blocks + j / c.block_size];
      const int64_t r = j % c.block_size;
      if (!t.quantized()) {
        for (int64_t e = 0; e < pages.shape[3]; ++e) {
          t.wide.Set(0, h, j, e, pages.wide.Get(page, h, r, e));
        }
        continue;
      }
      std::memcpy(t.Row(0, h, j), pages.Row(page, h, r),
                  static_cast<size_t>(t.RowBytes()));
      if (t.dtype == DType::kInt8) {
        t.scales[h * t.scale_strides[1] + j] =
            pages.scales[page * pages.scale_strides[0] + h * pages.scale_strides[1] + r];
      }
    }
  }
  return t;
}

void CheckPagedQuant(const PagedQuantCase& c, uint32_t seed) {
  SCOPED_TRACE(std::string("K ") + DTypeName(c.k_dtype) + " V " + DTypeName(c.v_dtype));
  const PagedQuantInputs in = MakeInputs(c, seed);
  const PagedKvCache cache = in.Cache(in.k.View(), in.v.View());
  AttentionOptions options;
  options.causal = true;
  SetScales(in.k, true, &options);
  SetScales(in.v, false, &options);
  const int64_t n = static_cast<int64_t>(c.lq.size());
  for (const std::string& target : TestTargets()) {
    SCOPED_TRACE(target);
    Tensor o(DType::kF32, 1, c.q_heads, in.total_q, c.dv, Layout::kBSHD);
    ExecutionOptions exec;
    exec.max_target = target.c_str();
    RunInfo info;
    const Status st = PagedAttention(in.q.View(), cache, n, in.cu.data(),
                                     o.MutableView(), options, {}, exec, &info);
    ASSERT_TRUE(st.ok()) << st.message;
    RecordTargetRun(info.target);
    for (int64_t s = 0; s < n; ++s) {
      if (c.lq[s] == 0 || c.lk[s] == 0) continue;
      const KvTensor k = Gather(c, in, in.k, s), v = Gather(c, in, in.v, s);
      TensorView q = in.q.View();
      q.data = static_cast<const float*>(q.data) + in.cu[s] * q.strides[2];
      q.shape[2] = c.lq[s];
      AttentionOptions ref = options;
      ref.alignment = Alignment::kBottomRight;
      SetScales(k, true, &ref);
      SetScales(v, false, &ref);
      std::vector<double> o_ref;
      ASSERT_TRUE(ReferenceAttention(q, k.View(), v.View(), ref, &o_ref, nullptr).ok());
      const double max_v = std::max(1.0, v.MaxAbs());
      double err = 0.0;
      for (int64_t h = 0; h < c.q_heads; ++h) {
        for (int64_t i = 0; i < c.lq[s]; ++i) {
          for (int64_t e = 0; e < c.dv; ++e) {
            const double d = std::fabs(o.Get(0, h, in.cu[s] + i, e) -
                                       o_ref[(h * c.lq[s] + i) * c.dv + e]);
            if (!(d <= err)) err = std::isnan(d) ? INFINITY : d;
          }
        }
      }
      EXPECT_LE(err / max_v, 2e-5) << "sequence " << s;
    }
  }
}

TEST(QuantPagedTest, EveryFormatAndMixes) {
  const DType kinds[][2] = {
      {DType::kInt8, DType::kInt8},       {DType::kQ8_0, DType::kQ8_0},
      {DType::kFp8E4M3, DType::kFp8E4M3}, {DType::kFp8E5M2, DType::kFp8E5M2},
      {DType::kInt8, DType::kF16},        {DType::kQ8_0, DType::kFp8E4M3},
      {DType::kBF16, DType::kInt8}};
  uint32_t seed = 7800;
  for (const auto& kv : kinds) {
    for (Layout layout : {Layout::kBSHD, Layout::kBHSD}) {
      // Quick mode (qemu): one page layout per format, alternating.
      if (QuickMode() && (layout == Layout::kBHSD) == (seed % 2 == 0)) {
        ++seed;
        continue;
      }
      PagedQuantCase c;
      c.lq = {1, 1, 5, 40, 0, 1};
      c.lk = {300, 17, 120, 200, 50, 0};
      c.k_dtype = kv[0];
      c.v_dtype = kv[1];
      c.layout = layout;
      CheckPagedQuant(c, seed++);
    }
  }
}

}  // namespace
}  // namespace test
}  // namespace simdattn
