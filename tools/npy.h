// Minimal, defensive reader and writer for NumPy .npy files (format versions
// 1.0, 2.0 and 3.0), used by the simdattn command-line tool and its tests.

#ifndef SIMDATTN_TOOLS_NPY_H_
#define SIMDATTN_TOOLS_NPY_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace simdattn {
namespace npy {

// Element type of an array as stored in the file.
enum class ElementType {
  kF32,   // '<f4'
  kF16,   // '<f2' (converted to f32 on read, exactly)
  kBool,  // '|b1' (raw bytes)
  kU8,    // '|u1' (raw bytes)
};

// A decoded array. Floating-point files ('<f4', '<f2') fill `f32`; byte files
// ('|b1', '|u1') fill `bytes` unchanged. Elements are in C (row-major) order.
struct Array {
  std::string descr;           // the dtype string as written in the file
  ElementType type = ElementType::kF32;
  std::vector<int64_t> shape;  // empty for a 0-d array (one element)
  std::vector<float> f32;
  std::vector<uint8_t> bytes;

  // Product of the extents (1 for a 0-d array).
  int64_t NumElements() const;
};

// Reads `path`. Returns false and sets *error to a message that names the file
// and the problem when the file is missing or unreadable, is not a .npy file,
// has an unknown version, a malformed header dict, an unsupported dtype
// (anything but '<f4', '<f2', '|b1', '|u1'; big-endian is named as such),
// fortran_order True, a shape whose element or byte count overflows, or data
// shorter than the shape implies. Trailing bytes after the data are also an
// error: a well-formed .npy file ends with its data, and extra bytes usually
// mean the header's shape does not describe the payload.
// Never throws (allocation failure is reported as an error).
bool Read(const std::string& path, Array* out, std::string* error);

// The same on bytes in memory; `name` is used in error messages.
bool Parse(const std::string& name, const uint8_t* data, size_t size,
           Array* out, std::string* error);

// The complete header of a .npy file (magic, version, header length and the
// dict padded with spaces and '\n' to a multiple of 64 bytes) for `descr`,
// fortran_order False and `shape`. major_version 1 (header length < 65536),
// 2 or 3. Exposed so tests can craft files of any dtype.
std::string MakeHeader(const std::string& descr,
                       const std::vector<int64_t>& shape, int major_version);

// Writes a '<f4' array of `shape` (data holds the product of the extents
// floats) to `path` atomically: the bytes go to a temporary file in the same
// directory, which then replaces `path` with rename(). `path` must pass
// CheckDestination. On any failure `path` is untouched, no temporary file is
// left, false is returned and *error is set. Never throws.
bool WriteF32(const std::string& path, const float* data,
              const std::vector<int64_t>& shape, std::string* error);

// Checks that WriteF32 may replace `path`: it is not empty and does not end
// in '/', its parent directory exists and is a directory, and `path`, if it
// exists, is a regular file or a symbolic link (rename() replaces the link
// itself, never its target). A directory, device, fifo or socket is rejected
// rather than renamed over. Returns false and sets *error (naming `path`)
// otherwise. Never throws.
bool CheckDestination(const std::string& path, std::string* error);

// The two halves of WriteF32, so a caller can prepare several files before
// replacing any of them. WriteF32Temp checks `path` with CheckDestination,
// writes the complete file to a fresh temporary file next to `path` and sets
// *temp_path. CommitTemp checks `path` again and renames the temporary file
// over it (removing the temporary file on failure); DiscardTemp removes it.
bool WriteF32Temp(const std::string& path, const float* data,
                  const std::vector<int64_t>& shape, std::string* temp_path,
                  std::string* error);
bool CommitTemp(const std::string& temp_path, const std::string& path,
                std::string* error);
void DiscardTemp(const std::string& temp_path);

// "(2, 3, 4)" / "(5,)" / "()", as NumPy prints shapes.
std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace npy
}  // namespace simdattn

#endif  // SIMDATTN_TOOLS_NPY_H_
