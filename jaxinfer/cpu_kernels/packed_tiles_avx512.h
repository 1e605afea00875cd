// The packed matmul's int8 and int4 tiles with AVX-512 (BW, and VNNI where the CPU has it).
//
// The same layouts and integer sums as packed_tiles_avx2.h, on 16-lane vectors: a tile's 32
// columns are two int32 vectors per row. VNNI's vpdpwssd multiplies a column's int16 pair by
// the row's pair and adds both products to the sum in one instruction (vpmaddwd + vpaddd
// without it). Up to 4 rows sum both vectors in one pass over a run of pairs, 5 to 8 rows one
// vector per pass (AVX2 needs four passes for 8 rows); the sums and broadcast pairs then fit
// the 32 registers.
//
// On an AVX512-BF16 CPU (Zen 4) the AVX2 loops left int8 and int4 at 0.6-0.7x the bf16 tiles'
// speed at batch 8. One vpdpwssd does as many multiply-adds as one vdpbf16ps, so there, where
// decode is compute bound, int8 can at best match bf16; at batch 1 both read at memory speed.

#ifndef JAXINFER_CPU_KERNELS_PACKED_TILES_AVX512_H_
#define JAXINFER_CPU_KERNELS_PACKED_TILES_AVX512_H_

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace jaxinfer_avx512 {

constexpr int64_t kColumns = 32;  // per tile
constexpr int kVectors = 2;       // 16-lane vectors per tile row
// int8 x int16 pair sums stay below 2^31 for 256 pairs (2 * 127 * 32767 each): a margin of 2.
constexpr int64_t kChunkPairs = 128;

// sum + the pairwise products of w and pairs (int16 lanes), per 32-bit lane.
inline __m512i AddPairProducts(__m512i sum, __m512i w, __m512i pairs) {
#if defined(__AVX512VNNI__)
  return _mm512_dpwssd_epi32(sum, w, pairs);
#else
  return _mm512_add_epi32(sum, _mm512_madd_epi16(w, pairs));
#endif
}

// Each row's int16 pair (2k2, 2k2 + 1) as one int32 in every lane.
template <int R>
void BroadcastPairs(const int16_t* x, int64_t ldx, int64_t k2, __m512i (&pairs)[R]) {
  for (int r = 0; r < R; ++r) {
    int32_t pair;
    std::memcpy(&pair, x + r * ldx + 2 * k2, sizeof(pair));
    pairs[r] = _mm512_set1_epi32(pair);
  }
}

// y[0, cols) of one row from two 16-float vectors, cols <= 32.
inline void Store(float* y, __m512 lo, __m512 hi, int64_t cols) {
  const __mmask16 lo_mask = cols >= 16 ? 0xFFFF : (1u << cols) - 1;
  const __mmask16 hi_mask = cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (1u << (cols - 16)) - 1;
  _mm512_mask_storeu_ps(y, lo_mask, lo);
  _mm512_mask_storeu_ps(y + 16, hi_mask, hi);
}

// Column vectors summed per pass over a run of pairs: both for up to 4 rows; for more rows the
// run is read again from L1 per vector, so the int32 sums and the broadcast pairs stay in
// registers (with both, GCC spilled two of 8 rows' sums inside the loop).
template <int R>
constexpr int PassVectors() { return R <= 4 ? 2 : 1; }

inline void AddAsFloat(float* total, __m512i sum) {
  _mm512_store_ps(total, _mm512_add_ps(_mm512_load_ps(total), _mm512_cvtepi32_ps(sum)));
}

// Pairs [k0, k1) of an int8 tile for vectors [v0, v0 + V) of R rows, added to total [R][32].
template <int R, int V>
void Int8Pass(const int16_t* x, int64_t ldx, const int8_t* tile, int64_t k0, int64_t k1, int v0,
              float (&total)[R][kColumns]) {
  __m512i sum[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) sum[r][v] = _mm512_setzero_si512();
  for (int64_t k2 = k0; k2 < k1; ++k2) {
    __m512i pairs[R];
    BroadcastPairs<R>(x, ldx, k2, pairs);
    const auto* words = reinterpret_cast<const __m256i*>(tile + k2 * 2 * kColumns) + v0;
    for (int v = 0; v < V; ++v) {
      const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256(words + v));
      for (int r = 0; r < R; ++r) sum[r][v] = AddPairProducts(sum[r][v], w, pairs[r]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) AddAsFloat(total[r] + 16 * (v0 + v), sum[r][v]);
}

// Columns [32t, 32t + 32) of R <= 8 rows of y from an int8 tile [K2, 64] (rows 2k2 and 2k2 + 1
// of each column side by side) and per-column scales; x is int16 [R, ldx] with per-row scales.
// int32 sums go to float every kChunkPairs pairs, before they could overflow.
template <int R>
void Int8Tile(const int16_t* x, int64_t ldx, const float* x_scale, const int8_t* tile, const float* scale, float* y,
              int64_t K2, int64_t N, int64_t t) {
  constexpr int V = PassVectors<R>();
  alignas(64) float total[R][kColumns] = {};
  for (int64_t k0 = 0; k0 < K2; k0 += kChunkPairs) {
    for (int v0 = 0; v0 < kVectors; v0 += V) Int8Pass<R, V>(x, ldx, tile, k0, std::min(K2, k0 + kChunkPairs), v0, total);
  }
  const int64_t j0 = t * kColumns, cols = std::min(kColumns, N - j0);
  const __m512 lo_scale = _mm512_loadu_ps(scale + j0), hi_scale = _mm512_loadu_ps(scale + j0 + 16);
  for (int r = 0; r < R; ++r) {
    const __m512 row_scale = _mm512_set1_ps(x_scale[r]);
    Store(y + r * N + j0, _mm512_mul_ps(_mm512_mul_ps(_mm512_load_ps(total[r]), lo_scale), row_scale),
          _mm512_mul_ps(_mm512_mul_ps(_mm512_load_ps(total[r] + 16), hi_scale), row_scale), cols);
  }
}

// 16 bf16 values as floats.
inline __m512 Bf16x16(const uint16_t* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// Quads [q0, q1) (rows 4q..4q + 3) of an int4 tile for vectors [v0, v0 + V) of R rows. 32 bytes
// (16 columns) widen to words holding a column's rows 4q, 4q + 1 in the low nibbles of two words
// and rows 4q + 2, 4q + 3 in their high nibbles: a mask and a shift make two vpdpwssd operands.
template <int R, int V>
void Int4Pass(const int16_t* x, int64_t ldx, const uint8_t* tile, int64_t q0, int64_t q1, int v0,
              __m512i (&sum)[R][V]) {
  const __m512i nibble = _mm512_set1_epi16(15);
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) sum[r][v] = _mm512_setzero_si512();
  for (int64_t q = q0; q < q1; ++q) {
    __m512i low_pairs[R], high_pairs[R];
    BroadcastPairs<R>(x, ldx, 2 * q, low_pairs);
    BroadcastPairs<R>(x, ldx, 2 * q + 1, high_pairs);
    const auto* bytes = reinterpret_cast<const __m256i*>(tile + q * 2 * kColumns) + v0;
    for (int v = 0; v < V; ++v) {
      const __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256(bytes + v));
      const __m512i lo = _mm512_and_si512(b, nibble), hi = _mm512_srli_epi16(b, 4);
      for (int r = 0; r < R; ++r) {
        sum[r][v] = AddPairProducts(AddPairProducts(sum[r][v], lo, low_pairs[r]), hi, high_pairs[r]);
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
  alignas(64) float total[R][kColumns] = {};
  for (int64_t g = 0; g < K2 / 2 / group_quads; ++g) {
    for (int v0 = 0; v0 < kVectors; v0 += V) {
      __m512i sum[R][V];
      Int4Pass<R, V>(x, ldx, tile, g * group_quads, (g + 1) * group_quads, v0, sum);
      for (int v = 0; v < V; ++v) {
        const __m512 s = Bf16x16(scales + g * padded_n + j0 + 16 * (v0 + v));
        for (int r = 0; r < R; ++r) {
          float* column = total[r] + 16 * (v0 + v);
          const __m512i offset = _mm512_set1_epi32(8 * x_sums[r * groups + g]);
          const __m512 part = _mm512_cvtepi32_ps(_mm512_sub_epi32(sum[r][v], offset));
          _mm512_store_ps(column, _mm512_fmadd_ps(part, s, _mm512_load_ps(column)));
        }
      }
    }
  }
  const int64_t cols = std::min(kColumns, N - j0);
  for (int r = 0; r < R; ++r) {
    const __m512 row_scale = _mm512_set1_ps(x_scale[r]);
    Store(y + r * N + j0, _mm512_mul_ps(_mm512_load_ps(total[r]), row_scale),
          _mm512_mul_ps(_mm512_load_ps(total[r] + 16), row_scale), cols);
  }
}

}  // namespace jaxinfer_avx512

#endif  // JAXINFER_CPU_KERNELS_PACKED_TILES_AVX512_H_
