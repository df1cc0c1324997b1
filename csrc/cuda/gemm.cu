// CUDA entry of the gemm family: asks the dispatcher (csrc/abi/gemm_plan.cc) for the plan of
// this GEMM on the current device and runs it — cuBLASLt (csrc/cuda/gemm_cublaslt.cu), or the
// tiled kernel below when cuBLASLt cannot be loaded or K == 0. The tiled kernel decodes
// operands to fp32 as it loads them into shared memory and keeps the spec's block structure:
// block-format partial sums are scaled per K-block, per-tensor FP8 and NVFP4 global factors
// applied once at the end. Value math is in numerics.h and internal/gemm.h.
#include <cuda_runtime.h>

#include <string>

#include "internal/gemm.h"

namespace twe {
namespace cuda {
namespace {

using numerics::FP8Format;

constexpr int kTile = 16;   // output tile edge (threads per block: kTile x kTile)
constexpr int kTileK = 32;  // K per shared-memory stage

struct DeviceOperand {
  TweGemmOperand op;
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

__device__ float operand_value(const DeviceOperand& d, TweGemmScaling scaling, int64_t r, int64_t kk) {
  if (scaling == kTweGemmNVFP4) {  // K-major packed E2M1, even K index in the low nibble
    const uint8_t byte = static_cast<const uint8_t*>(d.op.data.data)[r * (d.k / 2) + kk / 2];
    return numerics::e2m1_to_float(static_cast<uint8_t>((kk & 1) ? byte >> 4 : byte & 0xF));
  }
  return load_value(d.op.data.data, d.op.data.dtype, d.op.k_major ? r * d.k + kk : kk * d.rows + r);
}

__device__ void store_value(void* out, TweDType dtype, int64_t i, float v) {
  switch (dtype) {
    case kTweFloat32: static_cast<float*>(out)[i] = v; break;
    case kTweBFloat16: static_cast<uint16_t*>(out)[i] = numerics::float_to_bf16(v); break;
    default: static_cast<uint16_t*>(out)[i] = numerics::float_to_fp16(v); break;
  }
}

__global__ void gemm_kernel(DeviceOperand a, DeviceOperand b, const void* bias, TweDType bias_dtype, void* out,
                            TweDType out_dtype, int64_t m, int64_t n, int64_t k, TweGemmScaling scaling,
                            int64_t block) {
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
      a_tile[r][c] = (a_row < m && kk < k) ? operand_value(a, scaling, a_row, kk) : 0.0f;
      b_tile[r][c] = (b_row < n && kk < k) ? operand_value(b, scaling, b_row, kk) : 0.0f;
    }
    __syncthreads();
    for (int c = 0; c < kTileK && k0 + c < k; ++c) {
      partial = partial + a_tile[ty][c] * b_tile[tx][c];
      const int64_t kk = k0 + c;
      if (block > 0 && ((kk + 1) % block == 0 || kk + 1 == k)) {  // end of a K-block
        if (inside) {
          const int64_t j = kk / block;
          acc = acc + numerics::gemm_scale_partial(partial, gemm_block_scale(scaling, a.op, a.scale_stride, row, j),
                                                   gemm_block_scale(scaling, b.op, b.scale_stride, col, j));
        }
        partial = 0.0f;
      }
    }
    __syncthreads();
  }
  if (!inside) return;
  if (block == 0) acc = partial;
  if (scaling == kTweGemmFP8PerTensor) {
    acc = numerics::gemm_scale_partial(acc, *static_cast<const float*>(a.op.scale_inv.data),
                                       *static_cast<const float*>(b.op.scale_inv.data));
  } else if (scaling == kTweGemmNVFP4) {
    acc = numerics::gemm_scale_partial(acc, numerics::nvfp4_global_decode_scale(*static_cast<const float*>(a.op.amax.data)),
                                       numerics::nvfp4_global_decode_scale(*static_cast<const float*>(b.op.amax.data)));
  }
  if (bias) acc = acc + load_value(bias, bias_dtype, col);
  store_value(out, out_dtype, row * n + col, acc);
}

DeviceOperand device_operand(const TweGemmOperand& op, int64_t rows, int64_t k) {
  return DeviceOperand{op, rows, k, present(&op.scale_inv) ? cols(op.scale_inv) : 0};
}

}  // namespace

TweStatus gemm_tiled(const GemmArgs& args) {
  if (args.m == 0 || args.n == 0) return kTweSuccess;
  const dim3 threads(kTile, kTile);
  const dim3 blocks(static_cast<unsigned>(ceil_div(args.n, kTile)), static_cast<unsigned>(ceil_div(args.m, kTile)));
  gemm_kernel<<<blocks, threads, 0, static_cast<cudaStream_t>(args.stream)>>>(
      device_operand(*args.a, args.m, args.k), device_operand(*args.b, args.n, args.k),
      args.bias ? args.bias->data : nullptr, args.bias ? args.bias->dtype : kTweFloat32, args.out->data,
      args.out->dtype, args.m, args.n, args.k, args.scaling, gemm_block_length(args.scaling));
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return fail(kTweCudaError, std::string("gemm kernel launch failed: ") + cudaGetErrorString(err));
  return kTweSuccess;
}

namespace {

}  // namespace

TweStatus gemm_cublaslt(const GemmArgs& args, const TweGemmPlan& plan, const TweGemmPlanQuery& query, int device);

/*! The dispatcher's query for a validated call on the current device. */
TweStatus plan_query(const GemmArgs& args, TweGemmPlanQuery* q, int* device) {
  cudaError_t err = cudaGetDevice(device);
  int major = 0, minor = 0;
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, *device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, *device);
  if (err != cudaSuccess) return fail(kTweCudaError, std::string("gemm device query failed: ") + cudaGetErrorString(err));
  *q = TweGemmPlanQuery{};
  q->scaling = args.scaling;
  q->a_dtype = args.a->data.dtype;
  q->b_dtype = args.b->data.dtype;
  q->out_dtype = args.out->dtype;
  q->has_bias = args.bias != nullptr;
  q->bias_dtype = args.bias ? args.bias->dtype : kTweFloat32;
  q->a_k_major = args.a->k_major;
  q->b_k_major = args.b->k_major;
  q->a_block_2d = args.scaling == kTweGemmFP8Block ? args.a->block_2d : 0;
  q->b_block_2d = args.scaling == kTweGemmFP8Block ? args.b->block_2d : 0;
  q->m = args.m;
  q->n = args.n;
  q->k = args.k;
  q->a_scale_bytes = present(&args.a->scale_inv) ? numel(args.a->scale_inv) * element_size(args.a->scale_inv.dtype) : 0;
  q->b_scale_bytes = present(&args.b->scale_inv) ? numel(args.b->scale_inv) * element_size(args.b->scale_inv.dtype) : 0;
  q->device = kTweCUDA;
  q->sm = major * 10 + minor;
  q->cublaslt_version = static_cast<int32_t>(cublaslt_version());
  return kTweSuccess;
}

TweStatus gemm(const GemmArgs& args) {
  TweGemmPlanQuery query;
  int device = 0;
  TweStatus st = plan_query(args, &query, &device);
  if (st) return st;
  TweGemmPlan plan;
  if ((st = gemm_plan(query, &plan))) return st;
  switch (plan.path) {
    case kTweGemmPathNone: return kTweSuccess;
    case kTweGemmPathCublasLt:
    case kTweGemmPathDequantCublasLt: return gemm_cublaslt(args, plan, query, device);
    default: return gemm_tiled(args);
  }
}

}  // namespace cuda
}  // namespace twe
