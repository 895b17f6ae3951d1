// Unit tests of tools/npy: round trips, header versions, dtype conversion,
// every rejection of a malformed file, and the atomic writer's guarantees.

#include "tools/npy.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lib/dtype.h"

namespace simdattn {
namespace npy {
namespace {

namespace fs = std::filesystem;

// A fresh directory under $TMPDIR (or /tmp), removed with its contents.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base && *base ? base : "/tmp") +
                        "/simdattn_npy_test_XXXXXX";
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr) std::abort();
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string File(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }
  std::set<std::string> Entries() const {
    std::set<std::string> out;
    for (const auto& e : fs::directory_iterator(path_)) {
      out.insert(e.path().filename().string());
    }
    return out;
  }

 private:
  std::string path_;
};

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in),
                     std::istreambuf_iterator<char>());
}

// A v1.0 file with an arbitrary header dict (padded like NumPy does).
std::string RawFile(const std::string& dict, const std::string& payload,
                    int major = 1) {
  std::string header = dict;
  const size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::string out("\x93NUMPY", 6);
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  const uint32_t len = static_cast<uint32_t>(header.size());
  for (size_t i = 0; i < prefix - 8; ++i) {
    out.push_back(static_cast<char>((len >> (8 * i)) & 0xFF));
  }
  return out + header + payload;
}

std::string FloatBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

// Parses `bytes` and expects failure whose message names the file and holds
// `expect`.
void ExpectRejected(const std::string& bytes, const std::string& expect) {
  Array a;
  std::string error;
  EXPECT_FALSE(Parse("bad.npy", reinterpret_cast<const uint8_t*>(bytes.data()),
                     bytes.size(), &a, &error));
  EXPECT_NE(error.find("bad.npy: "), std::string::npos) << error;
  EXPECT_NE(error.find(expect), std::string::npos)
      << "message '" << error << "' lacks '" << expect << "'";
}

TEST(NpyTest, RoundTripsF32BitExactlyForSeveralShapes) {
  TempDir dir;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
  const std::vector<std::vector<int64_t>> shapes = {
      {2, 3, 4, 5}, {7}, {}, {0, 3}, {1, 1, 1, 1}, {3, 1, 17, 2}};
  for (const auto& shape : shapes) {
    int64_t n = 1;
    for (int64_t e : shape) n *= e;
    std::vector<float> data(static_cast<size_t>(n));
    for (float& x : data) x = dist(rng);
    if (n > 2) {
      data[0] = std::numeric_limits<float>::infinity();
      data[1] = -0.0f;
    }
    const std::string path = dir.File("a.npy");
    std::string error;
    ASSERT_TRUE(WriteF32(path, data.data(), shape, &error)) << error;
    const std::string bytes = ReadBytes(path);
    // NumPy's layout: 10-byte prefix + header padded to 64, then the data.
    ASSERT_GE(bytes.size(), 64u);
    EXPECT_EQ((bytes.size() - data.size() * 4) % 64, 0u);
    EXPECT_EQ(bytes[bytes.size() - data.size() * 4 - 1], '\n');
    Array a;
    ASSERT_TRUE(Read(path, &a, &error)) << error;
    EXPECT_EQ(a.descr, "<f4");
    EXPECT_EQ(a.type, ElementType::kF32);
    EXPECT_EQ(a.shape, shape);
    EXPECT_EQ(a.NumElements(), n);
    ASSERT_EQ(a.f32.size(), data.size());
    if (!data.empty()) {
      EXPECT_EQ(0, std::memcmp(a.f32.data(), data.data(), data.size() * 4));
    }
    // No temporary file is left behind.
    EXPECT_EQ(dir.Entries(), std::set<std::string>{"a.npy"});
  }
}

TEST(NpyTest, HeaderMatchesNumpyFormat) {
  const std::string h = MakeHeader("<f4", {2, 3}, 1);
  ASSERT_EQ(h.size() % 64, 0u);
  EXPECT_EQ(h.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_EQ(static_cast<uint8_t>(h[8]) | (static_cast<uint8_t>(h[9]) << 8),
            static_cast<int>(h.size() - 10));
  EXPECT_NE(h.find("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"),
            std::string::npos);
  EXPECT_EQ(h.back(), '\n');
  EXPECT_NE(MakeHeader("<f4", {5}, 1).find("(5,)"), std::string::npos);
  EXPECT_NE(MakeHeader("<f4", {}, 1).find("'shape': ()"), std::string::npos);
  const std::string h2 = MakeHeader("<f4", {2, 3}, 2);
  EXPECT_EQ(h2.size() % 64, 0u);
  EXPECT_EQ(h2[6], 2);
}

TEST(NpyTest, ReadsVersion2And3Headers) {
  const std::vector<float> v = {1.5f, -2.0f, 3.25f, 4.0f, 5.0f, 6.0f};
  for (int major : {2, 3}) {
    const std::string bytes =
        MakeHeader("<f4", {3, 2}, major) + FloatBytes(v);
    Array a;
    std::string error;
    ASSERT_TRUE(Parse("v.npy", reinterpret_cast<const uint8_t*>(bytes.data()),
                      bytes.size(), &a, &error))
        << error;
    EXPECT_EQ(a.shape, (std::vector<int64_t>{3, 2}));
    EXPECT_EQ(a.f32, v);
  }
}

TEST(NpyTest, AcceptsDictVariantsNumpyMayWrite) {
  // Other key order, double quotes, no trailing comma, Python 2 'L' suffix.
  const std::string payload = FloatBytes({1, 2, 3, 4, 5, 6});
  for (const std::string dict :
       {"{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}",
        "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2,3)}",
        "{'descr':'<f4','fortran_order':False,'shape':(2L, 3L),}"}) {
    const std::string bytes = RawFile(dict, payload);
    Array a;
    std::string error;
    ASSERT_TRUE(Parse("x.npy", reinterpret_cast<const uint8_t*>(bytes.data()),
                      bytes.size(), &a, &error))
        << dict << ": " << error;
    EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(a.f32[5], 6.0f);
  }
}

TEST(NpyTest, ConvertsF16ExactlyIncludingSpecials) {
  const std::vector<uint16_t> bits = {
      0x3C00,  // 1
      0xC100,  // -2.5
      0x7BFF,  // 65504
      0x0001,  // smallest subnormal 2^-24
      0x7C00,  // +inf
      0xFC00,  // -inf
      0x7E00,  // NaN
      0x8000,  // -0
  };
  std::string payload;
  for (uint16_t b : bits) {
    payload.push_back(static_cast<char>(b & 0xFF));
    payload.push_back(static_cast<char>(b >> 8));
  }
  const std::string bytes = MakeHeader("<f2", {2, 4}, 1) + payload;
  Array a;
  std::string error;
  ASSERT_TRUE(Parse("h.npy", reinterpret_cast<const uint8_t*>(bytes.data()),
                    bytes.size(), &a, &error))
      << error;
  EXPECT_EQ(a.descr, "<f2");
  EXPECT_EQ(a.type, ElementType::kF16);
  ASSERT_EQ(a.f32.size(), 8u);
  EXPECT_EQ(a.f32[0], 1.0f);
  EXPECT_EQ(a.f32[1], -2.5f);
  EXPECT_EQ(a.f32[2], 65504.0f);
  EXPECT_EQ(a.f32[3], std::ldexp(1.0f, -24));
  EXPECT_EQ(a.f32[4], std::numeric_limits<float>::infinity());
  EXPECT_EQ(a.f32[5], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(a.f32[6]));
  EXPECT_EQ(a.f32[7], 0.0f);
  EXPECT_TRUE(std::signbit(a.f32[7]));
  for (size_t i = 0; i < bits.size(); ++i) {
    if (i != 6) {
      EXPECT_EQ(a.f32[i], F16ToF32(bits[i])) << i;
    }
  }
}

TEST(NpyTest, ReturnsBoolAndU8Raw) {
  const std::string payload("\x00\x01\x01\x00\x01\x00", 6);
  for (const char* descr : {"|b1", "|u1"}) {
    const std::string bytes = MakeHeader(descr, {2, 3}, 1) + payload;
    Array a;
    std::string error;
    ASSERT_TRUE(Parse("m.npy", reinterpret_cast<const uint8_t*>(bytes.data()),
                      bytes.size(), &a, &error))
        << error;
    EXPECT_EQ(a.descr, descr);
    EXPECT_EQ(a.type, std::string(descr) == "|b1" ? ElementType::kBool
                                                  : ElementType::kU8);
    EXPECT_TRUE(a.f32.empty());
    EXPECT_EQ(std::string(a.bytes.begin(), a.bytes.end()), payload);
  }
}

TEST(NpyTest, RejectsMissingFileAndDirectory) {
  TempDir dir;
  Array a;
  std::string error;
  EXPECT_FALSE(Read(dir.File("missing.npy"), &a, &error));
  EXPECT_NE(error.find("missing.npy"), std::string::npos) << error;
  EXPECT_NE(error.find("No such file"), std::string::npos) << error;
  EXPECT_FALSE(Read(dir.path(), &a, &error));
  EXPECT_NE(error.find("not a regular file"), std::string::npos) << error;
}

TEST(NpyTest, RejectsBadMagicAndVersions) {
  const std::string good = MakeHeader("<f4", {2}, 1) + FloatBytes({1, 2});
  ExpectRejected("", "bad magic");
  ExpectRejected("\x93NUMP", "bad magic");
  std::string bad = good;
  bad[1] = 'X';
  ExpectRejected(bad, "bad magic");
  ExpectRejected(std::string("PK\x03\x04", 4) + good, "bad magic");  // .npz
  bad = good;
  bad[6] = 4;
  ExpectRejected(bad, "version 4.0");
  bad = good;
  bad[7] = 1;
  ExpectRejected(bad, "version 1.1");
}

TEST(NpyTest, RejectsTruncatedHeaderDataAndTrailingBytes) {
  const std::string header = MakeHeader("<f4", {2, 2}, 1);
  const std::string good = header + FloatBytes({1, 2, 3, 4});
  ExpectRejected(good.substr(0, 9), "truncated header");
  ExpectRejected(good.substr(0, 40), "truncated header");
  ExpectRejected(good.substr(0, good.size() - 1), "truncated data");
  ExpectRejected(header, "truncated data");
  ExpectRejected(good + "xyz", "3 unexpected bytes");
  // v2 with a header length far past the end of the file.
  std::string v2 = MakeHeader("<f4", {2, 2}, 2) + FloatBytes({1, 2, 3, 4});
  v2[11] = 0x7F;
  ExpectRejected(v2, "truncated header");
}

TEST(NpyTest, RejectsUnsupportedDtypesAndOrder) {
  const std::string payload = FloatBytes({1, 2});
  ExpectRejected(MakeHeader(">f4", {2}, 1) + payload, "big-endian");
  ExpectRejected(MakeHeader("<f8", {1}, 1) + payload, "unsupported dtype '<f8'");
  ExpectRejected(MakeHeader("<i4", {2}, 1) + payload, "unsupported dtype");
  ExpectRejected(MakeHeader("f4", {2}, 1) + payload, "unsupported dtype");
  ExpectRejected(RawFile("{'descr': '<f4', 'fortran_order': True, "
                         "'shape': (2,), }",
                         payload),
                 "fortran_order True");
  ExpectRejected(RawFile("{'descr': [('a', '<f4')], 'fortran_order': False, "
                         "'shape': (2,), }",
                         payload),
                 "structured");
}

TEST(NpyTest, RejectsAbsurdShapes) {
  // Element count overflows int64.
  ExpectRejected(MakeHeader("<f4", {1LL << 40, 1LL << 40}, 1), "overflows");
  // Extent itself overflows int64.
  ExpectRejected(RawFile("{'descr': '<f4', 'fortran_order': False, "
                         "'shape': (99999999999999999999,), }",
                         ""),
                 "overflows int64");
  // Element count fits, byte count does not.
  ExpectRejected(MakeHeader("<f4", {1LL << 62}, 1), "more bytes");
  // Fits, but far larger than the file: reported as truncated, no allocation.
  ExpectRejected(MakeHeader("<f4", {1LL << 20, 1LL << 20}, 1), "truncated data");
}

TEST(NpyTest, RejectsMalformedHeaders) {
  const std::string p = FloatBytes({1, 2});
  const struct {
    const char* dict;
    const char* expect;
  } kCases[] = {
      {"'descr': '<f4'", "not a dict"},
      {"{'descr': '<f4', 'fortran_order': False}", "lacks key 'shape'"},
      {"{'fortran_order': False, 'shape': (2,)}", "lacks key 'descr'"},
      {"{'descr': '<f4', 'shape': (2,)}", "lacks key 'fortran_order'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}",
       "unexpected key 'x'"},
      {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, "
       "'shape': (2,)}",
       "repeats key 'descr'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2)}", "trailing comma"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}",
       "non-negative integers"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': [2]}", "not a tuple"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,; }",
       "non-negative integers"},
      {"{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}",
       "neither True nor False"},
      {"{'descr': '<f4', 'fortran_order': Falsey, 'shape': (2,)}",
       "neither True nor False"},
      {"{'descr': '<f4 , 'fortran_order': False, 'shape': (2,)}",
       "malformed after key 'descr'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} junk",
       "text after the dict"},
      {"{descr: '<f4', 'fortran_order': False, 'shape': (2,)}",
       "key is not a string"},
      {"{'descr' '<f4', 'fortran_order': False, 'shape': (2,)}", "no ':'"},
      {"{'descr': '<f4' 'fortran_order': False, 'shape': (2,)}",
       "malformed after key 'descr'"},
  };
  for (const auto& c : kCases) {
    SCOPED_TRACE(c.dict);
    ExpectRejected(RawFile(c.dict, p), c.expect);
  }
  std::string with_nul = RawFile(
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", p);
  with_nul[30] = '\0';
  ExpectRejected(with_nul, "NUL");
}

TEST(NpyTest, ReplacesExistingFileAndUsesUmaskPermissions) {
  TempDir dir;
  const std::string path = dir.File("o.npy");
  WriteBytes(path, "old contents");
  const mode_t old_mask = ::umask(022);
  const std::vector<float> data = {1, 2, 3};
  std::string error;
  const bool ok = WriteF32(path, data.data(), {3}, &error);
  ::umask(old_mask);
  ASSERT_TRUE(ok) << error;
  Array a;
  ASSERT_TRUE(Read(path, &a, &error)) << error;
  EXPECT_EQ(a.f32, data);
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  EXPECT_EQ(dir.Entries(), std::set<std::string>{"o.npy"});
}

TEST(NpyTest, FailedWriteLeavesDestinationAndDirectoryUntouched) {
  TempDir dir;
  const std::vector<float> data = {1, 2, 3};
  std::string error;
  // Parent directory does not exist.
  EXPECT_FALSE(WriteF32(dir.File("nope/o.npy"), data.data(), {3}, &error));
  EXPECT_NE(error.find("nope/o.npy"), std::string::npos) << error;
  EXPECT_NE(error.find("No such file"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(dir.File("nope")));
  // Destination is a non-empty directory: rename fails, temp file removed.
  fs::create_directory(dir.File("d"));
  WriteBytes(dir.File("d/keep"), "x");
  EXPECT_FALSE(WriteF32(dir.File("d"), data.data(), {3}, &error));
  EXPECT_NE(error.find("cannot replace"), std::string::npos) << error;
  EXPECT_EQ(ReadBytes(dir.File("d/keep")), "x");
  EXPECT_EQ(dir.Entries(), std::set<std::string>{"d"});
  // Null data with a non-empty shape, and a negative extent.
  WriteBytes(dir.File("e.npy"), "keep me");
  EXPECT_FALSE(WriteF32(dir.File("e.npy"), nullptr, {3}, &error));
  EXPECT_FALSE(WriteF32(dir.File("e.npy"), data.data(), {-1}, &error));
  EXPECT_EQ(ReadBytes(dir.File("e.npy")), "keep me");
  EXPECT_EQ(dir.Entries(), (std::set<std::string>{"d", "e.npy"}));
}

TEST(NpyTest, NonRegularDestinationIsRejected) {
  TempDir dir;
  const std::vector<float> data = {1, 2, 3};
  std::string error;
  ASSERT_EQ(::mkfifo(dir.File("fifo").c_str(), 0600), 0);
  EXPECT_FALSE(WriteF32(dir.File("fifo"), data.data(), {3}, &error));
  EXPECT_NE(error.find("fifo"), std::string::npos) << error;
  EXPECT_NE(error.find("not a regular file"), std::string::npos) << error;
  EXPECT_TRUE(fs::is_fifo(dir.File("fifo")));
  EXPECT_EQ(dir.Entries(), std::set<std::string>{"fifo"});
  // The destination turns into a fifo between the temp file and the commit.
  std::string temp;
  ASSERT_TRUE(WriteF32Temp(dir.File("late"), data.data(), {3}, &temp, &error))
      << error;
  ASSERT_EQ(::mkfifo(dir.File("late").c_str(), 0600), 0);
  EXPECT_FALSE(CommitTemp(temp, dir.File("late"), &error));
  EXPECT_NE(error.find("not a regular file"), std::string::npos) << error;
  EXPECT_TRUE(fs::is_fifo(dir.File("late")));
  EXPECT_EQ(dir.Entries(), (std::set<std::string>{"fifo", "late"}));
}

TEST(NpyTest, CheckDestination) {
  TempDir dir;
  std::string error;
  EXPECT_TRUE(CheckDestination(dir.File("new.npy"), &error)) << error;
  WriteBytes(dir.File("f.npy"), "x");
  EXPECT_TRUE(CheckDestination(dir.File("f.npy"), &error)) << error;
  fs::create_symlink(dir.File("f.npy"), dir.File("link.npy"));
  EXPECT_TRUE(CheckDestination(dir.File("link.npy"), &error)) << error;
  EXPECT_FALSE(CheckDestination("", &error));
  EXPECT_NE(error.find("empty"), std::string::npos) << error;
  EXPECT_FALSE(CheckDestination(dir.File("new/"), &error));
  EXPECT_FALSE(CheckDestination(dir.File("f.npy/x.npy"), &error));
  EXPECT_NE(error.find("not a directory"), std::string::npos) << error;
  EXPECT_FALSE(CheckDestination(dir.File("nope/x.npy"), &error));
  EXPECT_NE(error.find("No such file"), std::string::npos) << error;
  EXPECT_FALSE(CheckDestination(dir.path(), &error));
  EXPECT_NE(error.find("a directory"), std::string::npos) << error;
  EXPECT_FALSE(CheckDestination("/dev/null", &error));
  EXPECT_NE(error.find("character device"), std::string::npos) << error;
}

TEST(NpyTest, TempThenDiscardLeavesNoTrace) {
  TempDir dir;
  const std::vector<float> data = {4, 5};
  WriteBytes(dir.File("o.npy"), "old");
  std::string temp, error;
  ASSERT_TRUE(WriteF32Temp(dir.File("o.npy"), data.data(), {2}, &temp, &error))
      << error;
  EXPECT_EQ(fs::path(temp).parent_path(), fs::path(dir.path()));
  EXPECT_EQ(ReadBytes(dir.File("o.npy")), "old");  // not replaced yet
  DiscardTemp(temp);
  EXPECT_EQ(dir.Entries(), std::set<std::string>{"o.npy"});
  ASSERT_TRUE(WriteF32Temp(dir.File("o.npy"), data.data(), {2}, &temp, &error));
  ASSERT_TRUE(CommitTemp(temp, dir.File("o.npy"), &error)) << error;
  Array a;
  ASSERT_TRUE(Read(dir.File("o.npy"), &a, &error)) << error;
  EXPECT_EQ(a.f32, data);
  EXPECT_EQ(dir.Entries(), std::set<std::string>{"o.npy"});
}

}  // namespace
}  // namespace npy
}  // namespace simdattn
