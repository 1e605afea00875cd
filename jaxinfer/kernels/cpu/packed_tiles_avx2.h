// The packed matmul's bf16 tiles with AVX2 (+ FMA), for CPUs without AVX512-BF16 (the int8 and
// int4 tiles are in packed_tiles_int.h).
//
// A tile's 32 columns are four 8-lane vectors per row. GCC's vectoriser left this loop at ~40%
// of the copy bandwidth (strided bf16 widening), so it is written out: a pair of rows
// interleaved per column is one 32-bit word per column; the even row's float is the word
// shifted left 16, the odd row's the word with its low half cleared. One row keeps separate
// sums for the two rows of a pair: eight FMA chains hide the FMA latency.

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

}  // namespace jaxinfer_avx2

#endif  // JAXINFER_CPU_KERNELS_PACKED_TILES_AVX2_H_
