// std::vector allocators for tests and benchmarks, not used by the library
// itself. CacheLineAllocator's storage starts on a 64-byte cache line, as an
// engine's tensor buffers do (std::vector's large blocks start 16 bytes past
// one): the tests and the benchmark keep their tensors in it, since the
// library writes O with streaming stores only where its rows start on a
// line (AttentionArgsF32::stream_output). FunctionAllocator takes storage
// from any function that returns memory for std::free (null when it has
// none); the benchmark uses it for 2 MiB pages.

#ifndef SIMDATTN_LIB_CACHE_LINE_ALLOCATOR_H_
#define SIMDATTN_LIB_CACHE_LINE_ALLOCATOR_H_

#include <cstddef>
#include <cstdlib>
#include <new>

namespace simdattn {

template <class T, void* (*kAlloc)(size_t bytes)>
struct FunctionAllocator {
  using value_type = T;
  template <class U>
  struct rebind {
    using other = FunctionAllocator<U, kAlloc>;
  };
  FunctionAllocator() = default;
  template <class U>
  FunctionAllocator(const FunctionAllocator<U, kAlloc>&) {}  // NOLINT(google-explicit-constructor)
  T* allocate(size_t n) {
    void* p = kAlloc(n * sizeof(T));
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  bool operator==(const FunctionAllocator&) const { return true; }
  bool operator!=(const FunctionAllocator&) const { return false; }
};

inline void* AllocCacheLines(size_t bytes) {
  return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
}

template <class T>
using CacheLineAllocator = FunctionAllocator<T, &AllocCacheLines>;

}  // namespace simdattn

#endif  // SIMDATTN_LIB_CACHE_LINE_ALLOCATOR_H_
