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
// Tiles are split over XLA's intra-op thread pool; one call takes every weight that multiplies
// the same x (q, k and v; gate and up), so the pool is dispatched once for them.
//
// Quantized weights (weight-only, see jaxinfer/quantization.py) use the same 32-column tiles so
// decode streams fewer bytes: int8 as Q [T, K2, 64] (a column's rows 2k2 and 2k2 + 1 side by
// side) with one float32 scale per column, int4 as Q [T, K / 4, 64] bytes (per quad of rows, a
// column's two bytes hold rows 4q and 4q + 2, then 4q + 1 and 4q + 3, in low and high nibbles,
// stored value + 8) with one bf16 scale per column and group of `group` rows, tile by tile as
// S [T, K / group, 32]: a tile's scales in one short run (laid out [K / group, N], each tile
// read a 64-byte line from every group row, and a third of the kernel's profile samples in
// batch-1 decode stalled on those loads, though the weight stream hid most of it: steps 1%
// faster). x comes as float32 and is rounded to int16 per row here; products are summed
// exactly in int32 and scaled in float once per chunk of pairs (int8) or group (int4). The
// vector loops are in packed_tiles_int.h (AVX2, or AVX-512 BW with VNNI where present), else
// portable loops with the same sums.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics self-initialise their undefined operands: a false alarm per call.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#if defined(__AVX2__) && defined(__FMA__)
#include "packed_tiles_avx2.h"
#include "packed_tiles_int.h"
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

// The weights of one call all multiply the same x (q, k and v; gate and up), so their tiles
// form one list, split into even tasks over the thread pool: one dispatch instead of one per
// weight (each cost ~10 us at decode). first[i] is weight i's first tile in the list, and
// first.back() the total. Calls run(i, t0, t1) for weight i's tiles [t0, t1).
template <typename Run>
void SplitTiles(ffi::ThreadPool& pool, std::vector<int64_t> first, int64_t tile_bytes, Run run) {
  const int64_t tiles = first.back();
  const int64_t wanted = jaxinfer::TaskCount(pool, tiles, tile_bytes);
  const int64_t per_task = (tiles + wanted - 1) / wanted;
  const int64_t tasks = (tiles + per_task - 1) / per_task;
  jaxinfer::ParallelFor<jaxinfer::NoState>(pool, tasks, [first, tiles, per_task, run](int64_t i, jaxinfer::NoState&) {
    const int64_t a = i * per_task, b = std::min(tiles, a + per_task);
    for (size_t w = 0; w + 1 < first.size(); ++w) {
      const int64_t lo = std::max(a, first[w]), hi = std::min(b, first[w + 1]);
      if (lo < hi) run(w, lo - first[w], hi - first[w]);
    }
  });
}

using Matrix = ffi::Buffer<ffi::BF16, 2>;
using Packed = ffi::Buffer<ffi::BF16, 3>;
using Result = ffi::Buffer<ffi::F32, 2>;

const uint16_t* Bits(const void* data) { return static_cast<const uint16_t*>(data); }

ffi::Error CountsMatch(const ffi::RemainingArgs& args, const ffi::RemainingRets& ys, size_t per_weight) {
  if (ys.size() == 0 || args.size() != per_weight * ys.size()) {
    return ffi::Error::InvalidArgument("need one result per weight and " + std::to_string(per_weight) +
                                       " operand(s) per weight after x");
  }
  return ffi::Error::Success();
}

// y_i [M, N_i] = x [M, K] . W_i for packed bf16 weights W_i [ceil(N_i/32), K/2, 64].
ffi::Error PackedMatmul(ffi::ThreadPool pool, Matrix x, ffi::RemainingArgs ws, ffi::RemainingRets ys) {
  if (auto err = CountsMatch(ws, ys, 1); err.failure()) return err;
  const auto xd = x.dimensions();
  std::vector<Operands> ops;
  std::vector<int64_t> first{0};
  for (size_t i = 0; i < ys.size(); ++i) {
    auto w = ws.get<Packed>(i);
    auto y = ys.get<Result>(i);
    if (!w.has_value()) return w.error();
    if (!y.has_value()) return y.error();
    const auto wd = w->dimensions(), yd = (*y)->dimensions();
    const Operands op{Bits(x.untyped_data()), Bits(w->untyped_data()), (*y)->typed_data(), xd[0], xd[1], yd[1]};
    if (wd[2] != kTileValues || op.K != 2 * wd[1] || yd[0] != op.M || op.N > wd[0] * kTileColumns ||
        op.N <= (wd[0] - 1) * kTileColumns) {
      return ffi::Error::InvalidArgument("need x [M, 2*K2], packed w [ceil(N/32), K2, 64], y [M, N] per weight");
    }
    ops.push_back(op);
    first.push_back(first.back() + wd[0]);
  }
  SplitTiles(pool, std::move(first), xd[1] * kTileColumns * sizeof(uint16_t),
             [ops](size_t i, int64_t t0, int64_t t1) { PackedTiles(ops[i], t0, t1); });
  return ffi::Error::Success();
}

// ---- quantized tiles ----
//
// The activations are rounded to int16 per row (x ~= scale * values, |values| <= 32767: a relative
// error of at most 2^-16 of the row's largest value, finer than bf16) so that a pair of int16
// activations times a column's pair of int8 or int4 weights is one vpmaddwd lane: integer
// products, exact, summed in int32. Converting every weight to float instead cost more than
// reading it, so int8 and int4 stayed compute bound below bf16's bandwidth.

// Each row of x [M, K] as int16 values [M, 2 * K2] (zero-padded) with a float scale per row,
// and for int4 each row's sum of values over each group of `group` k. A row with a NaN or an
// infinity gets a NaN scale, so its products are NaN as the float ones would be.
struct Int16Rows {
  std::vector<int16_t> values;
  std::vector<float> scale;
  std::vector<int32_t> sums;  // [M, K / group], int4 only
};

Int16Rows QuantizeRows(const float* x, int64_t M, int64_t K, int64_t K2, int64_t group) {
  const int64_t groups = group > 0 ? K / group : 0;
  Int16Rows q{std::vector<int16_t>(M * 2 * K2, 0), std::vector<float>(M), std::vector<int32_t>(M * groups, 0)};
  for (int64_t r = 0; r < M; ++r) {
    const float* row = x + r * K;
    // The largest magnitude from the bits, which vectorises where a float max does not (without
    // fast-math): below the all-ones exponent of infinities and NaNs, magnitudes order as their bits.
    uint32_t max_bits = 0;
    for (int64_t k = 0; k < K; ++k) {
      uint32_t bits;
      std::memcpy(&bits, row + k, sizeof(bits));
      max_bits = std::max(max_bits, bits & 0x7fffffffu);
    }
    if (max_bits >= 0x7f800000u) {
      q.scale[r] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    float max_abs;
    std::memcpy(&max_abs, &max_bits, sizeof(max_abs));
    q.scale[r] = max_abs / 32767.0f;
    if (max_abs == 0.0f) continue;
    const float inverse = 32767.0f / max_abs;
    int16_t* out = q.values.data() + r * 2 * K2;
    for (int64_t k = 0; k < K; ++k) {
      out[k] = static_cast<int16_t>(std::clamp(std::nearbyint(row[k] * inverse), -32767.0f, 32767.0f));
    }
    for (int64_t g = 0; g < groups; ++g) {
      int32_t sum = 0;
      for (int64_t k = g * group; k < (g + 1) * group; ++k) sum += out[k];
      q.sums[r * groups + g] = sum;
    }
  }
  return q;
}

#if defined(__AVX2__) && defined(__FMA__)

using jaxinfer_int::Int4Tile;
using jaxinfer_int::Int8Tile;
// As many rows as the registers hold.
constexpr int kInt8PassRows = jaxinfer_int::kInt8PassRows;
constexpr int kInt4PassRows = jaxinfer_int::kInt4PassRows;

#else

constexpr int kInt8PassRows = kGroupRows;
constexpr int kInt4PassRows = kGroupRows;
constexpr int64_t kChunkPairs = 128;  // pairs summed in int32 before float: 2^31 > 256 * 2 * 127 * 32767

// Columns [32t, 32t + 32) of R rows of y from an int8 tile [K2, 64] (rows 2k2 and 2k2 + 1 of each
// column side by side) and per-column scales; x is int16 [R, ldx] with per-row scales.
template <int R>
void Int8Tile(const int16_t* x, int64_t ldx, const float* x_scale, const int8_t* tile, const float* scale, float* y,
              int64_t K2, int64_t N, int64_t t) {
  alignas(64) float total[R][kTileColumns] = {};
  alignas(64) int32_t sum[R][kTileColumns];
  for (int64_t c0 = 0; c0 < K2; c0 += kChunkPairs) {
    for (int r = 0; r < R; ++r) std::fill(sum[r], sum[r] + kTileColumns, 0);
    for (int64_t k2 = c0; k2 < std::min(K2, c0 + kChunkPairs); ++k2) {
      const int8_t* w = tile + k2 * kTileValues;
      for (int r = 0; r < R; ++r) {
        const int32_t a0 = x[r * ldx + 2 * k2], a1 = x[r * ldx + 2 * k2 + 1];
#pragma omp simd
        for (int64_t c = 0; c < kTileColumns; ++c) sum[r][c] += a0 * w[2 * c] + a1 * w[2 * c + 1];
      }
    }
    for (int r = 0; r < R; ++r)
      for (int64_t c = 0; c < kTileColumns; ++c) total[r][c] += static_cast<float>(sum[r][c]);
  }
  const int64_t j = t * kTileColumns, cols = std::min(kTileColumns, N - j);
  for (int r = 0; r < R; ++r) {
    for (int64_t c = 0; c < cols; ++c) y[r * N + j + c] = total[r][c] * scale[j + c] * x_scale[r];
  }
}

// The same from an int4 tile [K / 4, 64]: per quad of rows 4q..4q + 3 and column c, byte 2c holds
// rows 4q (low nibble) and 4q + 2 (high), byte 2c + 1 rows 4q + 1 and 4q + 3, each stored + 8;
// the tile's bf16 scales [K / group, 32].
template <int R>
void Int4Tile(const int16_t* x, int64_t ldx, const float* x_scale, const int32_t* x_sums, int64_t groups,
              const uint8_t* tile, const uint16_t* scales, float* y, int64_t K2, int64_t N, int64_t t,
              int64_t group) {
  alignas(64) float total[R][kTileColumns] = {};
  alignas(64) int32_t sum[R][kTileColumns];
  const int64_t j = t * kTileColumns, group_quads = group / 4;
  for (int64_t g = 0; g < K2 / 2 / group_quads; ++g) {
    for (int r = 0; r < R; ++r) std::fill(sum[r], sum[r] + kTileColumns, 0);
    for (int64_t q = g * group_quads; q < (g + 1) * group_quads; ++q) {
      const uint8_t* bytes = tile + q * kTileValues;
      for (int r = 0; r < R; ++r) {
        const int16_t* a = x + r * ldx + 4 * q;
#pragma omp simd
        for (int64_t c = 0; c < kTileColumns; ++c) {
          const int32_t even = bytes[2 * c], odd = bytes[2 * c + 1];
          sum[r][c] += a[0] * (even & 15) + a[1] * (odd & 15) + a[2] * (even >> 4) + a[3] * (odd >> 4);
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      const int32_t offset = 8 * x_sums[r * groups + g];
      for (int64_t c = 0; c < kTileColumns; ++c) {
        total[r][c] += static_cast<float>(sum[r][c] - offset) * Widen(scales[g * kTileColumns + c]);
      }
    }
  }
  const int64_t cols = std::min(kTileColumns, N - j);
  for (int r = 0; r < R; ++r) {
    for (int64_t c = 0; c < cols; ++c) y[r * N + j + c] = total[r][c] * x_scale[r];
  }
}

#endif  // AVX2

// Calls tile(w, t, r, rows) for every tile of every weight and group of up to pass_rows rows.
template <typename TileFn>
void ForEachTile(ffi::ThreadPool& pool, std::vector<int64_t> first, int64_t tile_bytes, int64_t M, int64_t pass_rows,
                 TileFn tile) {
  SplitTiles(pool, std::move(first), tile_bytes, [=](size_t w, int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t r = 0; r < M; r += pass_rows) tile(w, t, r, std::min<int64_t>(pass_rows, M - r));
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
using GroupScales = ffi::Buffer<ffi::BF16, 3>;

// Weight i of a quantized call: its tiles and scales (operands 2i and 2i + 1 after x) and result.
template <typename W, typename S>
struct QuantArgs {
  W w;
  S scale;
  ffi::Result<Result> y;
};

template <typename W, typename S>
ffi::ErrorOr<QuantArgs<W, S>> QuantWeight(const ffi::RemainingArgs& args, const ffi::RemainingRets& ys, size_t i) {
  auto w = args.get<W>(2 * i);
  auto scale = args.get<S>(2 * i + 1);
  auto y = ys.get<Result>(i);
  if (!w.has_value()) return ffi::Unexpected(w.error());
  if (!scale.has_value()) return ffi::Unexpected(scale.error());
  if (!y.has_value()) return ffi::Unexpected(y.error());
  return QuantArgs<W, S>{*w, *scale, *y};
}

// One quantized weight's operands: tiles, scales, result and its columns.
template <typename T, typename S>
struct QuantOperands {
  const T* w;
  const S* scale;
  float* y;
  int64_t N;
};

// y_i [M, N_i] = x [M, K] . (W_i * scale_i) for int8 tiles W_i [ceil(N_i/32), ceil(K/2), 64] and
// float32 column scales [32 * ceil(N_i/32)]; the operands after x are (W_1, scale_1, W_2, ...).
ffi::Error Int8Matmul(ffi::ThreadPool pool, F32Matrix x, ffi::RemainingArgs args, ffi::RemainingRets ys) {
  if (auto err = CountsMatch(args, ys, 2); err.failure()) return err;
  const auto xd = x.dimensions();
  const int64_t M = xd[0], K = xd[1], K2 = (K + 1) / 2;
  std::vector<QuantOperands<int8_t, float>> ops;
  std::vector<int64_t> first{0};
  for (size_t i = 0; i < ys.size(); ++i) {
    auto a = QuantWeight<Int8Tiles, ColumnScales>(args, ys, i);
    if (!a.has_value()) return a.error();
    auto& [w, scale, y] = *a;
    const auto wd = w.dimensions(), yd = y->dimensions();
    const int64_t N = yd[1], tiles = wd[0];
    if (wd[1] != K2 || wd[2] != kTileValues || yd[0] != M || N > tiles * kTileColumns ||
        N <= (tiles - 1) * kTileColumns || scale.dimensions()[0] != tiles * kTileColumns) {
      return ffi::Error::InvalidArgument(
          "need x [M, K], int8 w [ceil(N/32), ceil(K/2), 64], scales [32*ceil(N/32)], y [M, N] per weight");
    }
    ops.push_back({w.typed_data(), scale.typed_data(), y->typed_data(), N});
    first.push_back(first.back() + tiles);
  }
  const Int16Rows quantized = QuantizeRows(x.typed_data(), M, K, K2, 0);
  const Int16Rows* rows = &quantized;  // every task ends before this call returns
  const int64_t tile_bytes = K2 * kTileValues;
  ForEachTile(pool, std::move(first), tile_bytes, M, kInt8PassRows, [=](size_t i, int64_t t, int64_t r, int64_t n) {
    const auto& op = ops[i];
    ByRows<Int8Rows>(n, rows->values.data() + r * 2 * K2, 2 * K2, rows->scale.data() + r, op.w + t * K2 * kTileValues,
                     op.scale, op.y + r * op.N, K2, op.N, t);
  });
  return ffi::Error::Success();
}

// y_i [M, N_i] = x [M, K] . W_i for int4 tiles W_i [ceil(N_i/32), K/4, 64] with bf16 group scales
// [ceil(N_i/32), K/group, 32], one group size for all; operands after x are (W_1, scales_1, ...).
ffi::Error Int4Matmul(ffi::ThreadPool pool, F32Matrix x, ffi::RemainingArgs args, ffi::RemainingRets ys) {
  if (auto err = CountsMatch(args, ys, 2); err.failure()) return err;
  const auto xd = x.dimensions();
  const int64_t M = xd[0], K = xd[1], K2 = K / 2;
  int64_t groups = -1;
  std::vector<QuantOperands<uint8_t, uint16_t>> ops;
  std::vector<int64_t> first{0};
  for (size_t i = 0; i < ys.size(); ++i) {
    auto a = QuantWeight<Int4Tiles, GroupScales>(args, ys, i);
    if (!a.has_value()) return a.error();
    auto& [w, scale, y] = *a;
    const auto wd = w.dimensions(), sd = scale.dimensions(), yd = y->dimensions();
    const int64_t N = yd[1], tiles = wd[0];
    const int64_t group = sd[1] > 0 ? K / sd[1] : 0;
    if (K % 4 || wd[1] * 4 != K || wd[2] != kTileValues || yd[0] != M || N > tiles * kTileColumns ||
        N <= (tiles - 1) * kTileColumns || sd[0] != tiles || sd[2] != kTileColumns || group % 4 ||
        group * sd[1] != K || (groups >= 0 && sd[1] != groups)) {
      return ffi::Error::InvalidArgument(
          "need x [M, K], int4 w [ceil(N/32), K/4, 64], scales [ceil(N/32), K/group, 32] (group a multiple of 4, "
          "the same for every weight), y [M, N] per weight");
    }
    groups = sd[1];
    ops.push_back({w.typed_data(), Bits(scale.untyped_data()), y->typed_data(), N});
    first.push_back(first.back() + tiles);
  }
  const int64_t group = K / groups;
  const Int16Rows quantized = QuantizeRows(x.typed_data(), M, K, K2, group);
  const Int16Rows* rows = &quantized;  // every task ends before this call returns
  const int64_t tile_bytes = K2 * kTileColumns;
  ForEachTile(pool, std::move(first), tile_bytes, M, kInt4PassRows, [=](size_t i, int64_t t, int64_t r, int64_t n) {
    const auto& op = ops[i];
    ByRows<Int4Rows>(n, rows->values.data() + r * 2 * K2, 2 * K2, rows->scale.data() + r, rows->sums.data() + r * groups,
                     groups, op.w + t * K2 * kTileColumns, op.scale + t * groups * kTileColumns, op.y + r * op.N, K2, op.N,
                     t, group);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxinferPackedMatmul, PackedMatmul,
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<Matrix>().RemainingArgs().RemainingRets());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxinferInt8Matmul, Int8Matmul,
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<F32Matrix>().RemainingArgs().RemainingRets());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxinferInt4Matmul, Int4Matmul,
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<F32Matrix>().RemainingArgs().RemainingRets());
