// CUDA kernel of the gemm family: a tiled GEMM that decodes operands to fp32 as it loads them
// into shared memory (the "dequantize, then fp32 GEMM" path of NUMERICS.md §8 that serves
// every format on every device) and keeps the spec's block structure: MXFP8 partial sums are
// scaled per 32-long K-block, per-tensor FP8 sums once at the end. Value math is in numerics.h.
#include <cuda_runtime.h>

#include <string>

#include "internal/gemm.h"

namespace twe {
namespace cuda {
namespace {

using numerics::FP8Format;

constexpr int kTile = 16;   // output tile edge (threads per block: kTile x kTile)
constexpr int kTileK = 32;  // K per shared-memory stage; equals the MXFP8 block

struct DeviceOperand {
  const void* data;
  TweDType dtype;
  const void* scale_inv;
  bool k_major;
  int64_t rows;
  int64_t k;
  int64_t scale_stride;
};

__device__ float load_value(const void* data, TweDType dtype, int64_t i) {
  switch (dtype) {
    case kTweFloat32: return static_cast<const float*>(data)[i];
    case kTweBFloat16: return numerics::bf16_to_float(static_cast<const uint16_t*>(data)[i]);
    case kTweFloat16: return numerics::fp16_to_float(static_cast<const uint16_t*>(data)[i]);
    case kTweFloat8E4M3: return numerics::fp8_to_float<FP8Format::kE4M3>(static_cast<const uint8_t*>(data)[i]);
    default: return numerics::fp8_to_float<FP8Format::kE5M2>(static_cast<const uint8_t*>(data)[i]);
  }
}

__device__ float operand_value(const DeviceOperand& op, int64_t r, int64_t kk) {
  return load_value(op.data, op.dtype, op.k_major ? r * op.k + kk : kk * op.rows + r);
}

__device__ float mxfp8_scale(const DeviceOperand& op, int64_t r, int64_t block) {
  const uint8_t* codes = static_cast<const uint8_t*>(op.scale_inv);
  return numerics::e8m0_to_float(op.k_major ? codes[r * op.scale_stride + block] : codes[block * op.scale_stride + r]);
}

__device__ void store_value(void* out, TweDType dtype, int64_t i, float v) {
  switch (dtype) {
    case kTweFloat32: static_cast<float*>(out)[i] = v; break;
    case kTweBFloat16: static_cast<uint16_t*>(out)[i] = numerics::float_to_bf16(v); break;
    default: static_cast<uint16_t*>(out)[i] = numerics::float_to_fp16(v); break;
  }
}

__global__ void gemm_kernel(DeviceOperand a, DeviceOperand b, const void* bias, TweDType bias_dtype, void* out,
                            TweDType out_dtype, int64_t m, int64_t n, int64_t k, TweGemmScaling scaling) {
  __shared__ float a_tile[kTile][kTileK + 1];
  __shared__ float b_tile[kTile][kTileK + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t row = static_cast<int64_t>(blockIdx.y) * kTile + ty;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kTile + tx;
  const bool inside = row < m && col < n;
  float acc = 0.0f;
  float partial = 0.0f;
  for (int64_t k0 = 0; k0 < k; k0 += kTileK) {
    for (int i = ty * kTile + tx; i < kTile * kTileK; i += kTile * kTile) {
      const int r = i / kTileK, c = i % kTileK;
      const int64_t kk = k0 + c;
      const int64_t a_row = static_cast<int64_t>(blockIdx.y) * kTile + r;
      const int64_t b_row = static_cast<int64_t>(blockIdx.x) * kTile + r;
      a_tile[r][c] = (a_row < m && kk < k) ? operand_value(a, a_row, kk) : 0.0f;
      b_tile[r][c] = (b_row < n && kk < k) ? operand_value(b, b_row, kk) : 0.0f;
    }
    __syncthreads();
    for (int c = 0; c < kTileK; ++c) partial = partial + a_tile[ty][c] * b_tile[tx][c];
    __syncthreads();
    if (scaling == kTweGemmMXFP8) {
      const int64_t block = k0 / kMxfp8GemmBlock;
      if (inside) acc = acc + numerics::gemm_scale_partial(partial, mxfp8_scale(a, row, block), mxfp8_scale(b, col, block));
      partial = 0.0f;
    }
  }
  if (!inside) return;
  if (scaling == kTweGemmFP8PerTensor) {
    acc = numerics::gemm_scale_partial(partial, *static_cast<const float*>(a.scale_inv),
                                       *static_cast<const float*>(b.scale_inv));
  } else if (scaling == kTweGemmHighPrecision) {
    acc = partial;
  }
  if (bias) acc = acc + load_value(bias, bias_dtype, col);
  store_value(out, out_dtype, row * n + col, acc);
}

DeviceOperand device_operand(const TweGemmOperand& op, int64_t rows, int64_t k) {
  return DeviceOperand{op.data.data, op.data.dtype, op.scale_inv.data, op.k_major != 0, rows, k,
                       present(&op.scale_inv) ? cols(op.scale_inv) : 0};
}

}  // namespace

TweStatus gemm(const GemmArgs& args) {
  if (args.m == 0 || args.n == 0) return kTweSuccess;
  const dim3 threads(kTile, kTile);
  const dim3 blocks(static_cast<unsigned>(ceil_div(args.n, kTile)), static_cast<unsigned>(ceil_div(args.m, kTile)));
  gemm_kernel<<<blocks, threads, 0, static_cast<cudaStream_t>(args.stream)>>>(
      device_operand(*args.a, args.m, args.k), device_operand(*args.b, args.n, args.k),
      args.bias ? args.bias->data : nullptr, args.bias ? args.bias->dtype : kTweFloat32, args.out->data,
      args.out->dtype, args.m, args.n, args.k, args.scaling);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return fail(kTweCudaError, std::string("gemm kernel launch failed: ") + cudaGetErrorString(err));
  return kTweSuccess;
}

}  // namespace cuda
}  // namespace twe
