// Writing a block's results: O = acc / l in O's storage type (rows or the
// transposed O^T tile) and LSE = m + log(l). Per-target code.

#if defined(SIMDATTN_LIB_KERNELS_OUTPUT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SIMDATTN_LIB_KERNELS_OUTPUT_INL_H_
#undef SIMDATTN_LIB_KERNELS_OUTPUT_INL_H_
#else
#define SIMDATTN_LIB_KERNELS_OUTPUT_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "hwy/highway.h"
#include "lib/dtype.h"
#include "lib/kernels/block-inl.h"
#include "lib/kernels/tile_gemm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;


// dst[0..n) = x[0..n) * inv in O's storage type (16-bit rounded to nearest
// even; f16 in hardware where the target converts it).
template <class D>
HWY_INLINE void StoreOutputRow(D d, Storage o_type, const float* HWY_RESTRICT x,
                               int64_t n, float inv, void* dst) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto vinv = hn::Set(d, inv);
  int64_t e = 0;
  if (o_type == Storage::kF32) {
    float* out = static_cast<float*>(dst);
    for (; e + N <= n; e += N) hn::StoreU(hn::Mul(hn::LoadU(d, x + e), vinv), d, out + e);
    for (; e < n; ++e) out[e] = x[e] * inv;
    return;
  }
  uint16_t* out = static_cast<uint16_t*>(dst);
#if SIMDATTN_HW_F16
  if (o_type == Storage::kF16) {
    const hn::Rebind<hwy::float16_t, D> dh;
    for (; e + N <= n; e += N) {
      hn::StoreU(hn::DemoteTo(dh, hn::Mul(hn::LoadU(d, x + e), vinv)), dh,
                 reinterpret_cast<hwy::float16_t*>(out + e));
    }
  }
#endif
  for (; e < n; ++e) {
    const float y = x[e] * inv;
    out[e] = o_type == Storage::kF16 ? F32ToF16(y) : F32ToBF16(y);
  }
}

// Where a block's rows of O go, and element-wise writes to them.
struct OutputRows {
  const AttentionArgs& a;
  int64_t b;
  const RowTable& rt;
  const float* l;

  int64_t elem_size() const { return StorageBytes(a.o_type); }
  char* Row(int64_t r) const {
    return static_cast<char*>(a.o) +
           (b * a.o_strides[0] + rt.head[r] * a.o_strides[1] +
            rt.query[r] * a.o_strides[2]) * elem_size();
  }
  // 1 / l, or 0 for a row without a visible key (l == 0).
  float Inverse(int64_t r) const { return l[r] == 0.0f ? 0.0f : 1.0f / l[r]; }
  // Element e of row r, already divided by l.
  void Put(int64_t r, int64_t e, float x) const {
    void* dst = Row(r);
    if (a.o_type == Storage::kF32) {
      static_cast<float*>(dst)[e] = x;
    } else {
      static_cast<uint16_t*>(dst)[e] =
          a.o_type == Storage::kF16 ? F32ToF16(x) : F32ToBF16(x);
    }
  }
};

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// Rows [r, ...) of an O^T tile (element e of row r at acc[e * e_stride + r])
// on AVX-512: 16 rows at a time through 16x16 transposes, each row's 16
// values then scaled and stored straight to O (f32; a streaming store where
// plan.stream_output and the 16 floats are one cache line), or through
// StoreOutputRow (16-bit O). Returns the first row not written.
inline int64_t WriteTransposed16(const OutputRows& out, const Plan& plan,
                                 int64_t rows, const float* acc,
                                 int64_t e_stride, int64_t r) {
  const hn::Full512<float> d16;
  const int64_t dv = out.a.head_dim_v;
  const int64_t full = dv / 16 * 16;
  bool streamed = false;
  for (; r + 16 <= rows; r += 16) {
    for (int64_t e = 0; e < full; e += 16) {
      hn::Vec<decltype(d16)> v[16];
      for (int t = 0; t < 16; ++t) v[t] = hn::LoadU(d16, acc + (e + t) * e_stride + r);
      Transpose16x16(v);  // v[c]: elements e .. e + 15 of row r + c
      for (int c = 0; c < 16; ++c) {
        char* dst = out.Row(r + c) + e * out.elem_size();
        if (out.a.o_type == Storage::kF32) {
          const auto y = hn::Mul(v[c], hn::Set(d16, out.Inverse(r + c)));
          float* o = reinterpret_cast<float*>(dst);
          if (plan.stream_output && (reinterpret_cast<uintptr_t>(o) & 63) == 0) {
            hn::Stream(y, d16, o);
            streamed = true;
          } else {
            hn::StoreU(y, d16, o);
          }
        } else {
          HWY_ALIGN float tmp[16];
          hn::Store(v[c], d16, tmp);
          StoreOutputRow(d16, out.a.o_type, tmp, 16, out.Inverse(r + c), dst);
        }
      }
    }
    for (int64_t e = full; e < dv; ++e) {
      for (int c = 0; c < 16; ++c) {
        out.Put(r + c, e, acc[e * e_stride + r + c] * out.Inverse(r + c));
      }
    }
  }
  // Streaming stores are weakly ordered: make them visible before the task
  // reports done (other threads, then the caller, read O after that).
  if (streamed) hwy::FlushStream();
  return r;
}
#endif

#if HWY_TARGET != HWY_SCALAR
// Rows [r, ...) of an O^T tile, 4 at a time through 4x4 transposes, 64
// columns per pass. Returns the first row not written.
inline int64_t WriteTransposed4(const OutputRows& out, int64_t rows,
                                const float* acc, int64_t e_stride, int64_t r) {
  const hn::ScalableTag<float> d;
  const int64_t dv = out.a.head_dim_v;
  constexpr int64_t kChunk = 64;
  HWY_ALIGN float tmp[4][kChunk];
  const hn::CappedTag<float, 4> d4;
  for (; r + 4 <= rows; r += 4) {
    for (int64_t e0 = 0; e0 < dv; e0 += kChunk) {
      const int64_t n = std::min(kChunk, dv - e0);
      int64_t e = 0;
      for (; e + 4 <= n; e += 4) {
        const float* src = acc + (e0 + e) * e_stride + r;
        auto a0 = hn::LoadU(d4, src), a1 = hn::LoadU(d4, src + e_stride);
        auto a2 = hn::LoadU(d4, src + 2 * e_stride), a3 = hn::LoadU(d4, src + 3 * e_stride);
        Transpose4x4(d4, &a0, &a1, &a2, &a3);  // a_t: row r + t
        hn::StoreU(a0, d4, tmp[0] + e);
        hn::StoreU(a1, d4, tmp[1] + e);
        hn::StoreU(a2, d4, tmp[2] + e);
        hn::StoreU(a3, d4, tmp[3] + e);
      }
      for (; e < n; ++e) {
        for (int t = 0; t < 4; ++t) tmp[t][e] = acc[(e0 + e) * e_stride + r + t];
      }
      for (int t = 0; t < 4; ++t) {
        char* dst = out.Row(r + t) + e0 * out.elem_size();
        StoreOutputRow(d, out.a.o_type, tmp[t], n, out.Inverse(r + t), dst);
      }
    }
  }
  return r;
}
#endif

// O = acc / l for the block's valid rows (element e of row r at
// acc[e * e_stride + r * r_stride]: rows contiguous when e_stride is 1, else
// the O^T tile of the kernel, e_stride = block rows, r_stride = 1); rows
// without a visible key (l == 0) get zeros and LSE = -inf. l is NaN (not 0)
// for rows that saw NaN, which then stays NaN.
inline void WriteRows(const AttentionArgs& a, const Plan& plan, int64_t b,
                      const RowTable& rt, int64_t rows, const float* m,
                      const float* l, const float* acc, int64_t e_stride,
                      int64_t r_stride) {
  const hn::ScalableTag<float> d;
  const int64_t dv = a.head_dim_v;
  const OutputRows out{a, b, rt, l};
  int64_t r = 0;
  if (e_stride == 1) {
    for (; r < rows; ++r) {
      StoreOutputRow(d, a.o_type, acc + r * r_stride, dv, out.Inverse(r), out.Row(r));
    }
  }
  if (r_stride == 1 && e_stride > 1) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    r = WriteTransposed16(out, plan, rows, acc, e_stride, r);
#endif
#if HWY_TARGET != HWY_SCALAR
    r = WriteTransposed4(out, rows, acc, e_stride, r);
#endif
  }
  (void)plan;
  for (; r < rows; ++r) {  // leftover rows: one element at a time
    const float inv = out.Inverse(r);
    for (int64_t e = 0; e < dv; ++e) out.Put(r, e, acc[e * e_stride + r * r_stride] * inv);
  }
  if (a.lse != nullptr) {
    for (r = 0; r < rows; ++r) {
      float* lse = a.lse + b * a.lse_strides[0] + rt.head[r] * a.lse_strides[1] +
                   rt.query[r] * a.lse_strides[2];
      *lse = l[r] == 0.0f ? -std::numeric_limits<float>::infinity()
                          : m[r] + std::log(l[r]);
    }
  }
}

// A split call's task result: m, l and the unnormalized O (`o_floats`
// floats, O^T or rows) into its PartialSlot.
inline void StorePartial(const AttentionArgs& a, const Plan& plan,
                         const Wave& wave, int64_t task, int64_t rows,
                         const float* m, const float* l, const float* o,
                         int64_t o_floats) {
  float* out = PartialSlot(plan, wave, a.head_dim_v, task);
  std::copy(m, m + rows, out);
  std::copy(l, l + rows, out + plan.block_rows);
  std::copy(o, o + o_floats, out + 2 * plan.block_rows);
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_OUTPUT_INL_H_
