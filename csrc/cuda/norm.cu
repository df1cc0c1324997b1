// CUDA kernels of the norm family: the same bytes as csrc/cpu/norm.cc. One warp per row: lane l
// adds elements l, l+32, ... in order and the 32 partials fold with a __shfl_down_sync tree
// (16, 8, 4, 2, 1) — exactly numerics::canonical_sum. The column sums of dγ / dβ give lane l the
// rows l, l+32, ... of a column and fold the same way. Value math comes from numerics.h; the fused
// quantization runs in the ABI layer through the quantize family's CUDA kernels on the same stream.
#include <cuda_runtime.h>

#include <string>

#include "internal/norm.h"

namespace twe {
namespace cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kLanes = numerics::kSumLanes;
constexpr unsigned kFullMask = 0xFFFFFFFFu;

TweStatus check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return fail(kTweCudaError, std::string(what) + ": " + cudaGetErrorString(err));
  return kTweSuccess;
}

/*! Element i of a high-precision array of runtime dtype `dtype`, widened exactly. */
__device__ __forceinline__ float load(const void* p, TweDType dtype, int64_t i) {
  switch (dtype) {
    case kTweBFloat16: return to_float(static_cast<const BFloat16*>(p)[i]);
    case kTweFloat16: return to_float(static_cast<const Float16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

/*! Stores v rounded (RNE) to `dtype` as element i. */
__device__ __forceinline__ void store(void* p, TweDType dtype, int64_t i, float v) {
  switch (dtype) {
    case kTweBFloat16: static_cast<BFloat16*>(p)[i] = FromFloat<BFloat16>::apply(v); break;
    case kTweFloat16: static_cast<Float16*>(p)[i] = FromFloat<Float16>::apply(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

/*! The canonical fold of one partial per lane (p_l = fl(p_l + p_{l+16}), ... +1), broadcast to
 *  every lane. */
__device__ __forceinline__ float warp_fold(float partial) {
  for (int half = kLanes / 2; half > 0; half >>= 1) {
    const float other = __shfl_down_sync(kFullMask, partial, half);
    partial = partial + other;
  }
  return __shfl_sync(kFullMask, partial, 0);
}

/*! Σc over a row of length k, term(i) giving element i: lane l adds terms l, l+32, ... in order. */
template <typename Term>
__device__ __forceinline__ float warp_canonical_sum(int64_t k, int lane, Term term) {
  float partial = 0.0f;
  for (int64_t i = lane; i < k; i += kLanes) partial = partial + term(i);
  return warp_fold(partial);
}

struct FwdParams {
  const void* x;
  const void* gamma;
  const void* beta;
  void* y;
  float* mu;
  float* rstd;
  TweDType x_dtype, gamma_dtype, beta_dtype;
  float eps;
  bool zero_centered_gamma;
  int64_t rows, cols;
};

template <NormKind Kind>
__global__ void norm_fwd_kernel(FwdParams p) {
  const int lane = threadIdx.x % kLanes;
  const int64_t r = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / kLanes;
  if (r >= p.rows) return;  // whole warps exit together
  const int64_t k = p.cols, base = r * k;
  const void* x = p.x;
  const TweDType xt = p.x_dtype;
  float rstd;
  if (Kind == NormKind::kLayerNorm) {
    const float mu = numerics::norm_mean(warp_canonical_sum(k, lane, [&](int64_t i) { return load(x, xt, base + i); }), k);
    const float var = numerics::norm_mean(
        warp_canonical_sum(k, lane, [&](int64_t i) { return numerics::square(load(x, xt, base + i) - mu); }), k);
    rstd = numerics::norm_rstd(var, p.eps);
    for (int64_t i = lane; i < k; i += kLanes) {
      const float gain = numerics::norm_gain(load(p.gamma, p.gamma_dtype, i), p.zero_centered_gamma);
      const float xhat = numerics::layernorm_xhat(load(x, xt, base + i), mu, rstd);
      store(p.y, xt, base + i, numerics::layernorm_output(xhat, gain, load(p.beta, p.beta_dtype, i)));
    }
    if (lane == 0) p.mu[r] = mu;
  } else if (Kind == NormKind::kRMSNorm) {
    const float ms = numerics::norm_mean(
        warp_canonical_sum(k, lane, [&](int64_t i) { return numerics::square(load(x, xt, base + i)); }), k);
    rstd = numerics::norm_rstd(ms, p.eps);
    for (int64_t i = lane; i < k; i += kLanes) {
      const float gain = numerics::norm_gain(load(p.gamma, p.gamma_dtype, i), p.zero_centered_gamma);
      store(p.y, xt, base + i, numerics::rmsnorm_output(load(x, xt, base + i), rstd, gain));
    }
  } else {
    const float sum_sq = warp_canonical_sum(k, lane, [&](int64_t i) { return numerics::square(load(x, xt, base + i)); });
    rstd = numerics::norm_rstd(sum_sq, p.eps);
    for (int64_t i = lane; i < k; i += kLanes) store(p.y, xt, base + i, load(x, xt, base + i) * rstd);
  }
  if (lane == 0) p.rstd[r] = rstd;
}

struct BwdParams {
  const void* dy;
  const void* x;
  const float* mu;
  const float* rstd;
  const void* gamma;
  void* dx;
  void* dgamma;
  void* dbeta;
  TweDType dy_dtype, x_dtype, gamma_dtype;
  bool zero_centered_gamma;
  int64_t rows, cols;
};

/*! x̂ of element (r, i): LayerNorm fl(fl(x − μ) · rstd), RMSNorm fl(x · rstd), L2 y = fl(x · rstd). */
template <NormKind Kind>
__device__ __forceinline__ float recompute_xhat(const BwdParams& p, int64_t r, int64_t idx) {
  const float x = load(p.x, p.x_dtype, idx);
  if (Kind == NormKind::kLayerNorm) return numerics::layernorm_xhat(x, p.mu[r], p.rstd[r]);
  return x * p.rstd[r];
}

template <NormKind Kind>
__global__ void norm_bwd_dx_kernel(BwdParams p) {
  const int lane = threadIdx.x % kLanes;
  const int64_t r = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / kLanes;
  if (r >= p.rows) return;
  const int64_t k = p.cols, base = r * k;
  const float rstd = p.rstd[r];
  auto dy = [&](int64_t i) { return load(p.dy, p.dy_dtype, base + i); };
  auto xhat = [&](int64_t i) { return recompute_xhat<Kind>(p, r, base + i); };
  if (Kind == NormKind::kL2Norm) {
    const float s = warp_canonical_sum(k, lane, [&](int64_t i) { return dy(i) * xhat(i); });
    for (int64_t i = lane; i < k; i += kLanes) store(p.dx, p.x_dtype, base + i, numerics::l2norm_dx(rstd, dy(i), xhat(i), s));
    return;
  }
  auto ghat = [&](int64_t i) {
    return dy(i) * numerics::norm_gain(load(p.gamma, p.gamma_dtype, i), p.zero_centered_gamma);
  };
  const float b = numerics::norm_mean(warp_canonical_sum(k, lane, [&](int64_t i) { return ghat(i) * xhat(i); }), k);
  if (Kind == NormKind::kLayerNorm) {
    const float a = numerics::norm_mean(warp_canonical_sum(k, lane, ghat), k);
    for (int64_t i = lane; i < k; i += kLanes) {
      store(p.dx, p.x_dtype, base + i, numerics::layernorm_dx(rstd, ghat(i), a, xhat(i), b));
    }
  } else {
    for (int64_t i = lane; i < k; i += kLanes) store(p.dx, p.x_dtype, base + i, numerics::rmsnorm_dx(rstd, ghat(i), xhat(i), b));
  }
}

/*! dγ (and dβ) for a tile of 32 columns, 1024 threads: thread t = 32·l + c adds rows l, l+32, ...
 *  of column c sequentially (a warp reads 32 consecutive columns of a row: coalesced), then warp w
 *  folds column w's 32 lane partials from shared memory, its lane c holding row-lane c. */
template <NormKind Kind>
__global__ void norm_bwd_params_kernel(BwdParams p) {
  __shared__ float dg_part[kLanes][kLanes + 1];
  __shared__ float db_part[kLanes][kLanes + 1];
  const int c = threadIdx.x % kLanes, l = threadIdx.x / kLanes;
  const int64_t tile = blockIdx.x * int64_t{kLanes};
  float dg = 0.0f, db = 0.0f;
  if (tile + c < p.cols) {
    for (int64_t r = l; r < p.rows; r += kLanes) {
      const int64_t idx = r * p.cols + tile + c;
      const float dy = load(p.dy, p.dy_dtype, idx);
      dg = dg + dy * recompute_xhat<Kind>(p, r, idx);
      db = db + dy;
    }
  }
  dg_part[l][c] = dg;
  db_part[l][c] = db;
  __syncthreads();
  const int column = l, lane = c;  // second phase: warp = column of the tile, lane = row-lane
  const float dg_sum = warp_fold(dg_part[lane][column]);
  const float db_sum = warp_fold(db_part[lane][column]);
  if (lane == 0 && tile + column < p.cols) {
    store(p.dgamma, p.gamma_dtype, tile + column, dg_sum);
    if (Kind == NormKind::kLayerNorm) store(p.dbeta, p.gamma_dtype, tile + column, db_sum);
  }
}

unsigned row_blocks(int64_t rows) { return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

template <NormKind Kind>
TweStatus launch_fwd(const FwdParams& p, cudaStream_t stream) {
  if (p.rows == 0) return kTweSuccess;
  norm_fwd_kernel<Kind><<<row_blocks(p.rows), kWarpsPerBlock * kLanes, 0, stream>>>(p);
  return check_launch("norm_fwd_kernel");
}

template <NormKind Kind>
TweStatus launch_bwd(const BwdParams& p, cudaStream_t stream) {
  if (p.rows > 0) {
    norm_bwd_dx_kernel<Kind><<<row_blocks(p.rows), kWarpsPerBlock * kLanes, 0, stream>>>(p);
    if (TweStatus st = check_launch("norm_bwd_dx_kernel")) return st;
  }
  if (Kind == NormKind::kL2Norm) return kTweSuccess;
  const unsigned tiles = static_cast<unsigned>((p.cols + kLanes - 1) / kLanes);
  norm_bwd_params_kernel<Kind><<<tiles, kLanes * kLanes, 0, stream>>>(p);
  return check_launch("norm_bwd_params_kernel");
}

}  // namespace

TweStatus norm_fwd(const NormFwdArgs& a) {
  FwdParams p{a.x->data,
              a.gamma ? a.gamma->data : nullptr,
              a.beta ? a.beta->data : nullptr,
              a.y->data,
              a.mu ? static_cast<float*>(a.mu->data) : nullptr,
              static_cast<float*>(a.rstd->data),
              a.x->dtype,
              a.gamma ? a.gamma->dtype : kTweFloat32,
              a.beta ? a.beta->dtype : kTweFloat32,
              a.eps,
              a.zero_centered_gamma,
              a.rows,
              a.cols};
  cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
  switch (a.kind) {
    case NormKind::kLayerNorm: return launch_fwd<NormKind::kLayerNorm>(p, stream);
    case NormKind::kRMSNorm: return launch_fwd<NormKind::kRMSNorm>(p, stream);
    default: return launch_fwd<NormKind::kL2Norm>(p, stream);
  }
}

TweStatus norm_bwd(const NormBwdArgs& a) {
  BwdParams p{a.dy->data,
              a.x->data,
              a.mu ? static_cast<const float*>(a.mu->data) : nullptr,
              static_cast<const float*>(a.rstd->data),
              a.gamma ? a.gamma->data : nullptr,
              a.dx->data,
              a.dgamma ? a.dgamma->data : nullptr,
              a.dbeta ? a.dbeta->data : nullptr,
              a.dy->dtype,
              a.x->dtype,
              a.gamma ? a.gamma->dtype : kTweFloat32,
              a.zero_centered_gamma,
              a.rows,
              a.cols};
  cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
  switch (a.kind) {
    case NormKind::kLayerNorm: return launch_bwd<NormKind::kLayerNorm>(p, stream);
    case NormKind::kRMSNorm: return launch_bwd<NormKind::kRMSNorm>(p, stream);
    default: return launch_bwd<NormKind::kL2Norm>(p, stream);
  }
}

}  // namespace cuda
}  // namespace twe
