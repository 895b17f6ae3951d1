// .npy reader and atomic writer (see npy.h). Every malformed input is an
// error with a message naming the file and the problem; nothing throws.

#include "tools/npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <sstream>

#include "lib/dtype.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tools/npy.cc assumes a little-endian host"
#endif

namespace simdattn {
namespace npy {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;

// A tiny cursor over the header text (a Python dict literal).
class HeaderParser {
 public:
  explicit HeaderParser(const std::string& text) : text_(text) {}

  void SkipSpace() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
            text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }
  bool Consume(char c) {
    SkipSpace();
    if (Peek() != c) return false;
    ++pos_;
    return true;
  }

  // A '...' or "..." literal without escapes.
  bool String(std::string* out) {
    SkipSpace();
    const char quote = Peek();
    if (quote != '\'' && quote != '"') return false;
    const size_t end = text_.find(quote, pos_ + 1);
    if (end == std::string::npos) return false;
    *out = text_.substr(pos_ + 1, end - pos_ - 1);
    if (out->find('\\') != std::string::npos) return false;
    pos_ = end + 1;
    return true;
  }

  bool Word(const char* word) {
    SkipSpace();
    const size_t n = std::strlen(word);
    if (text_.compare(pos_, n, word) != 0) return false;
    // The word must not continue (e.g. "Truex").
    const char next = pos_ + n < text_.size() ? text_[pos_ + n] : '\0';
    if (std::isalnum(static_cast<unsigned char>(next)) || next == '_') {
      return false;
    }
    pos_ += n;
    return true;
  }

  // "(a, b, c)", "(a,)" or "()": non-negative integers (a Python 2 'L'
  // suffix is accepted). Sets *why on failure.
  bool Tuple(std::vector<int64_t>* out, std::string* why) {
    out->clear();
    if (!Consume('(')) {
      *why = "'shape' is not a tuple";
      return false;
    }
    if (Consume(')')) return true;
    while (true) {
      SkipSpace();
      if (!std::isdigit(static_cast<unsigned char>(Peek()))) {
        *why = "'shape' holds something other than non-negative integers";
        return false;
      }
      int64_t value = 0;
      while (std::isdigit(static_cast<unsigned char>(Peek()))) {
        const int digit = Peek() - '0';
        if (value > (std::numeric_limits<int64_t>::max() - digit) / 10) {
          *why = "a 'shape' extent overflows int64";
          return false;
        }
        value = value * 10 + digit;
        ++pos_;
      }
      if (Peek() == 'L') ++pos_;
      out->push_back(value);
      if (Consume(')')) {
        if (out->size() == 1) {
          // "(5)" is an int in Python, not a tuple; NumPy never writes it.
          *why = "'shape' is not a tuple (a 1-tuple needs a trailing comma)";
          return false;
        }
        return true;
      }
      if (!Consume(',')) {
        *why = "'shape' tuple is malformed";
        return false;
      }
      if (Consume(')')) return true;
    }
  }

 private:
  const std::string& text_;
  size_t pos_ = 0;
};

struct Header {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

bool ParseDict(const std::string& text, Header* header, std::string* why) {
  HeaderParser p(text);
  if (!p.Consume('{')) {
    *why = "header is not a dict (no '{')";
    return false;
  }
  bool have_descr = false, have_fortran = false, have_shape = false;
  while (true) {
    if (p.Consume('}')) break;
    std::string key;
    if (!p.String(&key)) {
      *why = "header dict key is not a string";
      return false;
    }
    if (!p.Consume(':')) {
      *why = "header dict has no ':' after key '" + key + "'";
      return false;
    }
    bool* seen = nullptr;
    if (key == "descr") {
      seen = &have_descr;
      if (!p.String(&header->descr)) {
        *why = "'descr' is not a plain dtype string (structured dtypes are "
               "not supported)";
        return false;
      }
    } else if (key == "fortran_order") {
      seen = &have_fortran;
      if (p.Word("True")) {
        header->fortran_order = true;
      } else if (p.Word("False")) {
        header->fortran_order = false;
      } else {
        *why = "'fortran_order' is neither True nor False";
        return false;
      }
    } else if (key == "shape") {
      seen = &have_shape;
      if (!p.Tuple(&header->shape, why)) return false;
    } else {
      *why = "header dict has an unexpected key '" + key + "'";
      return false;
    }
    if (*seen) {
      *why = "header dict repeats key '" + key + "'";
      return false;
    }
    *seen = true;
    if (p.Consume(',')) continue;
    if (p.Consume('}')) break;
    *why = "header dict is malformed after key '" + key + "'";
    return false;
  }
  p.SkipSpace();
  if (!p.AtEnd()) {
    *why = "header has text after the dict";
    return false;
  }
  if (!have_descr || !have_fortran || !have_shape) {
    *why = std::string("header dict lacks key '") +
           (!have_descr ? "descr" : !have_fortran ? "fortran_order" : "shape") +
           "'";
    return false;
  }
  return true;
}

// Maps a descr to its element type and size; sets *why for unsupported ones.
bool LookUpDescr(const std::string& descr, ElementType* type, size_t* size,
                 std::string* why) {
  if (descr == "<f4") {
    *type = ElementType::kF32;
    *size = 4;
  } else if (descr == "<f2") {
    *type = ElementType::kF16;
    *size = 2;
  } else if (descr == "|b1") {
    *type = ElementType::kBool;
    *size = 1;
  } else if (descr == "|u1") {
    *type = ElementType::kU8;
    *size = 1;
  } else if (!descr.empty() && descr[0] == '>') {
    *why = "big-endian dtype '" + descr +
           "' is not supported (convert with arr.astype('<f4'))";
    return false;
  } else {
    *why = "unsupported dtype '" + descr +
           "' (supported: '<f4', '<f2', '|b1', '|u1')";
    return false;
  }
  return true;
}

uint32_t LoadLE(const uint8_t* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

bool Fail(const std::string& name, const std::string& problem,
          std::string* error) {
  if (error != nullptr) *error = name + ": " + problem;
  return false;
}

// Checks the magic string and version and reads the header length: the
// header text is [prefix, prefix + header_len) of the file.
bool ParsePreamble(const std::string& name, const uint8_t* data, size_t size,
                   size_t* prefix, uint64_t* header_len, std::string* error) {
  if (size < kMagicSize + 2 || std::memcmp(data, kMagic, kMagicSize) != 0) {
    return Fail(name, "not a .npy file (bad magic string)", error);
  }
  const int major = data[6];
  const int minor = data[7];
  if (major == 1) {
    *prefix = 10;
  } else if (major == 2 || major == 3) {
    *prefix = 12;
  } else {
    return Fail(name,
                "unsupported .npy format version " + std::to_string(major) +
                    "." + std::to_string(minor),
                error);
  }
  if (minor != 0) {
    return Fail(name,
                "unsupported .npy format version " + std::to_string(major) +
                    "." + std::to_string(minor),
                error);
  }
  if (size < *prefix) return Fail(name, "truncated header", error);
  *header_len = LoadLE(data + 8, static_cast<int>(*prefix - 8));
  if (*header_len > size - *prefix) {
    return Fail(name,
                "truncated header (header length " +
                    std::to_string(*header_len) + " exceeds the file)",
                error);
  }
  return true;
}

// Counts the elements of the header's shape, with overflow checks, and
// checks that the `have` bytes after the header hold exactly that many
// items of `item_size` bytes.
bool CountElements(const std::string& name, const Header& header,
                   size_t item_size, uint64_t have, uint64_t* count,
                   std::string* error) {
  *count = 1;
  const uint64_t limit = static_cast<uint64_t>(
      std::numeric_limits<int64_t>::max());
  for (int64_t extent : header.shape) {
    const uint64_t e = static_cast<uint64_t>(extent);
    if (e != 0 && *count > limit / e) {
      return Fail(name,
                  "shape " + ShapeString(header.shape) +
                      " has too many elements (overflows int64)",
                  error);
    }
    *count *= e;
  }
  if (*count > limit / item_size ||
      *count * item_size > std::numeric_limits<size_t>::max()) {
    return Fail(name,
                "shape " + ShapeString(header.shape) +
                    " needs more bytes than can be addressed",
                error);
  }
  const uint64_t need = *count * item_size;
  if (have < need) {
    return Fail(name,
                "truncated data: shape " + ShapeString(header.shape) + " of '" +
                    header.descr + "' needs " + std::to_string(need) +
                    " bytes, the file has " + std::to_string(have),
                error);
  }
  if (have > need) {
    return Fail(name,
                std::to_string(have - need) +
                    " unexpected bytes after the data of shape " +
                    ShapeString(header.shape),
                error);
  }
  return true;
}

// The array of `n` elements of `type` stored (little-endian) at `payload`;
// f16 is widened exactly to f32.
Array DecodePayload(const Header& header, ElementType type,
                    const uint8_t* payload, size_t n) {
  Array result;
  result.descr = header.descr;
  result.type = type;
  result.shape = header.shape;
  switch (type) {
    case ElementType::kF32:
      result.f32.resize(n);
      if (n > 0) std::memcpy(result.f32.data(), payload, n * 4);
      break;
    case ElementType::kF16:
      result.f32.resize(n);
      for (size_t i = 0; i < n; ++i) {
        const uint16_t bits = static_cast<uint16_t>(
            payload[2 * i] | (static_cast<uint16_t>(payload[2 * i + 1]) << 8));
        result.f32[i] = F16ToF32(bits);
      }
      break;
    case ElementType::kBool:
    case ElementType::kU8:
      result.bytes.assign(payload, payload + n);
      break;
  }
  return result;
}

bool ParseImpl(const std::string& name, const uint8_t* data, size_t size,
               Array* out, std::string* error) {
  size_t prefix = 0;
  uint64_t header_len = 0;
  if (!ParsePreamble(name, data, size, &prefix, &header_len, error)) {
    return false;
  }
  const std::string text(reinterpret_cast<const char*>(data + prefix),
                         static_cast<size_t>(header_len));
  if (text.find('\0') != std::string::npos) {
    return Fail(name, "malformed header (contains NUL bytes)", error);
  }
  Header header;
  std::string why;
  if (!ParseDict(text, &header, &why)) {
    return Fail(name, "malformed header: " + why, error);
  }
  ElementType type;
  size_t item_size = 0;
  if (!LookUpDescr(header.descr, &type, &item_size, &why)) {
    return Fail(name, why, error);
  }
  if (header.fortran_order) {
    return Fail(name,
                "fortran_order True is not supported (save a C-contiguous "
                "array)",
                error);
  }
  uint64_t count = 0;
  if (!CountElements(name, header, item_size, size - prefix - header_len,
                     &count, error)) {
    return false;
  }
  *out = DecodePayload(header, type, data + prefix + header_len,
                       static_cast<size_t>(count));
  return true;
}

std::string ErrnoString(int err) { return std::strerror(err); }

// Writes all of [data, data + size) to fd, retrying on EINTR / short writes.
bool WriteAll(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

int64_t Array::NumElements() const {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::ostringstream s;
  s << '(';
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s << ", ";
    s << shape[i];
  }
  if (shape.size() == 1) s << ',';
  s << ')';
  return s.str();
}

bool Parse(const std::string& name, const uint8_t* data, size_t size,
           Array* out, std::string* error) {
  try {
    return ParseImpl(name, data, size, out, error);
  } catch (const std::bad_alloc&) {
    return Fail(name, "out of memory while reading the array", error);
  } catch (const std::exception& e) {
    return Fail(name, std::string("internal error: ") + e.what(), error);
  }
}

bool Read(const std::string& path, Array* out, std::string* error) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Fail(path, "cannot open: " + ErrnoString(errno), error);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Fail(path, "cannot stat: " + ErrnoString(err), error);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Fail(path, "not a regular file", error);
  }
  std::vector<uint8_t> bytes;
  try {
    bytes.resize(static_cast<size_t>(st.st_size));
  } catch (const std::exception&) {
    ::close(fd);
    return Fail(path, "out of memory while reading the file", error);
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return Fail(path, "read error: " + ErrnoString(err), error);
    }
    if (n == 0) break;  // the file shrank while we read it
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return Parse(path, bytes.data(), done, out, error);
}

std::string MakeHeader(const std::string& descr,
                       const std::vector<int64_t>& shape, int major_version) {
  std::string dict = "{'descr': '" + descr +
                     "', 'fortran_order': False, 'shape': " +
                     ShapeString(shape) + ", }";
  const size_t prefix = major_version == 1 ? 10 : 12;
  size_t total = prefix + dict.size() + 1;  // + '\n'
  const size_t padded = (total + 63) / 64 * 64;
  dict.append(padded - total, ' ');
  dict.push_back('\n');
  const uint32_t len = static_cast<uint32_t>(dict.size());
  std::string out(kMagic, kMagicSize);
  out.push_back(static_cast<char>(major_version));
  out.push_back('\0');
  const int len_bytes = static_cast<int>(prefix - 8);
  for (int i = 0; i < len_bytes; ++i) {
    out.push_back(static_cast<char>((len >> (8 * i)) & 0xFF));
  }
  return out + dict;
}

bool CheckDestination(const std::string& path, std::string* error) {
  if (path.empty()) {
    if (error != nullptr) *error = "empty output path";
    return false;
  }
  if (path.back() == '/') {
    return Fail(path, "names a directory, not a file", error);
  }
  const size_t slash = path.rfind('/');
  const std::string parent = slash == std::string::npos ? "."
                             : slash == 0               ? "/"
                                                        : path.substr(0, slash);
  struct stat st;
  if (::stat(parent.c_str(), &st) != 0) {
    return Fail(path, "parent directory '" + parent + "': " +
                          ErrnoString(errno),
                error);
  }
  if (!S_ISDIR(st.st_mode)) {
    return Fail(path, "parent '" + parent + "' is not a directory", error);
  }
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return true;  // a new file
    return Fail(path, "cannot stat: " + ErrnoString(errno), error);
  }
  if (S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)) return true;
  const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                     : S_ISFIFO(st.st_mode) ? "a fifo"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                     : S_ISCHR(st.st_mode)  ? "a character device"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                                            : "a special file";
  return Fail(path,
              std::string("cannot replace: it is ") + kind +
                  ", not a regular file",
              error);
}

bool WriteF32Temp(const std::string& path, const float* data,
                  const std::vector<int64_t>& shape, std::string* temp_path,
                  std::string* error) {
  temp_path->clear();
  if (!CheckDestination(path, error)) return false;
  try {
    uint64_t count = 1;
    const uint64_t limit =
        static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / 4;
    for (int64_t e : shape) {
      if (e < 0) return Fail(path, "negative extent in shape to write", error);
      if (e != 0 && count > limit / static_cast<uint64_t>(e)) {
        return Fail(path, "shape to write overflows", error);
      }
      count *= static_cast<uint64_t>(e);
    }
    if (count > 0 && data == nullptr) {
      return Fail(path, "no data to write", error);
    }
    std::string header = MakeHeader("<f4", shape, 1);
    if (header.size() - 10 > 65535) header = MakeHeader("<f4", shape, 2);

    std::vector<char> name(path.begin(), path.end());
    const char kSuffix[] = ".tmp.XXXXXX";
    name.insert(name.end(), kSuffix, kSuffix + sizeof(kSuffix));  // with NUL
    const int fd = ::mkstemp(name.data());
    if (fd < 0) {
      return Fail(path, "cannot create a temporary file next to it: " +
                            ErrnoString(errno),
                  error);
    }
    *temp_path = name.data();
    const std::string& temp = *temp_path;
    // mkstemp creates 0600; give the file the usual 0666 & ~umask.
    const mode_t mask = ::umask(0);
    ::umask(mask);
    ::fchmod(fd, 0666 & ~mask);
    bool ok = WriteAll(fd, header.data(), header.size()) &&
              WriteAll(fd, data, static_cast<size_t>(count) * 4);
    int err = errno;
    if (ok && ::fsync(fd) != 0 && errno != EINVAL && errno != EROFS) {
      ok = false;
      err = errno;
    }
    if (::close(fd) != 0 && ok) {
      ok = false;
      err = errno;
    }
    if (!ok) {
      ::unlink(temp.c_str());
      temp_path->clear();
      return Fail(path, "write error: " + ErrnoString(err), error);
    }
    return true;
  } catch (const std::exception& e) {
    if (!temp_path->empty()) ::unlink(temp_path->c_str());
    temp_path->clear();
    return Fail(path, std::string("cannot write: ") + e.what(), error);
  }
}

bool CommitTemp(const std::string& temp_path, const std::string& path,
                std::string* error) {
  // Checked again: the destination may have changed since WriteF32Temp.
  if (!CheckDestination(path, error)) {
    ::unlink(temp_path.c_str());
    return false;
  }
  if (::rename(temp_path.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp_path.c_str());
    return Fail(path, "cannot replace: " + ErrnoString(err), error);
  }
  return true;
}

void DiscardTemp(const std::string& temp_path) {
  if (!temp_path.empty()) ::unlink(temp_path.c_str());
}

bool WriteF32(const std::string& path, const float* data,
              const std::vector<int64_t>& shape, std::string* error) {
  std::string temp;
  if (!WriteF32Temp(path, data, shape, &temp, error)) return false;
  return CommitTemp(temp, path, error);
}

}  // namespace npy
}  // namespace simdattn
