// Serving entries: one decode step of a batch of sequences whose KV caches
// live in pages (PagedAttention, pages of 16 tokens stored NHD as vLLM's or
// HND), against the same step with the caches dense and head-major (one
// Attention() call over a padded batch, or one call per sequence as an
// engine without paged attention makes):
//
//   serving/{paged_nhd,paged_hnd,dense,per_sequence}/qf32kvbf16/<batch>/threads:<n>
//   paired/qf32kvbf16/<batch>/dense_vs_{paged_nhd,paged_hnd}/threads:<n>
//
// <batch>: S<sequences>_Lk<keys each> (uniform), or mixed_Lk<long>+<n>x<short>
// (one long sequence among short ones). Counter bytes: the K/V bytes the
// step reads (bf16, valid keys only), as a rate; paired entries: ratio =
// time(paged) / time(dense), call by call.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/decode.h"
#include "bench/entries.h"
#include "lib/dtype.h"
#include "simdattn/serving.h"

namespace simdattn {
namespace bench {
namespace {

constexpr int64_t kHq = 32, kHkv = 8, kDim = 128, kBlockSize = 16;

// One batch of sequences, its pages shuffled over the cache, and the same
// keys in a dense [S, Hkv, Lk_max, D] cache (padding never read).
struct ServingBatch {
  std::vector<int64_t> lens;
  int64_t max_len = 0, max_blocks = 0;
  std::vector<int32_t> table, lens32;
  HugeVector<uint16_t> k_pages, v_pages, k_hnd, v_hnd, k_dense, v_dense;
  std::vector<float> q, o;
  double kv_bytes = 0;

  explicit ServingBatch(std::vector<int64_t> l);
};

ServingBatch::ServingBatch(std::vector<int64_t> l) : lens(std::move(l)) {
  const int64_t n = static_cast<int64_t>(lens.size());
  max_len = *std::max_element(lens.begin(), lens.end());
  max_blocks = (max_len + kBlockSize - 1) / kBlockSize;
  int64_t pages = 0;
  for (int64_t len : lens) pages += (len + kBlockSize - 1) / kBlockSize;
  std::vector<int32_t> order(static_cast<size_t>(pages));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(11);
  std::shuffle(order.begin(), order.end(), rng);
  table.assign(static_cast<size_t>(n * max_blocks), 0);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const size_t page = size_t(kBlockSize * kHkv * kDim);
  k_pages.resize(size_t(pages) * page);
  v_pages.resize(size_t(pages) * page);
  k_hnd.resize(size_t(pages) * page);
  v_hnd.resize(size_t(pages) * page);
  k_dense.assign(size_t(n * kHkv * max_len * kDim), 0);
  v_dense.assign(k_dense.size(), 0);
  size_t next = 0;
  for (int64_t s = 0; s < n; ++s) {
    lens32.push_back(static_cast<int32_t>(lens[s]));
    for (int64_t j = 0; j < lens[s]; ++j) {
      if (j % kBlockSize == 0) table[size_t(s * max_blocks + j / kBlockSize)] = order[next++];
      const size_t p = size_t(table[size_t(s * max_blocks + j / kBlockSize)]);
      for (int64_t h = 0; h < kHkv; ++h) {
        const size_t paged = p * page + size_t(((j % kBlockSize) * kHkv + h) * kDim);
        const size_t hnd = p * page + size_t((h * kBlockSize + j % kBlockSize) * kDim);
        const size_t dense = size_t(((s * kHkv + h) * max_len + j) * kDim);
        for (int64_t e = 0; e < kDim; ++e) {
          k_pages[paged + e] = k_hnd[hnd + e] = k_dense[dense + e] = F32ToBF16(dist(rng));
          v_pages[paged + e] = v_hnd[hnd + e] = v_dense[dense + e] = F32ToBF16(dist(rng));
        }
      }
    }
    kv_bytes += 2.0 * 2.0 * double(lens[s] * kHkv * kDim);
  }
  q.resize(size_t(n * kHq * kDim));
  for (float& x : q) x = dist(rng);
  o.assign(q.size(), 0.0f);
}

enum class Way { kPagedNhd, kPagedHnd, kDense, kPerSequence };
const char* const kWayNames[] = {"paged_nhd", "paged_hnd", "dense", "per_sequence"};

// One step of the batch the way `way` says; false when a call fails.
bool Step(ServingBatch& b, Way way, const ExecutionOptions& exec, Status* st) {
  const int64_t n = static_cast<int64_t>(b.lens.size());
  if (way == Way::kPagedNhd || way == Way::kPagedHnd) {
    PagedKvCache cache;
    const int64_t pages = int64_t(b.k_pages.size()) / (kBlockSize * kHkv * kDim);
    if (way == Way::kPagedNhd) {
      cache.k = MakePagedNHD(b.k_pages.data(), DType::kBF16, pages, kBlockSize, kHkv, kDim);
      cache.v = MakePagedNHD(b.v_pages.data(), DType::kBF16, pages, kBlockSize, kHkv, kDim);
    } else {
      cache.k = MakePagedHND(b.k_hnd.data(), DType::kBF16, pages, kBlockSize, kHkv, kDim);
      cache.v = MakePagedHND(b.v_hnd.data(), DType::kBF16, pages, kBlockSize, kHkv, kDim);
    }
    cache.block_table = b.table.data();
    cache.max_blocks_per_seq = b.max_blocks;
    cache.kv_lens = b.lens32.data();
    *st = PagedAttention(MakeTokenMajor(b.q.data(), DType::kF32, n, kHq, kDim), cache, n,
                         nullptr, MakeTokenMajor(b.o.data(), DType::kF32, n, kHq, kDim), {},
                         {}, exec);
    return st->ok();
  }
  if (way == Way::kDense) {
    AttentionOptions options;
    options.kv_lengths = b.lens.data();
    *st = Attention(MakeBSHD(b.q.data(), DType::kF32, n, kHq, 1, kDim),
                    MakeBHSD(b.k_dense.data(), DType::kBF16, n, kHkv, b.max_len, kDim),
                    MakeBHSD(b.v_dense.data(), DType::kBF16, n, kHkv, b.max_len, kDim),
                    MakeBSHD(b.o.data(), DType::kF32, n, kHq, 1, kDim), options, {}, exec);
    return st->ok();
  }
  const int64_t seq_kv = kHkv * b.max_len * kDim;
  for (int64_t s = 0; s < n; ++s) {
    *st = Attention(MakeBSHD(b.q.data() + s * kHq * kDim, DType::kF32, 1, kHq, 1, kDim),
                    MakeBHSD(b.k_dense.data() + s * seq_kv, DType::kBF16, 1, kHkv, b.lens[s],
                             kDim),
                    MakeBHSD(b.v_dense.data() + s * seq_kv, DType::kBF16, 1, kHkv, b.lens[s],
                             kDim),
                    MakeBSHD(b.o.data() + s * kHq * kDim, DType::kF32, 1, kHq, 1, kDim), {}, {},
                    exec);
    if (!st->ok()) return false;
  }
  return true;
}

// The batch of `name`, made on first use and kept for the run.
ServingBatch& CachedBatch(const std::string& name, const std::vector<int64_t>& lens) {
  static std::vector<std::pair<std::string, std::unique_ptr<ServingBatch>>> made;
  for (auto& m : made) {
    if (m.first == name) return *m.second;
  }
  made.emplace_back(name, std::make_unique<ServingBatch>(lens));
  return *made.back().second;
}

void BenchServing(benchmark::State& state, const std::string& batch,
                  const std::vector<int64_t>& lens, Way way, int threads) {
  ServingBatch& b = CachedBatch(batch, lens);
  ThreadPool pool(threads);
  ExecutionOptions exec;
  exec.pool = &pool;
  Status st;
  for (auto _ : state) {
    if (!Step(b, way, exec, &st)) {
      state.SkipWithError(st.message.c_str());
      return;
    }
  }
  state.counters["bytes"] =
      benchmark::Counter(b.kv_bytes * double(state.iterations()), benchmark::Counter::kIsRate);
}

// Paged (B) against dense (A), call by call.
constexpr double kPairSeconds = 3.0;
void PairServing(benchmark::State& state, const std::string& batch,
                 const std::vector<int64_t>& lens, Way paged, int threads) {
  ServingBatch& b = CachedBatch(batch, lens);
  ThreadPool pool(threads);
  ExecutionOptions exec;
  exec.pool = &pool;
  Status st;
  const auto call = [&](Way way) {
    if (Step(b, way, exec, &st)) return true;
    state.SkipWithError(st.message.c_str());
    return false;
  };
  TimePairs(state, [&] { return call(Way::kDense); }, [&] { return call(paged); });
}

struct ServingShape {
  std::string name;
  std::vector<int64_t> lens;
};

std::vector<ServingShape> ServingShapes() {
  std::vector<int64_t> mixed(16, 512);
  mixed[0] = 32768;
  return {{"S8_Lk4096", std::vector<int64_t>(8, 4096)}, {"mixed_Lk32768+15x512", mixed}};
}

}  // namespace

void RegisterServingEntries(const BenchConfig& config) {
  if (config.headline) return;
  for (const ServingShape& shape : ServingShapes()) {
    for (int threads : config.threads) {
      for (Way way : {Way::kPagedNhd, Way::kPagedHnd, Way::kDense, Way::kPerSequence}) {
        const std::string name = std::string("serving/") + kWayNames[int(way)] +
                                 "/qf32kvbf16/" + shape.name + ThreadsField(threads);
        Register(name, [shape, way, threads](benchmark::State& st) {
          BenchServing(st, shape.name, shape.lens, way, threads);
        });
      }
      for (Way way : {Way::kPagedNhd, Way::kPagedHnd}) {
        const std::string name = std::string("paired/qf32kvbf16/") + shape.name +
                                 "/dense_vs_" + kWayNames[int(way)] + ThreadsField(threads);
        Register(name, [shape, way, threads](benchmark::State& st) {
          PairServing(st, shape.name, shape.lens, way, threads);
        }, kPairSeconds, 1);
      }
    }
  }
}

}  // namespace bench
}  // namespace simdattn
