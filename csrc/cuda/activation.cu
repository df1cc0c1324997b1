// CUDA kernels of the activation family: the same bytes as csrc/cpu/activation.cc (one thread per
// output element, the value math is numerics.h's), launched on the caller's stream. The fused
// quantize and bias-gradient steps are the ABI layer's (twe_quantize / twe_bias_grad on the
// same stream).
#include <cuda_runtime.h>

#include <string>

#include "internal/activation.h"

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

/*! One thread per output element (r, c) of the (rows, out_cols) result. */
template <typename T>
__global__ void forward_kernel(const T* x, T* y, int64_t rows, int64_t cols, numerics::Activation kind, float limit,
                               float alpha) {
  const bool gated = numerics::activation_is_gated(kind);
  const int64_t out_cols = gated ? cols / 2 : cols;
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= rows * out_cols) return;
  const int64_t r = i / out_cols, c = i % out_cols;
  const T* xr = x + r * cols;
  float v;
  if (gated) v = numerics::gated_forward(kind, to_float(xr[c]), to_float(xr[out_cols + c]), limit, alpha);
  else v = numerics::activation_forward(kind, to_float(xr[c]));
  y[i] = FromFloat<T>::apply(v);
}

/*! One thread per element of dy (gated kinds write both halves of dx). */
template <typename T>
__global__ void backward_kernel(const T* dy, const T* x, T* dx, int64_t rows, int64_t cols,
                                numerics::Activation kind, float limit, float alpha) {
  const bool gated = numerics::activation_is_gated(kind);
  const int64_t out_cols = gated ? cols / 2 : cols;
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= rows * out_cols) return;
  const int64_t r = i / out_cols, c = i % out_cols;
  const T* xr = x + r * cols;
  T* dxr = dx + r * cols;
  if (gated) {
    const numerics::GatedGrad g =
        numerics::gated_backward(kind, to_float(xr[c]), to_float(xr[out_cols + c]), to_float(dy[i]), limit, alpha);
    dxr[c] = FromFloat<T>::apply(g.da);
    dxr[out_cols + c] = FromFloat<T>::apply(g.db);
  } else {
    dxr[c] = FromFloat<T>::apply(numerics::activation_backward(kind, to_float(xr[c]), to_float(dy[i])));
  }
}

int64_t out_elements(const ActivationArgs& a) {
  return a.rows * (numerics::activation_is_gated(a.kind) ? a.cols / 2 : a.cols);
}

}  // namespace

TweStatus activation_forward(const ActivationArgs& a) {
  const auto stream = static_cast<cudaStream_t>(a.stream);
  return dispatch_high_precision(a.x->dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t n = out_elements(a);
    forward_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(a.x->data),
                                                               static_cast<T*>(a.out->data), a.rows, a.cols, a.kind,
                                                               a.limit, a.alpha);
    return check_launch("activation forward_kernel");
  });
}

TweStatus activation_backward(const ActivationArgs& a) {
  const auto stream = static_cast<cudaStream_t>(a.stream);
  return dispatch_high_precision(a.x->dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t n = out_elements(a);
    backward_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(
        static_cast<const T*>(a.dy->data), static_cast<const T*>(a.x->data), static_cast<T*>(a.out->data), a.rows,
        a.cols, a.kind, a.limit, a.alpha);
    return check_launch("activation backward_kernel");
  });
}

}  // namespace cuda
}  // namespace twe
