// Attention of a few queries per sequence over the contiguous KV cache, on CPU.
//
// Decode and speculative verification attend with 1..16 queries per sequence. XLA:CPU runs
// that as many tiny batched dots over the whole preallocated cache, so a step costs as much at
// position 10 as at the cache's end. This reads only the visible keys of each sequence, once
// for all query heads of a KV head, in three passes per (sequence, KV head): scores, softmax,
// weighted sum of values. Plain loops shaped for the vectoriser (-O3 -march=native).
//
//   q [B, T, H, D] f32, keys [B, KV, S, D], values [B, KV, D, S] (f32, bf16 or f16; one dtype),
//   positions [B, T] int32: query t of sequence b sits at positions[b, t] and sees keys
//   s <= positions[b, t] (and positions[b, t] - s < window when window > 0).
//   out [B, T, H, D] f32. A query that sees no key gets zeros.
//
// (sequence, KV head) pairs are split over XLA's intra-op thread pool (parallel_tasks.h).
//
// The paged entry point (JaxinferPagedDecodeAttention) reads the serving engine's page pools
// directly: keys and values [KV, P, page, D] (values not transposed; 16-bit floats may be
// stored as uint16 bits, `value_dtype` says which), page_table [B, W] int32. Only the pages
// holding visible keys are touched, so a step's cost follows each sequence's own length.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "parallel_tasks.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kMaxQueries = 16;

inline float ToFloat(float v) { return v; }

struct Bf16 {
  uint16_t bits;
};
inline float ToFloat(Bf16 v) {
  const uint32_t wide = static_cast<uint32_t>(v.bits) << 16;
  float out;
  std::memcpy(&out, &wide, sizeof(out));
  return out;
}

struct Half {
  _Float16 value;
};
inline float ToFloat(Half v) { return static_cast<float>(v.value); }

// exp(x) for x <= 0 (softmax after subtracting the max), vectorisable: 2^n * p(r) with a
// degree-6 polynomial on r in [-ln2/2, ln2/2]; relative error ~2e-7.
inline float ExpNonPositive(float x) {
  x = std::max(x, -87.0f);
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  const float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
  float p = 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// Per-thread buffers, reused across tasks.
struct Scratch {
  std::vector<float> probs;    // [T * G, visible keys] scores, then probabilities
  std::vector<float> block;    // widened keys, then one widened value row
  std::vector<float> inv_sum;  // [T * G] 1 / softmax denominator
};

template <typename C>
void Widen(const C* __restrict src, float* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = ToFloat(src[i]);
}

struct Shape {
  int64_t B, T, H, KV, S, D;
  float scale;
  int64_t window;
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
    v.lo[t] = sh.window > 0 ? std::max<int64_t>(0, p - sh.window + 1) : 0;
    if (v.hi[t] >= v.lo[t]) {
      lo_all = std::min(lo_all, v.lo[t]);
      hi_all = std::max(hi_all, v.hi[t]);
    }
  }
  v.lo_all = lo_all;
  v.width = std::max<int64_t>(hi_all - lo_all + 1, 0);
  return v;
}

// Passes 1 and 2 over the widened visible keys in sc.block: probabilities (unnormalised) in
// sc.probs [T * G, width] and 1 / denominators in sc.inv_sum.
void ScoresSoftmax(const Shape& sh, const float* q, const Visible& v, int64_t b, int64_t h, Scratch& sc) {
  const int64_t G = sh.H / sh.KV, D = sh.D, width = v.width;
  for (int64_t t = 0; t < sh.T; ++t) {
    for (int64_t g = 0; g < G; ++g) {
      const float* __restrict qr = q + ((b * sh.T + t) * sh.H + h * G + g) * D;
      float* __restrict row = sc.probs.data() + (t * G + g) * width;
      for (int64_t s = v.lo[t]; s <= v.hi[t]; ++s) {
        const float* __restrict kr = sc.block.data() + (s - v.lo_all) * D;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < D; ++d) dot += qr[d] * kr[d];
        row[s - v.lo_all] = dot * sh.scale;
      }
    }
  }
  for (int64_t t = 0; t < sh.T; ++t) {
    if (v.hi[t] < v.lo[t]) continue;
    for (int64_t g = 0; g < G; ++g) {
      float* __restrict row = sc.probs.data() + (t * G + g) * width + (v.lo[t] - v.lo_all);
      const int64_t n = v.hi[t] - v.lo[t] + 1;
      float m = row[0];
      for (int64_t i = 1; i < n; ++i) m = std::max(m, row[i]);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t i = 0; i < n; ++i) {
        row[i] = ExpNonPositive(row[i] - m);
        sum += row[i];
      }
      sc.inv_sum[t * G + g] = 1.0f / sum;
    }
  }
}

void PrepareScratch(const Shape& sh, const Visible& v, Scratch& sc) {
  const int64_t rows = sh.T * (sh.H / sh.KV);
  sc.probs.assign(rows * v.width, 0.0f);
  sc.block.resize(std::max<int64_t>(v.width, 1) * sh.D);
  sc.inv_sum.assign(rows, 0.0f);
}

// All T x G queries of sequence b that share KV head h (contiguous cache).
template <typename C>
void AttendOne(const Shape& sh, const float* q, const C* keys, const C* values, const int32_t* positions,
               float* out, int64_t b, int64_t h, Scratch& scratch) {
  const int64_t G = sh.H / sh.KV, D = sh.D, S = sh.S;
  const C* k_block = keys + (b * sh.KV + h) * S * D;
  const C* v_block = values + (b * sh.KV + h) * D * S;
  const Visible v = VisibleKeys(sh, positions, b);
  const int64_t width = v.width, rows = sh.T * G;
  Scratch& sc = scratch;
  PrepareScratch(sh, v, sc);
  // The visible keys are widened to f32 once, then each key row is read for every query.
  Widen(k_block + v.lo_all * D, sc.block.data(), width * D);
  ScoresSoftmax(sh, q, v, b, h, sc);
  // Pass 3: out[query, d] = sum_s p[query, s] * V[d, s]; each value row widened once.
  for (int64_t d = 0; d < D; ++d) {
    Widen(v_block + d * S + v.lo_all, sc.block.data(), width);
    const float* __restrict vr = sc.block.data();
    for (int64_t r = 0; r < rows; ++r) {
      const float* __restrict pr = sc.probs.data() + r * width;
      float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = 0; i < width; ++i) acc += pr[i] * vr[i];
      const int64_t t = r / G, g = r % G;
      out[((b * sh.T + t) * sh.H + h * G + g) * D + d] = acc * sc.inv_sum[r];
    }
  }
}

struct Pages {
  int64_t num_pages, page, width;  // pool pages, tokens per page, page-table slots per sequence
  const int32_t* table;           // [B, width]
};

// The same queries over paged pools [KV, P, page, D]: keys gathered page by page into
// scratch; values accumulated row by row (their layout is [s, d]).
template <typename C>
void AttendPaged(const Shape& sh, const Pages& pg, const float* q, const C* keys, const C* values,
                 const int32_t* positions, float* out, int64_t b, int64_t h, Scratch& sc) {
  const int64_t G = sh.H / sh.KV, D = sh.D, rows = sh.T * G;
  const Visible v = VisibleKeys(sh, positions, b);
  PrepareScratch(sh, v, sc);
  auto row_of = [&](const C* pool, int64_t s) {
    const int64_t page = pg.table[b * pg.width + s / pg.page];
    return pool + ((h * pg.num_pages + page) * pg.page + s % pg.page) * D;
  };
  for (int64_t s = v.lo_all; s < v.lo_all + v.width;) {
    const int64_t run = std::min(pg.page - s % pg.page, v.lo_all + v.width - s);  // rest of this page
    Widen(row_of(keys, s), sc.block.data() + (s - v.lo_all) * D, run * D);
    s += run;
  }
  ScoresSoftmax(sh, q, v, b, h, sc);
  std::vector<float> acc(rows * D, 0.0f), vr(D);
  for (int64_t s = v.lo_all; s < v.lo_all + v.width; ++s) {
    Widen(row_of(values, s), vr.data(), D);
    for (int64_t r = 0; r < rows; ++r) {
      const float p = sc.probs[r * v.width + (s - v.lo_all)];
      if (p == 0.0f) continue;
      float* __restrict ar = acc.data() + r * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) ar[d] += p * vr[d];
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r / G, g = r % G;
    float* o = out + ((b * sh.T + t) * sh.H + h * G + g) * D;
    for (int64_t d = 0; d < D; ++d) o[d] = acc[r * D + d] * sc.inv_sum[r];
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
                           Positions positions, ffi::Result<Queries> out, float scale, int64_t window) {
  const auto qd = q.dimensions(), kd = keys.dimensions(), vd = values.dimensions();
  Shape sh{qd[0], qd[1], qd[2], kd.size() == 4 ? kd[1] : 0, kd.size() == 4 ? kd[2] : 0, qd[3], scale, window};
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

template <typename C>
void PagedAs(const Shape& sh, const Pages& pg, const float* q, const void* k, const void* v, const int32_t* pos,
             float* out, int64_t b, int64_t h, Scratch& sc) {
  AttendPaged(sh, pg, q, static_cast<const C*>(k), static_cast<const C*>(v), pos, out, b, h, sc);
}

// value_dtype: 0 float32, 1 bfloat16, 2 float16 (the pools may hold 16-bit floats as uint16 bits).
ffi::Error PagedDecodeAttention(ffi::ThreadPool pool, Queries q, ffi::AnyBuffer keys, ffi::AnyBuffer values,
                                PageTable table, Positions positions, ffi::Result<Queries> out, float scale,
                                int64_t window, int64_t value_dtype) {
  const auto qd = q.dimensions(), kd = keys.dimensions(), td = table.dimensions();
  const bool shapes_ok = kd.size() == 4 && values.dimensions().size() == 4 && kd[3] == qd[3] && kd[0] > 0 &&
                         qd[2] % kd[0] == 0 && td[0] == qd[0] && positions.dimensions()[0] == qd[0] &&
                         positions.dimensions()[1] == qd[1] && qd[1] <= kMaxQueries &&
                         keys.element_type() == values.element_type();
  if (!shapes_ok) {
    return ffi::Error::InvalidArgument("need q [B,T<=16,H,D], pools [KV,P,page,D] of one dtype, table [B,W]");
  }
  Shape sh{qd[0], qd[1], qd[2], kd[0], td[1] * kd[2], qd[3], scale, window};
  Pages pg{kd[1], kd[2], td[1], table.typed_data()};
  using Fn = void (*)(const Shape&, const Pages&, const float*, const void*, const void*, const int32_t*, float*,
                      int64_t, int64_t, Scratch&);
  Fn attend = value_dtype == 1 ? &PagedAs<Bf16> : value_dtype == 2 ? &PagedAs<Half> : &PagedAs<float>;
  const int64_t width = keys.size_bytes() / keys.element_count();
  if (width != (value_dtype == 0 ? 4 : 2)) return ffi::Error::InvalidArgument("value_dtype does not match the pools");
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
                                  .Attr<int64_t>("window"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxinferPagedDecodeAttention, PagedDecodeAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Queries>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<PageTable>()
                                  .Arg<Positions>()
                                  .Ret<Queries>()
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("window")
                                  .Attr<int64_t>("value_dtype"));
