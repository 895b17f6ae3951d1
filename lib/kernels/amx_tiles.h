// Intel AMX tiles for the bf16 products (the AVX3_AMX entry): the tile
// configuration, the instructions as inline assembly (HardwareTiles), and an
// emulator with their exact semantics (EmulatedTiles), so that the kernel's
// packing, tiling and edge handling run on every x86 machine in tests.
//
// Both offer the same operations on the 8 tile registers, every one 16 rows
// x 64 bytes. The kernel uses tiles 0-3 as accumulators C (16 x 16 f32),
// 4-5 as A (16 rows x 32 bf16) and 6-7 as B (16 rows of 16 bf16 pairs), with
// C[t] += A[4 + t / 2] * B[6 + t % 2] (Dot<t>).

#ifndef SIMDATTN_LIB_KERNELS_AMX_TILES_H_
#define SIMDATTN_LIB_KERNELS_AMX_TILES_H_

#include <cmath>
#include <cstdint>
#include <cstring>

namespace simdattn {
namespace amx {

constexpr int kTileRows = 16;   // rows of every tile
constexpr int kTileBytes = 64;  // bytes of a tile row

// The 64-byte operand of LDTILECFG: palette 1, tiles 0-7 of 16 x 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};

  TileConfig() {
    for (int t = 0; t < 8; ++t) {
      colsb[t] = kTileBytes;
      rows[t] = kTileRows;
    }
  }
};

#if defined(__x86_64__)
// The AMX instructions. GCC 12's intrinsics name tiles by literal number
// inside their assembly strings, so each tile number is spelled out here.
struct HardwareTiles {
  static void Configure() {
    static const TileConfig config;
    asm volatile("ldtilecfg %0" ::"m"(config));
  }
  static void Release() { asm volatile("tilerelease" ::: "memory"); }

  // Tile T (0-7) = 16 rows of 64 bytes from p, rows `stride` bytes apart.
  template <int T>
  static void Load(const void* p, int64_t stride) {
    static_assert(T >= 0 && T < 8, "tile");
    if constexpr (T == 0) {
      asm volatile("tileloadd (%0,%1,1), %%tmm0" ::"r"(p), "r"(stride) : "memory");
    } else if constexpr (T == 1) {
      asm volatile("tileloadd (%0,%1,1), %%tmm1" ::"r"(p), "r"(stride) : "memory");
    } else if constexpr (T == 2) {
      asm volatile("tileloadd (%0,%1,1), %%tmm2" ::"r"(p), "r"(stride) : "memory");
    } else if constexpr (T == 3) {
      asm volatile("tileloadd (%0,%1,1), %%tmm3" ::"r"(p), "r"(stride) : "memory");
    } else if constexpr (T == 4) {
      asm volatile("tileloadd (%0,%1,1), %%tmm4" ::"r"(p), "r"(stride) : "memory");
    } else if constexpr (T == 5) {
      asm volatile("tileloadd (%0,%1,1), %%tmm5" ::"r"(p), "r"(stride) : "memory");
    } else if constexpr (T == 6) {
      asm volatile("tileloadd (%0,%1,1), %%tmm6" ::"r"(p), "r"(stride) : "memory");
    } else {
      asm volatile("tileloadd (%0,%1,1), %%tmm7" ::"r"(p), "r"(stride) : "memory");
    }
  }
  // Accumulator T (0-3) to 16 rows of 64 bytes at p.
  template <int T>
  static void Store(void* p, int64_t stride) {
    static_assert(T >= 0 && T < 4, "accumulator");
    if constexpr (T == 0) {
      asm volatile("tilestored %%tmm0, (%0,%1,1)" ::"r"(p), "r"(stride) : "memory");
    } else if constexpr (T == 1) {
      asm volatile("tilestored %%tmm1, (%0,%1,1)" ::"r"(p), "r"(stride) : "memory");
    } else if constexpr (T == 2) {
      asm volatile("tilestored %%tmm2, (%0,%1,1)" ::"r"(p), "r"(stride) : "memory");
    } else {
      asm volatile("tilestored %%tmm3, (%0,%1,1)" ::"r"(p), "r"(stride) : "memory");
    }
  }
  template <int T>
  static void Zero() {
    static_assert(T >= 0 && T < 4, "accumulator");
    if constexpr (T == 0) {
      asm volatile("tilezero %%tmm0" ::: "memory");
    } else if constexpr (T == 1) {
      asm volatile("tilezero %%tmm1" ::: "memory");
    } else if constexpr (T == 2) {
      asm volatile("tilezero %%tmm2" ::: "memory");
    } else {
      asm volatile("tilezero %%tmm3" ::: "memory");
    }
  }
  // C[T] += A[4 + T / 2] * B[6 + T % 2] (tdpbf16ps; AT&T order B, A, C).
  template <int T>
  static void Dot() {
    static_assert(T >= 0 && T < 4, "accumulator");
    if constexpr (T == 0) {
      asm volatile("tdpbf16ps %%tmm6, %%tmm4, %%tmm0" ::: "memory");
    } else if constexpr (T == 1) {
      asm volatile("tdpbf16ps %%tmm7, %%tmm4, %%tmm1" ::: "memory");
    } else if constexpr (T == 2) {
      asm volatile("tdpbf16ps %%tmm6, %%tmm5, %%tmm2" ::: "memory");
    } else {
      asm volatile("tdpbf16ps %%tmm7, %%tmm5, %%tmm3" ::: "memory");
    }
  }
};
#endif  // __x86_64__

// The same operations on tiles in memory, with TDPBF16PS's arithmetic as
// the hardware does it (observed on Sapphire/Emerald Rapids; the SDM's
// pseudocode adds the products one by one instead): the products of bf16
// values are exact in f32; the even products (element 2k of a pair) and the
// odd ones (2k + 1) are summed in two f32 chains, k ascending, each addition
// rounded to nearest even; then C + (even + odd), rounded the same way.
// Denormal inputs read as zero and denormal results flush to zero.
class EmulatedTiles {
 public:
  static void Configure() {}
  static void Release() {}

  template <int T>
  static void Load(const void* p, int64_t stride) {
    for (int r = 0; r < kTileRows; ++r) {
      std::memcpy(State().tile[T][r], static_cast<const char*>(p) + r * stride, kTileBytes);
    }
  }
  template <int T>
  static void Store(void* p, int64_t stride) {
    for (int r = 0; r < kTileRows; ++r) {
      std::memcpy(static_cast<char*>(p) + r * stride, State().tile[T][r], kTileBytes);
    }
  }
  template <int T>
  static void Zero() {
    std::memset(State().tile[T], 0, sizeof(State().tile[T]));
  }
  template <int T>
  static void Dot() {
    Tiles& s = State();
    const uint8_t(*a)[kTileBytes] = s.tile[4 + T / 2];
    const uint8_t(*b)[kTileBytes] = s.tile[6 + T % 2];
    for (int m = 0; m < kTileRows; ++m) {
      for (int n = 0; n < kTileRows; ++n) {
        float chain[2] = {0.0f, 0.0f};
        for (int k = 0; k < kTileRows; ++k) {  // pairs along A's row
          for (int h = 0; h < 2; ++h) {
            const float x = Bf16At(a[m], 2 * k + h), y = Bf16At(b[k], 2 * n + h);
            chain[h] = FlushDenormal(chain[h] + FlushDenormal(x * y));
          }
        }
        const float c = FlushDenormal(F32At(s.tile[T][m], n));
        const float out = FlushDenormal(c + FlushDenormal(chain[0] + chain[1]));
        std::memcpy(s.tile[T][m] + 4 * n, &out, 4);
      }
    }
  }

 private:
  struct Tiles {
    uint8_t tile[8][kTileRows][kTileBytes];
  };
  static Tiles& State() {
    static thread_local Tiles tiles;
    return tiles;
  }
  static float FlushDenormal(float x) {
    return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x;
  }
  static float F32At(const uint8_t* row, int i) {
    float x;
    std::memcpy(&x, row + 4 * i, 4);
    return x;
  }
  // Element i of a row of bf16, denormals as zero.
  static float Bf16At(const uint8_t* row, int i) {
    uint16_t h;
    std::memcpy(&h, row + 2 * i, 2);
    const uint32_t bits = static_cast<uint32_t>(h) << 16;
    float x;
    std::memcpy(&x, &bits, 4);
    return FlushDenormal(x);
  }
};

}  // namespace amx
}  // namespace simdattn

#endif  // SIMDATTN_LIB_KERNELS_AMX_TILES_H_
