// Staging and epilogue kernels of the cuBLASLt GEMM path (csrc/cuda/gemm_cublaslt.cu): the
// dequantize-into-workspace fallback, the swizzle of block scales, the NVFP4 device alpha and
// the bias / output-rounding epilogue. No cuBLAS here, so tests/gpu/emulation checks them on
// the host. Value math is in numerics.h and internal/gemm.h.
#include <cuda_runtime.h>

#include <string>

#include "internal/gemm.h"
#include "internal/gemm_swizzle.h"

namespace twe {
namespace cuda {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t count) {
  const int64_t blocks = ceil_div(count, kThreads);
  return static_cast<unsigned>(blocks < 65535 * 8 ? blocks : 65535 * 8);
}

/*! Decoded operand x̂ in the stored element order (K-major (rows, K) or K-minor (K, rows)). */
template <typename Out>
__global__ void dequantize_operand_kernel(TweGemmOperand op, TweGemmScaling scaling, int64_t rows, int64_t k,
                                          int64_t scale_stride, Out* out) {
  const int64_t count = rows * k;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = op.k_major ? i / k : i % rows;
    const int64_t kk = op.k_major ? i % k : i / rows;
    out[i] = FromFloat<Out>::apply(gemm_decoded_value(scaling, op, rows, k, scale_stride, r, kk));
  }
}

/*! alpha = fl(S_dec_a · S_dec_b) (NVFP4 global decode scales), beta = 0, in device memory. */
__global__ void nvfp4_alpha_kernel(const float* amax_a, const float* amax_b, float* scalars) {
  scalars[0] = numerics::gemm_scale_partial(1.0f, numerics::nvfp4_global_decode_scale(*amax_a),
                                            numerics::nvfp4_global_decode_scale(*amax_b));
  scalars[1] = 0.0f;
}

/*! out (m, n) = RNE(fl(acc (+ bias))), acc fp32 (m, n) (may alias out when out is fp32). */
template <typename Out, typename Bias>
__global__ void epilogue_kernel(const float* acc, const Bias* bias, int64_t m, int64_t n, Out* out) {
  const int64_t count = m * n;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = acc[i];
    if (bias) v = v + to_float(bias[i % n]);
    out[i] = FromFloat<Out>::apply(v);
  }
}

TweStatus check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return fail(kTweCudaError, std::string(what) + " launch failed: " + cudaGetErrorString(err));
  return kTweSuccess;
}

}  // namespace

TweStatus launch_gemm_epilogue(const GemmArgs& args, const float* acc) {
  cudaStream_t stream = static_cast<cudaStream_t>(args.stream);
  const int64_t count = args.m * args.n;
  return dispatch_high_precision(args.out->dtype, [&](auto out_tag) {
    using Out = decltype(out_tag);
    Out* out = static_cast<Out*>(args.out->data);
    if (!args.bias) {
      epilogue_kernel<Out, float><<<grid_for(count), kThreads, 0, stream>>>(acc, nullptr, args.m, args.n, out);
      return check_launch("gemm epilogue");
    }
    return dispatch_high_precision(args.bias->dtype, [&](auto bias_tag) {
      using Bias = decltype(bias_tag);
      epilogue_kernel<Out, Bias><<<grid_for(count), kThreads, 0, stream>>>(
          acc, static_cast<const Bias*>(args.bias->data), args.m, args.n, out);
      return check_launch("gemm epilogue");
    });
  });
}

TweStatus launch_nvfp4_alpha(const float* amax_a, const float* amax_b, float* scalars, void* stream) {
  nvfp4_alpha_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(amax_a, amax_b, scalars);
  return check_launch("nvfp4 alpha");
}

TweStatus stage_operand(const TweGemmOperand& op, TweGemmScaling scaling, TweGemmStaging staging, int64_t rows,
                        int64_t k, uint8_t* dst, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t stride = present(&op.scale_inv) ? cols(op.scale_inv) : 0;
  switch (staging) {
    case kTweGemmStageSwizzle: {
      // Compact scales: (rows_p, blocks_p) for K-major operands, (blocks_p, rows_p) for
      // K-minor (MXFP8 columnwise) ones.
      const int64_t d0 = twe::rows(op.scale_inv), d1 = cols(op.scale_inv);
      const uint8_t* scales = static_cast<const uint8_t*>(op.scale_inv.data);
      return op.k_major ? launch_swizzle(scales, dst, d0, d1, false, false, stream)
                        : launch_swizzle(scales, dst, d1, d0, true, false, stream);
    }
    case kTweGemmStageBF16:
      dequantize_operand_kernel<BFloat16><<<grid_for(rows * k), kThreads, 0, s>>>(op, scaling, rows, k, stride,
                                                                                  reinterpret_cast<BFloat16*>(dst));
      return check_launch("gemm dequantize");
    case kTweGemmStageFP32:
      dequantize_operand_kernel<float><<<grid_for(rows * k), kThreads, 0, s>>>(op, scaling, rows, k, stride,
                                                                               reinterpret_cast<float*>(dst));
      return check_launch("gemm dequantize");
    default: return kTweSuccess;
  }
}

}  // namespace cuda
}  // namespace twe
