// libFuzzer target: the .npy reader (tools/npy.cc) on arbitrary bytes.
// Parse must return an error or an array that agrees with itself: as many
// values as its shape implies, of the type its descr names; a parsed
// array's header, rebuilt by MakeHeader with the bytes of its values, must
// parse back to the same array.

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "tools/npy.h"

namespace {

using simdattn::fuzz::Fail;
using simdattn::npy::Array;
using simdattn::npy::ElementType;

// The payload of `a` as the file stores it (f16 arrays are written back as
// f32: MakeHeader then names '<f4').
std::vector<uint8_t> Payload(const Array& a, std::string* descr) {
  std::vector<uint8_t> out;
  if (a.type == ElementType::kF32 || a.type == ElementType::kF16) {
    *descr = "<f4";
    out.resize(a.f32.size() * 4);
    if (!out.empty()) std::memcpy(out.data(), a.f32.data(), out.size());
  } else {
    *descr = a.descr;
    out = a.bytes;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Array a;
  std::string error;
  if (!simdattn::npy::Parse("fuzz.npy", data, size, &a, &error)) {
    if (error.empty()) Fail("Parse failed without a message", "");
    return 0;
  }
  const int64_t n = a.NumElements();
  const bool floats = a.type == ElementType::kF32 || a.type == ElementType::kF16;
  const size_t got = floats ? a.f32.size() : a.bytes.size();
  if (n < 0 || got != static_cast<size_t>(n)) {
    Fail("array of " + std::to_string(n) + " elements holds " + std::to_string(got),
         simdattn::npy::ShapeString(a.shape));
  }
  if ((floats ? !a.bytes.empty() : !a.f32.empty())) Fail("values in the wrong member", a.descr);
  // Round trip through the writer's header.
  std::string descr;
  const std::vector<uint8_t> payload = Payload(a, &descr);
  std::string file = simdattn::npy::MakeHeader(descr, a.shape, 2);
  file.append(reinterpret_cast<const char*>(payload.data()), payload.size());
  Array b;
  if (!simdattn::npy::Parse("again.npy", reinterpret_cast<const uint8_t*>(file.data()),
                            file.size(), &b, &error)) {
    Fail("rebuilt file does not parse: " + error, simdattn::npy::ShapeString(a.shape));
  }
  const bool same_values =
      b.shape == a.shape && b.bytes == a.bytes && b.f32.size() == a.f32.size() &&
      (a.f32.empty() || std::memcmp(a.f32.data(), b.f32.data(), a.f32.size() * 4) == 0);
  if (!same_values) Fail("rebuilt file parses to other values", a.descr);
  return 0;
}
