// CUDA kernels of the bias family: the same bytes as csrc/cpu/bias.cc, launched on the caller's
// stream. Elementwise ops: one thread per element. Bias gradient: one warp per column, lane l
// adds rows l, l+32, ... sequentially from 0 (the canonical lanes), then the __shfl_down_sync
// tree p_l += p_{l+16}, +8, +4, +2, +1 — exactly numerics::canonical_fold.
#include <cuda_runtime.h>

#include <string>

#include "internal/bias.h"

namespace twe {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / numerics::kSumLanes;

inline unsigned blocks_for(int64_t n, int64_t per_block) { return static_cast<unsigned>((n + per_block - 1) / per_block); }

TweStatus check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return fail(kTweCudaError, std::string(what) + ": " + cudaGetErrorString(err));
  return kTweSuccess;
}

template <typename T, typename U>
__global__ void elementwise_kernel(const T* x, const U* b, T* out, int64_t rows, int64_t cols, BiasOp op, float c) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= rows * cols) return;
  const float v = to_float(x[i]);
  float r;
  if (op == BiasOp::kAddBias) r = numerics::add_f32(v, to_float(b[i % cols]));
  else if (op == BiasOp::kAddResidual) r = numerics::add_f32(v, to_float(b[i]));
  else r = numerics::scale_f32(v, c);
  out[i] = FromFloat<T>::apply(r);
}

/*! One warp per column: the canonical 32-lane sum over the rows. */
template <typename T, typename U>
__global__ void grad_kernel(const T* dy, U* db, int64_t rows, int64_t cols) {
  const int lane = threadIdx.x % numerics::kSumLanes;
  const int64_t col = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / numerics::kSumLanes;
  if (col >= cols) return;  // whole warps leave together: col is uniform within a warp
  float partial = 0.0f;
  for (int64_t r = lane; r < rows; r += numerics::kSumLanes) partial = partial + to_float(dy[r * cols + col]);
  for (int half = numerics::kSumLanes / 2; half > 0; half >>= 1) {
    const float other = __shfl_down_sync(0xFFFFFFFFu, partial, half);
    partial = partial + other;
  }
  if (lane == 0) db[col] = FromFloat<U>::apply(partial);
}

}  // namespace

TweStatus bias_elementwise(const BiasArgs& a) {
  const auto stream = static_cast<cudaStream_t>(a.stream);
  const TweDType other = a.b ? a.b->dtype : a.a->dtype;
  return dispatch_high_precision(a.a->dtype, [&](auto t) {
    return dispatch_high_precision(other, [&](auto u) {
      using T = decltype(t);
      using U = decltype(u);
      const int64_t n = a.rows * a.cols;
      elementwise_kernel<T, U><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(
          static_cast<const T*>(a.a->data), a.b ? static_cast<const U*>(a.b->data) : nullptr,
          static_cast<T*>(a.out->data), a.rows, a.cols, a.op, a.c);
      return check_launch("bias elementwise_kernel");
    });
  });
}

TweStatus bias_grad(const BiasArgs& a) {
  const auto stream = static_cast<cudaStream_t>(a.stream);
  return dispatch_high_precision(a.a->dtype, [&](auto t) {
    return dispatch_high_precision(a.out->dtype, [&](auto u) {
      using T = decltype(t);
      using U = decltype(u);
      grad_kernel<T, U><<<blocks_for(a.cols, kWarpsPerBlock), kThreads, 0, stream>>>(
          static_cast<const T*>(a.a->data), static_cast<U*>(a.out->data), a.rows, a.cols);
      return check_launch("bias grad_kernel");
    });
  });
}

}  // namespace cuda
}  // namespace twe
