// NumPy .npz reader (see npz.h): the zip central directory, each member's
// local header, then stored bytes or a raw deflate stream (zlib).

#include "tools/npz.h"

#include <zlib.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <new>
#include <vector>

namespace simdattn {
namespace npz {
namespace {

uint32_t U16(const uint8_t* p) { return uint32_t(p[0]) | uint32_t(p[1]) << 8; }
uint32_t U32(const uint8_t* p) { return U16(p) | U16(p + 2) << 16; }
uint64_t U64(const uint8_t* p) { return uint64_t(U32(p)) | uint64_t(U32(p + 4)) << 32; }

struct Member {
  std::string name;
  uint32_t method, crc, flags;
  uint64_t compressed, size, offset;
};

// Replaces the 0xFFFFFFFF fields of m by the zip64 extra field's values
// (in the order uncompressed size, compressed size, local header offset).
bool ApplyZip64(const uint8_t* extra, size_t len, Member* m) {
  for (size_t i = 0; i + 4 <= len;) {
    const uint32_t id = U16(extra + i), n = U16(extra + i + 2);
    if (i + 4 + n > len) return false;
    if (id == 1) {
      const uint8_t* p = extra + i + 4;
      size_t used = 0;
      for (uint64_t* f : {&m->size, &m->compressed, &m->offset}) {
        if (*f != 0xFFFFFFFFu) continue;
        if (used + 8 > n) return false;
        *f = U64(p + used);
        used += 8;
      }
    }
    i += 4 + n;
  }
  return true;
}

bool Directory(const std::vector<uint8_t>& z, std::vector<Member>* members, std::string* why) {
  if (z.size() < 22) return (*why = "too short for a zip archive"), false;
  size_t eocd = z.size() - 22;
  while (U32(&z[eocd]) != 0x06054b50u) {
    if (eocd == 0 || z.size() - eocd > 22 + 65535) return (*why = "no end of central directory"), false;
    --eocd;
  }
  const uint32_t count = U16(&z[eocd + 10]);
  uint64_t pos = U32(&z[eocd + 16]);
  if (count == 0xFFFF || pos == 0xFFFFFFFFu) return (*why = "zip64 directory not supported"), false;
  for (uint32_t e = 0; e < count; ++e) {
    if (pos + 46 > z.size() || U32(&z[pos]) != 0x02014b50u) return (*why = "bad central directory"), false;
    const uint8_t* h = &z[pos];
    Member m{"", U16(h + 10), U32(h + 16), U16(h + 8), U32(h + 20), U32(h + 24), U32(h + 42)};
    const uint32_t name_len = U16(h + 28), extra_len = U16(h + 30), comment = U16(h + 32);
    if (pos + 46 + name_len + extra_len > z.size()) return (*why = "truncated directory"), false;
    m.name.assign(reinterpret_cast<const char*>(h + 46), name_len);
    if (!ApplyZip64(h + 46 + name_len, extra_len, &m)) return (*why = "bad zip64 field"), false;
    members->push_back(m);
    pos += 46 + name_len + extra_len + comment;
  }
  return true;
}

// The bytes of member m, inflated when deflated, CRC-checked.
bool Extract(const std::vector<uint8_t>& z, const Member& m, std::vector<uint8_t>* out,
             std::string* why) {
  if (m.flags & 1u) return (*why = "encrypted"), false;
  if (m.offset + 30 > z.size() || U32(&z[m.offset]) != 0x04034b50u) {
    return (*why = "bad local header"), false;
  }
  const uint64_t data = m.offset + 30 + U16(&z[m.offset + 26]) + U16(&z[m.offset + 28]);
  if (data + m.compressed > z.size()) return (*why = "truncated data"), false;
  out->resize(m.size);
  if (m.method == 0) {
    if (m.compressed != m.size) return (*why = "stored size mismatch"), false;
    std::copy(z.begin() + long(data), z.begin() + long(data + m.size), out->begin());
  } else if (m.method == 8) {
    z_stream s{};
    if (inflateInit2(&s, -15) != Z_OK) return (*why = "zlib init failed"), false;
    s.next_in = const_cast<Bytef*>(&z[data]);
    s.avail_in = uInt(m.compressed);
    s.next_out = out->data();
    s.avail_out = uInt(m.size);
    const int rc = inflate(&s, Z_FINISH);
    inflateEnd(&s);
    if (rc != Z_STREAM_END || s.total_out != m.size) return (*why = "deflate data corrupt"), false;
  } else {
    return (*why = "compression method " + std::to_string(m.method) + " not supported"), false;
  }
  if (crc32(0L, out->data(), uInt(out->size())) != m.crc) return (*why = "CRC mismatch"), false;
  return true;
}

}  // namespace

bool Read(const std::string& path, std::map<std::string, npy::Array>* out, std::string* error) {
  try {
    std::ifstream f(path, std::ios::binary);
    if (!f) return (*error = path + ": cannot open"), false;
    const std::vector<uint8_t> z((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::vector<Member> members;
    std::string why;
    if (!Directory(z, &members, &why)) return (*error = path + ": " + why), false;
    for (const Member& m : members) {
      std::vector<uint8_t> bytes;
      if (!Extract(z, m, &bytes, &why)) return (*error = path + ": member " + m.name + ": " + why), false;
      std::string key = m.name;
      if (key.size() > 4 && key.compare(key.size() - 4, 4, ".npy") == 0) key.resize(key.size() - 4);
      npy::Array a;
      if (!npy::Parse(path + ":" + m.name, bytes.data(), bytes.size(), &a, error)) return false;
      (*out)[key] = std::move(a);
    }
    return true;
  } catch (const std::bad_alloc&) {
    *error = path + ": out of memory";
    return false;
  }
}

}  // namespace npz
}  // namespace simdattn
