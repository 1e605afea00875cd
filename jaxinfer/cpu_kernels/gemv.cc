// One-row matmul with bfloat16 weights for CPU decode: y[N] (f32) = x[K] (f32) . W.
//
// At one row XLA:CPU reads bf16 weights at about a third of the machine's bandwidth (slower
// than the same weights in f32), and single-sequence decode is bound by reading every weight
// once per step. This streams each weight once and widens it in registers: plain loops shaped
// for the compiler's vectoriser (-O3 -march=native), no intrinsics.
//
// Columns are split in chunks over XLA's intra-op thread pool. The calling thread claims chunks
// too and afterwards waits only for chunks other threads have started, so it cannot deadlock
// when every pool thread is itself inside such a call.
//
//   transposed=false: W is [K, N] row-major (y = x @ W)
//   transposed=true:  W is [N, K] row-major (y = x @ W.T; a tied embedding as output head)

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kColumnBlock = 256;  // partial sums of one block stay in L1
constexpr int64_t kMinChunk = 64;      // columns per task: below this, scheduling costs more

inline float Widen(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, sizeof(out));
  return out;
}

// y[j0:j1] for W [K, N]: four rows of W per pass over the block's partial sums.
void ColumnsOfProduct(const float* x, const uint16_t* w, float* y, int64_t K, int64_t N, int64_t j0,
                      int64_t j1) {
  alignas(64) float acc[kColumnBlock];
  for (int64_t jb = j0; jb < j1; jb += kColumnBlock) {
    const int64_t n = std::min(kColumnBlock, j1 - jb);
    std::fill(acc, acc + n, 0.0f);
    int64_t k = 0;
    for (; k + 4 <= K; k += 4) {
      const uint16_t* r0 = w + k * N + jb;
      const uint16_t *r1 = r0 + N, *r2 = r1 + N, *r3 = r2 + N;
      const float a0 = x[k], a1 = x[k + 1], a2 = x[k + 2], a3 = x[k + 3];
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        acc[j] += a0 * Widen(r0[j]) + a1 * Widen(r1[j]) + a2 * Widen(r2[j]) + a3 * Widen(r3[j]);
      }
    }
    for (; k < K; ++k) {
      const uint16_t* r0 = w + k * N + jb;
      const float a0 = x[k];
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) acc[j] += a0 * Widen(r0[j]);
    }
    std::memcpy(y + jb, acc, n * sizeof(float));
  }
}

// y[j0:j1] for W [N, K]: one dot product per row of W.
void ColumnsOfTransposedProduct(const float* x, const uint16_t* w, float* y, int64_t K, int64_t N,
                                int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; ++j) {
    const uint16_t* row = w + j * K;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t k = 0; k < K; ++k) sum += x[k] * Widen(row[k]);
    y[j] = sum;
  }
}

using ColumnFn = void (*)(const float*, const uint16_t*, float*, int64_t, int64_t, int64_t, int64_t);

// Chunks of columns, claimed by whichever thread gets there first.
struct Job {
  ColumnFn fn;
  const float* x;
  const uint16_t* w;
  float* y;
  int64_t K, N, chunk, num_chunks;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  void Work() {
    for (int64_t c; (c = next.fetch_add(1)) < num_chunks;) {
      fn(x, w, y, K, N, c * chunk, std::min(N, (c + 1) * chunk));
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

using Vector = ffi::Buffer<ffi::F32, 1>;
using Matrix = ffi::Buffer<ffi::BF16, 2>;

ffi::Error Gemv(ffi::ThreadPool pool, Vector x, Matrix w, ffi::Result<Vector> y, bool transposed) {
  const int64_t K = x.dimensions()[0];
  const int64_t N = transposed ? w.dimensions()[0] : w.dimensions()[1];
  if ((transposed ? w.dimensions()[1] : w.dimensions()[0]) != K) {
    return ffi::Error::InvalidArgument("x and w have different contracting sizes");
  }
  auto job = std::make_shared<Job>();
  job->fn = transposed ? &ColumnsOfTransposedProduct : &ColumnsOfProduct;
  job->x = x.typed_data();
  job->w = reinterpret_cast<const uint16_t*>(w.untyped_data());
  job->y = y->typed_data();
  job->K = K;
  job->N = N;
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  // Two chunks per thread balance the load; small matrices get one each, 16-column aligned.
  const int64_t per_thread = N >= threads * 2 * kMinChunk ? 2 : 1;
  job->chunk = std::max(kMinChunk, ((N + threads * per_thread - 1) / (threads * per_thread) + 15) / 16 * 16);
  job->num_chunks = (N + job->chunk - 1) / job->chunk;
  for (int64_t t = 1; t < std::min(threads, job->num_chunks); ++t) pool.Schedule([job] { job->Work(); });
  job->Work();
  while (job->done.load(std::memory_order_acquire) < job->num_chunks) std::this_thread::yield();
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxinferBf16Gemv, Gemv,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Vector>()
                                  .Arg<Matrix>()
                                  .Ret<Vector>()
                                  .Attr<bool>("transposed"));
