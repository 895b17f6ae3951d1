// The `simdattn` command-line tool: `info` prints CPU features and Highway
// targets; `run` computes attention on .npy files. Exit codes: 0 success,
// 2 any usage, input or library error, 1 an unexpected internal exception.

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <memory>
#include <new>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "simdattn/attention.h"
#include "tools/npy.h"

namespace simdattn {
namespace {

constexpr int kExitError = 2;
constexpr int kExitInternal = 1;
constexpr int kMaxThreads = 1024;

int Error(const std::string& message) {
  std::cerr << "simdattn: error: " << message << std::endl;
  return kExitError;
}

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) {
    if (!out.empty()) out += ' ';
    out += s;
  }
  return out.empty() ? "(none)" : out;
}

// ------------------------------------------------------------------ info

// Reads the first "<key> : value" line of /proc/cpuinfo whose key is one of
// `keys`; returns false when the file or the key is absent.
bool CpuInfoField(const std::vector<std::string>& keys, std::string* value) {
  std::ifstream in("/proc/cpuinfo");
  if (!in) return false;
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) {
      key.pop_back();
    }
    for (const std::string& k : keys) {
      if (key == k) {
        *value = line.substr(colon + 1);
        const size_t start = value->find_first_not_of(" \t");
        *value = start == std::string::npos ? "" : value->substr(start);
        return true;
      }
    }
  }
  return false;
}

int PrintInfo() {
  // Features that matter to simdattn's kernels (x86 flags, aarch64 Features).
  static const char* const kRelevant[] = {
      "sse2",       "ssse3",       "sse4_1",      "sse4_2",
      "avx",        "avx2",        "fma",         "f16c",
      "bmi2",       "avx512f",     "avx512vl",    "avx512dq",
      "avx512bw",   "avx512cd",    "avx512vnni",  "avx512_vnni",
      "avx512_bf16", "avx512_fp16", "avx512vbmi", "avx512_vbmi2",
      "avx512_bitalg", "avx512_vpopcntdq", "gfni", "vaes", "vpclmulqdq",
      "amx_tile",   "amx_bf16",    "asimd",       "fphp",
      "asimdhp",    "asimddp",     "bf16",        "i8mm",
      "sve",        "sve2",        "svebf16",     "svei8mm",
      "sme",        "sme2"};
  std::string model;
  if (CpuInfoField({"model name", "Processor", "CPU part"}, &model)) {
    std::cout << "cpu: " << model << "\n";
  }
  std::string flags;
  if (CpuInfoField({"flags", "Features"}, &flags)) {
    std::set<std::string> present;
    std::istringstream words(flags);
    std::string w;
    while (words >> w) present.insert(w);
    std::vector<std::string> found;
    for (const char* f : kRelevant) {
      if (present.count(f)) found.push_back(f);
    }
    std::cout << "cpu features: " << Join(found) << "\n";
  } else {
    std::cout << "cpu features: unknown (no flags in /proc/cpuinfo)\n";
  }
  std::cout << "compiled targets: " << Join(CompiledTargets()) << "\n";
  std::cout << "available targets: " << Join(AvailableTargets()) << "\n";
  const char* env = std::getenv("SIMDATTN_MAX_TARGET");
  if (env != nullptr && env[0] != '\0') {
    std::cout << "SIMDATTN_MAX_TARGET: " << env << "\n";
  }
  std::string selected;
  const Status s = SelectedTarget(&selected);
  if (!s.ok()) {
    std::cout << std::flush;
    return Error(s.message);
  }
  std::cout << "selected target: " << selected << std::endl;
  return 0;
}

// ------------------------------------------------------------------ run

struct RunArgs {
  std::string q, k, v, out, lse;
  bool lse_given = false;
  std::string layout = "bhsd";
  std::string scale;  // parsed here, so that 'nan' and '-1' get our message
  std::string causal;
  std::string align;
  int threads = 0;  // 0 = not given
  bool threads_given = false;
  std::string target;
  bool verbose = false;
};

bool ParseAlignment(const std::string& flag, const std::string& text,
                    Alignment* out, std::string* error) {
  if (text == "top-left") {
    *out = Alignment::kTopLeft;
  } else if (text == "bottom-right") {
    *out = Alignment::kBottomRight;
  } else {
    *error = flag + " must be top-left or bottom-right, got '" + text + "'";
    return false;
  }
  return true;
}

// Loads a 4-D floating-point array for `flag`.
bool LoadInput(const std::string& flag, const std::string& path,
               npy::Array* array, std::string* error) {
  if (path.empty()) {
    *error = flag + ": empty path";
    return false;
  }
  if (!npy::Read(path, array, error)) {
    *error = flag + ": " + *error;
    return false;
  }
  if (array->type != npy::ElementType::kF32 &&
      array->type != npy::ElementType::kF16) {
    *error = path + ": dtype '" + array->descr + "' is not supported for " +
             flag + " (use '<f4' or '<f2')";
    return false;
  }
  if (array->shape.size() != 4) {
    *error = path + ": " + flag + " must be a 4-D array, got shape " +
             npy::ShapeString(array->shape);
    return false;
  }
  return true;
}

// ------------------------------------------------------------ file names

// Where a path's directory entry lives: the canonical parent directory plus
// the last component, e.g. "o.npy", "./o.npy" and "/abs/dir/o.npy" all give
// "/abs/dir/o.npy". rename() replaces exactly this entry (a symbolic link is
// replaced, not followed). `dev`/`ino` come from lstat() when it exists.
struct PathEntry {
  std::string entry;  // empty when the parent directory cannot be resolved
  bool exists = false;
  dev_t dev = 0;
  ino_t ino = 0;
};

std::string CanonicalPath(const std::string& path) {
  char buf[PATH_MAX];
  return ::realpath(path.c_str(), buf) == nullptr ? std::string()
                                                   : std::string(buf);
}

PathEntry ResolveEntry(const std::string& path) {
  PathEntry out;
  const size_t slash = path.rfind('/');
  const std::string parent = slash == std::string::npos ? "."
                             : slash == 0               ? "/"
                                                        : path.substr(0, slash);
  const std::string base =
      slash == std::string::npos ? path : path.substr(slash + 1);
  const std::string dir = CanonicalPath(parent);
  if (!dir.empty()) out.entry = (dir == "/" ? "" : dir) + "/" + base;
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    out.exists = true;
    out.dev = st.st_dev;
    out.ino = st.st_ino;
  }
  return out;
}

// Checks an output path for `flag` (see npy::CheckDestination) and resolves
// its directory entry.
bool CheckOutput(const std::string& flag, const std::string& path,
                 PathEntry* entry, std::string* error) {
  if (path.empty()) {
    *error = flag + ": empty path";
    return false;
  }
  if (!npy::CheckDestination(path, error)) {
    *error = flag + ": " + *error;
    return false;
  }
  *entry = ResolveEntry(path);
  if (entry->entry.empty()) {
    *error = flag + ": " + path + ": cannot resolve its parent directory";
    return false;
  }
  return true;
}

// True when writing the output entry `out` would replace the input file at
// `input`: the input names the same directory entry (through any spelling)
// or resolves, through symbolic links, to the file that entry holds.
bool OutputReplacesInput(const PathEntry& out, const std::string& input) {
  if (input.empty()) return false;
  if (ResolveEntry(input).entry == out.entry) return true;
  if (CanonicalPath(input) == out.entry) return true;
  struct stat st;
  return out.exists && ::stat(input.c_str(), &st) == 0 &&
         st.st_dev == out.dev && st.st_ino == out.ino;
}

// Checks both destinations before anything is computed or written, so that a
// bad --lse cannot fail after O has been replaced.
bool CheckOutputs(const RunArgs& args, std::string* error) {
  if (args.lse_given && args.lse.empty()) {
    *error = "--lse: empty path";
    return false;
  }
  PathEntry out, lse;
  if (!CheckOutput("--out", args.out, &out, error)) return false;
  const bool has_lse = !args.lse.empty();
  if (has_lse && !CheckOutput("--lse", args.lse, &lse, error)) return false;
  if (has_lse && (out.entry == lse.entry ||
                  (out.exists && lse.exists && out.dev == lse.dev &&
                   out.ino == lse.ino))) {
    *error = "--out '" + args.out + "' and --lse '" + args.lse +
             "' name the same file";
    return false;
  }
  struct Named {
    const char* flag;
    const std::string* path;
  };
  const Named inputs[] = {{"--q", &args.q}, {"--k", &args.k}, {"--v", &args.v}};
  const std::pair<Named, const PathEntry*> outputs[] = {
      {{"--out", &args.out}, &out}, {{"--lse", &args.lse}, &lse}};
  for (const auto& o : outputs) {
    if (o.first.path->empty()) continue;  // --lse not given
    for (const Named& in : inputs) {
      if (OutputReplacesInput(*o.second, *in.path)) {
        *error = std::string(o.first.flag) + " '" + *o.first.path +
                 "' names the same file as input " + in.flag + " '" +
                 *in.path + "'; inputs are never overwritten";
        return false;
      }
    }
  }
  return true;
}

int RunAttention(const RunArgs& args) {
  std::string error;
  const bool bshd = args.layout == "bshd";
  if (!bshd && args.layout != "bhsd") {
    return Error("--layout must be bhsd or bshd, got '" + args.layout + "'");
  }
  AttentionOptions options;
  if (!args.scale.empty()) {
    const char* text = args.scale.c_str();
    char* end = nullptr;
    errno = 0;
    const double value = std::strtod(text, &end);
    const float f = static_cast<float>(value);
    if (end == text || *end != '\0') {
      return Error("--scale must be a number, got '" + args.scale + "'");
    }
    if (!std::isfinite(f) || f < 0.0f) {
      return Error("--scale must be finite and >= 0, got '" + args.scale +
                   "'");
    }
    options.scale = f;
  }
  if (!args.causal.empty()) {
    if (!ParseAlignment("--causal", args.causal, &options.alignment, &error)) {
      return Error(error);
    }
    options.causal = true;
  }
  if (!args.align.empty()) {
    Alignment align;
    if (!ParseAlignment("--align", args.align, &align, &error)) {
      return Error(error);
    }
    if (options.causal && align != options.alignment) {
      return Error("--causal " + args.causal + " conflicts with --align " +
                   args.align);
    }
    options.alignment = align;
  }
  if (args.threads_given &&
      (args.threads < 1 || args.threads > kMaxThreads)) {
    return Error("--threads must be in 1.." + std::to_string(kMaxThreads) +
                 ", got " + std::to_string(args.threads));
  }
  if (!CheckOutputs(args, &error)) return Error(error);
  if (!args.target.empty()) {
    const Status s = SetMaxTarget(args.target.c_str());
    if (!s.ok()) return Error("--target: " + s.message);
  }

  npy::Array q, k, v;
  if (!LoadInput("--q", args.q, &q, &error) ||
      !LoadInput("--k", args.k, &k, &error) ||
      !LoadInput("--v", args.v, &v, &error)) {
    return Error(error);
  }
  // Logical [B, H, L, D] of a file array in the chosen layout.
  auto logical = [bshd](const npy::Array& a) {
    const std::vector<int64_t>& s = a.shape;
    return bshd ? std::vector<int64_t>{s[0], s[2], s[1], s[3]} : s;
  };
  auto make_view = [bshd](const npy::Array& a, const std::vector<int64_t>& l) {
    return bshd ? MakeBSHD(a.f32.data(), DType::kF32, l[0], l[1], l[2], l[3])
                : MakeBHSD(a.f32.data(), DType::kF32, l[0], l[1], l[2], l[3]);
  };
  const std::vector<int64_t> lq = logical(q), lk = logical(k), lv = logical(v);
  const TensorView qv = make_view(q, lq);
  const TensorView kv = make_view(k, lk);
  const TensorView vv = make_view(v, lv);

  // O is [B, Hq, Lq, Dv]; its extents come from Q and V, which Attention()
  // checks against each other before writing anything.
  const int64_t b = lq[0], hq = lq[1], seq_q = lq[2], dv = lv[3];
  const std::vector<int64_t> o_logical = {b, hq, seq_q, dv};
  int64_t o_count = 1, lse_count = 1;
  for (size_t i = 0; i < o_logical.size(); ++i) {
    const int64_t e = o_logical[i];
    if (e < 0 || (e > 0 && o_count > INT64_MAX / 4 / e)) {
      return Error("output shape " + npy::ShapeString(o_logical) +
                   " is too large");
    }
    o_count *= e;
    if (i < 3) lse_count *= e;  // equals o_count so far: checked
  }
  // Not value-initialized: pages of a huge, rejected output are never touched.
  std::unique_ptr<float[]> o(new (std::nothrow)
                                 float[static_cast<size_t>(o_count) + 1]);
  std::unique_ptr<float[]> lse;
  if (!args.lse.empty()) {
    lse.reset(new (std::nothrow) float[static_cast<size_t>(lse_count) + 1]);
  }
  if (o == nullptr || (!args.lse.empty() && lse == nullptr)) {
    return Error("out of memory allocating the output");
  }
  const MutableTensorView ov =
      bshd ? MakeBSHD(o.get(), DType::kF32, b, hq, seq_q, dv)
           : MakeBHSD(o.get(), DType::kF32, b, hq, seq_q, dv);
  MutableTensorView lsev;
  if (lse != nullptr) lsev = MakeBHSD(lse.get(), DType::kF32, b, hq, seq_q, 1);

  std::unique_ptr<ThreadPool> pool;
  ExecutionOptions exec;
  if (args.threads_given) {
    try {
      pool.reset(new ThreadPool(args.threads));
    } catch (const std::system_error& e) {
      return Error("cannot start " + std::to_string(args.threads) +
                   " threads: " + e.what());
    }
    exec.pool = pool.get();
  }
  simdattn::RunInfo info;
  const Status s = Attention(qv, kv, vv, ov, options, lsev, exec, &info);
  if (!s.ok()) {
    std::string message = std::string(StatusCodeName(s.code)) + ": " +
                          s.message;
    if (bshd && s.code == StatusCode::kInvalidArgument) {
      message += " (shapes are logical [B, H, L, D]; bshd files hold "
                 "[B, L, H, D])";
    }
    return Error(message);
  }

  // Prepare both files completely before replacing either destination, and
  // check both destinations again just before the first rename. Residual
  // risk: two renames are not one atomic step, so if LSE's rename still
  // fails after O's succeeded (the destination changed in between, or an
  // I/O error), O has been replaced; the message then says so.
  const std::vector<int64_t> o_file =
      bshd ? std::vector<int64_t>{b, seq_q, hq, dv} : o_logical;
  std::string o_temp, lse_temp;
  if (!npy::WriteF32Temp(args.out, o.get(), o_file, &o_temp, &error)) {
    return Error("--out: " + error);
  }
  if (lse != nullptr &&
      !npy::WriteF32Temp(args.lse, lse.get(), {b, hq, seq_q}, &lse_temp,
                         &error)) {
    npy::DiscardTemp(o_temp);
    return Error("--lse: " + error);
  }
  if (lse != nullptr && !npy::CheckDestination(args.lse, &error)) {
    npy::DiscardTemp(o_temp);
    npy::DiscardTemp(lse_temp);
    return Error("--lse: " + error);
  }
  if (!npy::CommitTemp(o_temp, args.out, &error)) {
    npy::DiscardTemp(lse_temp);
    return Error("--out: " + error);
  }
  if (lse != nullptr && !npy::CommitTemp(lse_temp, args.lse, &error)) {
    return Error("--lse: " + error + "; --out '" + args.out +
                 "' was already replaced, so the outputs do not match");
  }
  if (args.verbose) {
    std::cerr << "simdattn: ran on " << info.target << std::endl;
  }
  return 0;
}

int Main(int argc, char** argv) {
  CLI::App app("Fused scaled dot-product attention on the CPU.", "simdattn");
  app.footer(
      "Exit status: 0 on success, 2 on any usage, input or library error, "
      "1 on an unexpected internal failure.\n");
  app.require_subcommand(1);
  CLI::App* info = app.add_subcommand(
      "info", "Print CPU features and the compiled, available and selected "
              "targets (SIMDATTN_MAX_TARGET caps the selection).");
  CLI::App* run = app.add_subcommand(
      "run", "Compute O = softmax(scale * Q K^T) V on 4-D .npy arrays "
             "('<f4' or '<f2').");
  RunArgs args;
  run->add_option("--q", args.q, "Q.npy: [B,Hq,Lq,Dk] (bhsd) or [B,Lq,Hq,Dk]")
      ->required();
  run->add_option("--k", args.k, "K.npy: [B,Hkv,Lk,Dk] or [B,Lk,Hkv,Dk]")
      ->required();
  run->add_option("--v", args.v, "V.npy: [B,Hkv,Lk,Dv] or [B,Lk,Hkv,Dv]")
      ->required();
  run->add_option("--out", args.out,
                  "O.npy to write ('<f4', same layout as the inputs)")
      ->required();
  CLI::Option* lse_opt = run->add_option(
      "--lse", args.lse, "LSE.npy to write ('<f4', [B,Hq,Lq])");
  run->add_option("--layout", args.layout,
                  "bhsd (default) or bshd: axis order of every array");
  run->add_option("--scale", args.scale,
                  "multiplies Q.K (default 1/sqrt(Dk)); finite, >= 0");
  run->add_option("--causal", args.causal,
                  "causal mask with alignment top-left or bottom-right");
  run->add_option("--align", args.align,
                  "query alignment (top-left or bottom-right) when not causal");
  CLI::Option* threads_opt =
      run->add_option("--threads", args.threads, "worker threads (1..1024)");
  run->add_option("--target", args.target,
                  "cap the code path (a name from `simdattn info`)");
  run->add_flag("--verbose", args.verbose,
                "print the target that ran on stderr");

  if (argc >= 2 && argv[1][0] != '-' && std::string(argv[1]) != "info" &&
      std::string(argv[1]) != "run") {
    return Error(std::string("unknown command '") + argv[1] +
                 "' (expected info or run; see simdattn --help)");
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    return Error(std::string(e.what()) + " (see simdattn --help)");
  }
  args.threads_given = threads_opt->count() > 0;
  args.lse_given = lse_opt->count() > 0;
  if (info->parsed()) return PrintInfo();
  if (run->parsed()) return RunAttention(args);
  return Error("no subcommand");
}

}  // namespace
}  // namespace simdattn

int main(int argc, char** argv) {
  try {
    return simdattn::Main(argc, argv);
  } catch (const std::bad_alloc&) {
    return simdattn::Error("out of memory");
  } catch (const std::exception& e) {
    std::cerr << "simdattn: internal error: " << e.what() << std::endl;
    return simdattn::kExitInternal;
  } catch (...) {
    std::cerr << "simdattn: internal error: unknown exception" << std::endl;
    return simdattn::kExitInternal;
  }
}
