// PagedAttention: ragged batches of sequences against a paged KV cache, on
// every target, held to the double-precision reference of each sequence
// (its pages gathered into a dense K/V), with every option; bit-identical
// for any thread count; bad input rejected with nothing written.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/reference.h"
#include "simdattn/serving.h"
#include "simdattn/simdattn.h"
#include "tests/test_util.h"

namespace simdattn {
namespace test {
namespace {

struct Seq {
  int64_t lq, lk;
};

struct PagedCase {
  std::vector<Seq> seqs;
  int64_t q_heads = 4, kv_heads = 2, dk = 32, dv = 32;
  int64_t block_size = 16;
  bool nhd = true;  // [num_blocks, block_size, Hkv, D]; else HND
  DType q_dtype = DType::kF32, kv_dtype = DType::kF32, o_dtype = DType::kF32;
  AttentionOptions options;
  bool mask = false;  // a bool mask [1, 1, total_q, Lk_mask] of random keys
  bool one_query_each = false;  // cu_seqlens_q = nullptr
};

// The inputs of a case: pages handed out to sequences in a random order
// (with spare pages no sequence uses).
struct PagedInputs : PageTable {
  Tensor q, k, v, mask;
};

PagedInputs MakePaged(const PagedCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> lq, lk;
  int64_t longest = 1;
  for (const Seq& s : c.seqs) {
    lq.push_back(s.lq);
    lk.push_back(s.lk);
    longest = std::max(longest, s.lk);
  }
  PagedInputs in;
  // One unused column, 3 spare pages.
  static_cast<PageTable&>(in) = PageTable(lq, lk, c.block_size, 1, 3, -7, &rng);
  const int64_t num_blocks = in.num_blocks;
  const Layout kv_layout = c.nhd ? Layout::kBSHD : Layout::kBHSD;
  in.q = Tensor(c.q_dtype, 1, c.q_heads, in.total_q, c.dk, Layout::kBSHD);
  in.k = Tensor(c.kv_dtype, num_blocks, c.kv_heads, c.block_size, c.dk, kv_layout);
  in.v = Tensor(c.kv_dtype, num_blocks, c.kv_heads, c.block_size, c.dv, kv_layout);
  in.q.FillUniform(&rng, -1.0f, 1.0f);
  in.k.FillUniform(&rng, -1.0f, 1.0f);
  in.v.FillUniform(&rng, -1.0f, 1.0f);
  if (c.mask) {
    in.mask = Tensor(DType::kBool, 1, 1, in.total_q, longest + 5);
    std::bernoulli_distribution attend(0.7);
    for (int64_t i = 0; i < in.total_q; ++i) {
      for (int64_t j = 0; j < longest + 5; ++j) {
        in.mask.Set(0, 0, i, j, attend(rng) ? 1.0f : 0.0f);
      }
    }
  }
  return in;
}

PagedKvCache CacheOf(const PagedInputs& in) { return in.Cache(in.k.View(), in.v.View()); }

AttentionOptions OptionsOf(const PagedCase& c, const PagedInputs& in) {
  AttentionOptions o = c.options;
  if (c.mask) o.mask = in.mask.View();
  return o;
}

struct PagedOutputs {
  Tensor o;
  std::vector<float> lse;  // [Hq, total_q]
  RunInfo info;
  Status status;
};

PagedOutputs RunPaged(const PagedCase& c, PagedInputs* in,
                      const ExecutionOptions& exec) {
  PagedOutputs out;
  out.o = Tensor(c.o_dtype, 1, c.q_heads, in->total_q, c.dv, Layout::kBSHD);
  out.o.FillBytes(0xA5);
  out.lse.assign(static_cast<size_t>(c.q_heads * in->total_q), 1234.5f);
  const MutableTensorView lse =
      MakeBHSD(out.lse.data(), DType::kF32, 1, c.q_heads, in->total_q, 1);
  out.status = PagedAttention(in->q.View(), CacheOf(*in),
                              static_cast<int64_t>(c.seqs.size()),
                              c.one_query_each ? nullptr : in->cu.data(),
                              out.o.MutableView(), OptionsOf(c, *in), lse, exec,
                              &out.info);
  return out;
}

// Sequence s's K or V pages gathered into a dense [1, Hkv, Lk, D] tensor.
Tensor Gather(const PagedCase& c, const PagedInputs& in, const Tensor& pages,
              int64_t s, int64_t d) {
  const int64_t lk = c.seqs[s].lk;
  Tensor t(c.kv_dtype, 1, c.kv_heads, lk, d);
  for (int64_t h = 0; h < c.kv_heads; ++h) {
    for (int64_t j = 0; j < lk; ++j) {
      const int64_t page = in.table[s * in.max_blocks + j / c.block_size];
      for (int64_t e = 0; e < d; ++e) {
        t.Set(0, h, j, e, pages.Get(page, h, j % c.block_size, e));
      }
    }
  }
  return t;
}

// A view whose batch extent is s + 1 with stride 0: every batch entry is the
// same data, so that entry s of the reference has the dropout mask of b = s.
TensorView Repeated(TensorView v, int64_t s) {
  v.shape[0] = s + 1;
  v.strides[0] = 0;
  return v;
}

// Checks the call's O and LSE rows of every sequence against the reference.
void CheckAgainstReference(const PagedCase& c, const PagedInputs& in,
                           const PagedOutputs& out) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const double max_v = std::max(1.0, MaxAbs(in.v));
  auto any = [&](DType t) { return c.q_dtype == t || c.kv_dtype == t || c.o_dtype == t; };
  const double bound = OutputBound(any(DType::kBF16)  ? DType::kBF16
                                   : any(DType::kF16) ? DType::kF16
                                                      : DType::kF32);
  const double lse_bound = c.q_dtype == DType::kF32 && c.kv_dtype == DType::kF32
                               ? kLseBound : kLseBound16;
  for (size_t s = 0; s < c.seqs.size(); ++s) {
    SCOPED_TRACE("sequence " + std::to_string(s));
    const int64_t lq = c.seqs[s].lq, lk = c.seqs[s].lk, row0 = in.cu[s];
    if (lq == 0) continue;
    std::vector<double> o_ref, lse_ref;
    if (lk > 0) {
      const Tensor k = Gather(c, in, in.k, static_cast<int64_t>(s), c.dk);
      const Tensor v = Gather(c, in, in.v, static_cast<int64_t>(s), c.dv);
      TensorView q = in.q.View();
      q.data = static_cast<const char*>(q.data) + row0 * q.strides[2] * DTypeSize(q.dtype);
      q.shape[2] = lq;
      AttentionOptions o = OptionsOf(c, in);
      if (!o.alignment.has_value()) o.alignment = Alignment::kBottomRight;
      if (c.mask) {
        o.mask.data = static_cast<const char*>(o.mask.data) + row0 * o.mask.strides[2];
        o.mask.shape[2] = lq;
        o.mask.shape[3] = lk;
      }
      const int64_t b = static_cast<int64_t>(s);
      ASSERT_TRUE(ReferenceAttention(Repeated(q, b), Repeated(k.View(), b),
                                     Repeated(v.View(), b), o, &o_ref, &lse_ref)
                      .ok());
    }
    const size_t base = s * static_cast<size_t>(c.q_heads * lq);
    for (int64_t h = 0; h < c.q_heads; ++h) {
      for (int64_t i = 0; i < lq; ++i) {
        const size_t r = base + static_cast<size_t>(h * lq + i);
        const float sink = c.options.sinks != nullptr ? c.options.sinks[h] : neg_inf;
        const double want_lse = lk > 0 ? lse_ref[r] : sink;
        const float got_lse = out.lse[h * in.total_q + row0 + i];
        if (std::isinf(want_lse)) {
          EXPECT_EQ(got_lse, want_lse) << "h " << h << " i " << i;
        } else {
          EXPECT_NEAR(got_lse, want_lse, lse_bound) << "h " << h << " i " << i;
        }
        for (int64_t e = 0; e < c.dv; ++e) {
          const double want = lk > 0 ? o_ref[r * c.dv + e] : 0.0;
          const double got = out.o.Get(0, h, row0 + i, e);
          ASSERT_LE(std::fabs(got - want) / max_v, bound)
              << "h " << h << " i " << i << " e " << e << ": " << got << " vs " << want;
        }
      }
    }
  }
}

// Runs the case on every target under test against the reference; returns
// the kernel paths that ran (RunInfo::path of each target).
std::set<std::string> CheckPaged(const PagedCase& c, uint32_t seed) {
  PagedInputs in = MakePaged(c, seed);
  std::set<std::string> paths;
  for (const std::string& target : TestTargets()) {
    SCOPED_TRACE(target);
    ExecutionOptions exec;
    exec.max_target = target.c_str();
    const PagedOutputs out = RunPaged(c, &in, exec);
    EXPECT_TRUE(out.status.ok()) << out.status.message;
    if (!out.status.ok()) continue;
    EXPECT_EQ(out.info.target, target);
    RecordTargetRun(out.info.target);
    paths.insert(out.info.path);
    CheckAgainstReference(c, in, out);
  }
  return paths;
}

// Decode steps, speculative rows, a chunk of prefill, a sequence without
// queries and ones without keys, in one batch.
std::vector<Seq> MixedSeqs() {
  if (QuickMode()) return {{1, 300}, {1, 17}, {5, 120}, {20, 100}, {0, 50}, {1, 0}, {2, 1}};
  return {{1, 300}, {1, 17}, {5, 120}, {40, 200}, {0, 50}, {1, 0}, {3, 0}, {2, 1}};
}

TEST(PagedTest, MixedBatchEveryStorageType) {
  const DType types[][3] = {{DType::kF32, DType::kF32, DType::kF32},
                            {DType::kF32, DType::kBF16, DType::kF32},
                            {DType::kF32, DType::kF16, DType::kF16},
                            {DType::kBF16, DType::kBF16, DType::kBF16}};
  uint32_t seed = 100;
  for (const auto& t : types) {
    for (bool causal : {false, true}) {
      // Quick mode (qemu): f32 plain and bf16 causal.
      if (QuickMode() && (t[1] == DType::kF32) == causal) continue;
      if (QuickMode() && t[1] == DType::kF16) continue;
      PagedCase c;
      c.seqs = MixedSeqs();
      c.q_dtype = t[0];
      c.kv_dtype = t[1];
      c.o_dtype = t[2];
      c.options.causal = causal;
      c.nhd = seed % 2 == 0;
      c.block_size = seed % 3 == 0 ? 32 : 16;
      SCOPED_TRACE(std::string(DTypeName(t[0])) + "/" + DTypeName(t[1]) +
                   (causal ? " causal" : ""));
      CheckPaged(c, seed++);
    }
  }
}

// bf16 decode rows of 5 to 16 per KV head (GQA 8, speculative Lq 2 with
// GQA 4) read K and V from their pages on AVX3_AMX's tiles, 16 keys per
// page at least (pages of 16 and 32, both layouts, chunks of a long
// sequence); pages of 8 leave the keys to the decode path.
TEST(PagedTest, DecodeOnTheTilesReadsPages) {
  uint32_t seed = 230;
  for (int64_t block : {16, 32, 8}) {
    for (bool nhd : {true, false}) {
      // Quick mode (qemu, no tiles): pages of 16 (NHD) and 8 (HND) only.
      if (QuickMode() && (block == 32 || nhd != (block == 16))) {
        ++seed;
        continue;
      }
      PagedCase c;
      c.seqs = QuickMode() ? std::vector<Seq>{{1, 300}, {2, 200}, {1, 40}}
                           : std::vector<Seq>{{1, 1500}, {2, 700}, {1, 40}, {2, 90}};
      c.q_heads = 16;
      c.kv_heads = 2;
      c.dk = c.dv = 64;
      c.block_size = block;
      c.nhd = nhd;
      c.q_dtype = c.kv_dtype = c.o_dtype = DType::kBF16;
      c.options.causal = true;
      c.options.alignment = Alignment::kBottomRight;
      SCOPED_TRACE(testing::Message() << "pages of " << block << (nhd ? " NHD" : " HND"));
      CheckPaged(c, seed++);
    }
  }
}

// A long sequence among short ones is split into key chunks (combined
// through their LSE); the fused 16-bit decode loop reads page by page.
TEST(PagedTest, LongSequenceAmongShortOnes) {
  for (DType kv : {DType::kF32, DType::kBF16, DType::kF16}) {
    if (QuickMode() && kv != DType::kBF16) continue;  // qemu: the fused loop
    PagedCase c;
    c.seqs = {{1, 40}, {1, QuickMode() ? 1100 : 5000}, {1, 9}, {1, 700}};
    c.q_heads = 8;
    c.kv_heads = 2;
    c.dk = c.dv = 64;
    c.block_size = 8;
    c.kv_dtype = kv;
    c.one_query_each = true;
    SCOPED_TRACE(DTypeName(kv));
    const std::set<std::string> paths = CheckPaged(c, 200);
    if (kv == DType::kBF16) {
      EXPECT_TRUE(paths.count("fused decode") == 1 || paths.count("decode") == 1);
    }
  }
}

TEST(PagedTest, EveryOption) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  static const float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
  static const float sinks[4] = {0.5f, neg_inf, -1.0f, 2.0f};
  for (int option = 0; option < 8; ++option) {
    PagedCase c;
    c.seqs = MixedSeqs();
    c.kv_dtype = option % 2 == 0 ? DType::kF32 : DType::kF16;
    c.options.causal = option % 3 != 0;
    switch (option) {
      case 0: c.options.window_left = 20; c.options.window_right = 3; break;
      case 1: c.options.softcap = 2.0f; break;
      case 2: c.options.alibi_slopes = slopes; break;
      case 3: c.options.sinks = sinks; break;
      case 4: c.options.dropout_p = 0.25f; c.options.dropout_seed = 99; break;
      case 5: c.mask = true; break;
      case 6: c.options.alignment = Alignment::kTopLeft; break;
      default: c.options.scale = 0.3f; c.dv = 24; break;
    }
    SCOPED_TRACE("option " + std::to_string(option));
    CheckPaged(c, 300 + option);
  }
}

TEST(PagedTest, BitIdenticalForAnyThreadCount) {
  PagedCase c;
  c.seqs = {{1, QuickMode() ? 1100 : 3000}, {4, 900}, {33, 400}, {1, 64}};
  c.kv_dtype = DType::kBF16;
  c.options.causal = true;
  PagedInputs in = MakePaged(c, 400);
  std::vector<PagedOutputs> outs;
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    ExecutionOptions exec;
    exec.pool = &pool;
    outs.push_back(RunPaged(c, &in, exec));
    ASSERT_TRUE(outs.back().status.ok()) << outs.back().status.message;
  }
  for (size_t t = 1; t < outs.size(); ++t) {
    EXPECT_EQ(outs[t].o.bytes, outs[0].o.bytes) << "threads " << t + 1;
    EXPECT_EQ(0, std::memcmp(outs[t].lse.data(), outs[0].lse.data(),
                             outs[0].lse.size() * sizeof(float)));
  }
}

// Decode rows whose window starts off the grid of 4 keys, mid-page, on the
// fused 16-bit loop's paths (no other option) and the tiles'.
TEST(PagedTest, WindowStartsMidPage) {
  for (DType kv : {DType::kBF16, DType::kF16, DType::kF32}) {
    if (QuickMode() && kv == DType::kF16) continue;
    for (int64_t left : {5, 13, 70}) {
      if (QuickMode() && left == 13) continue;
      PagedCase c;
      c.seqs = {{1, 203}, {1, 98}, {1, QuickMode() ? 600 : 1500}, {1, 11}};
      c.q_heads = 8;
      c.kv_heads = 2;
      c.dk = c.dv = 64;
      c.block_size = 8;
      c.kv_dtype = kv;
      c.one_query_each = true;
      c.options.window_left = left;
      SCOPED_TRACE(std::string(DTypeName(kv)) + " window " + std::to_string(left));
      CheckPaged(c, 800 + static_cast<uint32_t>(left));
    }
  }
}

// Each bad argument: kInvalidArgument naming it, O and LSE untouched.
TEST(PagedTest, BadInputWritesNothing) {
  PagedCase c;
  c.seqs = {{1, 20}, {3, 40}};
  struct Bad {
    const char* name;  // expected in the message
    void (*spoil)(PagedInputs*, AttentionOptions*, ExecutionOptions*, int64_t*);
  };
  static int64_t lengths[2] = {20, 40};
  static char workspace[64];
  const Bad bads[] = {
      {"kv_lens[1]", [](PagedInputs* in, AttentionOptions*, ExecutionOptions*, int64_t*) {
         in->kv_lens[1] = static_cast<int32_t>(in->max_blocks * 16 + 1); }},
      {"kv_lens[0]", [](PagedInputs* in, AttentionOptions*, ExecutionOptions*, int64_t*) {
         in->kv_lens[0] = -1; }},
      {"block_table[1][0]", [](PagedInputs* in, AttentionOptions*, ExecutionOptions*, int64_t*) {
         in->table[in->max_blocks] = static_cast<int32_t>(in->k.shape[0]); }},
      {"cu_seqlens_q[num_seqs]", [](PagedInputs* in, AttentionOptions*, ExecutionOptions*, int64_t*) {
         in->cu[2] = 3; }},
      {"cu_seqlens_q[1]", [](PagedInputs* in, AttentionOptions*, ExecutionOptions*, int64_t*) {
         in->cu[1] = 5; }},
      {"num_seqs", [](PagedInputs*, AttentionOptions*, ExecutionOptions*, int64_t* n) {
         *n = 0; }},
      {"kv_lengths", [](PagedInputs*, AttentionOptions* o, ExecutionOptions*, int64_t*) {
         o->kv_lengths = lengths; }},
      {"workspace", [](PagedInputs*, AttentionOptions*, ExecutionOptions* e, int64_t*) {
         e->workspace = workspace; e->workspace_bytes = sizeof(workspace); }},
      {"softcap", [](PagedInputs*, AttentionOptions* o, ExecutionOptions*, int64_t*) {
         o->softcap = -1.0f; }},
      {"block_size", [](PagedInputs* in, AttentionOptions*, ExecutionOptions*, int64_t*) {
         in->k.shape[2] = in->v.shape[2] = 12; }},
  };
  for (const Bad& bad : bads) {
    SCOPED_TRACE(bad.name);
    PagedInputs in = MakePaged(c, 500);
    AttentionOptions options;
    ExecutionOptions exec;
    int64_t num_seqs = 2;
    bad.spoil(&in, &options, &exec, &num_seqs);
    Tensor o(DType::kF32, 1, 4, in.total_q, 32, Layout::kBSHD);
    o.FillBytes(0xA5);
    const auto before = o.bytes;
    std::vector<float> lse(static_cast<size_t>(4 * in.total_q), 7.0f);
    const Status s = PagedAttention(
        in.q.View(), CacheOf(in), num_seqs, in.cu.data(), o.MutableView(), options,
        MakeBHSD(lse.data(), DType::kF32, 1, 4, in.total_q, 1), exec);
    EXPECT_EQ(s.code, StatusCode::kInvalidArgument) << s.message;
    EXPECT_NE(s.message.find(bad.name), std::string::npos) << s.message;
    EXPECT_EQ(o.bytes, before);
    for (float x : lse) ASSERT_EQ(x, 7.0f);
  }
}

// O must not overlap the cache or the arrays the call reads.
TEST(PagedTest, OutputOverlappingAnInputIsRejected) {
  PagedCase c;
  c.seqs = {{1, 20}, {1, 40}};
  PagedInputs in = MakePaged(c, 600);
  MutableTensorView o = MakeTokenMajor(const_cast<void*>(in.k.View().data), DType::kF32,
                                       2, 4, 32);
  Status s = PagedAttention(in.q.View(), CacheOf(in), 2, nullptr, o);
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument);
  EXPECT_NE(s.message.find("overlaps input k"), std::string::npos) << s.message;
  std::vector<float> out(2 * 4 * 32 + 64);
  PagedKvCache cache = CacheOf(in);
  std::vector<int32_t> lens_in_out(2);
  cache.kv_lens = reinterpret_cast<const int32_t*>(out.data() + 8);
  std::memcpy(out.data() + 8, in.kv_lens.data(), 8);
  s = PagedAttention(in.q.View(), cache, 2, nullptr,
                     MakeTokenMajor(out.data(), DType::kF32, 2, 4, 32));
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument);
  EXPECT_NE(s.message.find("cache.kv_lens"), std::string::npos) << s.message;
}

// The C API gives the C++ call's bits, options included, and names a bad
// argument through simdattn_last_error() with nothing written.
TEST(PagedTest, CApiMatchesCpp) {
  static const float sinks[4] = {0.5f, 1.0f, -1.0f, 2.0f};
  PagedCase c;
  c.seqs = MixedSeqs();
  c.kv_dtype = DType::kBF16;
  c.options.causal = true;
  c.options.sinks = sinks;
  PagedInputs in = MakePaged(c, 700);
  const PagedOutputs want = RunPaged(c, &in, {});
  ASSERT_TRUE(want.status.ok()) << want.status.message;

  Tensor o(DType::kF32, 1, c.q_heads, in.total_q, c.dv, Layout::kBSHD);
  std::vector<float> lse(static_cast<size_t>(c.q_heads * in.total_q));
  const simdattn_tensor q = ToC(in.q.View());
  const simdattn_tensor co = ToC(o.MutableView());
  const simdattn_tensor clse =
      ToC(MakeBHSD(lse.data(), DType::kF32, 1, c.q_heads, in.total_q, 1));
  simdattn_paged_cache cache;
  simdattn_paged_cache_init(&cache);
  cache.k = ToC(in.k.View());
  cache.v = ToC(in.v.View());
  cache.block_table = in.table.data();
  cache.max_blocks_per_seq = in.max_blocks;
  cache.kv_lens = in.kv_lens.data();
  simdattn_options options;
  simdattn_options_init(&options);
  options.causal = 1;
  options.sinks = sinks;
  options.num_sinks = 4;
  simdattn_run_info info;
  info.struct_size = sizeof(info);
  const int64_t n = static_cast<int64_t>(c.seqs.size());
  ASSERT_EQ(simdattn_paged_attention(&q, &cache, n, in.cu.data(), &co, &options, &clse,
                                     nullptr, &info),
            SIMDATTN_OK)
      << simdattn_last_error();
  EXPECT_EQ(o.bytes, want.o.bytes);
  EXPECT_EQ(0, std::memcmp(lse.data(), want.lse.data(), lse.size() * sizeof(float)));
  EXPECT_STREQ(info.target, want.info.target);
  EXPECT_EQ(info.num_tasks, want.info.num_tasks);

  o.FillBytes(0x5A);
  const auto before = o.bytes;
  in.table[0] = 1 << 30;  // sequence 0's first page
  EXPECT_EQ(simdattn_paged_attention(&q, &cache, n, in.cu.data(), &co, &options, &clse,
                                     nullptr, nullptr),
            SIMDATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(simdattn_last_error()).find("block_table[0][0]"), std::string::npos)
      << simdattn_last_error();
  EXPECT_EQ(o.bytes, before);
  cache.struct_size = 8;
  EXPECT_EQ(simdattn_paged_attention(&q, &cache, n, in.cu.data(), &co, &options, &clse,
                                     nullptr, nullptr),
            SIMDATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(simdattn_last_error()).find("simdattn_paged_cache->struct_size"),
            std::string::npos)
      << simdattn_last_error();
}

}  // namespace
}  // namespace test
}  // namespace simdattn
