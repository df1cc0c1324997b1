// CUDA kernels of the dropout family: the same bytes as csrc/cpu/dropout.cc (one thread per mask
// byte, i.e. per 8 elements; the Philox draw and the keep test are numerics.h's), launched on the
// caller's stream. The rng state is read on the device (no host synchronization).
#include <cuda_runtime.h>

#include <string>

#include "internal/dropout.h"

namespace twe {
namespace cuda {
namespace {

constexpr int kThreads = 256;

inline unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

TweStatus check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return fail(kTweCudaError, std::string(what) + ": " + cudaGetErrorString(err));
  return kTweSuccess;
}

/*! Word `index` of the [seed, offset] array: uint32 / int32 bits, or the low 32 bits of int64. */
__device__ uint32_t rng_word(const void* rng, bool int64, int index) {
  if (int64) return static_cast<uint32_t>(static_cast<const int64_t*>(rng)[index]);
  return static_cast<const uint32_t*>(rng)[index];
}

/*! Thread m: mask byte m (drawn when `rng` is given, else read) and elements 8m .. 8m+7. */
template <typename T>
__global__ void dropout_kernel(const T* in, T* out, uint8_t* mask, const void* rng, bool rng_int64, int64_t n,
                               float p) {
  const int64_t m = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (m >= (n + 7) / 8) return;
  const float scale = numerics::dropout_scale(p);
  uint8_t bits;
  if (rng != nullptr) {
    bits = numerics::dropout_mask_byte(m, n, numerics::dropout_threshold(p), rng_word(rng, rng_int64, 0),
                                       rng_word(rng, rng_int64, 1));
    mask[m] = bits;
  } else {
    bits = mask[m];
  }
  for (int e = 0; e < 8 && m * 8 + e < n; ++e) {
    const int64_t i = m * 8 + e;
    out[i] = FromFloat<T>::apply(numerics::dropout_apply(to_float(in[i]), (bits >> e) & 1u, scale));
  }
}

TweStatus launch(const DropoutArgs& a, bool draw) {
  const auto stream = static_cast<cudaStream_t>(a.stream);
  return dispatch_high_precision(a.in->dtype, [&](auto tag) {
    using T = decltype(tag);
    const void* rng = draw ? a.rng->data : nullptr;
    const bool rng_int64 = draw && a.rng->dtype == kTweInt64;
    dropout_kernel<T><<<blocks_for((a.n + 7) / 8), kThreads, 0, stream>>>(
        static_cast<const T*>(a.in->data), static_cast<T*>(a.out->data), static_cast<uint8_t*>(a.mask->data), rng,
        rng_int64, a.n, a.p);
    return check_launch("dropout_kernel");
  });
}

}  // namespace

TweStatus dropout_forward(const DropoutArgs& a) { return launch(a, true); }

TweStatus dropout_backward(const DropoutArgs& a) { return launch(a, false); }

}  // namespace cuda
}  // namespace twe
