// The end of a simdattn_bench run: a summary of the medians, grouped by
// thread count, with each entry's ratios to oneDNN, to the plain loop, to
// f32 storage, to the smallest thread count and to the roofline of the same
// thread count; and the headline figures as a table for tools/bench.sh's
// chart.

#ifndef SIMDATTN_BENCH_SUMMARY_H_
#define SIMDATTN_BENCH_SUMMARY_H_

#include <benchmark/benchmark.h>

#include <map>
#include <string>
#include <vector>

namespace simdattn {
namespace bench {

// The medians of one run, by entry name (without /real_time, /min_time:...,
// /repeats:...).
struct Results {
  struct Median {
    double flops = 0.0;  // FLOPS counter (bytes/s for roofline/read_bw)
    double bytes = 0.0;  // bytes counter
    std::string label;   // the target or oneDNN's implementations
  };
  std::map<std::string, Median> medians;  // entries with a rate counter
  std::map<std::string, double> ratios;   // paired entries' `ratio`

  const Median* Find(const std::string& name) const;
  const double* FindRatio(const std::string& name) const;
  // Every thread count that has a result, ascending.
  std::vector<int> Threads() const;
};

// Console output as usual, and keeps the median of each entry (the single
// run stands for it without repetitions).
class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override;
  const Results& results() const { return results_; }

 private:
  Results results_;
};

void PrintSummary(const Results& r);

// Writes the headline figures for tools/bench.sh's chart, tab-separated:
// one block per panel (f32 prefill, bf16 prefill, decode), one group per
// thread count, each row a case with simdattn, oneDNN and the rooflines of
// the same thread count ("-" where not measured). False if the file cannot
// be written.
bool WriteChartTable(const Results& r, const char* path);

}  // namespace bench
}  // namespace simdattn

#endif  // SIMDATTN_BENCH_SUMMARY_H_
