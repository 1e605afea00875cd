// Matmul with packed bfloat16 weights for CPU decode (and prefill): y[M, N] (f32) = x[M, K] (bf16) . W.
//
// Decode multiplies a handful of rows (one per sequence, or per verified draft token) by every
// weight once per step, so it is bound by how fast the weights stream from memory. XLA:CPU
// reads bf16 weights [K, N] at well under half the machine's bandwidth at these shapes: a
// column block walks down K with a stride of a whole row. Here the weights are packed once at
// load time as P [T, K2, 64], T = ceil(N / 32), K2 = ceil(K / 2): tile t holds columns
// 32t..32t+31, and for each pair of rows (2k2, 2k2+1) the 32 columns' values interleaved as
// (W[2k2, c], W[2k2+1, c]). A tile is one sequential stream, already in the operand order of
// AVX512-BF16's pair dot product (vdpbf16ps): the inner loop is two loads and 2M dot products
// per 32x2 weights. x is [M, 2 * K2] (the caller zero-pads an odd K).
//
// Products of two bf16 values are exact in f32 and every sum is accumulated in f32. Rows go in
// groups of up to 8 while the tile is in cache, so many rows (prefill) cost no more than XLA's
// dot. Without AVX512-BF16 the same loops run on widened floats, shaped for the vectoriser.
// Tiles are split over XLA's intra-op thread pool.
//
// Quantized weights (weight-only, see jaxinfer/quantization.py) use the same 32-column tiles so
// decode streams fewer bytes: int8 as Q [T, K, 32] with one float32 scale per column, int4 as
// Q [T, K2, 32] bytes (row 2k2 in the low nibble, 2k2 + 1 in the high one, stored value + 8)
// with one bf16 scale per column and group of `group` rows. x is float32 there; the widened
// products are summed in f32 and scaled once per column (int8) or per group (int4), with
// AVX-512 intrinsics where the CPU has them (the vectoriser chose 256-bit vectors and a long
// widening chain, leaving int4 compute bound), AVX2 ones (packed_tiles_avx2.h) on CPUs with
// only AVX2 + FMA, else portable loops.

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#if defined(__AVX2__) && defined(__FMA__)
#include "packed_tiles_avx2.h"
#endif

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics self-initialise their undefined operands: a false alarm per call.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "parallel_tasks.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kTileColumns = 32;
constexpr int64_t kTileValues = 2 * kTileColumns;  // per pair of rows
constexpr int kGroupRows = 8;                       // rows whose accumulators live in registers
#ifndef JAXINFER_PASS_ROWS
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
// 16 ymm registers hold two rows' 32-column sums with their operands; more rows spill them.
// Larger batches take several passes over a tile that is then in cache.
#define JAXINFER_PASS_ROWS 2
#else
#define JAXINFER_PASS_ROWS kGroupRows
#endif
#endif
constexpr int kPassRows = JAXINFER_PASS_ROWS;  // rows per pass over a tile (-D for experiments)

struct Operands {
  const uint16_t* x;  // [M, K]
  const uint16_t* w;  // packed [T, K2, 64]
  float* y;           // [M, N]
  int64_t M, K, N;    // K = 2 * K2
};

// A bf16 bit pattern as the float it names.
inline float Widen(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, sizeof(out));
  return out;
}

#if defined(__AVX512BF16__)

// Columns [32t, 32t + 32) of rows [0, R) of y, for R <= 8 rows starting at x / y.
template <int R>
void PackedTile(const uint16_t* x, const uint16_t* tile, float* y, int64_t K, int64_t N, int64_t t) {
  __m512 lo[R], hi[R];
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm512_setzero_ps();
  for (int64_t k2 = 0; k2 < K / 2; ++k2) {
    const __m512bh w_lo = (__m512bh)_mm512_loadu_si512(tile + k2 * kTileValues);
    const __m512bh w_hi = (__m512bh)_mm512_loadu_si512(tile + k2 * kTileValues + kTileColumns);
    for (int r = 0; r < R; ++r) {
      uint32_t pair;
      std::memcpy(&pair, x + r * K + 2 * k2, sizeof(pair));
      const __m512bh xp = (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(pair));
      lo[r] = _mm512_dpbf16_ps(lo[r], w_lo, xp);
      hi[r] = _mm512_dpbf16_ps(hi[r], w_hi, xp);
    }
  }
  const int64_t j = t * kTileColumns, cols = std::min(kTileColumns, N - j);
  const __mmask16 lo_mask = cols >= 16 ? 0xFFFF : (1u << cols) - 1;
  const __mmask16 hi_mask = cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (1u << (cols - 16)) - 1;
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(y + r * N + j, lo_mask, lo[r]);
    _mm512_mask_storeu_ps(y + r * N + j + 16, hi_mask, hi[r]);
  }
}

#elif defined(__AVX2__) && defined(__FMA__)

using jaxinfer_avx2::PackedTile;

#else

template <int R>
void PackedTile(const uint16_t* x, const uint16_t* tile, float* y, int64_t K, int64_t N, int64_t t) {
  alignas(64) float acc[R][kTileColumns] = {};
  for (int64_t k2 = 0; k2 < K / 2; ++k2) {
    const uint16_t* w = tile + k2 * kTileValues;
    for (int r = 0; r < R; ++r) {
      const float a0 = Widen(x[r * K + 2 * k2]), a1 = Widen(x[r * K + 2 * k2 + 1]);
#pragma omp simd
      for (int64_t c = 0; c < kTileColumns; ++c) acc[r][c] += a0 * Widen(w[2 * c]) + a1 * Widen(w[2 * c + 1]);
    }
  }
  const int64_t j = t * kTileColumns, cols = std::min(kTileColumns, N - j);
  for (int r = 0; r < R; ++r) std::memcpy(y + r * N + j, acc[r], cols * sizeof(float));
}

#endif

using PackedFn = void (*)(const uint16_t*, const uint16_t*, float*, int64_t, int64_t, int64_t);
constexpr PackedFn kPackedTile[kGroupRows] = {&PackedTile<1>, &PackedTile<2>, &PackedTile<3>, &PackedTile<4>,
                                              &PackedTile<5>, &PackedTile<6>, &PackedTile<7>, &PackedTile<8>};

// Every row group for tiles [t0, t1): a tile is read from memory once, then from cache.
void PackedTiles(const Operands& op, int64_t t0, int64_t t1) {
  const int64_t tile_size = (op.K / 2) * kTileValues;
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t r = 0; r < op.M; r += kPassRows) {
      const int64_t rows = std::min<int64_t>(kPassRows, op.M - r);
      kPackedTile[rows - 1](op.x + r * op.K, op.w + t * tile_size, op.y + r * op.N, op.K, op.N, t);
    }
  }
}

// Splits the tiles into even tasks over the thread pool.
void SplitTiles(ffi::ThreadPool& pool, const Operands& op, int64_t tiles) {
  const int64_t tile_bytes = op.K * kTileColumns * sizeof(uint16_t);
  const int64_t wanted = jaxinfer::TaskCount(pool, tiles, tile_bytes);
  const int64_t per_task = (tiles + wanted - 1) / wanted;
  const int64_t tasks = (tiles + per_task - 1) / per_task;
  jaxinfer::ParallelFor<jaxinfer::NoState>(pool, tasks, [op, tiles, per_task](int64_t i, jaxinfer::NoState&) {
    PackedTiles(op, i * per_task, std::min(tiles, (i + 1) * per_task));
  });
}

using Matrix = ffi::Buffer<ffi::BF16, 2>;
using Packed = ffi::Buffer<ffi::BF16, 3>;
using Result = ffi::Buffer<ffi::F32, 2>;

const uint16_t* Bits(const void* data) { return static_cast<const uint16_t*>(data); }

ffi::Error PackedMatmul(ffi::ThreadPool pool, Matrix x, Packed w, ffi::Result<Result> y) {
  const auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  const Operands op{Bits(x.untyped_data()), Bits(w.untyped_data()), y->typed_data(), xd[0], xd[1], yd[1]};
  if (wd[2] != kTileValues || op.K != 2 * wd[1] || yd[0] != op.M || op.N > wd[0] * kTileColumns ||
      op.N <= (wd[0] - 1) * kTileColumns) {
    return ffi::Error::InvalidArgument("need x [M, 2*K2], packed w [ceil(N/32), K2, 64], y [M, N]");
  }
  SplitTiles(pool, op, wd[0]);
  return ffi::Error::Success();
}

// ---- quantized tiles ----
//
// With AVX-512 the widened weights and each row's accumulators stay in registers. int8: sign
// extension and one conversion per 16 weights. int4: vpermps maps a nibble (the low four bits
// of each int32 lane, so no mask) to its float value - 8 from a 16-entry table. One or two rows
// keep two accumulator sets so the FMA latency stays hidden behind independent chains.

#if defined(__AVX512F__)

inline __m512 Int8x16(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

inline __m512 Bf16x16(const uint16_t* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// y[0, cols) = lo | hi (16 floats each), cols <= 32.
inline void StoreColumns(float* y, __m512 lo, __m512 hi, int64_t cols) {
  const __mmask16 lo_mask = cols >= 16 ? 0xFFFF : (1u << cols) - 1;
  const __mmask16 hi_mask = cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (1u << (cols - 16)) - 1;
  _mm512_mask_storeu_ps(y, lo_mask, lo);
  _mm512_mask_storeu_ps(y + 16, hi_mask, hi);
}

// Columns [32t, 32t + 32) of R rows of y from an int8 tile [K, 32] and per-column scales.
template <int R>
void Int8Tile(const float* x, const int8_t* tile, const float* scale, float* y, int64_t K, int64_t N, int64_t t) {
  constexpr int S = R <= 2 ? 2 : 1;
  __m512 acc[S][R][2];
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < R; ++r) acc[s][r][0] = acc[s][r][1] = _mm512_setzero_ps();
  auto step = [&](int s, int64_t k) {
    const __m512 w0 = Int8x16(tile + k * kTileColumns), w1 = Int8x16(tile + k * kTileColumns + 16);
    for (int r = 0; r < R; ++r) {
      const __m512 xr = _mm512_set1_ps(x[r * K + k]);
      acc[s][r][0] = _mm512_fmadd_ps(xr, w0, acc[s][r][0]);
      acc[s][r][1] = _mm512_fmadd_ps(xr, w1, acc[s][r][1]);
    }
  };
  int64_t k = 0;
  for (; k + S <= K; k += S)
    for (int s = 0; s < S; ++s) step(s, k + s);
  for (; k < K; ++k) step(0, k);
  const int64_t j = t * kTileColumns;
  const __m512 s0 = _mm512_loadu_ps(scale + j), s1 = _mm512_loadu_ps(scale + j + 16);
  for (int r = 0; r < R; ++r) {
    const __m512 lo = S == 2 ? _mm512_add_ps(acc[0][r][0], acc[S - 1][r][0]) : acc[0][r][0];
    const __m512 hi = S == 2 ? _mm512_add_ps(acc[0][r][1], acc[S - 1][r][1]) : acc[0][r][1];
    StoreColumns(y + r * N + j, _mm512_mul_ps(lo, s0), _mm512_mul_ps(hi, s1), std::min(kTileColumns, N - j));
  }
}

// The same from an int4 tile [K / 2, 32] (two rows per byte) with bf16 scales [K / group, padded N].
template <int R>
void Int4Tile(const float* x, const uint8_t* tile, const uint16_t* scales, float* y, int64_t K, int64_t N,
              int64_t t, int64_t group, int64_t padded_n) {
  constexpr int S = R <= 2 ? 2 : 1;  // separate low- and high-nibble sums for one or two rows
  const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  const int64_t j = t * kTileColumns;
  alignas(64) float acc[R][kTileColumns] = {};  // once per group: memory is fine
  for (int64_t g = 0; g < K / group; ++g) {
    __m512 part[S][R][2];
    for (int s = 0; s < S; ++s)
      for (int r = 0; r < R; ++r) part[s][r][0] = part[s][r][1] = _mm512_setzero_ps();
    for (int64_t k2 = g * group / 2; k2 < (g + 1) * group / 2; ++k2) {
      const auto* bytes = reinterpret_cast<const __m128i*>(tile + k2 * kTileColumns);
      const __m512i b0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(bytes));
      const __m512i b1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(bytes + 1));
      const __m512 lo0 = _mm512_permutexvar_ps(b0, table), lo1 = _mm512_permutexvar_ps(b1, table);
      const __m512 hi0 = _mm512_permutexvar_ps(_mm512_srli_epi32(b0, 4), table);
      const __m512 hi1 = _mm512_permutexvar_ps(_mm512_srli_epi32(b1, 4), table);
      for (int r = 0; r < R; ++r) {
        const __m512 a0 = _mm512_set1_ps(x[r * K + 2 * k2]), a1 = _mm512_set1_ps(x[r * K + 2 * k2 + 1]);
        part[0][r][0] = _mm512_fmadd_ps(a0, lo0, part[0][r][0]);
        part[0][r][1] = _mm512_fmadd_ps(a0, lo1, part[0][r][1]);
        part[S - 1][r][0] = _mm512_fmadd_ps(a1, hi0, part[S - 1][r][0]);
        part[S - 1][r][1] = _mm512_fmadd_ps(a1, hi1, part[S - 1][r][1]);
      }
    }
    const __m512 s0 = Bf16x16(scales + g * padded_n + j), s1 = Bf16x16(scales + g * padded_n + j + 16);
    for (int r = 0; r < R; ++r) {
      const __m512 lo = S == 2 ? _mm512_add_ps(part[0][r][0], part[S - 1][r][0]) : part[0][r][0];
      const __m512 hi = S == 2 ? _mm512_add_ps(part[0][r][1], part[S - 1][r][1]) : part[0][r][1];
      _mm512_store_ps(acc[r], _mm512_fmadd_ps(lo, s0, _mm512_load_ps(acc[r])));
      _mm512_store_ps(acc[r] + 16, _mm512_fmadd_ps(hi, s1, _mm512_load_ps(acc[r] + 16)));
    }
  }
  for (int r = 0; r < R; ++r) {
    StoreColumns(y + r * N + j, _mm512_load_ps(acc[r]), _mm512_load_ps(acc[r] + 16), std::min(kTileColumns, N - j));
  }
}

#elif defined(__AVX2__) && defined(__FMA__)

using jaxinfer_avx2::Int4Tile;
using jaxinfer_avx2::Int8Tile;

#else

// Columns [32t, 32t + 32) of R rows of y from an int8 tile [K, 32] and per-column scales.
template <int R>
void Int8Tile(const float* x, const int8_t* tile, const float* scale, float* y, int64_t K, int64_t N, int64_t t) {
  alignas(64) float acc[R][kTileColumns] = {};
  alignas(64) float w[kTileColumns];
  for (int64_t k = 0; k < K; ++k) {
#pragma omp simd
    for (int64_t c = 0; c < kTileColumns; ++c) w[c] = static_cast<float>(tile[k * kTileColumns + c]);
    for (int r = 0; r < R; ++r) {
      const float a = x[r * K + k];
#pragma omp simd
      for (int64_t c = 0; c < kTileColumns; ++c) acc[r][c] += a * w[c];
    }
  }
  const int64_t j = t * kTileColumns, cols = std::min(kTileColumns, N - j);
  for (int r = 0; r < R; ++r) {
    for (int64_t c = 0; c < cols; ++c) y[r * N + j + c] = acc[r][c] * scale[j + c];
  }
}

// The same from an int4 tile [K / 2, 32] (two rows per byte) with bf16 scales [K / group, padded N].
template <int R>
void Int4Tile(const float* x, const uint8_t* tile, const uint16_t* scales, float* y, int64_t K, int64_t N,
              int64_t t, int64_t group, int64_t padded_n) {
  alignas(64) float acc[R][kTileColumns] = {};
  alignas(64) float part[R][kTileColumns];
  alignas(64) float lo[kTileColumns], hi[kTileColumns], s[kTileColumns];
  const int64_t j = t * kTileColumns;
  for (int64_t g = 0; g < K / group; ++g) {
    for (int r = 0; r < R; ++r) std::fill(part[r], part[r] + kTileColumns, 0.0f);
    for (int64_t k2 = g * group / 2; k2 < (g + 1) * group / 2; ++k2) {
      const uint8_t* bytes = tile + k2 * kTileColumns;
#pragma omp simd
      for (int64_t c = 0; c < kTileColumns; ++c) {
        lo[c] = static_cast<float>(static_cast<int>(bytes[c] & 15) - 8);
        hi[c] = static_cast<float>(static_cast<int>(bytes[c] >> 4) - 8);
      }
      for (int r = 0; r < R; ++r) {
        const float a0 = x[r * K + 2 * k2], a1 = x[r * K + 2 * k2 + 1];
#pragma omp simd
        for (int64_t c = 0; c < kTileColumns; ++c) part[r][c] += a0 * lo[c] + a1 * hi[c];
      }
    }
#pragma omp simd
    for (int64_t c = 0; c < kTileColumns; ++c) s[c] = Widen(scales[g * padded_n + j + c]);
    for (int r = 0; r < R; ++r) {
#pragma omp simd
      for (int64_t c = 0; c < kTileColumns; ++c) acc[r][c] += part[r][c] * s[c];
    }
  }
  const int64_t cols = std::min(kTileColumns, N - j);
  for (int r = 0; r < R; ++r) std::memcpy(y + r * N + j, acc[r], cols * sizeof(float));
}

#endif  // __AVX512F__, AVX2

// Calls tile(t, r, rows) for every tile and group of up to 8 rows, tiles split over the pool.
template <typename TileFn>
void ForEachTile(ffi::ThreadPool& pool, int64_t tiles, int64_t tile_bytes, int64_t M, TileFn tile) {
  const int64_t wanted = jaxinfer::TaskCount(pool, tiles, tile_bytes);
  const int64_t per_task = (tiles + wanted - 1) / wanted;
  const int64_t tasks = (tiles + per_task - 1) / per_task;
  jaxinfer::ParallelFor<jaxinfer::NoState>(pool, tasks, [=](int64_t i, jaxinfer::NoState&) {
    for (int64_t t = i * per_task; t < std::min(tiles, (i + 1) * per_task); ++t) {
      for (int64_t r = 0; r < M; r += kPassRows) tile(t, r, std::min<int64_t>(kPassRows, M - r));
    }
  });
}

template <template <int> class Fn, typename... Args>
void ByRows(int64_t rows, Args... args) {
  switch (rows) {
    case 1: Fn<1>::Run(args...); break;
    case 2: Fn<2>::Run(args...); break;
    case 3: Fn<3>::Run(args...); break;
    case 4: Fn<4>::Run(args...); break;
    case 5: Fn<5>::Run(args...); break;
    case 6: Fn<6>::Run(args...); break;
    case 7: Fn<7>::Run(args...); break;
    default: Fn<8>::Run(args...); break;
  }
}

template <int R>
struct Int8Rows {
  template <typename... A>
  static void Run(A... a) { Int8Tile<R>(a...); }
};

template <int R>
struct Int4Rows {
  template <typename... A>
  static void Run(A... a) { Int4Tile<R>(a...); }
};

using F32Matrix = ffi::Buffer<ffi::F32, 2>;
using Int8Tiles = ffi::Buffer<ffi::S8, 3>;
using Int4Tiles = ffi::Buffer<ffi::U8, 3>;
using ColumnScales = ffi::Buffer<ffi::F32, 1>;
using GroupScales = ffi::Buffer<ffi::BF16, 2>;

ffi::Error Int8Matmul(ffi::ThreadPool pool, F32Matrix x, Int8Tiles w, ColumnScales scale,
                      ffi::Result<Result> y) {
  const auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  const int64_t M = xd[0], K = xd[1], N = yd[1], tiles = wd[0];
  if (wd[1] != K || wd[2] != kTileColumns || yd[0] != M || N > tiles * kTileColumns ||
      N <= (tiles - 1) * kTileColumns || scale.dimensions()[0] != tiles * kTileColumns) {
    return ffi::Error::InvalidArgument("need x [M, K], int8 w [ceil(N/32), K, 32], scales [32*ceil(N/32)], y [M, N]");
  }
  const float* xp = x.typed_data();
  const int8_t* wp = w.typed_data();
  const float* sp = scale.typed_data();
  float* yp = y->typed_data();
  ForEachTile(pool, tiles, K * kTileColumns, M, [=](int64_t t, int64_t r, int64_t rows) {
    ByRows<Int8Rows>(rows, xp + r * K, wp + t * K * kTileColumns, sp, yp + r * N, K, N, t);
  });
  return ffi::Error::Success();
}

ffi::Error Int4Matmul(ffi::ThreadPool pool, F32Matrix x, Int4Tiles w, GroupScales scale,
                      ffi::Result<Result> y) {
  const auto xd = x.dimensions(), wd = w.dimensions(), sd = scale.dimensions(), yd = y->dimensions();
  const int64_t M = xd[0], K = xd[1], N = yd[1], tiles = wd[0];
  const int64_t group = sd[0] > 0 ? K / sd[0] : 0;
  if (K % 2 || wd[1] * 2 != K || wd[2] != kTileColumns || yd[0] != M || N > tiles * kTileColumns ||
      N <= (tiles - 1) * kTileColumns || sd[1] != tiles * kTileColumns || group % 2 || group * sd[0] != K) {
    return ffi::Error::InvalidArgument(
        "need x [M, K], int4 w [ceil(N/32), K/2, 32], scales [K/group, 32*ceil(N/32)] (even group), y [M, N]");
  }
  const float* xp = x.typed_data();
  const uint8_t* wp = w.typed_data();
  const uint16_t* sp = Bits(scale.untyped_data());
  float* yp = y->typed_data();
  const int64_t padded_n = sd[1];
  ForEachTile(pool, tiles, K / 2 * kTileColumns, M, [=](int64_t t, int64_t r, int64_t rows) {
    ByRows<Int4Rows>(rows, xp + r * K, wp + t * (K / 2) * kTileColumns, sp, yp + r * N, K, N, t, group, padded_n);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxinferPackedMatmul, PackedMatmul,
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<Matrix>().Arg<Packed>().Ret<Result>());


XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxinferInt8Matmul, Int8Matmul,
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<F32Matrix>().Arg<Int8Tiles>().Arg<ColumnScales>().Ret<Result>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxinferInt4Matmul, Int4Matmul,
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<F32Matrix>().Arg<Int4Tiles>().Arg<GroupScales>().Ret<Result>());
