// In-place KV-cache write for CPU: cache[b, h, positions[b, t], :] = new[b, t, h, :].
//
// XLA:CPU turns the equivalent scatter into slow forms: with bf16 caches it widens the whole
// layer's cache to f32 and back at every write, and with one sequence it rewrites the scatter as
// a dynamic-update-slice that its fusion pass duplicates into the attention read, copying the
// layer's cache several times per step. This call updates the cache buffer it is given
// (aliased to its result) and touches only the written entries.
//
//   transposed=false: cache [B, KV, S, K]  (keys: one contiguous K-vector per position)
//   transposed=true:  cache [B, KV, K, S]  (values: position is the minor axis)
//   new [B, T, KV, K] in the cache's dtype, positions [B, T] int32; positions outside [0, S)
//   are dropped.

#include <cstdint>
#include <cstring>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using Positions = ffi::Buffer<ffi::S32, 2>;

template <typename T>
void WriteTransposed(const T* src, T* dst, int64_t K, int64_t S, int64_t p) {
  for (int64_t d = 0; d < K; ++d) dst[d * S + p] = src[d];
}

ffi::Error CacheWrite(ffi::AnyBuffer cache, ffi::AnyBuffer updates, Positions positions,
                      ffi::Result<ffi::AnyBuffer> out, bool transposed) {
  const auto cd = cache.dimensions();
  const auto ud = updates.dimensions();
  if (cd.size() != 4 || ud.size() != 4 || cache.element_type() != updates.element_type()) {
    return ffi::Error::InvalidArgument("cache and updates must be rank-4 arrays of one dtype");
  }
  const int64_t B = cd[0], KV = cd[1], S = transposed ? cd[3] : cd[2], K = transposed ? cd[2] : cd[3];
  const int64_t T = ud[1];
  if (ud[0] != B || ud[2] != KV || ud[3] != K || positions.dimensions()[0] != B || positions.dimensions()[1] != T) {
    return ffi::Error::InvalidArgument("updates [B, T, KV, K] and positions [B, T] do not match the cache");
  }
  const int64_t width = static_cast<int64_t>(cache.size_bytes() / cache.element_count());
  auto* dst = static_cast<uint8_t*>(out->untyped_data());
  if (dst != cache.untyped_data()) std::memcpy(dst, cache.untyped_data(), cache.size_bytes());
  const auto* src = static_cast<const uint8_t*>(updates.untyped_data());
  const int32_t* pos = positions.typed_data();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t p = pos[b * T + t];
      if (p < 0 || p >= S) continue;
      for (int64_t h = 0; h < KV; ++h) {
        const uint8_t* row = src + ((b * T + t) * KV + h) * K * width;
        uint8_t* block = dst + (b * KV + h) * S * K * width;
        if (!transposed) {
          std::memcpy(block + p * K * width, row, K * width);
        } else if (width == 2) {
          WriteTransposed(reinterpret_cast<const uint16_t*>(row), reinterpret_cast<uint16_t*>(block), K, S, p);
        } else if (width == 4) {
          WriteTransposed(reinterpret_cast<const uint32_t*>(row), reinterpret_cast<uint32_t*>(block), K, S, p);
        } else {
          for (int64_t d = 0; d < K; ++d) std::memcpy(block + (d * S + p) * width, row + d * width, width);
        }
      }
    }
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxinferCacheWrite, CacheWrite,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<Positions>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("transposed"));
