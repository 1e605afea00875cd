// The packed matmul's tiles with AVX2 + FMA, for CPUs without AVX-512 (AMD Zen 2/3, older Intel).
//
// Same layouts and sums as the AVX-512 loops in packed_matmul.cc, on 8-float vectors: a tile's
// 32 columns are four vectors per row. GCC's vectoriser left these loops at ~40% of the copy
// bandwidth (strided bf16 widening, int8 widened through memory), so they are written out:
// - bf16: a pair of rows interleaved per column is one 32-bit word per column; the even row's
//   float is the word shifted left 16, the odd row's the word with its low half cleared.
// - int8: sign-extend 8 values to int32, convert, multiply-add.
// - int4: zero-extend 8 bytes to int32; the low nibble is row 2k2, the high one row 2k2 + 1,
//   each less 8 (stored offset) before conversion.
// One row keeps separate sums for the two rows of a pair (or two consecutive rows for int8), so
// eight independent FMA chains hide the FMA latency.

#ifndef JAXINFER_CPU_KERNELS_PACKED_TILES_AVX2_H_
#define JAXINFER_CPU_KERNELS_PACKED_TILES_AVX2_H_

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace jaxinfer_avx2 {

constexpr int64_t kColumns = 32;  // per tile
constexpr int kVectors = 4;       // 8-float vectors per tile row

inline float Widen(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, sizeof(out));
  return out;
}

// y[0, cols) from four vectors, cols <= 32.
inline void Store(float* y, const __m256 (&v)[kVectors], int64_t cols) {
  if (cols == kColumns) {
    for (int j = 0; j < kVectors; ++j) _mm256_storeu_ps(y + 8 * j, v[j]);
    return;
  }
  alignas(32) float tmp[kColumns];
  for (int j = 0; j < kVectors; ++j) _mm256_store_ps(tmp + 8 * j, v[j]);
  std::memcpy(y, tmp, cols * sizeof(float));
}

// Columns [32t, 32t + 32) of R rows of y from a packed bf16 tile [K / 2, 64].
template <int R>
void PackedTile(const uint16_t* x, const uint16_t* tile, float* y, int64_t K, int64_t N, int64_t t) {
  constexpr int S = R == 1 ? 2 : 1;
  __m256 acc[S][R][kVectors];
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < kVectors; ++j) acc[s][r][j] = _mm256_setzero_ps();
  const __m256i high = _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  for (int64_t k2 = 0; k2 < K / 2; ++k2) {
    __m256 a0[R], a1[R];
    for (int r = 0; r < R; ++r) {
      a0[r] = _mm256_set1_ps(Widen(x[r * K + 2 * k2]));
      a1[r] = _mm256_set1_ps(Widen(x[r * K + 2 * k2 + 1]));
    }
    const auto* words = reinterpret_cast<const __m256i*>(tile + k2 * 2 * kColumns);
    for (int j = 0; j < kVectors; ++j) {
      const __m256i w = _mm256_loadu_si256(words + j);
      const __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
      const __m256 odd = _mm256_castsi256_ps(_mm256_and_si256(w, high));
      for (int r = 0; r < R; ++r) {
        acc[0][r][j] = _mm256_fmadd_ps(a0[r], even, acc[0][r][j]);
        acc[S - 1][r][j] = _mm256_fmadd_ps(a1[r], odd, acc[S - 1][r][j]);
      }
    }
  }
  const int64_t j0 = t * kColumns, cols = std::min(kColumns, N - j0);
  for (int r = 0; r < R; ++r) {
    __m256 sum[kVectors];
    for (int j = 0; j < kVectors; ++j) sum[j] = S == 2 ? _mm256_add_ps(acc[0][r][j], acc[S - 1][r][j]) : acc[0][r][j];
    Store(y + r * N + j0, sum, cols);
  }
}

inline __m256 Int8x8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Columns [32t, 32t + 32) of R rows of y from an int8 tile [K, 32] and per-column scales.
template <int R>
void Int8Tile(const float* x, const int8_t* tile, const float* scale, float* y, int64_t K, int64_t N, int64_t t) {
  constexpr int S = R == 1 ? 2 : 1;
  __m256 acc[S][R][kVectors];
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < kVectors; ++j) acc[s][r][j] = _mm256_setzero_ps();
  auto step = [&](int s, int64_t k) {
    for (int j = 0; j < kVectors; ++j) {
      const __m256 w = Int8x8(tile + k * kColumns + 8 * j);
      for (int r = 0; r < R; ++r) acc[s][r][j] = _mm256_fmadd_ps(_mm256_set1_ps(x[r * K + k]), w, acc[s][r][j]);
    }
  };
  int64_t k = 0;
  for (; k + S <= K; k += S)
    for (int s = 0; s < S; ++s) step(s, k + s);
  for (; k < K; ++k) step(0, k);
  const int64_t j0 = t * kColumns, cols = std::min(kColumns, N - j0);
  for (int r = 0; r < R; ++r) {
    __m256 out[kVectors];
    for (int j = 0; j < kVectors; ++j) {
      const __m256 sum = S == 2 ? _mm256_add_ps(acc[0][r][j], acc[S - 1][r][j]) : acc[0][r][j];
      out[j] = _mm256_mul_ps(sum, _mm256_loadu_ps(scale + j0 + 8 * j));
    }
    Store(y + r * N + j0, out, cols);
  }
}

inline __m256 Bf16x8(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// The same from an int4 tile [K / 2, 32] (two rows per byte) with bf16 scales [K / group, padded N].
template <int R>
void Int4Tile(const float* x, const uint8_t* tile, const uint16_t* scales, float* y, int64_t K, int64_t N,
              int64_t t, int64_t group, int64_t padded_n) {
  constexpr int S = R == 1 ? 2 : 1;  // separate low- and high-nibble sums for one row
  const __m256i nibble = _mm256_set1_epi32(15), offset = _mm256_set1_epi32(8);
  const int64_t j0 = t * kColumns;
  __m256 total[R][kVectors];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < kVectors; ++j) total[r][j] = _mm256_setzero_ps();
  for (int64_t g = 0; g < K / group; ++g) {
    __m256 part[S][R][kVectors];
    for (int s = 0; s < S; ++s)
      for (int r = 0; r < R; ++r)
        for (int j = 0; j < kVectors; ++j) part[s][r][j] = _mm256_setzero_ps();
    for (int64_t k2 = g * group / 2; k2 < (g + 1) * group / 2; ++k2) {
      const uint8_t* bytes = tile + k2 * kColumns;
      for (int j = 0; j < kVectors; ++j) {
        const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes + 8 * j)));
        const __m256 lo = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(b, nibble), offset));
        const __m256 hi = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(b, 4), offset));
        for (int r = 0; r < R; ++r) {
          part[0][r][j] = _mm256_fmadd_ps(_mm256_set1_ps(x[r * K + 2 * k2]), lo, part[0][r][j]);
          part[S - 1][r][j] = _mm256_fmadd_ps(_mm256_set1_ps(x[r * K + 2 * k2 + 1]), hi, part[S - 1][r][j]);
        }
      }
    }
    for (int j = 0; j < kVectors; ++j) {
      const __m256 s = Bf16x8(scales + g * padded_n + j0 + 8 * j);
      for (int r = 0; r < R; ++r) {
        const __m256 sum = S == 2 ? _mm256_add_ps(part[0][r][j], part[S - 1][r][j]) : part[0][r][j];
        total[r][j] = _mm256_fmadd_ps(sum, s, total[r][j]);
      }
    }
  }
  const int64_t cols = std::min(kColumns, N - j0);
  for (int r = 0; r < R; ++r) Store(y + r * N + j0, total[r], cols);
}

}  // namespace jaxinfer_avx2

#endif  // JAXINFER_CPU_KERNELS_PACKED_TILES_AVX2_H_
