// Helpers of the command-line tests (see cli_util.h).

#include "tests/cli_util.h"

#include <sys/wait.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/dtype.h"
#include "lib/reference.h"
#include "tools/npy.h"

#ifndef SIMDATTN_CLI_PATH
#error "SIMDATTN_CLI_PATH must name the simdattn binary"
#endif

namespace simdattn {
namespace test {

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in),
                     std::istreambuf_iterator<char>());
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

CliResult RunCli(const std::string& args, const std::string& env) {
  TempDir io;
  const std::string cmd = env + "'" SIMDATTN_CLI_PATH "' " + args + " >'" +
                          io.File("stdout") + "' 2>'" + io.File("stderr") +
                          "' </dev/null";
  const int status = std::system(cmd.c_str());
  CliResult r;
  if (status != -1 && WIFEXITED(status)) {
    r.code = WEXITSTATUS(status);
  } else if (status != -1 && WIFSIGNALED(status)) {
    r.code = 128 + WTERMSIG(status);
  }
  r.out = ReadBytes(io.File("stdout"));
  r.err = ReadBytes(io.File("stderr"));
  return r;
}

std::vector<int64_t> FileShape(const Tensor& t, Layout layout) {
  return layout == Layout::kBHSD
             ? std::vector<int64_t>{t.shape[0], t.shape[1], t.shape[2],
                                    t.shape[3]}
             : std::vector<int64_t>{t.shape[0], t.shape[2], t.shape[1],
                                    t.shape[3]};
}

void WriteTensor(const std::string& path, const Tensor& t, Layout layout) {
  const char* descr = t.dtype == DType::kF16 ? "<f2" : "<f4";
  ASSERT_TRUE(t.dtype == DType::kF16 || t.dtype == DType::kF32);
  WriteBytes(path, npy::MakeHeader(descr, FileShape(t, layout), 1) +
                       std::string(t.bytes.begin(), t.bytes.end()));
}

std::string DimsString(const Dims& d) {
  return "B=" + std::to_string(d.b) + " Hq=" + std::to_string(d.hq) +
         " Hkv=" + std::to_string(d.hkv) + " Lq=" + std::to_string(d.lq) +
         " Lk=" + std::to_string(d.lk) + " Dk=" + std::to_string(d.dk) +
         " Dv=" + std::to_string(d.dv);
}

Tensor RoundedCopy(const Tensor& t, DType dtype, Layout layout) {
  if (dtype == DType::kF32) return t;
  Tensor out(dtype, t.shape[0], t.shape[1], t.shape[2], t.shape[3], layout);
  for (int64_t i0 = 0; i0 < t.shape[0]; ++i0) {
    for (int64_t i1 = 0; i1 < t.shape[1]; ++i1) {
      for (int64_t i2 = 0; i2 < t.shape[2]; ++i2) {
        for (int64_t i3 = 0; i3 < t.shape[3]; ++i3) {
          const float x = t.Get(i0, i1, i2, i3);
          const uint16_t h =
              dtype == DType::kF16 ? F32ToF16(x) : F32ToBF16(x);
          std::memcpy(out.bytes.data() + 2 * out.Index(i0, i1, i2, i3), &h,
                      2);
        }
      }
    }
  }
  return out;
}

DType Narrowest(DType a, DType b) {
  if (a == DType::kBF16 || b == DType::kBF16) return DType::kBF16;
  if (a == DType::kF16 || b == DType::kF16) return DType::kF16;
  return DType::kF32;
}

RunResult RunAndCheck(const RunSpec& spec) {
  SCOPED_TRACE(DimsString(spec.dims) + " layout=" +
               (spec.layout == Layout::kBHSD ? "bhsd" : "bshd") + " " +
               spec.extra);
  const Dims& d = spec.dims;
  std::mt19937 rng(spec.seed);
  Tensor q(spec.q_dtype, d.b, d.hq, d.lq, d.dk, spec.layout);
  Tensor k(spec.kv_dtype, d.b, d.hkv, d.lk, d.dk, spec.layout);
  Tensor v(spec.kv_dtype, d.b, d.hkv, d.lk, d.dv, spec.layout);
  q.FillUniform(&rng, -1.0f, 1.0f);
  k.FillUniform(&rng, -1.0f, 1.0f);
  v.FillUniform(&rng, -2.0f, 2.0f);
  TempDir dir;
  WriteTensor(dir.File("q.npy"), q, spec.layout);
  WriteTensor(dir.File("k.npy"), k, spec.layout);
  WriteTensor(dir.File("v.npy"), v, spec.layout);
  std::string args = "run --q " + dir.File("q.npy") + " --k " +
                     dir.File("k.npy") + " --v " + dir.File("v.npy") +
                     " --out " + dir.File("o.npy") + " --layout " +
                     (spec.layout == Layout::kBHSD ? "bhsd" : "bshd");
  if (spec.lse) args += " --lse " + dir.File("lse.npy");
  for (const InputFile& f : spec.files) {
    WriteBytes(dir.File(f.name), f.bytes);
    args += " " + f.flag + " " + dir.File(f.name);
  }
  args += " " + spec.extra;
  RunResult result;
  result.cli = RunCli(args);
  EXPECT_EQ(result.cli.code, 0) << result.cli.err;
  EXPECT_EQ(result.cli.out, "");
  if (spec.extra.find("--verbose") == std::string::npos) {
    EXPECT_EQ(result.cli.err, "");
  }
  if (result.cli.code != 0) return result;

  // The values as stored after the CLI's rounding (the files themselves
  // stay '<f4' / '<f2').
  const Tensor q_ref = RoundedCopy(q, spec.round_q, spec.layout);
  const Tensor k_ref = RoundedCopy(k, spec.round_kv, spec.layout);
  const Tensor v_ref = RoundedCopy(v, spec.round_kv, spec.layout);
  std::vector<double> o_ref, lse_ref;
  const Status s = ReferenceAttention(q_ref.View(), k_ref.View(),
                                      v_ref.View(), spec.options, &o_ref,
                                      &lse_ref);
  EXPECT_TRUE(s.ok()) << s.message;
  if (!s.ok()) return result;

  npy::Array o_file;
  std::string error;
  EXPECT_TRUE(npy::Read(dir.File("o.npy"), &o_file, &error)) << error;
  result.o_bytes = ReadBytes(dir.File("o.npy"));
  Tensor o(DType::kF32, d.b, d.hq, d.lq, d.dv, spec.layout);
  EXPECT_EQ(o_file.descr, "<f4");
  EXPECT_EQ(o_file.shape, FileShape(o, spec.layout));
  if (o_file.shape != FileShape(o, spec.layout)) return result;
  std::memcpy(o.bytes.data(), o_file.f32.data(), o.bytes.size());
  // SEMANTICS.md: the bound of the narrowest storage type among Q, K, V and
  // O (O is stored in Q's type); f16 files are f32 once widened.
  const DType narrowest = Narrowest(spec.round_q, spec.round_kv);
  const double bound = test::OutputBound(narrowest);
  const double err = test::MaxError(o, o_ref, test::MaxAbs(v_ref));
  EXPECT_LE(err, bound) << "narrowest " << DTypeName(narrowest);
  const bool qk_f32 =
      spec.round_q == DType::kF32 && spec.round_kv == DType::kF32;
  const double lse_bound = qk_f32 ? kLseBound : kLseBound16;

  std::set<std::string> expect_files = {"q.npy", "k.npy", "v.npy", "o.npy"};
  for (const InputFile& f : spec.files) expect_files.insert(f.name);
  if (spec.lse) {
    expect_files.insert("lse.npy");
    npy::Array lse;
    EXPECT_TRUE(npy::Read(dir.File("lse.npy"), &lse, &error)) << error;
    EXPECT_EQ(lse.shape, (std::vector<int64_t>{d.b, d.hq, d.lq}));
    if (lse.f32.size() == lse_ref.size()) {
      for (size_t i = 0; i < lse_ref.size(); ++i) {
        if (std::isinf(lse_ref[i])) {
          EXPECT_EQ(lse.f32[i], static_cast<float>(lse_ref[i])) << i;
        } else {
          EXPECT_LE(std::fabs(lse.f32[i] - lse_ref[i]), lse_bound)
              << "lse[" << i << "] = " << lse.f32[i] << ", ref "
              << lse_ref[i];
        }
      }
    }
  }
  // No temporary file is left next to the outputs.
  EXPECT_EQ(dir.Entries(), expect_files);
  return result;
}

}  // namespace test
}  // namespace simdattn
