// Attention of a few queries per sequence over the contiguous KV cache, on CPU.
//
// Decode and speculative verification attend with 1..16 queries per sequence. XLA:CPU runs
// that as many tiny batched dots over the whole preallocated cache, so a step costs as much at
// position 10 as at the cache's end. This reads only the visible keys of each sequence, once
// for all query heads of a KV head, in three passes per (sequence, KV head): scores, softmax,
// weighted sum of values, on eight-float vectors (attention_vectors.h; -O3 -march=native).
//
//   q [B, T, H, D] f32, keys [B, KV, S, D], values [B, KV, D, S] (f32, bf16 or f16; one dtype),
//   positions [B, T] int32: query t of sequence b sits at positions[b, t] and sees keys
//   s <= positions[b, t] (and positions[b, t] - s < window when window > 0, or, when chunk > 0, s in the
//   query's chunk of positions: s >= positions[b, t] - positions[b, t] % chunk; Llama 4).
//   out [B, T, H, D] f32. A query that sees no key gets zeros.
//
// (sequence, KV head) pairs are split over XLA's intra-op thread pool (parallel_tasks.h).
//
// The paged entry point (JaxinferPagedDecodeAttention) reads the serving engine's page pools
// directly: keys and values [KV, P, page, D] (values not transposed; 16-bit floats may be
// stored as uint16 bits, `value_dtype` says which), page_table [B, W] int32. Only the pages
// holding visible keys are touched, so a step's cost follows each sequence's own length.
// int8 pools come with float32 scales [KV, P, page] (one per token and head, value = int8 *
// scale): half the bytes of bf16 pages per decode step.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "attention_vectors.h"
#include "parallel_tasks.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace jaxinfer_attention;

constexpr int64_t kMaxQueries = 16;

// Per-thread buffers, reused across tasks.
struct Scratch {
  std::vector<float> queries;  // [T * G, D] this pair's queries in lane order
  std::vector<float> probs;    // [T * G, visible keys] scores, then probabilities
  std::vector<float> inv_sum;  // [T * G] 1 / softmax denominator
  std::vector<float> sums;     // paged: [T * G, D] weighted values in lane order; contiguous: one value row
  std::vector<float> run;      // paged int8: one page run of keys or values, dequantized
};

// int8 pages: value = int8 * its token's scale. Widened run by run into Scratch::run (in L1),
// once for all the query rows that read it.
struct Int8 {
  int8_t value;
};

struct Shape {
  int64_t B, T, H, KV, S, D;
  float scale;
  int64_t window;
  int64_t chunk;
};

// Visible key range of each query of sequence b, and of all of them: [lo_all, lo_all + width).
struct Visible {
  int64_t lo[kMaxQueries], hi[kMaxQueries];
  int64_t lo_all, width;
};

Visible VisibleKeys(const Shape& sh, const int32_t* positions, int64_t b) {
  Visible v;
  int64_t lo_all = sh.S, hi_all = -1;
  for (int64_t t = 0; t < sh.T; ++t) {
    const int64_t p = positions[b * sh.T + t];
    v.hi[t] = std::min<int64_t>(p, sh.S - 1);
    v.lo[t] = sh.chunk > 0 ? std::max<int64_t>(0, p - p % sh.chunk)
              : sh.window > 0 ? std::max<int64_t>(0, p - sh.window + 1) : 0;
    if (v.hi[t] >= v.lo[t]) {
      lo_all = std::min(lo_all, v.lo[t]);
      hi_all = std::max(hi_all, v.hi[t]);
    }
  }
  v.lo_all = lo_all;
  v.width = std::max<int64_t>(hi_all - lo_all + 1, 0);
  return v;
}

// Row r = t * G + g of the T x G queries of sequence b that share KV head h.
inline int64_t QueryOffset(const Shape& sh, int64_t b, int64_t h, int64_t r) {
  const int64_t G = sh.H / sh.KV;
  return ((b * sh.T + r / G) * sh.H + h * G + r % G) * sh.D;
}

// Sizes the buffers for the visible keys and copies the pair's queries in C's lane order.
template <typename C>
void Prepare(const Shape& sh, const Visible& v, const float* q, int64_t b, int64_t h, int64_t sums, Scratch& sc) {
  const int64_t rows = sh.T * (sh.H / sh.KV);
  sc.queries.resize(rows * sh.D);
  sc.probs.resize(rows * v.width);
  sc.inv_sum.assign(rows, 0.0f);
  sc.sums.assign(sums, 0.0f);
  for (int64_t r = 0; r < rows; ++r) ToLaneOrder<C>(q + QueryOffset(sh, b, h, r), sc.queries.data() + r * sh.D, sh.D);
}

// Softmax of each query row over its own visible keys, in place in sc.probs [rows, width]:
// probabilities (unnormalised; 1 / sum in sc.inv_sum), zero outside the row's range.
void SoftmaxRows(const Shape& sh, const Visible& v, Scratch& sc) {
  const int64_t G = sh.H / sh.KV, width = v.width;
  for (int64_t t = 0; t < sh.T; ++t) {
    for (int64_t g = 0; g < G; ++g) {
      float* row = sc.probs.data() + (t * G + g) * width;
      if (v.hi[t] < v.lo[t]) {
        std::fill(row, row + width, 0.0f);
        continue;
      }
      const int64_t first = v.lo[t] - v.lo_all, last = v.hi[t] - v.lo_all;
      sc.inv_sum[t * G + g] = 1.0f / ExpShifted(row + first, last - first + 1);
      std::fill(row, row + first, 0.0f);
      std::fill(row + last + 1, row + width, 0.0f);
    }
  }
}

// All T x G queries of sequence b that share KV head h (contiguous cache): scores over the
// visible keys read in place, softmax, then out[query, d] = sum_s p[query, s] * V[d, s] with
// each value row (values are stored transposed) widened once.
template <typename C>
void AttendOne(const Shape& sh, const float* q, const C* keys, const C* values, const int32_t* positions,
               float* out, int64_t b, int64_t h, Scratch& sc) {
  const int64_t D = sh.D, S = sh.S, rows = sh.T * (sh.H / sh.KV);
  const C* k_block = keys + (b * sh.KV + h) * S * D;
  const C* v_block = values + (b * sh.KV + h) * D * S;
  const Visible v = VisibleKeys(sh, positions, b);
  const int64_t width = v.width;
  Prepare<C>(sh, v, q, b, h, width, sc);
  for (int64_t r = 0; r < rows; ++r) {
    ScoreKeys(sc.queries.data() + r * D, k_block + v.lo_all * D, width, D, sh.scale, sc.probs.data() + r * width);
  }
  SoftmaxRows(sh, v, sc);
  for (int64_t d = 0; d < D; ++d) {
    const C* __restrict src = v_block + d * S + v.lo_all;
    float* __restrict vr = sc.sums.data();
    for (int64_t i = 0; i < width; ++i) vr[i] = ToFloat(src[i]);
    for (int64_t r = 0; r < rows; ++r) {
      const float* __restrict pr = sc.probs.data() + r * width;
      float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = 0; i < width; ++i) acc += pr[i] * vr[i];
      out[QueryOffset(sh, b, h, r) + d] = acc * sc.inv_sum[r];
    }
  }
}

struct Pages {
  int64_t num_pages, page, width;  // pool pages, tokens per page, page-table slots per sequence
  const int32_t* table;           // [B, width]
  const float* k_scales = nullptr;  // int8 pools: [KV, P, page] per-token scales; else null
  const float* v_scales = nullptr;
};

// A page run of n int8 rows [n, D] times their scales, as floats in sc.run.
inline const float* Dequantized(const Int8* pool, const float* scales, int64_t n, int64_t D, Scratch& sc) {
  sc.run.resize(n * D);
  const int8_t* in = &pool->value;
  for (int64_t j = 0; j < n; ++j) {
    const float s = scales[j];
    for (int64_t d = 0; d < D; ++d) sc.run[j * D + d] = static_cast<float>(in[j * D + d]) * s;
  }
  return sc.run.data();
}

// The same queries over paged pools [KV, P, page, D], read in place one page's run of visible
// keys at a time: scores of every query row, softmax, then the weighted values (in lane order,
// put back in order at the end). int8 runs are dequantized first (into L1, for every row).
template <typename C>
void AttendPaged(const Shape& sh, const Pages& pg, const float* q, const C* keys, const C* values,
                 const int32_t* positions, float* out, int64_t b, int64_t h, Scratch& sc) {
  constexpr bool kInt8 = std::is_same_v<C, Int8>;
  using Read = std::conditional_t<kInt8, float, C>;  // what the vector loops read
  const int64_t D = sh.D, rows = sh.T * (sh.H / sh.KV);
  const Visible v = VisibleKeys(sh, positions, b);
  const int64_t end = v.lo_all + v.width;
  Prepare<Read>(sh, v, q, b, h, rows * D, sc);
  auto slot_of = [&](int64_t s) {  // the pool slot of position s: page * page_size + offset
    return (h * pg.num_pages + pg.table[b * pg.width + s / pg.page]) * pg.page + s % pg.page;
  };
  auto run_length = [&](int64_t s) { return std::min(pg.page - s % pg.page, end - s); };
  auto run_of = [&](const C* pool, const float* scales, int64_t s) -> const Read* {
    if constexpr (kInt8) {
      return Dequantized(pool + slot_of(s) * D, scales + slot_of(s), run_length(s), D, sc);
    } else {
      return pool + slot_of(s) * D;
    }
  };
  // The next page is elsewhere in the pool: ask for it while this one is being read.
  auto prefetch_next = [&](const C* pool, int64_t s) {
    const int64_t next = s + run_length(s);
    if (next >= end) return;
    const char* start = reinterpret_cast<const char*>(pool + slot_of(next) * D);
    const int64_t bytes = run_length(next) * D * sizeof(C);
    for (int64_t offset = 0; offset < bytes; offset += 64) __builtin_prefetch(start + offset);
  };
  for (int64_t s = v.lo_all; s < end; s += run_length(s)) {
    prefetch_next(keys, s);
    const Read* run = run_of(keys, pg.k_scales, s);
    for (int64_t r = 0; r < rows; ++r) {
      ScoreKeys(sc.queries.data() + r * D, run, run_length(s), D, sh.scale, sc.probs.data() + r * v.width + (s - v.lo_all));
    }
  }
  SoftmaxRows(sh, v, sc);
  for (int64_t s = v.lo_all; s < end; s += run_length(s)) {
    prefetch_next(values, s);
    const Read* run = run_of(values, pg.v_scales, s);
    for (int64_t r = 0; r < rows; ++r) {
      WeighValues(sc.probs.data() + r * v.width + (s - v.lo_all), run, run_length(s), D, sc.sums.data() + r * D);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    FromLaneOrder<Read>(sc.sums.data() + r * D, out + QueryOffset(sh, b, h, r), D, sc.inv_sum[r]);
  }
}

template <typename C>
void AttendAs(const Shape& sh, const float* q, const void* keys, const void* values, const int32_t* positions,
              float* out, int64_t b, int64_t h, Scratch& scratch) {
  AttendOne(sh, q, static_cast<const C*>(keys), static_cast<const C*>(values), positions, out, b, h, scratch);
}

using Queries = ffi::Buffer<ffi::F32, 4>;
using Positions = ffi::Buffer<ffi::S32, 2>;

ffi::Error DecodeAttention(ffi::ThreadPool pool, Queries q, ffi::AnyBuffer keys, ffi::AnyBuffer values,
                           Positions positions, ffi::Result<Queries> out, float scale, int64_t window,
                           int64_t chunk) {
  const auto qd = q.dimensions(), kd = keys.dimensions(), vd = values.dimensions();
  Shape sh{qd[0], qd[1], qd[2], kd.size() == 4 ? kd[1] : 0, kd.size() == 4 ? kd[2] : 0, qd[3], scale, window, chunk};
  const bool shapes_ok = kd.size() == 4 && vd.size() == 4 && kd[0] == sh.B && kd[3] == sh.D && vd[0] == sh.B &&
                         vd[1] == sh.KV && vd[2] == sh.D && vd[3] == sh.S && sh.KV > 0 && sh.H % sh.KV == 0 &&
                         positions.dimensions()[0] == sh.B && positions.dimensions()[1] == sh.T;
  if (!shapes_ok || sh.T > kMaxQueries || keys.element_type() != values.element_type()) {
    return ffi::Error::InvalidArgument("need q [B,T<=16,H,D], keys [B,KV,S,D], values [B,KV,D,S] of one dtype");
  }
  using AttendFn = void (*)(const Shape&, const float*, const void*, const void*, const int32_t*, float*, int64_t,
                            int64_t, Scratch&);
  AttendFn attend;
  switch (keys.element_type()) {
    case ffi::F32: attend = &AttendAs<float>; break;
    case ffi::BF16: attend = &AttendAs<Bf16>; break;
    case ffi::F16: attend = &AttendAs<Half>; break;
    default: return ffi::Error::InvalidArgument("the cache must be f32, bf16 or f16");
  }
  const float* qp = q.typed_data();
  const void *kp = keys.untyped_data(), *vp = values.untyped_data();
  const int32_t* pp = positions.typed_data();
  float* op = out->typed_data();
  // Each (sequence, KV head) pair reads at most the keys and values up to the last position.
  const int32_t last = *std::max_element(pp, pp + sh.B * sh.T);
  const int64_t pair_bytes = 2 * std::min<int64_t>(last + 1, sh.S) * sh.D * (keys.size_bytes() / keys.element_count());
  const int64_t pairs = sh.B * sh.KV;
  const int64_t wanted = jaxinfer::TaskCount(pool, pairs, std::max<int64_t>(pair_bytes, 1));
  const int64_t per_task = (pairs + wanted - 1) / wanted;
  jaxinfer::ParallelFor<Scratch>(pool, (pairs + per_task - 1) / per_task, [=](int64_t task, Scratch& scratch) {
    for (int64_t i = task * per_task; i < std::min(pairs, (task + 1) * per_task); ++i) {
      attend(sh, qp, kp, vp, pp, op, i / sh.KV, i % sh.KV, scratch);
    }
  });
  return ffi::Error::Success();
}

using PageTable = ffi::Buffer<ffi::S32, 2>;
using Scales = ffi::Buffer<ffi::F32>;

template <typename C>
void PagedAs(const Shape& sh, const Pages& pg, const float* q, const void* k, const void* v, const int32_t* pos,
             float* out, int64_t b, int64_t h, Scratch& sc) {
  AttendPaged(sh, pg, q, static_cast<const C*>(k), static_cast<const C*>(v), pos, out, b, h, sc);
}

// value_dtype: 0 float32, 1 bfloat16, 2 float16 (the pools may hold 16-bit floats as uint16 bits),
// 3 int8 with scales [KV, P, page] float32 (other dtypes take empty scales).
ffi::Error PagedDecodeAttention(ffi::ThreadPool pool, Queries q, ffi::AnyBuffer keys, ffi::AnyBuffer values,
                                PageTable table, Positions positions, Scales k_scales, Scales v_scales,
                                ffi::Result<Queries> out, float scale, int64_t window, int64_t chunk,
                                int64_t value_dtype) {
  const auto qd = q.dimensions(), kd = keys.dimensions(), td = table.dimensions();
  const bool shapes_ok = kd.size() == 4 && values.dimensions().size() == 4 && kd[3] == qd[3] && kd[0] > 0 &&
                         qd[2] % kd[0] == 0 && td[0] == qd[0] && positions.dimensions()[0] == qd[0] &&
                         positions.dimensions()[1] == qd[1] && qd[1] <= kMaxQueries &&
                         keys.element_type() == values.element_type();
  if (!shapes_ok) {
    return ffi::Error::InvalidArgument("need q [B,T<=16,H,D], pools [KV,P,page,D] of one dtype, table [B,W]");
  }
  Shape sh{qd[0], qd[1], qd[2], kd[0], td[1] * kd[2], qd[3], scale, window, chunk};
  Pages pg{kd[1], kd[2], td[1], table.typed_data()};
  using Fn = void (*)(const Shape&, const Pages&, const float*, const void*, const void*, const int32_t*, float*,
                      int64_t, int64_t, Scratch&);
  constexpr Fn kByDtype[] = {&PagedAs<float>, &PagedAs<Bf16>, &PagedAs<Half>, &PagedAs<Int8>};
  constexpr int64_t kWidth[] = {4, 2, 2, 1};
  const int64_t width = keys.size_bytes() / keys.element_count();
  if (value_dtype < 0 || value_dtype > 3 || width != kWidth[value_dtype]) {
    return ffi::Error::InvalidArgument("value_dtype does not match the pools");
  }
  const int64_t slots = kd[0] * kd[1] * kd[2];
  const int64_t scale_count = value_dtype == 3 ? slots : 0;
  if (k_scales.element_count() != static_cast<size_t>(scale_count) ||
      v_scales.element_count() != static_cast<size_t>(scale_count)) {
    return ffi::Error::InvalidArgument("int8 pools need scales [KV, P, page]; other pools empty scales");
  }
  if (value_dtype == 3) pg.k_scales = k_scales.typed_data(), pg.v_scales = v_scales.typed_data();
  Fn attend = kByDtype[value_dtype];
  const float* qp = q.typed_data();
  const void *kp = keys.untyped_data(), *vp = values.untyped_data();
  const int32_t* pp = positions.typed_data();
  float* op = out->typed_data();
  const int32_t last = *std::max_element(pp, pp + sh.B * sh.T);
  const int64_t pair_bytes = 2 * std::min<int64_t>(last + 1, sh.S) * sh.D * width;
  const int64_t pairs = sh.B * sh.KV;
  const int64_t wanted = jaxinfer::TaskCount(pool, pairs, std::max<int64_t>(pair_bytes, 1));
  const int64_t per_task = (pairs + wanted - 1) / wanted;
  jaxinfer::ParallelFor<Scratch>(pool, (pairs + per_task - 1) / per_task, [=](int64_t task, Scratch& scratch) {
    for (int64_t i = task * per_task; i < std::min(pairs, (task + 1) * per_task); ++i) {
      attend(sh, pg, qp, kp, vp, pp, op, i / sh.KV, i % sh.KV, scratch);
    }
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxinferDecodeAttention, DecodeAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Queries>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<Positions>()
                                  .Ret<Queries>()
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("window")
                                  .Attr<int64_t>("chunk"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxinferPagedDecodeAttention, PagedDecodeAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Queries>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<PageTable>()
                                  .Arg<Positions>()
                                  .Arg<Scales>()
                                  .Arg<Scales>()
                                  .Ret<Queries>()
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("window")
                                  .Attr<int64_t>("chunk")
                                  .Attr<int64_t>("value_dtype"));
