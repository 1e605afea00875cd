// The packed matmul's tiles with AVX2 (+ FMA): bf16 on CPUs without AVX512-BF16, int8 and int4
// on CPUs without AVX512-BW (packed_tiles_avx512.h).
//
// A tile's 32 columns are four 8-lane vectors per row. GCC's vectoriser left these loops at ~40%
// of the copy bandwidth (strided bf16 widening, int8 widened through memory), so they are
// written out:
// - bf16: a pair of rows interleaved per column is one 32-bit word per column; the even row's
//   float is the word shifted left 16, the odd row's the word with its low half cleared. One
//   row keeps separate sums for the two rows of a pair: eight FMA chains hide the FMA latency.
// - int8 / int4: the activations come as int16 (rounded per row, see packed_matmul.cc) and a
//   column's two weights of a row pair sit in one 32-bit lane as int16 after widening, so one
//   vpmaddwd multiplies and adds a pair: no int-to-float conversion per weight, which had left
//   both compute bound (one core from DRAM: int8 8-9 GB/s, int4 5-6; now 12 and 11).

#ifndef JAXINFER_CPU_KERNELS_PACKED_TILES_AVX2_H_
#define JAXINFER_CPU_KERNELS_PACKED_TILES_AVX2_H_

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace jaxinfer_avx2 {

constexpr int64_t kColumns = 32;  // per tile
constexpr int kVectors = 4;       // 8-float vectors per tile row
// int8 x int16 pair sums stay below 2^31 for 256 pairs (2 * 127 * 32767 each): a margin of 2.
constexpr int64_t kChunkPairs = 128;

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

inline __m256 Bf16x8(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// Each row's int16 pair (2k2, 2k2 + 1) as one int32 in every lane: vpmaddwd's activation operand.
template <int R>
void BroadcastPairs(const int16_t* x, int64_t ldx, int64_t k2, __m256i (&pairs)[R]) {
  for (int r = 0; r < R; ++r) {
    int32_t pair;
    std::memcpy(&pair, x + r * ldx + 2 * k2, sizeof(pair));
    pairs[r] = _mm256_set1_epi32(pair);
  }
}

// Column vectors summed per pass over a run of pairs: all four for one row; for more rows the
// run is read again from L1 per two (or one) vectors, so the int32 sums stay in registers
// (with all four, two rows' sums spilled and the loop ran at a store-forwarding latency).
template <int R>
constexpr int PassVectors() { return R == 1 ? 4 : R == 2 ? 2 : 1; }

inline void AddAsFloat(float* total, __m256i sum) {
  _mm256_storeu_ps(total, _mm256_add_ps(_mm256_loadu_ps(total), _mm256_cvtepi32_ps(sum)));
}

// Pairs [k0, k1) of an int8 tile for vectors [v0, v0 + V) of R rows, added to total [R][32].
template <int R, int V>
void Int8Pass(const int16_t* x, int64_t ldx, const int8_t* tile, int64_t k0, int64_t k1, int v0,
              float (&total)[R][kColumns]) {
  __m256i sum[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) sum[r][v] = _mm256_setzero_si256();
  for (int64_t k2 = k0; k2 < k1; ++k2) {
    __m256i pairs[R];
    BroadcastPairs<R>(x, ldx, k2, pairs);
    const auto* words = reinterpret_cast<const __m128i*>(tile + k2 * 2 * kColumns) + v0;
    for (int v = 0; v < V; ++v) {
      const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128(words + v));
      for (int r = 0; r < R; ++r) sum[r][v] = _mm256_add_epi32(sum[r][v], _mm256_madd_epi16(w, pairs[r]));
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) AddAsFloat(total[r] + 8 * (v0 + v), sum[r][v]);
}

// Columns [32t, 32t + 32) of R rows of y from an int8 tile [K2, 64] (rows 2k2 and 2k2 + 1 of each
// column side by side) and per-column scales; x is int16 [R, ldx] with per-row scales.
// vpmaddwd multiplies a column's pair by the row's pair and adds them: 16 weights per instruction,
// int32 sums converted to float every kChunkPairs pairs, before they could overflow.
template <int R>
void Int8Tile(const int16_t* x, int64_t ldx, const float* x_scale, const int8_t* tile, const float* scale, float* y,
              int64_t K2, int64_t N, int64_t t) {
  constexpr int V = PassVectors<R>();
  alignas(32) float total[R][kColumns] = {};
  for (int64_t k0 = 0; k0 < K2; k0 += kChunkPairs) {
    for (int v0 = 0; v0 < kVectors; v0 += V) Int8Pass<R, V>(x, ldx, tile, k0, std::min(K2, k0 + kChunkPairs), v0, total);
  }
  const int64_t j0 = t * kColumns, cols = std::min(kColumns, N - j0);
  for (int r = 0; r < R; ++r) {
    const __m256 row_scale = _mm256_set1_ps(x_scale[r]);
    __m256 out[kVectors];
    for (int j = 0; j < kVectors; ++j) {
      out[j] = _mm256_mul_ps(_mm256_mul_ps(_mm256_load_ps(total[r] + 8 * j), _mm256_loadu_ps(scale + j0 + 8 * j)), row_scale);
    }
    Store(y + r * N + j0, out, cols);
  }
}

// Quads [q0, q1) (rows 4q..4q + 3) of an int4 tile for vectors [v0, v0 + V) of R rows. 16 bytes
// (8 columns) widen to 16-bit words holding a column's rows 4q, 4q + 1 in the low nibbles of two
// words and rows 4q + 2, 4q + 3 in their high nibbles: a mask and a shift make two vpmaddwd
// operands.
template <int R, int V>
void Int4Pass(const int16_t* x, int64_t ldx, const uint8_t* tile, int64_t q0, int64_t q1, int v0,
              __m256i (&sum)[R][V]) {
  const __m256i nibble = _mm256_set1_epi16(15);
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) sum[r][v] = _mm256_setzero_si256();
  for (int64_t q = q0; q < q1; ++q) {
    __m256i low_pairs[R], high_pairs[R];
    BroadcastPairs<R>(x, ldx, 2 * q, low_pairs);
    BroadcastPairs<R>(x, ldx, 2 * q + 1, high_pairs);
    const auto* bytes = reinterpret_cast<const __m128i*>(tile + q * 2 * kColumns) + v0;
    for (int v = 0; v < V; ++v) {
      const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(bytes + v));
      const __m256i lo = _mm256_and_si256(b, nibble), hi = _mm256_srli_epi16(b, 4);
      for (int r = 0; r < R; ++r) {
        const __m256i both = _mm256_add_epi32(_mm256_madd_epi16(lo, low_pairs[r]), _mm256_madd_epi16(hi, high_pairs[r]));
        sum[r][v] = _mm256_add_epi32(sum[r][v], both);
      }
    }
  }
}

// The same from an int4 tile [K / 4, 64] (per quad of rows, see Int4Pass; each value stored + 8)
// with bf16 scales [K / group, padded N]. The stored + 8 is taken off once per group: 8 times
// the row's sum of activations over the group (x_sums [R, groups]).
template <int R>
void Int4Tile(const int16_t* x, int64_t ldx, const float* x_scale, const int32_t* x_sums, int64_t groups,
              const uint8_t* tile, const uint16_t* scales, float* y, int64_t K2, int64_t N, int64_t t,
              int64_t group, int64_t padded_n) {
  constexpr int V = PassVectors<R>();
  const int64_t j0 = t * kColumns, group_quads = group / 4;
  alignas(32) float total[R][kColumns] = {};
  for (int64_t g = 0; g < K2 / 2 / group_quads; ++g) {
    for (int v0 = 0; v0 < kVectors; v0 += V) {
      __m256i sum[R][V];
      Int4Pass<R, V>(x, ldx, tile, g * group_quads, (g + 1) * group_quads, v0, sum);
      for (int v = 0; v < V; ++v) {
        const int j = v0 + v;
        const __m256 s = Bf16x8(scales + g * padded_n + j0 + 8 * j);
        for (int r = 0; r < R; ++r) {
          const __m256i offset = _mm256_set1_epi32(8 * x_sums[r * groups + g]);
          const __m256 part = _mm256_cvtepi32_ps(_mm256_sub_epi32(sum[r][v], offset));
          _mm256_store_ps(total[r] + 8 * j, _mm256_fmadd_ps(part, s, _mm256_load_ps(total[r] + 8 * j)));
        }
      }
    }
  }
  const int64_t cols = std::min(kColumns, N - j0);
  for (int r = 0; r < R; ++r) {
    const __m256 row_scale = _mm256_set1_ps(x_scale[r]);
    __m256 out[kVectors];
    for (int j = 0; j < kVectors; ++j) out[j] = _mm256_mul_ps(_mm256_load_ps(total[r] + 8 * j), row_scale);
    Store(y + r * N + j0, out, cols);
  }
}

}  // namespace jaxinfer_avx2

#endif  // JAXINFER_CPU_KERNELS_PACKED_TILES_AVX2_H_
