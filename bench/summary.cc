#include "bench/summary.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "bench/common.h"
#include "bench/entries.h"

namespace simdattn {
namespace bench {
namespace {

constexpr size_t npos = std::string::npos;

// Removes the fields Google Benchmark appends to an entry's name.
std::string CleanName(std::string name) {
  for (const char* field : {"/real_time", "/min_time:", "/repeats:"}) {
    const size_t at = name.find(field);
    if (at == npos) continue;
    const size_t end = name.find('/', at + 1);
    name.erase(at, end == npos ? npos : end - at);
  }
  return name;
}

// The thread count of an entry: .../threads:<n> or .../threads<n>_vs_threads1.
int ThreadsOf(const std::string& name) {
  size_t at = name.rfind("/threads:");
  if (at != npos) return std::atoi(name.c_str() + at + 9);
  at = name.rfind("/threads");
  return at == npos ? 0 : std::atoi(name.c_str() + at + 8);
}

std::vector<std::string> Split(const std::string& name) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t at; (at = name.find('/', start)) != npos; start = at + 1) {
    parts.push_back(name.substr(start, at - start));
  }
  parts.push_back(name.substr(start));
  return parts;
}

// attention/<impl>/<dtype>/<shape>/<mask>/threads:<n>
struct EntryName {
  std::string impl, dtype, shape, mask;
  int threads = 0;

  std::string Str() const {
    return "attention/" + impl + "/" + dtype + "/" + shape + "/" + mask + ThreadsField(threads);
  }
  // This entry with another implementation, dtype or thread count.
  EntryName With(const std::string& i, const std::string& d, int t) const {
    EntryName e = *this;
    e.impl = i, e.dtype = d, e.threads = t;
    return e;
  }
};

bool ParseAttention(const std::string& name, EntryName* e) {
  const std::vector<std::string> p = Split(name);
  if (p.size() != 6 || p[0] != "attention" || p[5].rfind("threads:", 0) != 0) return false;
  *e = {p[1], p[2], p[3], p[4], std::atoi(p[5].c_str() + 8)};
  return true;
}

// Decode shapes: at most 16 queries per head (Lq 1, or speculative decoding).
bool IsDecodeShape(const std::string& shape) {
  const size_t at = shape.find("_Lq");
  return at != npos && std::strtoll(shape.c_str() + at + 3, nullptr, 10) <= 16;
}

std::string Format(const char* format, double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), format, x);
  return buf;
}

// a / b as "1.23x"; empty without b.
std::string Times(double a, const Results::Median* b, double Results::Median::*rate) {
  return b == nullptr || b->*rate <= 0.0 ? "" : Format("%.2fx", a / (b->*rate));
}

std::string Roofline(const std::string& kind, int threads) {
  return "roofline/" + kind + ThreadsField(threads);
}

// The roofline a prefill entry is held against: bf16 entries that ran
// native bf16 products (our AVX3_BF16, oneDNN's avx512_core_bf16) against
// the vdpbf16ps loop where it ran, the others (bf16 widened to f32, and
// oneDNN's AMX, beyond both loops) against the FMAs. *kind names it.
const Results::Median* PrefillRoofline(const Results& r, const EntryName& e,
                                       const std::string& label, std::string* kind) {
  const bool native_bf16 = label == "AVX3_BF16" || label.find("avx512_core_bf16") != npos;
  *kind = "dot_bf16";
  const Results::Median* roof = r.Find(Roofline(*kind, e.threads));
  if (e.dtype != "bf16" || !native_bf16 || roof == nullptr) {
    *kind = "fma_f32";
    roof = r.Find(Roofline(*kind, e.threads));
  }
  return roof;
}

// Prints the header and the rows, when there are rows.
void PrintTable(const std::string& header, const std::vector<std::string>& rows) {
  if (rows.empty()) return;
  std::printf("\n%s\n", header.c_str());
  for (const std::string& row : rows) std::printf("%s\n", row.c_str());
}

std::string Row(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string Row(const char* format, ...) {
  char buf[256];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof(buf), format, args);
  va_end(args);
  std::string row = buf;
  row.erase(row.find_last_not_of(' ') + 1);  // empty trailing columns
  return row;
}

void PrintRooflines(const Results& r, int t) {
  std::vector<std::string> rows;
  for (const char* kind : {"fma_f32", "dot_bf16", "read_bw"}) {
    if (const Results::Median* m = r.Find(Roofline(kind, t))) {
      const bool read = std::string(kind) == "read_bw";
      rows.push_back(Row("%-12s %9.1f %s", kind, m->flops * 1e-9, read ? "GB/s" : "GFLOP/s"));
    }
  }
  PrintTable("roofline", rows);
}

// Prefill entries of t threads; t0 is the smallest thread count that ran.
void PrintPrefill(const Results& r, int t, int t0) {
  std::vector<std::string> rows;
  for (const auto& [name, m] : r.medians) {
    EntryName e;
    if (!ParseAttention(name, &e) || e.threads != t || IsDecodeShape(e.shape)) continue;
    const bool ours = e.impl == "simdattn";
    std::string kind, peak, vs_dnn, vs_naive, vs_f32, vs_t0;
    if (const Results::Median* roof = PrefillRoofline(r, e, m.label, &kind)) {
      peak = Format("%.0f%%", 100.0 * m.flops / roof->flops);
    }
    if (ours) {
      const auto flops = &Results::Median::flops;
      vs_dnn = Times(m.flops, r.Find(e.With("onednn", e.dtype, t).Str()), flops);
      vs_naive = Times(m.flops, r.Find(e.With("naive", e.dtype, 1).Str()), flops);
      if (e.dtype != "f32") vs_f32 = Times(m.flops, r.Find(e.With(e.impl, "f32", t).Str()), flops);
    }
    if (t != t0) {
      vs_t0 = Times(m.flops, r.Find(e.With(e.impl, e.dtype, t0).Str()), &Results::Median::flops);
    }
    const std::string what = e.dtype + "/" + e.shape + "/" + e.mask;
    rows.push_back(Row("%-9s %-52s %-9s %8.1f %6s %9s %8s %7s %7s", e.impl.c_str(), what.c_str(),
                       ours ? m.label.c_str() : "", m.flops * 1e-9, peak.c_str(), vs_dnn.c_str(),
                       vs_naive.c_str(), vs_f32.c_str(), vs_t0.c_str()));
  }
  const std::string t0_column = "vs " + std::to_string(t0) + "T";
  PrintTable(
      Row("%-9s %-52s %-9s %8s %6s %9s %8s %7s %7s", "impl", "prefill dtype/shape/mask", "target",
          "GFLOP/s", "%peak", "vs oneDNN", "vs naive", "vs f32", t == t0 ? "" : t0_column.c_str()),
      rows);
}

// The paired prefill entries of t threads: simdattn's speed-up over oneDNN
// and over 1 thread, each a median of call-by-call ratios.
void PrintPairedPrefill(const Results& r, int t) {
  std::vector<std::string> rows;
  for (const auto& [name, ratio] : r.ratios) {
    // paired/f32/<shape>/<mask>/onednn_vs_simdattn/threads:<t>
    const std::vector<std::string> p = Split(name);
    if (p.size() != 6 || p[1] != "f32" || p[4] != "onednn_vs_simdattn" || ThreadsOf(name) != t ||
        IsDecodeShape(p[2])) {
      continue;
    }
    const std::string base = "paired/f32/" + p[2] + "/" + p[3];
    const double* scaling =
        t > 1 ? r.FindRatio(base + "/threads" + std::to_string(t) + "_vs_threads1") : nullptr;
    rows.push_back(Row("%-52s %10.2fx %10s", (p[2] + "/" + p[3]).c_str(), ratio,
                       scaling ? Format("%.2fx", *scaling).c_str() : ""));
  }
  // Pairs of t and 1 threads where no oneDNN pair ran (2t above the cores).
  for (const auto& [name, ratio] : r.ratios) {
    const std::vector<std::string> p = Split(name);
    if (p.size() != 5 || p[1] != "f32" || ThreadsOf(name) != t || t == 1 ||
        p[4].rfind("threads", 0) != 0 ||
        r.FindRatio("paired/f32/" + p[2] + "/" + p[3] + "/onednn_vs_simdattn" + ThreadsField(t))) {
      continue;
    }
    rows.push_back(Row("%-52s %11s %9.2fx", (p[2] + "/" + p[3]).c_str(), "", ratio));
  }
  PrintTable(Row("%-52s %11s %10s", "prefill f32, paired call by call", "vs oneDNN",
                 t == 1 ? "" : (std::to_string(t) + "T / 1T").c_str()),
             rows);
}

// Each option's cost over plain attention with the same visible pairs (the
// option entries do the same work per call, so the ratio of any rate is the
// ratio of times): "paired" from the paired/ entries (the figure to trust),
// "entries" from the separate attention/ entries.
void PrintOptionCosts(const Results& r, const char* title, const std::string& dtype_shape, int t) {
  const std::string base = "attention/simdattn/" + dtype_shape + "/";
  const Results::Median* plain = r.Find(base + "none" + ThreadsField(t));
  std::vector<std::string> rows;
  for (const Variant& var : OptionVariants()) {
    std::string paired, entries;
    if (const double* x =
            r.FindRatio("paired/" + dtype_shape + "/" + var.name + "_vs_none" + ThreadsField(t))) {
      paired = Format("%.1f%%", 100.0 * (*x - 1.0));
    }
    const Results::Median* m = r.Find(base + var.name + ThreadsField(t));
    if (plain != nullptr && m != nullptr && m->bytes > 0) {
      entries = Format("%.0f%%", 100.0 * (plain->bytes / m->bytes - 1.0));
    }
    if (paired.empty() && entries.empty()) continue;
    rows.push_back(Row("%-40s %16s %16s", var.name.c_str(), paired.c_str(), entries.c_str()));
  }
  PrintTable(Row("%-40s %16s %16s", title, "extra (paired)", "extra (entries)"), rows);
}

// The sliding window's speed-up over full causal attention.
void PrintWindow(const Results& r, int t) {
  const std::string shape = "f32/" + kWindowShape.Name();
  if (const double* x =
          r.FindRatio("paired/" + shape + "/causal_vs_causal_window512" + ThreadsField(t))) {
    std::printf("window 512 over L 8192 vs full causal (paired): %.1fx faster\n", *x);
  }
  const Results::Median* full = r.Find("attention/simdattn/" + shape + "/causal" + ThreadsField(t));
  const Results::Median* win =
      r.Find("attention/simdattn/" + shape + "/causal_window512" + ThreadsField(t));
  if (full != nullptr && win != nullptr && win->flops > 0) {
    // time = flops / rate, with the visible pairs of each.
    const double t_full = VisiblePairs(kWindowShape, true) / full->flops;
    const double t_win = VisiblePairs(kWindowShape, true, kWindowLeft) / win->flops;
    std::printf("window 512 over L 8192 vs full causal (entries): %.1fx faster\n", t_full / t_win);
  }
}

// Decode entries of t threads (plain or causal; the options are above),
// bound by reading K and V once.
void PrintDecode(const Results& r, int t, int t0) {
  std::vector<std::string> rows;
  for (const auto& [name, m] : r.medians) {
    EntryName e;
    if (!ParseAttention(name, &e) || e.threads != t || !IsDecodeShape(e.shape) ||
        (e.mask != "none" && e.mask != "causal")) {
      continue;
    }
    std::string pct, vs_dnn, vs_t0;
    const auto bytes = &Results::Median::bytes;
    if (const Results::Median* bw = r.Find(Roofline("read_bw", t))) {
      if (bw->flops > 0) pct = Format("%.0f%%", 100.0 * m.bytes / bw->flops);
    }
    if (e.impl == "simdattn") {
      // f32 against oneDNN f32, a 16-bit KV cache against oneDNN bf16.
      vs_dnn = Times(m.bytes, r.Find(e.With("onednn", e.dtype == "f32" ? "f32" : "bf16", t).Str()),
                     bytes);
    }
    if (t != t0) vs_t0 = Times(m.bytes, r.Find(e.With(e.impl, e.dtype, t0).Str()), bytes);
    const std::string what = e.dtype + "/" + e.shape + "/" + e.mask;
    rows.push_back(Row("%-9s %-52s %8.1f %8s %9s %7s", e.impl.c_str(), what.c_str(), m.bytes * 1e-9,
                       pct.c_str(), vs_dnn.c_str(), vs_t0.c_str()));
  }
  const std::string t0_column = t == t0 ? "" : "vs " + std::to_string(t0) + "T";
  PrintTable(Row("%-9s %-52s %8s %8s %9s %7s", "impl", "decode dtype/shape/mask (K+V read)", "GB/s",
                 "%read_bw", "vs oneDNN", t0_column.c_str()),
             rows);
}

// The paired decode entries of t threads: simdattn's bytes rate over a
// streaming read of the same bytes next to it, and over oneDNN's.
void PrintPairedDecode(const Results& r, int t) {
  const std::string tag = "/none/read_vs_simdattn" + ThreadsField(t);
  std::vector<std::string> rows;
  for (const auto& [name, ratio] : r.ratios) {
    const size_t at = name.find(tag);
    if (name.rfind("paired/", 0) != 0 || at == npos || at + tag.size() != name.size()) continue;
    const std::string what = name.substr(7, at - 7);  // <dtype>/<shape>
    const double* dnn =
        r.FindRatio("paired/" + what + "/none/onednn_vs_simdattn" + ThreadsField(t));
    rows.push_back(Row("%-52s %8.0f%% %9s", what.c_str(), 100.0 * ratio,
                       dnn ? Format("%.2fx", *dnn).c_str() : ""));
  }
  PrintTable(Row("%-52s %9s %9s", "decode, paired call by call", "of read", "vs oneDNN"), rows);
}

// One row of the chart table: the figures of one case at t threads, "-"
// where one is missing. `rate` picks the counter (FLOPS or bytes).
struct ChartCase {
  std::string label;
  const Results::Median *ours, *dnn, *roof, *roof_bf16;
};
std::string ChartRow(const std::string& panel, const std::string& shape, int t, const ChartCase& c,
                     double Results::Median::*rate) {
  auto value = [](const Results::Median* m, double Results::Median::*field) {
    return m == nullptr || m->*field <= 0.0 ? std::string("-") : Format("%.2f", m->*field * 1e-9);
  };
  const auto roof_rate = &Results::Median::flops;  // the rooflines' one counter
  return panel + "\t" + shape + "\t" + std::to_string(t) + "\t" + c.label + "\t" +
         value(c.ours, rate) + "\t" + value(c.dnn, rate) + "\t" + value(c.roof, roof_rate) + "\t" +
         value(c.roof_bf16, roof_rate);
}

// The rows of one panel at t threads: f32 or bf16 prefill of the headline
// shapes against the FMA roofline (bf16 also against vdpbf16ps'), or decode
// of the headline cache against the read roofline.
std::vector<std::string> ChartRows(const Results& r, const std::string& panel, int t) {
  std::vector<std::string> rows;
  if (panel == "decode") {
    struct Kind {
      const char* label;
      const char* ours;
      const char* dnn;
    };
    const Kind kinds[] = {
        {"f32", "f32", "f32"}, {"bf16 KV", "qf32kvbf16", "bf16"}, {"f16 KV", "qf32kvf16", ""}};
    for (const DecodeShape& ds : DecodeShapes()) {
      if (!ds.headline) continue;
      const EntryName e{"simdattn", "", ds.shape.Name(), "none", t};
      for (const Kind& k : kinds) {
        const ChartCase c{k.label, r.Find(e.With("simdattn", k.ours, t).Str()),
                          *k.dnn ? r.Find(e.With("onednn", k.dnn, t).Str()) : nullptr,
                          r.Find(Roofline("read_bw", t)), nullptr};
        if (c.ours || c.dnn)
          rows.push_back(ChartRow(panel, e.shape, t, c, &Results::Median::bytes));
      }
    }
    return rows;
  }
  int headline_shapes = 0;
  for (const PrefillShape& ps : PrefillShapes()) headline_shapes += ps.headline;
  for (const PrefillShape& ps : PrefillShapes()) {
    if (!ps.headline) continue;
    for (const char* mask : {"none", "causal"}) {
      const EntryName e{"simdattn", panel, ps.shape.Name(), mask, t};
      const ChartCase c{headline_shapes > 1 ? e.shape + " " + mask : mask, r.Find(e.Str()),
                        r.Find(e.With("onednn", panel, t).Str()), r.Find(Roofline("fma_f32", t)),
                        panel == "bf16" ? r.Find(Roofline("dot_bf16", t)) : nullptr};
      if (c.ours || c.dnn) rows.push_back(ChartRow(panel, e.shape, t, c, &Results::Median::flops));
    }
  }
  return rows;
}

}  // namespace

const Results::Median* Results::Find(const std::string& name) const {
  const auto it = medians.find(name);
  return it == medians.end() ? nullptr : &it->second;
}

const double* Results::FindRatio(const std::string& name) const {
  const auto it = ratios.find(name);
  return it == ratios.end() ? nullptr : &it->second;
}

std::vector<int> Results::Threads() const {
  std::set<int> threads;
  for (const auto& entry : medians) threads.insert(ThreadsOf(entry.first));
  for (const auto& entry : ratios) threads.insert(ThreadsOf(entry.first));
  threads.erase(0);
  return {threads.begin(), threads.end()};
}

void SummaryReporter::ReportRuns(const std::vector<Run>& runs) {
  ConsoleReporter::ReportRuns(runs);
  for (const Run& run : runs) {
    const bool median = run.aggregate_name == "median";
    if (run.error_occurred || (run.run_type == Run::RT_Aggregate && !median)) continue;
    const std::string name = CleanName(run.run_name.str());
    if (const auto rc = run.counters.find("ratio"); rc != run.counters.end()) {
      if (median || results_.ratios.count(name) == 0) results_.ratios[name] = double(rc->second);
      continue;
    }
    auto it = run.counters.find("FLOPS");
    if (it == run.counters.end()) it = run.counters.find("bytes");
    if (it == run.counters.end()) continue;
    const auto bytes = run.counters.find("bytes");
    if (median || results_.medians.count(name) == 0) {
      results_.medians[name] = {double(it->second),
                                bytes == run.counters.end() ? 0.0 : double(bytes->second),
                                run.report_label};
    }
  }
}

bool WriteChartTable(const Results& r, const char* path) {
  FILE* f = std::fopen(path, "w");
  if (f == nullptr) return false;
  std::fprintf(f,
               "# simdattn_bench's headline figures: one block per panel (prefill f32 and bf16\n"
               "# in GFLOP/s, decode in GB/s), one group per thread count. Rooflines of the\n"
               "# same thread count: fma_f32 (prefill) or read_bw (decode), and dot_bf16.\n"
               "# panel\tshape\tthreads\tcase\tsimdattn\tonednn\troofline\tdot_bf16\n");
  bool first_panel = true;
  for (const char* panel : {"f32", "bf16", "decode"}) {
    bool first_group = true;
    for (int t : r.Threads()) {
      const std::vector<std::string> rows = ChartRows(r, panel, t);
      if (rows.empty()) continue;
      // Two blank lines between panels (gnuplot's index), one between groups.
      std::fprintf(f, "%s", first_group ? (first_panel ? "" : "\n\n") : "\n");
      for (const std::string& row : rows) std::fprintf(f, "%s\n", row.c_str());
      first_group = first_panel = false;
    }
  }
  return std::fclose(f) == 0;
}

void PrintSummary(const Results& r) {
  const std::vector<int> threads = r.Threads();
  if (threads.empty()) return;
  std::printf(
      "\nSummary (medians), by thread count. %%peak: of roofline/fma_f32 with the same "
      "threads (bf16 on native products, our AVX3_BF16 or oneDNN's avx512_core_bf16: of "
      "roofline/dot_bf16); %%read_bw: of roofline/read_bw with the same threads; vs <n>T: "
      "over the same entry with n threads.\n");
  for (int t : threads) {
    std::printf("\n======== %d thread%s\n", t, t == 1 ? "" : "s");
    PrintRooflines(r, t);
    PrintPrefill(r, t, threads[0]);
    PrintPairedPrefill(r, t);
    PrintOptionCosts(r, "option (B1 H8 L2048 D128)", "f32/" + kOptionShape.Name(), t);
    PrintOptionCosts(r, "option (decode f16 KV Lk 16384)", "qf32kvf16/" + kOptionDecodeShape.Name(),
                     t);
    PrintWindow(r, t);
    PrintDecode(r, t, threads[0]);
    PrintPairedDecode(r, t);
  }
}

}  // namespace bench
}  // namespace simdattn
