// CUDA scale swizzle: one thread per scale; the index math is in internal/gemm_swizzle.h,
// shared with the host function.
#include <cuda_runtime.h>

#include <string>

#include "internal/gemm_swizzle.h"

namespace twe {
namespace cuda {
namespace {

__global__ void swizzle_kernel(const uint8_t* in, uint8_t* out, int64_t rows, int64_t blocks, bool transposed,
                               bool inverse) {
  const int64_t count = rows * blocks;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    swizzle_scale_element(in, out, i, rows, blocks, transposed, inverse);
  }
}

}  // namespace

TweStatus launch_swizzle(const uint8_t* in, uint8_t* out, int64_t rows, int64_t blocks, bool transposed, bool inverse,
                         void* stream) {
  const int64_t count = rows * blocks;
  if (count == 0) return kTweSuccess;
  constexpr int kThreads = 256;
  const unsigned grid = static_cast<unsigned>(ceil_div(count, kThreads) < 65535 ? ceil_div(count, kThreads) : 65535);
  swizzle_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(in, out, rows, blocks, transposed, inverse);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return fail(kTweCudaError, std::string("swizzle launch failed: ") + cudaGetErrorString(err));
  return kTweSuccess;
}

TweStatus gemm_swizzle_scales(const SwizzleArgs& args) {
  return launch_swizzle(static_cast<const uint8_t*>(args.in->data), static_cast<uint8_t*>(args.out->data), args.rows,
                        args.blocks, args.transposed, args.inverse, args.stream);
}

}  // namespace cuda
}  // namespace twe
