// CUDA kernel of the rope family: the same bytes as csrc/cpu/rope.cc, launched on the caller's
// stream. One thread per rotary element (numerics::rope_sincos evaluated per element, in double,
// with --fmad=false) plus the copied channels; a token's position comes from its index (sbhd,
// bshd) or from a search of cu_seqlens (thd; tokens outside every sequence or at positions
// >= S_f are copied).
#include <cuda_runtime.h>

#include <string>

#include "internal/rope.h"

namespace twe {
namespace cuda {
namespace {

constexpr int kThreads = 256;

TweStatus check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return fail(kTweCudaError, std::string(what) + ": " + cudaGetErrorString(err));
  return kTweSuccess;
}

__device__ int64_t token_position(const RopeArgs& a, int64_t token) {
  if (a.format == kTweRopeSbhd) return token / a.batch;
  if (a.format == kTweRopeBshd) return token % a.seq;
  // thd: the last b with cu_seqlens[b] <= token (binary search), position token − cu_seqlens[b].
  if (a.batch < 1 || token < a.cu_seqlens[0] || token >= a.cu_seqlens[a.batch]) return -1;
  int64_t lo = 0, hi = a.batch;  // invariant: cu[lo] <= token < cu[hi]
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (a.cu_seqlens[mid] <= token) lo = mid;
    else hi = mid;
  }
  const int64_t p = token - a.cu_seqlens[lo];
  return p < a.freq_rows ? p : -1;
}

template <typename T>
__global__ void rope_kernel(RopeArgs a, const T* x, T* out) {
  const int64_t n = a.tokens * a.heads * a.d;
  const int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (e >= n) return;
  const int64_t i = e % a.d, r = e / a.d;
  const int64_t p = i < a.d2 ? token_position(a, r / a.heads) : -1;
  if (p < 0) {
    out[e] = x[e];
    return;
  }
  int64_t j;
  bool negate;
  rope_partner(i, a.d2, a.interleaved, a.backward, &j, &negate);
  const float xi = to_float(x[e]);
  const float xj = to_float(x[r * a.d + j]);
  const float other = negate ? -xj : xj;
  const numerics::RopeSinCos own = numerics::rope_sincos(a.freqs[p * a.d2 + i]);
  const float s = a.backward ? numerics::rope_sincos(a.freqs[p * a.d2 + j]).sin : own.sin;
  out[e] = FromFloat<T>::apply(numerics::rope_rotate(xi, own.cos, other, s));
}

}  // namespace

TweStatus rope_apply(const RopeArgs& a) {
  const auto stream = static_cast<cudaStream_t>(a.stream);
  return dispatch_high_precision(a.x->dtype, [&](auto t) {
    using T = decltype(t);
    const int64_t n = a.tokens * a.heads * a.d;
    const unsigned blocks = static_cast<unsigned>((n + kThreads - 1) / kThreads);
    rope_kernel<T><<<blocks, kThreads, 0, stream>>>(a, static_cast<const T*>(a.x->data), static_cast<T*>(a.out->data));
    return check_launch("rope_kernel");
  });
}

}  // namespace cuda
}  // namespace twe
