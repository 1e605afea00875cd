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

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include "parallel_tasks.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kTileColumns = 32;
constexpr int64_t kTileValues = 2 * kTileColumns;  // per pair of rows
constexpr int kGroupRows = 8;                       // rows whose accumulators live in registers

struct Operands {
  const uint16_t* x;  // [M, K]
  const uint16_t* w;  // packed [T, K2, 64]
  float* y;           // [M, N]
  int64_t M, K, N;    // K = 2 * K2
};

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

#else

inline float Widen(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, sizeof(out));
  return out;
}

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
    for (int64_t r = 0; r < op.M; r += kGroupRows) {
      const int64_t rows = std::min<int64_t>(kGroupRows, op.M - r);
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

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxinferPackedMatmul, PackedMatmul,
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<Matrix>().Arg<Packed>().Ret<Result>());

