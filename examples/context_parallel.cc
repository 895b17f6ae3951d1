// Context parallelism with MPI: one long sequence whose KV cache is split
// evenly across the ranks. Each rank runs simdattn::Attention on its shard
// with the LSE, rank 0 gathers the partial results and merges them with
// simdattn::MergeStates, then checks the merge against one Attention call
// over the whole cache. Prints the errors and PASS or FAIL; exits 1 on
// failure (every rank, so mpirun fails too).
//
//   mpirun -n 2 ./simdattn_context_parallel
//
// The queries are the last Lq tokens of the sequence (a chunk of prefill,
// or Lq = 1 for decode), causal bottom-right: query i sees global key
// j <= i + Lk - Lq. Rank r holds keys [k0, k0 + S), S = Lk / ranks, and
// sees them with local indices j' = j - k0, so the same rule reads
// j' <= i + (Lk - Lq - k0): a sliding window with window_right = Lk - Lq -
// k0 and no left bound, top-left alignment (p(i) = i). That holds while
// the offset is >= 0, i.e. every shard starts at or before Lk - Lq: shards
// of at least Lq keys.

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

#include "simdattn/attention.h"
#include "simdattn/serving.h"

namespace {

constexpr int64_t kHq = 8, kHkv = 2, kLq = 64, kLk = 8192, kD = 128;

// Deterministic values in [-1, 1) from (tensor, index): every rank makes
// its own shard of K/V, and rank 0 the whole cache, without communication.
float ValueAt(uint64_t tensor, uint64_t index) {
  uint64_t z = (tensor << 40) + index + 0x9E3779B97F4A7C15ull;  // splitmix64
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) / static_cast<float>(1 << 23) - 1.0f;
}

// Keys [k0, k1) of K (tensor 1) or V (tensor 2) as dense [1, Hkv, k1 - k0, D].
std::vector<float> KeysOf(uint64_t tensor, int64_t k0, int64_t k1) {
  std::vector<float> x(static_cast<size_t>(kHkv * (k1 - k0) * kD));
  for (int64_t h = 0; h < kHkv; ++h)
    for (int64_t j = k0; j < k1; ++j)
      for (int64_t d = 0; d < kD; ++d) {
        x[static_cast<size_t>((h * (k1 - k0) + j - k0) * kD + d)] =
            ValueAt(tensor, static_cast<uint64_t>((h * kLk + j) * kD + d));
      }
  return x;
}

void Check(const simdattn::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "%s failed: %s\n", what, s.message.c_str());
  MPI_Abort(MPI_COMM_WORLD, 1);
}

// This rank's partial result: O [1, Hq, Lq, D] and LSE [1, Hq, Lq, 1] over
// keys [k0, k0 + shard).
void AttendShard(const std::vector<float>& q, int64_t k0, int64_t shard,
                 const simdattn::ExecutionOptions& exec, std::vector<float>* o,
                 std::vector<float>* lse) {
  using simdattn::DType;
  const std::vector<float> k = KeysOf(1, k0, k0 + shard);
  const std::vector<float> v = KeysOf(2, k0, k0 + shard);
  simdattn::AttentionOptions options;
  options.alignment = simdattn::Alignment::kTopLeft;
  options.window_right = kLk - kLq - k0;  // causal, bottom-right over all keys
  o->resize(static_cast<size_t>(kHq * kLq * kD));
  lse->resize(static_cast<size_t>(kHq * kLq));
  Check(simdattn::Attention(simdattn::MakeBHSD(q.data(), DType::kF32, 1, kHq, kLq, kD),
                            simdattn::MakeBHSD(k.data(), DType::kF32, 1, kHkv, shard, kD),
                            simdattn::MakeBHSD(v.data(), DType::kF32, 1, kHkv, shard, kD),
                            simdattn::MakeBHSD(o->data(), DType::kF32, 1, kHq, kLq, kD),
                            options,
                            simdattn::MakeBHSD(lse->data(), DType::kF32, 1, kHq, kLq, 1),
                            exec),
        "Attention on a shard");
}

// Rank 0: merges the gathered parts and compares them with one call over
// the whole cache. Returns whether the errors are within the bounds.
bool MergeAndCheck(const std::vector<float>& q, const std::vector<float>& outs,
                   const std::vector<float>& lses, int ranks,
                   const simdattn::ExecutionOptions& exec) {
  using simdattn::DType;
  const int64_t o_size = kHq * kLq * kD, lse_size = kHq * kLq;
  std::vector<simdattn::TensorView> o_parts, lse_parts;
  for (int r = 0; r < ranks; ++r) {
    o_parts.push_back(simdattn::MakeBHSD(outs.data() + r * o_size, DType::kF32, 1, kHq, kLq, kD));
    lse_parts.push_back(simdattn::MakeBHSD(lses.data() + r * lse_size, DType::kF32, 1, kHq, kLq, 1));
  }
  std::vector<float> merged(static_cast<size_t>(o_size)), merged_lse(static_cast<size_t>(lse_size));
  Check(simdattn::MergeStates(o_parts.data(), lse_parts.data(), ranks,
                              simdattn::MakeBHSD(merged.data(), DType::kF32, 1, kHq, kLq, kD),
                              simdattn::MakeBHSD(merged_lse.data(), DType::kF32, 1, kHq, kLq, 1),
                              exec),
        "MergeStates");

  const std::vector<float> k = KeysOf(1, 0, kLk), v = KeysOf(2, 0, kLk);
  std::vector<float> o(static_cast<size_t>(o_size)), lse(static_cast<size_t>(lse_size));
  simdattn::AttentionOptions options;
  options.causal = true;
  options.alignment = simdattn::Alignment::kBottomRight;
  Check(simdattn::Attention(simdattn::MakeBHSD(q.data(), DType::kF32, 1, kHq, kLq, kD),
                            simdattn::MakeBHSD(k.data(), DType::kF32, 1, kHkv, kLk, kD),
                            simdattn::MakeBHSD(v.data(), DType::kF32, 1, kHkv, kLk, kD),
                            simdattn::MakeBHSD(o.data(), DType::kF32, 1, kHq, kLq, kD),
                            options, simdattn::MakeBHSD(lse.data(), DType::kF32, 1, kHq, kLq, 1),
                            exec),
        "Attention over the whole cache");

  // SEMANTICS.md bounds, f32: each of the two results is within 2e-5 x
  // max(1, max|V|) of the exact one (LSE 1e-4), so they agree within twice
  // that. |V| <= 1 here.
  double o_err = 0.0, lse_err = 0.0;
  for (size_t i = 0; i < o.size(); ++i) {
    const double e = std::fabs(static_cast<double>(merged[i]) - o[i]);
    if (!(e <= o_err)) o_err = std::isnan(e) ? INFINITY : e;
  }
  for (size_t i = 0; i < lse.size(); ++i) {
    const double e = std::fabs(static_cast<double>(merged_lse[i]) - lse[i]);
    if (!(e <= lse_err)) lse_err = std::isnan(e) ? INFINITY : e;
  }
  const bool pass = o_err <= 4e-5 && lse_err <= 2e-4;
  std::printf("context parallel: %d ranks x %lld keys, Hq %lld Hkv %lld Lq %lld D %lld\n",
              ranks, static_cast<long long>(kLk / ranks), static_cast<long long>(kHq),
              static_cast<long long>(kHkv), static_cast<long long>(kLq),
              static_cast<long long>(kD));
  std::printf("max |O_merged - O_one_call| = %.3g (bound 4e-5), max |LSE diff| = %.3g "
              "(bound 2e-4): %s\n", o_err, lse_err, pass ? "PASS" : "FAIL");
  return pass;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const int64_t shard = kLk / ranks;
  if (kLk % ranks != 0 || shard < kLq) {
    if (rank == 0) {
      std::fprintf(stderr, "Lk = %lld must split evenly into shards of at least Lq = %lld "
                   "keys; %d ranks do not\n", static_cast<long long>(kLk),
                   static_cast<long long>(kLq), ranks);
    }
    MPI_Finalize();
    return 1;
  }
  // The ranks share the machine's cores.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  simdattn::ThreadPool pool(static_cast<int>(std::max(1u, cores / static_cast<unsigned>(ranks))));
  simdattn::ExecutionOptions exec;
  exec.pool = &pool;

  std::vector<float> q(static_cast<size_t>(kHq * kLq * kD));
  for (size_t i = 0; i < q.size(); ++i) q[i] = ValueAt(0, i);
  std::vector<float> o, lse;
  AttendShard(q, rank * shard, shard, exec, &o, &lse);

  std::vector<float> outs, lses;
  if (rank == 0) {
    outs.resize(o.size() * static_cast<size_t>(ranks));
    lses.resize(lse.size() * static_cast<size_t>(ranks));
  }
  MPI_Gather(o.data(), static_cast<int>(o.size()), MPI_FLOAT, outs.data(),
             static_cast<int>(o.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  MPI_Gather(lse.data(), static_cast<int>(lse.size()), MPI_FLOAT, lses.data(),
             static_cast<int>(lse.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  int pass = 1;
  if (rank == 0) pass = MergeAndCheck(q, outs, lses, ranks, exec) ? 1 : 0;
  MPI_Bcast(&pass, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return pass ? 0 : 1;
}
