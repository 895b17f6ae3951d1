// Shared by the libFuzzer targets of fuzz/: reading decisions from the fuzz
// input, strided tensors that own exactly the bytes their views span (so
// that AddressSanitizer sees any access past them), and the checks that
// end a run with a report.

#ifndef SIMDATTN_FUZZ_FUZZ_UTIL_H_
#define SIMDATTN_FUZZ_FUZZ_UTIL_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "lib/dtype.h"
#include "simdattn/attention.h"

namespace simdattn {
namespace fuzz {

// Decisions taken from the input bytes, in order; past the end every
// decision is 0 (the smallest choice).
class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  // A value in [lo, hi] (hi - lo < 2^16).
  int64_t Range(int64_t lo, int64_t hi) {
    const uint32_t x = Byte() | (hi - lo > 255 ? uint32_t{Byte()} << 8 : 0u);
    return lo + static_cast<int64_t>(x % static_cast<uint32_t>(hi - lo + 1));
  }
  bool Bool() { return (Byte() & 1) != 0; }
  // True with probability about 1 / n.
  bool OneIn(int n) { return Byte() % n == 0; }
  float Float() {
    uint32_t bits = 0;
    for (int i = 0; i < 4; ++i) bits |= uint32_t{Byte()} << (8 * i);
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  size_t remaining() const { return size_ - pos_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Reports a failed check with the case's description and aborts, which
// libFuzzer records as a crash with the input that caused it.
[[noreturn]] inline void Fail(const std::string& what, const std::string& detail) {
  std::fprintf(stderr, "FUZZ CHECK FAILED: %s\n  %s\n", what.c_str(), detail.c_str());
  std::abort();
}

// A 4-D view over bytes it owns: exactly the span of its elements (any
// strides, negative ones included), base placed inside.
struct TensorBuf {
  // Shared: an output placed inside an input's buffer (aliasing cases).
  std::shared_ptr<std::vector<uint8_t>> buf;
  int64_t base = 0;  // byte offset of element (0, 0, 0, 0) in *buf
  DType dtype = DType::kF32;  // any value, unknown ones too (1 byte each)
  // A one-byte stand-in for a view that must be rejected before any
  // access (an extent <= 0, or strides spanning more than the fuzzer
  // allocates): its elements are never read or written here.
  bool stand_in = false;
  int64_t shape[4] = {0, 0, 0, 0};
  int64_t strides[4] = {0, 0, 0, 0};

  int64_t Offset(int64_t i0, int64_t i1, int64_t i2, int64_t i3) const {
    return base + (i0 * strides[0] + i1 * strides[1] + i2 * strides[2] + i3 * strides[3]) *
                      DTypeSize(dtype);
  }
  void Set(int64_t i0, int64_t i1, int64_t i2, int64_t i3, float x) {
    uint8_t* p = buf->data() + Offset(i0, i1, i2, i3);
    if (dtype == DType::kF32) {
      std::memcpy(p, &x, 4);
    } else if (DTypeSize(dtype) == 1) {  // bool, or an unknown dtype
      *p = x != 0.0f ? 1 : 0;
    } else {
      const uint16_t h = dtype == DType::kF16 ? F32ToF16(x) : F32ToBF16(x);
      std::memcpy(p, &h, 2);
    }
  }
  float Get(int64_t i0, int64_t i1, int64_t i2, int64_t i3) const {
    const uint8_t* p = buf->data() + Offset(i0, i1, i2, i3);
    if (dtype == DType::kF32) {
      float x;
      std::memcpy(&x, p, 4);
      return x;
    }
    if (DTypeSize(dtype) == 1) return *p;
    uint16_t h;
    std::memcpy(&h, p, 2);
    return dtype == DType::kF16 ? F16ToF32(h) : BF16ToF32(h);
  }
  TensorView View() const {
    TensorView v;
    v.data = buf == nullptr ? nullptr : buf->data() + base;
    v.dtype = dtype;
    for (int i = 0; i < 4; ++i) {
      v.shape[i] = shape[i];
      v.strides[i] = strides[i];
    }
    return v;
  }
  MutableTensorView Mutable() {
    MutableTensorView v;
    v.data = buf == nullptr ? nullptr : buf->data() + base;
    v.dtype = dtype;
    for (int i = 0; i < 4; ++i) {
      v.shape[i] = shape[i];
      v.strides[i] = strides[i];
    }
    return v;
  }
  // Sets marks[i] for every byte i (within *buf) of an element; marks
  // holds buf->size() entries.
  void MarkElements(std::vector<uint8_t>* marks) const {
    const int64_t size = DTypeSize(dtype);
    for (int64_t a = 0; a < shape[0]; ++a)
      for (int64_t b = 0; b < shape[1]; ++b)
        for (int64_t c = 0; c < shape[2]; ++c)
          for (int64_t d = 0; d < shape[3]; ++d) {
            const int64_t at = Offset(a, b, c, d);
            for (int64_t i = 0; i < size; ++i) (*marks)[static_cast<size_t>(at + i)] = 1;
          }
  }
  // Byte offsets (within *buf) of every element's bytes.
  std::set<int64_t> ElementBytes() const {
    std::set<int64_t> out;
    const int64_t size = DTypeSize(dtype);
    for (int64_t a = 0; a < shape[0]; ++a)
      for (int64_t b = 0; b < shape[1]; ++b)
        for (int64_t c = 0; c < shape[2]; ++c)
          for (int64_t d = 0; d < shape[3]; ++d)
            for (int64_t i = 0; i < size; ++i) out.insert(Offset(a, b, c, d) + i);
    return out;
  }
};

// "dtype [shape] strides (..) bytes N": for reports.
inline std::string Describe(const char* name, const TensorBuf& t) {
  std::string s = std::string(name) + " " + std::to_string(static_cast<int>(t.dtype)) + " [";
  for (int i = 0; i < 4; ++i) s += std::to_string(t.shape[i]) + (i < 3 ? " " : "] (");
  for (int i = 0; i < 4; ++i) s += std::to_string(t.strides[i]) + (i < 3 ? " " : ") bytes ");
  s += std::to_string(t.buf == nullptr ? 0 : t.buf->size()) + " base " + std::to_string(t.base);
  return s + (t.stand_in ? " stand-in" : "");
}

// With SIMDATTN_FUZZ_VERBOSE set, prints a case before its call (to
// replay a crash: simdattn_fuzz_<name> <crash file>).
inline void Verbose(const std::string& text) {
  if (std::getenv("SIMDATTN_FUZZ_VERBOSE") != nullptr) std::fprintf(stderr, "%s\n", text.c_str());
}

// Element offset range [lo, hi] of a view with positive extents.
inline void OffsetRange(const int64_t* shape, const int64_t* strides, int64_t* lo,
                        int64_t* hi) {
  *lo = *hi = 0;
  for (int i = 0; i < 4; ++i) {
    const int64_t span = (shape[i] - 1) * strides[i];
    if (span < 0) *lo += span; else *hi += span;
  }
}

// A tensor of `shape` (every extent >= 1, small) with `strides`, its bytes
// set to `fill`. `extra` more bytes follow the span (room for another view).
inline TensorBuf MakeTensor(DType dtype, const int64_t* shape, const int64_t* strides,
                            uint8_t fill, int64_t extra = 0) {
  TensorBuf t;
  t.dtype = dtype;
  int64_t lo, hi;
  OffsetRange(shape, strides, &lo, &hi);
  const int64_t size = DTypeSize(dtype);
  t.base = -lo * size;
  t.buf = std::make_shared<std::vector<uint8_t>>(
      static_cast<size_t>((hi - lo + 1) * size + extra), fill);
  for (int i = 0; i < 4; ++i) {
    t.shape[i] = shape[i];
    t.strides[i] = strides[i];
  }
  return t;
}

// Strides of a view of `shape`: dimensions 0..2 stored in the order
// perm[0] (outermost) .. perm[2], the last dimension contiguous, each row
// `pad` elements longer than it needs; broadcast[i] sets stride i to 0.
inline void LayoutStrides(const int64_t* shape, const int* perm, int64_t pad,
                          const bool* broadcast, int64_t* strides) {
  strides[3] = 1;
  int64_t step = shape[3] + pad;
  for (int n = 2; n >= 0; --n) {
    strides[perm[n]] = step;
    step *= shape[perm[n]];
  }
  for (int i = 0; i < 3; ++i) {
    if (broadcast != nullptr && broadcast[i]) strides[i] = 0;
  }
}

// A storage dtype, or (rarely) one the call must reject.
inline DType TakeDType(FuzzInput* in, bool allow_invalid) {
  const int64_t x = in->Range(0, allow_invalid ? 15 : 2);
  if (x <= 2) return static_cast<DType>(x);
  if (x == 3) return DType::kBool;
  return x == 4 ? static_cast<DType>(9) : static_cast<DType>(x % 3);
}

// Element values in [-1, 1] from `seed`; with `specials`, about one in 50
// is Inf, NaN or a large logit instead.
inline void FillValues(TensorBuf* t, uint32_t seed, bool specials) {
  const float kSpecial[6] = {INFINITY, -INFINITY, NAN, 100.0f, -90.0f, 65504.0f};
  uint32_t x = seed * 2654435761u + 12345u;
  for (int64_t a = 0; a < t->shape[0]; ++a)
    for (int64_t b = 0; b < t->shape[1]; ++b)
      for (int64_t c = 0; c < t->shape[2]; ++c)
        for (int64_t d = 0; d < t->shape[3]; ++d) {
          x = x * 1664525u + 1013904223u;  // a plain LCG: reproducible, cheap
          const uint32_t r = x >> 8;
          const float v = specials && r % 50 == 0
                              ? kSpecial[(r / 50) % 6]
                              : static_cast<float>(r % 2048) / 1024.0f - 1.0f;
          t->Set(a, b, c, d, v);
        }
}

}  // namespace fuzz
}  // namespace simdattn

#endif  // SIMDATTN_FUZZ_FUZZ_UTIL_H_
