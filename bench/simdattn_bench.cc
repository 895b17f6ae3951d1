// simdattn_bench: Google Benchmark entries for the fused kernel and the
// baselines it is compared with, measured in one process, then a summary of
// the medians grouped by thread count (entries.h lists the families).
//
// Flags of our own, taken out before Google Benchmark parses the rest:
//   --threads=LIST  thread counts every family runs at: comma-separated
//                   numbers or `all` (every core); default 1,2
//   --headline      only the headline comparison (entries.h)
//   --verify        check simdattn and oneDNN against the reference first
//   --table=PATH    write the headline figures, tab-separated, for a chart

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/common.h"
#include "bench/entries.h"
#include "bench/summary.h"
#include "bench/mha_entries.h"

namespace {

using simdattn::bench::BenchConfig;

// Parses --threads' list into config->threads (ascending, no duplicates).
bool ParseThreads(const std::string& list, BenchConfig* config) {
  std::vector<int> threads;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(start, end - start);
    char* rest = nullptr;
    const long n =
        item == "all" ? simdattn::bench::HardwareThreads() : std::strtol(item.c_str(), &rest, 10);
    if ((item != "all" && (item.empty() || *rest != '\0')) || n < 1 || n > 4096) return false;
    threads.push_back(int(n));
    start = end + 1;
  }
  std::sort(threads.begin(), threads.end());
  threads.erase(std::unique(threads.begin(), threads.end()), threads.end());
  config->threads = threads;
  return true;
}

struct Flags {
  BenchConfig config;
  bool verify = false;
  std::string table_path;
};

// Takes our flags out of argv; false (with a message) on a malformed one.
bool TakeOwnFlags(int* argc, char** argv, Flags* flags) {
  for (int i = 1; i < *argc;) {
    const std::string arg = argv[i];
    bool ours = true;
    if (arg == "--verify") {
      flags->verify = true;
    } else if (arg == "--headline") {
      flags->config.headline = true;
    } else if (arg.rfind("--table=", 0) == 0) {
      flags->table_path = arg.substr(8);
    } else if (arg.rfind("--threads=", 0) == 0) {
      if (!ParseThreads(arg.substr(10), &flags->config)) {
        std::fprintf(stderr, "simdattn_bench: bad %s (want e.g. --threads=1,4 or all)\n",
                     arg.c_str());
        return false;
      }
    } else {
      ours = false;
    }
    if (ours) {
      for (int j = i; j + 1 < *argc; ++j) argv[j] = argv[j + 1];
      --*argc;
    } else {
      ++i;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  namespace sb = simdattn::bench;
  Flags flags;
  if (!TakeOwnFlags(&argc, argv, &flags)) return 2;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;

  if (flags.verify && !sb::VerifyPrefill(flags.config)) {
    std::fprintf(stderr, "simdattn_bench: verification failed\n");
    return 1;
  }
  sb::RegisterRooflineEntries(flags.config);
  sb::RegisterPrefillEntries(flags.config);
  sb::RegisterOptionEntries(flags.config);
  sb::RegisterDecodeEntries(flags.config);
  sb::RegisterQuantEntries(flags.config);
  sb::RegisterPairedEntries(flags.config);
  sb::RegisterServingEntries(flags.config);
  sb::RegisterGemmEntries(flags.config);
  sb::RegisterMhaEntries(flags.config);

  sb::SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  sb::PrintSummary(reporter.results());
  benchmark::Shutdown();
  if (!flags.table_path.empty() &&
      !sb::WriteChartTable(reporter.results(), flags.table_path.c_str())) {
    std::fprintf(stderr, "simdattn_bench: cannot write %s\n", flags.table_path.c_str());
    return 1;
  }
  return 0;
}
