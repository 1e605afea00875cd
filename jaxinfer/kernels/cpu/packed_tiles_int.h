// The packed matmul's int8 and int4 tiles on x86 vectors: one set of loops over ISA traits,
// AVX2 (8 int32 lanes, 16 registers) or AVX-512 BW (16 lanes, 32 registers; VNNI's vpdpwssd
// where the CPU has it).
//
// The activations come as int16 (rounded per row, see packed_matmul.cc) and a column's two
// weights of a row pair sit in one 32-bit lane as int16 after widening, so one multiply-add of
// int16 pairs (vpmaddwd, + vpaddd; or vpdpwssd) multiplies and adds a pair: no int-to-float
// conversion per weight, which had left both compute bound (one Zen 3 core from DRAM: int8
// 8-9 GB/s, int4 5-6; with this, 12 and 11).
//
// A pass sums as many of a tile's column vectors for its rows as the registers hold with their
// operands (kInt8Sums or kInt4Sums / rows); more rows read the run of pairs again from L1 per
// vector, broadcasting every row's pairs again. int8 holds one broadcast pair a row, int4 two:
// with AVX-512, int8 sums both vectors of 8 rows in one pass, int4 both vectors of 4 rows.
// With all four AVX2 vectors for two rows GCC spilled a sum, and the loop ran at a
// store-forwarding latency. On a Zen 4 (AVX512-BF16) the AVX2 loops left batch-8 decode at
// 0.67x (int8) and 0.57x (int4) of the bf16 tiles, the AVX-512 ones at 0.78-0.86x and
// 0.74-0.78x with one vector per pass of 8 rows, 0.98-1.02x and 0.93-0.99x with the passes
// above: one vpdpwssd does as many multiply-adds as one vdpbf16ps, so where decode is compute
// bound int8 can at best match bf16; at batch 1 both read at memory speed.

#ifndef JAXINFER_CPU_KERNELS_PACKED_TILES_INT_H_
#define JAXINFER_CPU_KERNELS_PACKED_TILES_INT_H_

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace jaxinfer_int {

constexpr int64_t kColumns = 32;  // per tile
// int8 x int16 pair sums stay below 2^31 for 256 pairs (2 * 127 * 32767 each): a margin of 2.
constexpr int64_t kChunkPairs = 128;

#if defined(__AVX512BW__)

struct Isa {
  using I = __m512i;
  using F = __m512;
  static constexpr int kLanes = 16;
  static constexpr int kInt8Sums = 16;  // of 32, beside R broadcast pairs and a widened vector
  static constexpr int kInt4Sums = 8;   // beside 2R broadcast pairs, a vector and its two nibble halves
  static constexpr int kInt8PassRows = 8;
  static constexpr int kInt4PassRows = 4;
  static I Zero() { return _mm512_setzero_si512(); }
  static I Broadcast(int32_t v) { return _mm512_set1_epi32(v); }
  // kLanes columns' pairs of int8 (or bytes) at p, widened to int16.
  static I WidenSigned(const void* p) { return _mm512_cvtepi8_epi16(_mm256_loadu_si256(static_cast<const __m256i*>(p))); }
  static I WidenUnsigned(const void* p) { return _mm512_cvtepu8_epi16(_mm256_loadu_si256(static_cast<const __m256i*>(p))); }
  static I LowNibbles(I b) { return _mm512_and_si512(b, _mm512_set1_epi16(15)); }
  static I HighNibbles(I b) { return _mm512_srli_epi16(b, 4); }
  static I AddPairProducts(I sum, I w, I pairs) {
#if defined(__AVX512VNNI__)
    return _mm512_dpwssd_epi32(sum, w, pairs);
#else
    return _mm512_add_epi32(sum, _mm512_madd_epi16(w, pairs));
#endif
  }
  static I Sub(I a, I b) { return _mm512_sub_epi32(a, b); }
  static F ToFloat(I v) { return _mm512_cvtepi32_ps(v); }
  static F Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F Set1(float v) { return _mm512_set1_ps(v); }
  static F Add(F a, F b) { return _mm512_add_ps(a, b); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F Bf16(const uint16_t* p) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
};

#else  // AVX2 + FMA

struct Isa {
  using I = __m256i;
  using F = __m256;
  static constexpr int kLanes = 8;
  static constexpr int kInt8Sums = 4;  // of 16
  static constexpr int kInt4Sums = 4;
  static constexpr int kInt8PassRows = 2;
  static constexpr int kInt4PassRows = 2;
  static I Zero() { return _mm256_setzero_si256(); }
  static I Broadcast(int32_t v) { return _mm256_set1_epi32(v); }
  static I WidenSigned(const void* p) { return _mm256_cvtepi8_epi16(_mm_loadu_si128(static_cast<const __m128i*>(p))); }
  static I WidenUnsigned(const void* p) { return _mm256_cvtepu8_epi16(_mm_loadu_si128(static_cast<const __m128i*>(p))); }
  static I LowNibbles(I b) { return _mm256_and_si256(b, _mm256_set1_epi16(15)); }
  static I HighNibbles(I b) { return _mm256_srli_epi16(b, 4); }
  static I AddPairProducts(I sum, I w, I pairs) { return _mm256_add_epi32(sum, _mm256_madd_epi16(w, pairs)); }
  static I Sub(I a, I b) { return _mm256_sub_epi32(a, b); }
  static F ToFloat(I v) { return _mm256_cvtepi32_ps(v); }
  static F Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F Set1(float v) { return _mm256_set1_ps(v); }
  static F Add(F a, F b) { return _mm256_add_ps(a, b); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F Bf16(const uint16_t* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
};

#endif

using I = Isa::I;
using F = Isa::F;
constexpr int kLanes = Isa::kLanes;
constexpr int kVectors = kColumns / kLanes;  // per tile row
constexpr int kInt8PassRows = Isa::kInt8PassRows;  // rows per call of a tile function
constexpr int kInt4PassRows = Isa::kInt4PassRows;

// Column vectors one pass sums for R rows, in `sums` registers.
template <int R, int sums>
constexpr int PassVectors() { return std::min(kVectors, std::max(1, sums / R)); }

// Each row's int16 pair (2k2, 2k2 + 1) as one int32 in every lane: the multiply-add's operand.
template <int R>
void BroadcastPairs(const int16_t* x, int64_t ldx, int64_t k2, I (&pairs)[R]) {
  for (int r = 0; r < R; ++r) {
    int32_t pair;
    std::memcpy(&pair, x + r * ldx + 2 * k2, sizeof(pair));
    pairs[r] = Isa::Broadcast(pair);
  }
}

// y[0, cols) of R rows: total [R][32] times the per-column factors (or ones) and each row's scale.
template <int R>
void StoreRows(const float (&total)[R][kColumns], const float* column_scale, const float* x_scale, float* y,
               int64_t ldy, int64_t cols) {
  for (int r = 0; r < R; ++r) {
    alignas(64) float out[kColumns];
    for (int j = 0; j < kVectors; ++j) {
      F v = Isa::Mul(Isa::Load(total[r] + kLanes * j), Isa::Set1(x_scale[r]));
      if (column_scale != nullptr) v = Isa::Mul(v, Isa::Load(column_scale + kLanes * j));
      Isa::Store(out + kLanes * j, v);
    }
    std::memcpy(y + r * ldy, out, cols * sizeof(float));
  }
}

// Pairs [k0, k1) of an int8 tile for vectors [v0, v0 + V) of R rows, added to total [R][32].
template <int R, int V>
void Int8Pass(const int16_t* x, int64_t ldx, const int8_t* tile, int64_t k0, int64_t k1, int v0,
              float (&total)[R][kColumns]) {
  I sum[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) sum[r][v] = Isa::Zero();
  for (int64_t k2 = k0; k2 < k1; ++k2) {
    I pairs[R];
    BroadcastPairs<R>(x, ldx, k2, pairs);
    const int8_t* words = tile + k2 * 2 * kColumns + 2 * kLanes * v0;
    for (int v = 0; v < V; ++v) {
      const I w = Isa::WidenSigned(words + 2 * kLanes * v);
      for (int r = 0; r < R; ++r) sum[r][v] = Isa::AddPairProducts(sum[r][v], w, pairs[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < V; ++v) {
      float* out = total[r] + kLanes * (v0 + v);
      Isa::Store(out, Isa::Add(Isa::Load(out), Isa::ToFloat(sum[r][v])));
    }
  }
}

// Columns [32t, 32t + 32) of R rows of y from an int8 tile [K2, 64] (rows 2k2 and 2k2 + 1 of each
// column side by side) and per-column scales; x is int16 [R, ldx] with per-row scales. int32
// sums go to float every kChunkPairs pairs, before they could overflow.
template <int R>
void Int8Tile(const int16_t* x, int64_t ldx, const float* x_scale, const int8_t* tile, const float* scale, float* y,
              int64_t K2, int64_t N, int64_t t) {
  constexpr int V = PassVectors<R, Isa::kInt8Sums>();
  alignas(64) float total[R][kColumns] = {};
  for (int64_t k0 = 0; k0 < K2; k0 += kChunkPairs) {
    for (int v0 = 0; v0 < kVectors; v0 += V) Int8Pass<R, V>(x, ldx, tile, k0, std::min(K2, k0 + kChunkPairs), v0, total);
  }
  const int64_t j0 = t * kColumns;
  StoreRows<R>(total, scale + j0, x_scale, y + j0, N, std::min(kColumns, N - j0));
}

// Quads [q0, q1) (rows 4q..4q + 3) of an int4 tile for vectors [v0, v0 + V) of R rows. A
// vector's bytes widen to 16-bit words holding a column's rows 4q, 4q + 1 in the low nibbles
// of two words and rows 4q + 2, 4q + 3 in their high nibbles: a mask and a shift make two
// multiply-add operands.
template <int R, int V>
void Int4Pass(const int16_t* x, int64_t ldx, const uint8_t* tile, int64_t q0, int64_t q1, int v0, I (&sum)[R][V]) {
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) sum[r][v] = Isa::Zero();
  for (int64_t q = q0; q < q1; ++q) {
    I low_pairs[R], high_pairs[R];
    BroadcastPairs<R>(x, ldx, 2 * q, low_pairs);
    BroadcastPairs<R>(x, ldx, 2 * q + 1, high_pairs);
    const uint8_t* bytes = tile + q * 2 * kColumns + 2 * kLanes * v0;
    for (int v = 0; v < V; ++v) {
      const I b = Isa::WidenUnsigned(bytes + 2 * kLanes * v);
      const I lo = Isa::LowNibbles(b), hi = Isa::HighNibbles(b);
      for (int r = 0; r < R; ++r) {
        sum[r][v] = Isa::AddPairProducts(Isa::AddPairProducts(sum[r][v], lo, low_pairs[r]), hi, high_pairs[r]);
      }
    }
  }
}

// The same from an int4 tile [K / 4, 64] (per quad of rows: byte 2c holds rows 4q (low nibble)
// and 4q + 2 (high) of column c, byte 2c + 1 rows 4q + 1 and 4q + 3; each value stored + 8) with
// the tile's bf16 scales [K / group, 32]. The stored + 8 is taken off once per group: 8 times the
// row's sum of activations over the group (x_sums [R, groups]).
template <int R>
void Int4Tile(const int16_t* x, int64_t ldx, const float* x_scale, const int32_t* x_sums, int64_t groups,
              const uint8_t* tile, const uint16_t* scales, float* y, int64_t K2, int64_t N, int64_t t,
              int64_t group) {
  constexpr int V = PassVectors<R, Isa::kInt4Sums>();
  const int64_t j0 = t * kColumns, group_quads = group / 4;
  alignas(64) float total[R][kColumns] = {};
  for (int64_t g = 0; g < K2 / 2 / group_quads; ++g) {
    for (int v0 = 0; v0 < kVectors; v0 += V) {
      I sum[R][V];
      Int4Pass<R, V>(x, ldx, tile, g * group_quads, (g + 1) * group_quads, v0, sum);
      for (int v = 0; v < V; ++v) {
        const F s = Isa::Bf16(scales + g * kColumns + kLanes * (v0 + v));
        for (int r = 0; r < R; ++r) {
          float* out = total[r] + kLanes * (v0 + v);
          const F part = Isa::ToFloat(Isa::Sub(sum[r][v], Isa::Broadcast(8 * x_sums[r * groups + g])));
          Isa::Store(out, Isa::Fma(part, s, Isa::Load(out)));
        }
      }
    }
  }
  StoreRows<R>(total, nullptr, x_scale, y + j0, N, std::min(kColumns, N - j0));
}

}  // namespace jaxinfer_int

#endif  // JAXINFER_CPU_KERNELS_PACKED_TILES_INT_H_
