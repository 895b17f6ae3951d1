// A std::vector allocator whose storage starts on a 64-byte cache line, as
// an engine's tensor buffers do (std::vector's large blocks start 16 bytes
// past one). The tests and the benchmark keep their tensors in it: the
// library writes O with streaming stores only where its rows start on a
// line (AttentionArgsF32::stream_output). Not used by the library itself.

#ifndef SIMDATTN_LIB_CACHE_LINE_ALLOCATOR_H_
#define SIMDATTN_LIB_CACHE_LINE_ALLOCATOR_H_

#include <cstddef>
#include <cstdlib>
#include <new>

namespace simdattn {

template <class T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}  // NOLINT(google-explicit-constructor)
  T* allocate(size_t n) {
    void* p = std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64);
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  bool operator==(const CacheLineAllocator&) const { return true; }
  bool operator!=(const CacheLineAllocator&) const { return false; }
};

}  // namespace simdattn

#endif  // SIMDATTN_LIB_CACHE_LINE_ALLOCATOR_H_
