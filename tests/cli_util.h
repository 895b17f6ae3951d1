// Helpers of the `simdattn` command-line tests: temporary directories, running
// the binary, .npy inputs, and RunAndCheck, which runs the tool on random
// inputs and holds its output to the reference within SEMANTICS.md's bounds.

#ifndef SIMDATTN_TESTS_CLI_UTIL_H_
#define SIMDATTN_TESTS_CLI_UTIL_H_

#include <stdlib.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include "simdattn/attention.h"
#include "tests/test_util.h"

namespace simdattn {
namespace test {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base && *base ? base : "/tmp") +
                        "/simdattn_cli_test_XXXXXX";
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr) std::abort();
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string File(const std::string& name) const { return path_ + "/" + name; }
  std::set<std::string> Entries() const {
    std::set<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path_)) {
      out.insert(e.path().filename().string());
    }
    return out;
  }

 private:
  std::string path_;
};

std::string ReadBytes(const std::string& path);
void WriteBytes(const std::string& path, const std::string& bytes);

struct CliResult {
  int code = -1;
  std::string out, err;
};

// Runs `simdattn <args>` through the shell; `env` prefixes the command
// (e.g. "env -u SIMDATTN_MAX_TARGET ").
CliResult RunCli(const std::string& args, const std::string& env = "");

// Shape of the file holding a [b, h, s, d] tensor in `layout`.
std::vector<int64_t> FileShape(const Tensor& t, Layout layout);

// Writes a dense test::Tensor (pad 0) as a .npy file ('<f4' or '<f2').
void WriteTensor(const std::string& path, const Tensor& t, Layout layout);

struct Dims {
  int64_t b, hq, hkv, lq, lk, dk, dv;
};

std::string DimsString(const Dims& d);

// An extra input file of a run, passed as `flag <dir>/<name>`.
struct InputFile {
  std::string flag;
  std::string name;
  std::string bytes;  // the complete .npy file
};

struct RunSpec {
  Dims dims;
  Layout layout = Layout::kBHSD;
  DType q_dtype = DType::kF32;
  DType kv_dtype = DType::kF32;
  bool lse = true;
  std::string extra;         // further CLI arguments
  std::vector<InputFile> files;  // further input files (mask, slopes, sinks)
  AttentionOptions options;  // what `extra` and `files` should mean
  uint32_t seed = 1;
  // Storage types the CLI is asked to round to (--dtype / --kv-dtype in
  // `extra`): the reference is given Q (and O's bound) and K/V rounded to
  // these with the same F32ToF16 / F32ToBF16, so it sees the values as stored.
  DType round_q = DType::kF32;
  DType round_kv = DType::kF32;
};

struct RunResult {
  CliResult cli;
  std::string o_bytes;  // the O file as written
};

// A dense copy of `t` (logical values as stored) in `dtype`, f16 or bf16
// values made with F32ToF16 / F32ToBF16 exactly as the CLI rounds its inputs;
// `t` itself when dtype is f32.
Tensor RoundedCopy(const Tensor& t, DType dtype, Layout layout);

// The narrowest of two storage types (bf16 < f16 < f32 in precision).
DType Narrowest(DType a, DType b);

// Runs the tool on random inputs and checks O (and LSE) against the
// reference. Checks that a successful run prints nothing unless --verbose.
RunResult RunAndCheck(const RunSpec& spec);

}  // namespace test
}  // namespace simdattn

#endif  // SIMDATTN_TESTS_CLI_UTIL_H_
