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

#include "lib/dtype.h"
#include "simdattn/attention.h"
#include "simdattn/serving.h"
#include "tools/mha_command.h"
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
  std::cout << "selected target: " << selected << std::endl;
  if (!s.ok()) return Error(s.message);  // a SIMDATTN_MAX_TARGET of no target
  const std::vector<std::string> available = AvailableTargets();
  if ((env == nullptr || env[0] == '\0') && !available.empty() &&
      available.front() == "AVX3_BF16" && selected != "AVX3_BF16") {
    std::cout << "note: AVX3_BF16 (native bf16 products) runs on this CPU only "
                 "when named: SIMDATTN_MAX_TARGET=AVX3_BF16" << std::endl;
  }
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
  // Storage types: --dtype for Q, K, V and O, --kv-dtype for K and V only.
  std::string dtype;
  std::string kv_dtype;
  bool dtype_given = false;
  bool kv_dtype_given = false;
  // Variant options, kept as text and parsed here (see ParseInt64 and
  // friends) so that every bad value gets a message naming its option.
  std::string mask;
  std::string kv_lens;
  std::string window_left;
  std::string window_right;
  std::string softcap;
  std::string alibi_slopes;
  std::string sinks;
  std::string dropout;
  std::string seed;
  bool mask_given = false;
  bool kv_lens_given = false;
  bool window_left_given = false;
  bool window_right_given = false;
  bool softcap_given = false;
  bool alibi_slopes_given = false;
  bool sinks_given = false;
  bool dropout_given = false;
  bool seed_given = false;
};

// ------------------------------------------------------------ numbers

// Parses a decimal integer: an optional '-' (when `allow_negative`) and one or
// more digits, nothing else (no spaces, '+', hex or exponent), within int64.
bool ParseInt64(const std::string& flag, const std::string& text,
                bool allow_negative, int64_t* out, std::string* error) {
  const bool negative = !text.empty() && text[0] == '-';
  const size_t first = negative ? 1 : 0;
  bool digits = text.size() > first;
  for (size_t i = first; i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9') digits = false;
  }
  if (!digits || (negative && !allow_negative)) {
    *error = flag + " must be " +
             (allow_negative ? "an integer" : "a non-negative integer") +
             ", got '" + text + "'";
    return false;
  }
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (errno == ERANGE || *end != '\0') {
    *error = flag + " is out of range, got '" + text + "'";
    return false;
  }
  *out = static_cast<int64_t>(value);
  return true;
}

// Parses a decimal uint64 (digits only).
bool ParseUint64(const std::string& flag, const std::string& text,
                 uint64_t* out, std::string* error) {
  bool digits = !text.empty();
  for (char c : text) {
    if (c < '0' || c > '9') digits = false;
  }
  if (!digits) {
    *error = flag + " must be a non-negative integer, got '" + text + "'";
    return false;
  }
  errno = 0;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  if (errno == ERANGE || *end != '\0') {
    *error = flag + " must be at most 18446744073709551615, got '" + text +
             "'";
    return false;
  }
  *out = static_cast<uint64_t>(value);
  return true;
}

// Parses a number (as strtod reads it) and rounds it to float; the whole
// text must be consumed.
bool ParseFloat(const std::string& flag, const std::string& text, float* out,
                std::string* error) {
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(begin, &end);
  if (text.empty() || end == begin || *end != '\0') {
    *error = flag + " must be a number, got '" + text + "'";
    return false;
  }
  *out = static_cast<float>(value);
  return true;
}

// Parses "a,b,..." into integers, each strictly as ParseInt64 (negative
// values are let through here and range-checked once Lk is known).
bool ParseIntList(const std::string& flag, const std::string& text,
                  std::vector<int64_t>* out, std::string* error) {
  out->clear();
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(
        start, comma == std::string::npos ? std::string::npos : comma - start);
    int64_t value;
    if (!ParseInt64(flag, item, /*allow_negative=*/true, &value, error)) {
      *error = flag + " must be a comma-separated list of integers, got '" +
               text + "' (bad item '" + item + "')";
      return false;
    }
    out->push_back(value);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return true;
}

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

// Parses a storage type name for `flag` (--dtype, --kv-dtype).
bool ParseStorageType(const std::string& flag, const std::string& text,
                      DType* out, std::string* error) {
  if (text == "f32") {
    *out = DType::kF32;
  } else if (text == "f16") {
    *out = DType::kF16;
  } else if (text == "bf16") {
    *out = DType::kBF16;
  } else {
    *error = flag + " must be f32, f16 or bf16, got '" + text + "'";
    return false;
  }
  return true;
}

// Parses --kv-dtype: a storage type or a quantized K/V format (int8, q8_0,
// fp8_e4m3, fp8_e5m2).
bool ParseKvType(const std::string& text, DType* out, std::string* error) {
  const struct {
    const char* name;
    DType dtype;
  } quantized[] = {{"int8", DType::kInt8},
                   {"q8_0", DType::kQ8_0},
                   {"fp8_e4m3", DType::kFp8E4M3},
                   {"fp8_e5m2", DType::kFp8E5M2}};
  for (const auto& q : quantized) {
    if (text == q.name) {
      *out = q.dtype;
      return true;
    }
  }
  if (ParseStorageType("--kv-dtype", text, out, error)) return true;
  *error = "--kv-dtype must be f32, f16, bf16, int8, q8_0, fp8_e4m3 or fp8_e5m2, got '" +
           text + "'";
  return false;
}

// The storage types of Q and O (`qo`) and of K and V (`kv`) from --dtype and
// --kv-dtype: --dtype sets all four, --kv-dtype sets K and V when --dtype is
// f32 (or absent); a non-f32 --dtype with a different --kv-dtype conflicts.
bool ParseStorageTypes(const RunArgs& args, DType* qo, DType* kv,
                       std::string* error) {
  *qo = DType::kF32;
  *kv = DType::kF32;
  if (args.dtype_given && !ParseStorageType("--dtype", args.dtype, qo, error)) {
    return false;
  }
  *kv = *qo;
  if (args.kv_dtype_given) {
    DType k;
    if (!ParseKvType(args.kv_dtype, &k, error)) {
      return false;
    }
    if (*qo != DType::kF32 && k != *qo) {
      *error = "--dtype " + args.dtype + " conflicts with --kv-dtype " +
               args.kv_dtype + " (--dtype sets K and V too; give the same "
               "type, or --dtype f32 for f32 Q and O)";
      return false;
    }
    *kv = k;
  }
  return true;
}

// `count` f32 values rounded to `dtype` (kF16 or kBF16), round to nearest
// even. Out of memory throws std::bad_alloc (main() reports it, exit 2).
void RoundTo16(DType dtype, const float* values, size_t count,
               std::vector<uint16_t>* out) {
  out->resize(count);
  uint16_t* dst = out->data();
  if (dtype == DType::kF16) {
    for (size_t i = 0; i < count; ++i) dst[i] = F32ToF16(values[i]);
  } else {
    for (size_t i = 0; i < count; ++i) dst[i] = F32ToBF16(values[i]);
  }
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

// A mask file and the view of it that Attention() reads.
struct MaskInput {
  npy::Array array;
  TensorView view;
};

// Loads --mask: '|b1' (1 = attend) or additive '<f4' / '<f2' ('<f2' is
// widened exactly to f32), of any shape that broadcasts to `full` =
// [B, Hq, Lq, Lk] by NumPy rules. The view has the shape padded on the left
// with 1s (extent 1 broadcasts) and dense row-major strides; the mask is in
// logical [B, Hq, Lq, Lk] order whatever the layout of Q, K and V.
bool LoadMask(const std::string& path, const int64_t full[4], MaskInput* mask,
              std::string* error) {
  const std::string flag = "--mask";
  if (!npy::Read(path, &mask->array, error)) {
    *error = flag + ": " + *error;
    return false;
  }
  const npy::Array& a = mask->array;
  DType dtype;
  const void* data;
  switch (a.type) {
    case npy::ElementType::kBool:
      dtype = DType::kBool;
      data = a.bytes.data();
      break;
    case npy::ElementType::kF32:
    case npy::ElementType::kF16:
      dtype = DType::kF32;
      data = a.f32.data();
      break;
    default:
      *error = flag + ": " + path + ": dtype '" + a.descr +
               "' is not supported (use '|b1' (1 = attend), or additive "
               "'<f4' or '<f2')";
      return false;
  }
  const std::string target =
      "[B, Hq, Lq, Lk] = " + npy::ShapeString({full[0], full[1], full[2],
                                               full[3]});
  const size_t rank = a.shape.size();
  if (rank > 4) {
    *error = flag + ": " + path + ": shape " + npy::ShapeString(a.shape) +
             " has more than 4 dimensions; it must broadcast to " + target;
    return false;
  }
  int64_t shape[4] = {1, 1, 1, 1};
  for (size_t i = 0; i < rank; ++i) shape[4 - rank + i] = a.shape[i];
  for (int i = 0; i < 4; ++i) {
    if (shape[i] != 1 && shape[i] != full[i]) {
      *error = flag + ": " + path + ": shape " + npy::ShapeString(a.shape) +
               " does not broadcast to " + target +
               " (dimensions align from the right; each must be 1 or equal)";
      return false;
    }
  }
  TensorView& v = mask->view;
  v.data = data;
  v.dtype = dtype;
  int64_t stride = 1;
  for (int i = 3; i >= 0; --i) {
    v.shape[i] = shape[i];
    v.strides[i] = shape[i] == 1 ? 0 : stride;
    stride *= shape[i];
  }
  return true;
}

// Loads a 1-D '<f4' array of `heads` values for `flag` (--alibi-slopes,
// --sinks).
bool LoadPerHead(const std::string& flag, const std::string& path,
                 int64_t heads, npy::Array* array, std::string* error) {
  if (!npy::Read(path, array, error)) {
    *error = flag + ": " + *error;
    return false;
  }
  if (array->type != npy::ElementType::kF32) {
    *error = flag + ": " + path + ": dtype '" + array->descr +
             "' is not supported (use '<f4')";
    return false;
  }
  if (array->shape.size() != 1 || array->shape[0] != heads) {
    *error = flag + ": " + path + ": shape " + npy::ShapeString(array->shape) +
             " must be (Hq,) = (" + std::to_string(heads) + ",)";
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
  const Named inputs[] = {{"--q", &args.q},
                          {"--k", &args.k},
                          {"--v", &args.v},
                          {"--mask", &args.mask},
                          {"--alibi-slopes", &args.alibi_slopes},
                          {"--sinks", &args.sinks}};
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

// Parses the variant options given as text (everything but the files, and
// the checks that need the shapes) into `options` and `kv_lens`.
bool ParseVariantText(const RunArgs& args, AttentionOptions* options,
                      std::vector<int64_t>* kv_lens, std::string* error) {
  if (args.kv_lens_given &&
      !ParseIntList("--kv-lens", args.kv_lens, kv_lens, error)) {
    return false;
  }
  if (args.window_left_given &&
      !ParseInt64("--window-left", args.window_left, /*allow_negative=*/true,
                  &options->window_left, error)) {
    return false;
  }
  if (args.window_right_given &&
      !ParseInt64("--window-right", args.window_right,
                  /*allow_negative=*/true, &options->window_right, error)) {
    return false;
  }
  if (args.softcap_given) {
    float c;
    if (!ParseFloat("--softcap", args.softcap, &c, error)) return false;
    if (!std::isfinite(c) || c < 0.0f) {
      *error = "--softcap must be finite and >= 0, got '" + args.softcap + "'";
      return false;
    }
    options->softcap = c;
  }
  if (args.dropout_given) {
    float p;
    if (!ParseFloat("--dropout", args.dropout, &p, error)) return false;
    // Checked after rounding to float: 0.9999999999 rounds to 1.
    if (!(p >= 0.0f && p < 1.0f)) {
      *error = "--dropout must be in [0, 1), got '" + args.dropout + "'";
      return false;
    }
    options->dropout_p = p;
  }
  if (args.seed_given &&
      !ParseUint64("--seed", args.seed, &options->dropout_seed, error)) {
    return false;
  }
  const std::pair<const char*, bool> paths[] = {
      {"--mask", args.mask_given && args.mask.empty()},
      {"--alibi-slopes", args.alibi_slopes_given && args.alibi_slopes.empty()},
      {"--sinks", args.sinks_given && args.sinks.empty()}};
  for (const auto& p : paths) {
    if (p.second) {
      *error = std::string(p.first) + ": empty path";
      return false;
    }
  }
  return true;
}

// The settings of a run that come from text options alone, parsed and
// checked before any file is read.
struct RunConfig {
  bool bshd = false;
  AttentionOptions options;
  std::vector<int64_t> kv_lens;  // options.kv_lengths points here once checked
  DType qo_type = DType::kF32;   // storage of Q and O
  DType kv_type = DType::kF32;   // storage of K and V
};

// Parses --scale: a number (as strtod reads it) that is finite and >= 0
// once rounded to float.
bool ParseScale(const std::string& text, float* scale, std::string* error) {
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(begin, &end);
  const float f = static_cast<float>(value);
  if (end == begin || *end != '\0') {
    *error = "--scale must be a number, got '" + text + "'";
    return false;
  }
  if (!std::isfinite(f) || f < 0.0f) {
    *error = "--scale must be finite and >= 0, got '" + text + "'";
    return false;
  }
  *scale = f;
  return true;
}

// Parses --causal and --align into the options' causal flag and alignment.
bool ParseCausalAndAlign(const RunArgs& args, AttentionOptions* options,
                         std::string* error) {
  if (!args.causal.empty()) {
    Alignment align;
    if (!ParseAlignment("--causal", args.causal, &align, error)) return false;
    options->causal = true;
    options->alignment = align;
  }
  if (!args.align.empty()) {
    Alignment align;
    if (!ParseAlignment("--align", args.align, &align, error)) return false;
    if (options->causal && align != options->alignment) {
      *error = "--causal " + args.causal + " conflicts with --align " +
               args.align;
      return false;
    }
    options->alignment = align;
  }
  return true;
}

// Parses and checks every text option, then both destinations, then applies
// --target; the first problem found is the one reported.
bool ParseRunConfig(const RunArgs& args, RunConfig* config,
                    std::string* error) {
  config->bshd = args.layout == "bshd";
  if (!config->bshd && args.layout != "bhsd") {
    *error = "--layout must be bhsd or bshd, got '" + args.layout + "'";
    return false;
  }
  AttentionOptions& options = config->options;
  if (!args.scale.empty()) {
    float scale;
    if (!ParseScale(args.scale, &scale, error)) return false;
    options.scale = scale;
  }
  if (!ParseCausalAndAlign(args, &options, error)) return false;
  if (args.threads_given &&
      (args.threads < 1 || args.threads > kMaxThreads)) {
    *error = "--threads must be in 1.." + std::to_string(kMaxThreads) +
             ", got " + std::to_string(args.threads);
    return false;
  }
  if (!ParseVariantText(args, &options, &config->kv_lens, error) ||
      !ParseStorageTypes(args, &config->qo_type, &config->kv_type, error) ||
      !CheckOutputs(args, error)) {
    return false;
  }
  if (!args.target.empty()) {
    const Status s = SetMaxTarget(args.target.c_str());
    if (!s.ok()) {
      *error = "--target: " + s.message;
      return false;
    }
  }
  return true;
}

// K or V in a quantized format: QuantizeKv's output, dense [B, H, L, D]
// (q8_0: rows of D / 32 blocks), int8's per-row scales, fp8's scale.
struct QuantizedInput {
  std::vector<uint8_t> bytes;
  std::vector<float> scales;  // int8: [B, H, L]
  float scale = 1.0f;         // fp8
  TensorView scales_view;     // int8 only
};

// Q, K and V as read from their files, and the views Attention() reads.
// Inputs are rounded to their storage type (round to nearest even) into
// 16-bit copies in the file's element order, so the views keep the file's
// layout; a quantized K/V type (--kv-dtype int8, ...) is QuantizeKv's
// dense copy instead. Not copyable: the views point into the arrays.
struct InputTensors {
  npy::Array q, k, v;
  std::vector<uint16_t> q16, k16, v16;
  QuantizedInput k8, v8;
  std::vector<int64_t> lq, lk, lv;  // logical [B, H, L, D] of each
  TensorView qv, kv, vv;

  InputTensors() = default;
  InputTensors(const InputTensors&) = delete;
  InputTensors& operator=(const InputTensors&) = delete;
};

// Logical [B, H, L, D] of a file array in the chosen layout.
std::vector<int64_t> LogicalShape(const npy::Array& a, bool bshd) {
  const std::vector<int64_t>& s = a.shape;
  return bshd ? std::vector<int64_t>{s[0], s[2], s[1], s[3]} : s;
}

TensorView MakeInputView(const npy::Array& a, DType dtype, bool bshd,
                         std::vector<uint16_t>* rounded,
                         const std::vector<int64_t>& l) {
  const void* data = a.f32.data();
  if (dtype != DType::kF32) {
    RoundTo16(dtype, a.f32.data(), a.f32.size(), rounded);
    data = rounded->data();
  }
  return bshd ? MakeBSHD(data, dtype, l[0], l[1], l[2], l[3])
              : MakeBHSD(data, dtype, l[0], l[1], l[2], l[3]);
}

// The f32 view `wide` stored by QuantizeKv in `dtype` (a quantized K/V
// format) into *out: int8 with a scale per row, fp8 with the per-tensor
// scale max|x| / 448 (e4m3) or / 57344 (e5m2), 1 for an all-zero or
// non-finite tensor. Returns the quantized view, or data null with *error.
TensorView Quantize(const char* flag, const TensorView& wide, DType dtype,
                    QuantizedInput* out, std::string* error) {
  const int64_t* l = wide.shape;
  const int64_t rows = l[0] * l[1] * l[2];
  const int64_t row_bytes =
      dtype == DType::kQ8_0 ? l[3] / 32 * 34 : l[3];  // int8 and fp8: a byte each
  out->bytes.assign(static_cast<size_t>(rows * row_bytes), 0);
  MutableTensorView q = MakeBHSD(out->bytes.data(), dtype, l[0], l[1], l[2], l[3]);
  if (dtype == DType::kQ8_0) {
    const int64_t st[3] = {l[1] * l[2] * row_bytes, l[2] * row_bytes, row_bytes};
    for (int i = 0; i < 3; ++i) q.strides[i] = st[i];
  }
  MutableTensorView sv;
  if (dtype == DType::kInt8) {
    out->scales.assign(static_cast<size_t>(rows), 0.0f);
    sv = MakeBHSD(out->scales.data(), DType::kF32, l[0], l[1], l[2], 1);
    out->scales_view = sv;
  }
  if (dtype == DType::kFp8E4M3 || dtype == DType::kFp8E5M2) {
    float amax = 0.0f;
    const float* x = static_cast<const float*>(wide.data);
    // The file's element order: every element once, whatever the layout.
    for (int64_t i = 0; i < rows * l[3] && std::isfinite(amax); ++i) {
      amax = std::isnan(x[i]) ? x[i] : std::fmax(amax, std::fabs(x[i]));
    }
    const float max = dtype == DType::kFp8E4M3 ? 448.0f : 57344.0f;
    out->scale = std::isfinite(amax) && amax > 0.0f ? amax / max : 1.0f;
  }
  const Status s = QuantizeKv(wide, q, sv, out->scale);
  if (!s.ok()) {
    *error = std::string(flag) + " as --kv-dtype " + DTypeName(dtype) + ": " + s.message;
    return TensorView();
  }
  return q;
}

bool LoadInputs(const RunArgs& args, const RunConfig& config,
                InputTensors* in, std::string* error) {
  if (!LoadInput("--q", args.q, &in->q, error) ||
      !LoadInput("--k", args.k, &in->k, error) ||
      !LoadInput("--v", args.v, &in->v, error)) {
    return false;
  }
  in->lq = LogicalShape(in->q, config.bshd);
  in->lk = LogicalShape(in->k, config.bshd);
  in->lv = LogicalShape(in->v, config.bshd);
  in->qv = MakeInputView(in->q, config.qo_type, config.bshd, &in->q16, in->lq);
  const bool quantized = config.kv_type == DType::kInt8 ||
                         config.kv_type == DType::kQ8_0 ||
                         config.kv_type == DType::kFp8E4M3 ||
                         config.kv_type == DType::kFp8E5M2;
  const DType wide = quantized ? DType::kF32 : config.kv_type;
  in->kv = MakeInputView(in->k, wide, config.bshd, &in->k16, in->lk);
  in->vv = MakeInputView(in->v, wide, config.bshd, &in->v16, in->lv);
  if (quantized) {
    in->kv = Quantize("--k", in->kv, config.kv_type, &in->k8, error);
    if (in->kv.data == nullptr) return false;
    in->vv = Quantize("--v", in->vv, config.kv_type, &in->v8, error);
    if (in->vv.data == nullptr) return false;
  }
  return true;
}

// The files of the variant options, which the options point into.
struct VariantFiles {
  MaskInput mask;
  npy::Array alibi, sinks;
};

// Checks --kv-lens against `full` = [B, Hq, Lq, Lk] (the logical shapes of
// Q and K, which Attention() checks against each other), loads the variant
// files, and points the options at them.
bool LoadVariantInputs(const RunArgs& args, const int64_t full[4],
                       RunConfig* config, VariantFiles* files,
                       std::string* error) {
  AttentionOptions& options = config->options;
  const std::vector<int64_t>& kv_lens = config->kv_lens;
  if (args.kv_lens_given) {
    if (static_cast<int64_t>(kv_lens.size()) != full[0]) {
      *error = "--kv-lens has " + std::to_string(kv_lens.size()) +
               " values, expected B = " + std::to_string(full[0]);
      return false;
    }
    for (size_t i = 0; i < kv_lens.size(); ++i) {
      if (kv_lens[i] < 0 || kv_lens[i] > full[3]) {
        *error = "--kv-lens value " + std::to_string(i) + " is " +
                 std::to_string(kv_lens[i]) + ", must be in [0, Lk = " +
                 std::to_string(full[3]) + "]";
        return false;
      }
    }
    options.kv_lengths = kv_lens.data();
  }
  if (args.mask_given) {
    if (!LoadMask(args.mask, full, &files->mask, error)) return false;
    options.mask = files->mask.view;
  }
  if (args.alibi_slopes_given) {
    if (!LoadPerHead("--alibi-slopes", args.alibi_slopes, full[1],
                     &files->alibi, error)) {
      return false;
    }
    options.alibi_slopes = files->alibi.f32.data();
  }
  if (args.sinks_given) {
    if (!LoadPerHead("--sinks", args.sinks, full[1], &files->sinks, error)) {
      return false;
    }
    options.sinks = files->sinks.f32.data();
  }
  return true;
}

// O (f32, as written to its file, and in its storage type when that is
// 16-bit) and LSE, with the views Attention() writes.
struct OutputBuffers {
  std::vector<int64_t> o_logical;  // [B, Hq, Lq, Dv]
  int64_t o_count = 0;
  std::unique_ptr<float[]> o;
  std::unique_ptr<float[]> lse;
  std::unique_ptr<uint16_t[]> o16;
  MutableTensorView ov, lsev;
};

// O is [B, Hq, Lq, Dv]; its extents come from Q and V, which Attention()
// checks against each other before writing anything. A 16-bit O is computed
// in its storage type and widened (exactly) to f32 for the '<f4' file.
bool AllocateOutputs(const RunArgs& args, const RunConfig& config,
                     const InputTensors& in, OutputBuffers* out,
                     std::string* error) {
  const int64_t b = in.lq[0], hq = in.lq[1], seq_q = in.lq[2], dv = in.lv[3];
  out->o_logical = {b, hq, seq_q, dv};
  int64_t o_count = 1, lse_count = 1;
  for (size_t i = 0; i < out->o_logical.size(); ++i) {
    const int64_t e = out->o_logical[i];
    if (e < 0 || (e > 0 && o_count > INT64_MAX / 4 / e)) {
      *error = "output shape " + npy::ShapeString(out->o_logical) +
               " is too large";
      return false;
    }
    o_count *= e;
    if (i < 3) lse_count *= e;  // equals o_count so far: checked
  }
  out->o_count = o_count;
  // Not value-initialized: pages of a huge, rejected output are never touched.
  out->o.reset(new (std::nothrow) float[static_cast<size_t>(o_count) + 1]);
  if (!args.lse.empty()) {
    out->lse.reset(new (std::nothrow)
                       float[static_cast<size_t>(lse_count) + 1]);
  }
  const DType qo_type = config.qo_type;
  if (qo_type != DType::kF32) {
    out->o16.reset(new (std::nothrow)
                       uint16_t[static_cast<size_t>(o_count) + 1]);
  }
  if (out->o == nullptr || (!args.lse.empty() && out->lse == nullptr) ||
      (qo_type != DType::kF32 && out->o16 == nullptr)) {
    *error = "out of memory allocating the output";
    return false;
  }
  void* o_data = out->o16 != nullptr ? static_cast<void*>(out->o16.get())
                                     : static_cast<void*>(out->o.get());
  out->ov = config.bshd ? MakeBSHD(o_data, qo_type, b, hq, seq_q, dv)
                        : MakeBHSD(o_data, qo_type, b, hq, seq_q, dv);
  if (out->lse != nullptr) {
    out->lsev = MakeBHSD(out->lse.get(), DType::kF32, b, hq, seq_q, 1);
  }
  return true;
}

// Runs Attention() on --threads workers (or the caller's thread) and widens
// a 16-bit O into the f32 buffer; *target names the code path that ran.
bool Compute(const RunArgs& args, const RunConfig& config,
             const InputTensors& in, OutputBuffers* out, std::string* target,
             std::string* error) {
  std::unique_ptr<ThreadPool> pool;
  ExecutionOptions exec;
  if (args.threads_given) {
    try {
      pool.reset(new ThreadPool(args.threads));
    } catch (const std::system_error& e) {
      *error = "cannot start " + std::to_string(args.threads) +
               " threads: " + e.what();
      return false;
    }
    exec.pool = pool.get();
  }
  simdattn::RunInfo info;
  AttentionOptions options = config.options;  // with a quantized K/V's scales
  options.k_scales = in.k8.scales_view;
  options.v_scales = in.v8.scales_view;
  options.k_scale = in.k8.scale;
  options.v_scale = in.v8.scale;
  const Status s = Attention(in.qv, in.kv, in.vv, out->ov, options,
                             out->lsev, exec, &info);
  if (!s.ok()) {
    *error = std::string(StatusCodeName(s.code)) + ": " + s.message;
    if (s.message.rfind("alignment is unset", 0) == 0) {
      *error += " (--align or --causal)";
    }
    if (config.bshd && s.code == StatusCode::kInvalidArgument) {
      *error += " (shapes are logical [B, H, L, D]; bshd files hold "
                "[B, L, H, D])";
    }
    return false;
  }
  if (out->o16 != nullptr) {
    // Dense in the file's element order, like the f32 buffer.
    const size_t n = static_cast<size_t>(out->o_count);
    for (size_t i = 0; i < n; ++i) {
      out->o[i] = config.qo_type == DType::kF16 ? F16ToF32(out->o16[i])
                                                : BF16ToF32(out->o16[i]);
    }
  }
  *target = info.target;
  return true;
}

// Prepares both files completely before replacing either destination, and
// checks both destinations again just before the first rename. Residual
// risk: two renames are not one atomic step, so if LSE's rename still fails
// after O's succeeded (the destination changed in between, or an I/O
// error), O has been replaced; the message then says so.
bool WriteOutputs(const RunArgs& args, bool bshd, const OutputBuffers& out,
                  std::string* error) {
  const std::vector<int64_t>& l = out.o_logical;
  const std::vector<int64_t> o_file =
      bshd ? std::vector<int64_t>{l[0], l[2], l[1], l[3]} : l;
  std::string o_temp, lse_temp, e;
  if (!npy::WriteF32Temp(args.out, out.o.get(), o_file, &o_temp, &e)) {
    *error = "--out: " + e;
    return false;
  }
  if (out.lse != nullptr &&
      !npy::WriteF32Temp(args.lse, out.lse.get(), {l[0], l[1], l[2]},
                         &lse_temp, &e)) {
    npy::DiscardTemp(o_temp);
    *error = "--lse: " + e;
    return false;
  }
  if (out.lse != nullptr && !npy::CheckDestination(args.lse, &e)) {
    npy::DiscardTemp(o_temp);
    npy::DiscardTemp(lse_temp);
    *error = "--lse: " + e;
    return false;
  }
  if (!npy::CommitTemp(o_temp, args.out, &e)) {
    npy::DiscardTemp(lse_temp);
    *error = "--out: " + e;
    return false;
  }
  if (out.lse != nullptr && !npy::CommitTemp(lse_temp, args.lse, &e)) {
    *error = "--lse: " + e + "; --out '" + args.out +
             "' was already replaced, so the outputs do not match";
    return false;
  }
  return true;
}

int RunAttention(const RunArgs& args) {
  std::string error;
  RunConfig config;
  if (!ParseRunConfig(args, &config, &error)) return Error(error);
  InputTensors in;
  if (!LoadInputs(args, config, &in, &error)) return Error(error);
  const int64_t full[4] = {in.lq[0], in.lq[1], in.lq[2], in.lk[2]};
  VariantFiles files;
  if (!LoadVariantInputs(args, full, &config, &files, &error)) {
    return Error(error);
  }
  OutputBuffers out;
  std::string target;
  if (!AllocateOutputs(args, config, in, &out, &error) ||
      !Compute(args, config, in, &out, &target, &error) ||
      !WriteOutputs(args, config.bshd, out, &error)) {
    return Error(error);
  }
  if (args.verbose) {
    std::cerr << "simdattn: ran on " << target << std::endl;
  }
  return 0;
}

// ------------------------------------------------------------ command line

// The `run` options whose presence RunArgs records (an empty or default
// value is not the same as the option left out).
struct GivenOptions {
  CLI::Option* threads = nullptr;
  CLI::Option* lse = nullptr;
  CLI::Option* mask = nullptr;
  CLI::Option* kv_lens = nullptr;
  CLI::Option* window_left = nullptr;
  CLI::Option* window_right = nullptr;
  CLI::Option* softcap = nullptr;
  CLI::Option* alibi_slopes = nullptr;
  CLI::Option* sinks = nullptr;
  CLI::Option* dropout = nullptr;
  CLI::Option* seed = nullptr;
  CLI::Option* dtype = nullptr;
  CLI::Option* kv_dtype = nullptr;
};

// The inputs, outputs, layout and scale of `run`.
void AddRunTensorOptions(CLI::App* run, RunArgs* args, GivenOptions* given) {
  run->add_option("--q", args->q, "Q.npy: [B,Hq,Lq,Dk] (bhsd) or [B,Lq,Hq,Dk]")
      ->required();
  run->add_option("--k", args->k, "K.npy: [B,Hkv,Lk,Dk] or [B,Lk,Hkv,Dk]")
      ->required();
  run->add_option("--v", args->v, "V.npy: [B,Hkv,Lk,Dv] or [B,Lk,Hkv,Dv]")
      ->required();
  run->add_option("--out", args->out,
                  "O.npy to write ('<f4', same layout as the inputs)")
      ->required();
  given->lse = run->add_option(
      "--lse", args->lse, "LSE.npy to write ('<f4', [B,Hq,Lq])");
  run->add_option("--layout", args->layout,
                  "bhsd (default) or bshd: axis order of every array");
  run->add_option("--scale", args->scale,
                  "multiplies Q.K (default 1/sqrt(Dk)); finite, >= 0");
}

// The SEMANTICS.md options of `run`: masks, windows and score terms.
void AddRunVariantOptions(CLI::App* run, RunArgs* args, GivenOptions* given) {
  run->add_option("--causal", args->causal,
                  "causal mask with alignment top-left or bottom-right");
  run->add_option("--align", args->align,
                  "query alignment (top-left or bottom-right) when not causal; "
                  "used by --window-left/right and --alibi-slopes, and "
                  "required by them when Lq != Lk or with --kv-lens");
  given->mask = run->add_option(
      "--mask", args->mask,
      "M.npy: '|b1' (1 = attend) or additive '<f4'/'<f2' mask of any shape "
      "that broadcasts to [B,Hq,Lq,Lk] (NumPy rules; logical order in "
      "either layout)");
  given->kv_lens = run->add_option(
      "--kv-lens", args->kv_lens,
      "a,b,...: B valid key counts in [0, Lk]; later keys are hidden");
  given->window_left = run->add_option(
      "--window-left", args->window_left,
      "sliding window: keys j >= p(i) - N are visible (negative: "
      "unbounded; p(i) from --causal or --align)");
  given->window_right = run->add_option(
      "--window-right", args->window_right,
      "sliding window: keys j <= p(i) + N are visible (negative: "
      "unbounded)");
  given->softcap = run->add_option(
      "--softcap", args->softcap,
      "logit softcap C: s = C * tanh(s / C); finite, >= 0 (0 = off)");
  given->alibi_slopes = run->add_option(
      "--alibi-slopes", args->alibi_slopes,
      "A.npy: '<f4' of shape (Hq,); s -= A[h] * |p(i) - j|");
  given->sinks = run->add_option(
      "--sinks", args->sinks,
      "S.npy: '<f4' of shape (Hq,); sink logits that only enlarge the "
      "softmax denominator");
  given->dropout = run->add_option(
      "--dropout", args->dropout, "dropout probability P in [0, 1) (0 = off)");
  given->seed = run->add_option(
      "--seed", args->seed, "dropout seed, an integer in [0, 2^64) (default 0)");
}

// How `run` executes: threads, target, storage types, verbosity.
void AddRunExecutionOptions(CLI::App* run, RunArgs* args,
                            GivenOptions* given) {
  given->threads =
      run->add_option("--threads", args->threads, "worker threads (1..1024)");
  run->add_option("--target", args->target,
                  "cap the code path (a name from `simdattn info`)");
  given->dtype = run->add_option(
      "--dtype", args->dtype,
      "f32 (default), f16 or bf16: storage type of Q, K, V and O (inputs "
      "rounded to it, O widened to '<f4' when written)");
  given->kv_dtype = run->add_option(
      "--kv-dtype", args->kv_dtype,
      "f32 (default), f16 or bf16: storage type of K and V only (inputs "
      "rounded to it); or int8, q8_0, fp8_e4m3, fp8_e5m2: K and V quantized "
      "with QuantizeKv (int8 a scale per row, q8_0 per block of 32, fp8 "
      "with scale max|x| / 448 or / 57344); with a non-f32 --dtype it must "
      "agree");
  run->add_flag("--verbose", args->verbose,
                "print the target that ran on stderr");
}

// Records in `args` which of the options were given.
void NoteGivenOptions(const GivenOptions& given, RunArgs* args) {
  args->threads_given = given.threads->count() > 0;
  args->lse_given = given.lse->count() > 0;
  args->mask_given = given.mask->count() > 0;
  args->kv_lens_given = given.kv_lens->count() > 0;
  args->window_left_given = given.window_left->count() > 0;
  args->window_right_given = given.window_right->count() > 0;
  args->softcap_given = given.softcap->count() > 0;
  args->alibi_slopes_given = given.alibi_slopes->count() > 0;
  args->sinks_given = given.sinks->count() > 0;
  args->dropout_given = given.dropout->count() > 0;
  args->seed_given = given.seed->count() > 0;
  args->dtype_given = given.dtype->count() > 0;
  args->kv_dtype_given = given.kv_dtype->count() > 0;
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
      "run", "Compute O = softmax(scale * Q K^T + options) V on 4-D .npy "
             "arrays ('<f4' or '<f2'); docs/SEMANTICS.md defines every "
             "option.");
  RunArgs args;
  GivenOptions given;
  AddRunTensorOptions(run, &args, &given);
  AddRunVariantOptions(run, &args, &given);
  AddRunExecutionOptions(run, &args, &given);
  MhaArgs mha_args;
  CLI::App* mha = AddMhaCommand(&app, &mha_args);

  if (argc >= 2 && argv[1][0] != '-' && std::string(argv[1]) != "info" &&
      std::string(argv[1]) != "run" && std::string(argv[1]) != "mha") {
    return Error(std::string("unknown command '") + argv[1] +
                 "' (expected info, run or mha; see simdattn --help)");
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    return Error(std::string(e.what()) + " (see simdattn --help)");
  }
  NoteGivenOptions(given, &args);
  if (info->parsed()) return PrintInfo();
  if (run->parsed()) return RunAttention(args);
  if (mha->parsed()) return RunMha(mha_args);
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
