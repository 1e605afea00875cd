// The decode-attention kernel's inner loops on eight-float vectors (decode_attention.cc).
//
// GCC/Clang vector extensions, so one source gives AVX, SSE or NEON code as -march allows. The
// plain loops these replace ran at ~25% of the memory bandwidth on a 2-core AVX2 machine: the
// vectoriser left each key's dot product latency bound on its reduction, spilled accumulators
// and widened bf16 through four shuffles per vector.
// - Cache values are read in place, 16 at a time (Load16). bf16 comes as its 8 even-indexed
//   values, then its 8 odd ones: each 32-bit word holds a pair, the even value is the word
//   shifted left 16, the odd one the word with its low half cleared (no shuffles). Queries and
//   value sums are kept in that lane order (ToLaneOrder / FromLaneOrder).
// - Scores go eight keys at a time (eight independent FMA chains), their horizontal sums
//   together (Sums); weighted values 64 columns at a time, the sums held in registers.

#ifndef JAXINFER_CPU_KERNELS_ATTENTION_VECTORS_H_
#define JAXINFER_CPU_KERNELS_ATTENTION_VECTORS_H_

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace jaxinfer_attention {

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

typedef float F8 __attribute__((vector_size(32)));
typedef int32_t I8 __attribute__((vector_size(32)));
typedef uint32_t U8 __attribute__((vector_size(32)));
typedef _Float16 H8 __attribute__((vector_size(16)));

template <typename To, typename From>
inline To BitCast(From v) {
  static_assert(sizeof(To) == sizeof(From));
  To out;
  std::memcpy(&out, &v, sizeof(out));
  return out;
}

inline F8 Load8(const float* p) {
  F8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline F8 Load8(const Half* p) {
  H8 h;
  std::memcpy(&h, p, sizeof(h));
  return __builtin_convertvector(h, F8);
}
inline void Store8(float* p, F8 v) { std::memcpy(p, &v, sizeof(v)); }

// A block of 16 cache values as two vectors (bf16: evens, then odds; see the top).
inline void Load16(const float* p, F8& a, F8& b) { a = Load8(p), b = Load8(p + 8); }
inline void Load16(const Half* p, F8& a, F8& b) { a = Load8(p), b = Load8(p + 8); }
inline void Load16(const Bf16* p, F8& a, F8& b) {
  U8 words;
  std::memcpy(&words, p, sizeof(words));
  a = BitCast<F8>(words << 16);
  b = BitCast<F8>(words & 0xFFFF0000u);
}

// Where value i of a 16-block lands in Load16's two vectors (lane 0..15).
template <typename C>
inline int64_t Lane16(int64_t i) {
  return i;
}
template <>
inline int64_t Lane16<Bf16>(int64_t i) {
  return (i % 2) * 8 + i / 2;
}

// The first D - D % 16 entries of x [D] reordered block by block as Load16 orders the cache.
template <typename C>
inline void ToLaneOrder(const float* x, float* out, int64_t D) {
  for (int64_t d = 0; d < D - D % 16; ++d) out[d - d % 16 + Lane16<C>(d % 16)] = x[d];
  std::copy(x + D - D % 16, x + D, out + D - D % 16);
}
template <typename C>
inline void FromLaneOrder(const float* x, float* out, int64_t D, float scale) {
  for (int64_t d = 0; d < D - D % 16; ++d) out[d] = x[d - d % 16 + Lane16<C>(d % 16)] * scale;
  for (int64_t d = D - D % 16; d < D; ++d) out[d] = x[d] * scale;
}

inline float Sum(F8 v) { return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7])); }

// Lane i of the result is the sum of a[i]'s lanes: three rounds of pairwise shuffles and adds.
inline F8 Sums(const F8 (&a)[8]) {
  F8 b[4], c[2];
  for (int i = 0; i < 4; ++i) {
    b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 8, 2, 10, 4, 12, 6, 14) +
           __builtin_shufflevector(a[2 * i], a[2 * i + 1], 1, 9, 3, 11, 5, 13, 7, 15);
  }
  for (int i = 0; i < 2; ++i) {
    c[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
           __builtin_shufflevector(b[2 * i], b[2 * i + 1], 2, 3, 10, 11, 6, 7, 14, 15);
  }
  return __builtin_shufflevector(c[0], c[1], 0, 1, 2, 3, 8, 9, 10, 11) +
         __builtin_shufflevector(c[0], c[1], 4, 5, 6, 7, 12, 13, 14, 15);
}

// out[j] = scale * <q, keys[j]> for n key rows D apart, read in place; q_lanes is q in lane
// order (ToLaneOrder). Eight keys at a time: eight independent FMA chains (one chain per key is
// bound by the FMA latency), their horizontal sums done together.
template <typename C>
inline void ScoreKeys(const float* __restrict q_lanes, const C* __restrict keys, int64_t n, int64_t D, float scale,
                      float* __restrict out) {
  const int64_t body = D - D % 16;
  auto dot = [&](int64_t j) {
    F8 acc = {}, a, b;
    for (int64_t d = 0; d < body; d += 16) {
      Load16(keys + j * D + d, a, b);
      acc += Load8(q_lanes + d) * a + Load8(q_lanes + d + 8) * b;
    }
    float sum = Sum(acc);
    for (int64_t d = body; d < D; ++d) sum += q_lanes[d] * ToFloat(keys[j * D + d]);
    return sum * scale;
  };
  int64_t j = 0;
  for (; j + 8 <= n && body == D; j += 8) {
    F8 acc[8] = {}, a, b;
    for (int64_t d = 0; d < D; d += 16) {
      const F8 qa = Load8(q_lanes + d), qb = Load8(q_lanes + d + 8);
      for (int i = 0; i < 8; ++i) {
        Load16(keys + (j + i) * D + d, a, b);
        acc[i] += qa * a + qb * b;
      }
    }
    Store8(out + j, Sums(acc) * scale);
  }
  for (; j < n; ++j) out[j] = dot(j);
}

// acc[0, 8V) += sum_j p[j] * values[j][0, 8V) in lane order, over n rows D apart: V vectors of
// sums held over the whole run (V = 8: eight FMA chains, enough to hide the FMA latency).
template <int V, typename C>
inline void WeighColumns(const float* __restrict p, const C* __restrict values, int64_t n, int64_t D,
                         float* __restrict acc) {
  F8 sum[V];
  for (int i = 0; i < V; ++i) sum[i] = Load8(acc + 8 * i);
  for (int64_t j = 0; j < n; ++j) {
    const F8 pj = F8{} + p[j];
    for (int i = 0; i < V; i += 2) {
      F8 a, b;
      Load16(values + j * D + 8 * i, a, b);
      sum[i] += pj * a;
      sum[i + 1] += pj * b;
    }
  }
  for (int i = 0; i < V; ++i) Store8(acc + 8 * i, sum[i]);
}

// acc[0, D) += sum_j p[j] * values[j] (lane order) for n value rows D apart, read in place: 64
// columns at a time, then 16, then the last D % 16 one by one.
template <typename C>
inline void WeighValues(const float* p, const C* values, int64_t n, int64_t D, float* acc) {
  const int64_t body = D - D % 16;
  int64_t d = 0;
  for (; d + 64 <= body; d += 64) WeighColumns<8>(p, values + d, n, D, acc + d);
  for (; d < body; d += 16) WeighColumns<2>(p, values + d, n, D, acc + d);
  for (; d < D; ++d) {
    for (int64_t j = 0; j < n; ++j) acc[d] += p[j] * ToFloat(values[j * D + d]);
  }
}

// exp(x) on eight lanes for x <= 0 (softmax after subtracting the max): 2^n * p(r) with a
// degree-6 polynomial on r in [-ln2/2, ln2/2]; relative error ~2e-7.
inline F8 ExpNonPositive8(F8 x) {
  x = x < -87.0f ? F8{} - 87.0f : x;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const F8 n = (x * 1.44269504088896341f + kRound) - kRound;
  const F8 r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
  F8 p = F8{} + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p * BitCast<F8>((__builtin_convertvector(n, I8) + 127) << 23);
}

// exp(row[i] - max) in place over row[0, n), returning their sum (n >= 1).
inline float ExpShifted(float* row, int64_t n) {
  F8 best = F8{} + row[0];
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const F8 x = Load8(row + i);
    best = x > best ? x : best;
  }
  float m = best[0];
  for (int l = 1; l < 8; ++l) m = std::max(m, best[l]);
  for (; i < n; ++i) m = std::max(m, row[i]);
  F8 total = {};
  for (i = 0; i + 8 <= n; i += 8) {
    const F8 e = ExpNonPositive8(Load8(row + i) - m);
    Store8(row + i, e);
    total += e;
  }
  float sum = Sum(total);
  for (; i < n; ++i) sum += (row[i] = ExpNonPositive8(F8{} + (row[i] - m))[0]);
  return sum;
}

}  // namespace jaxinfer_attention

#endif  // JAXINFER_CPU_KERNELS_ATTENTION_VECTORS_H_
