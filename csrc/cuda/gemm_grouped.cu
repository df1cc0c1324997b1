// CUDA grouped GEMMs of GroupedLinear (high precision): the G expert GEMMs of one phase in one
// launch, m_splits read on the device (no host sync). Each group's output is its GEMM rounded to
// the output dtype, then the bias added (fl(y + b), NUMERICS.md §11) — the CPU kernel's rule
// (csrc/cpu/gemm.cc grouped_gemm); the fp32 sums follow the tile order (within fp32
// summation-order error of the CPU kernel). Host-emulated by tests/gpu/emulation (run.sh gemm).
#include <cuda_runtime.h>

#include <string>

#include "internal/gemm.h"

namespace twe {
namespace cuda {
namespace {

constexpr int kTile = 16;   // output tile edge (threads per block: kTile x kTile)
constexpr int kTileK = 32;  // K per shared-memory stage

__device__ float load_value(const void* data, TweDType dtype, int64_t i) {
  switch (dtype) {
    case kTweFloat32: return static_cast<const float*>(data)[i];
    case kTweBFloat16: return numerics::bf16_to_float(static_cast<const uint16_t*>(data)[i]);
    default: return numerics::fp16_to_float(static_cast<const uint16_t*>(data)[i]);
  }
}

__device__ void store_value(void* out, TweDType dtype, int64_t i, float v) {
  switch (dtype) {
    case kTweFloat32: static_cast<float*>(out)[i] = v; break;
    case kTweBFloat16: static_cast<uint16_t*>(out)[i] = numerics::float_to_bf16(v); break;
    default: static_cast<uint16_t*>(out)[i] = numerics::float_to_fp16(v); break;
  }
}

/*! Element (r, c) of a stored 2-D operand whose logical row r and contraction index c live at
 *  r * ld_r + c * ld_c elements past `base`. */
struct StridedOperand {
  const void* base;
  TweDType dtype;
  int64_t ld_r;
  int64_t ld_c;
  __device__ float at(int64_t r, int64_t c) const { return load_value(base, dtype, r * ld_r + c * ld_c); }
};

// Ragged rows: grid (N tiles, row tiles of the largest possible group = M, G). Each block finds
// its group's rows from m_splits on the device; tiles past the group's rows return at once.
__global__ void grouped_gemm_kernel(const void* a, const void* b, const void* bias, TweDType in_dtype,
                                    TweDType b_dtype, TweDType bias_dtype, void* out, TweDType out_dtype,
                                    const int32_t* splits, int64_t m, int64_t n, int64_t k, bool b_k_major,
                                    int64_t b_group_bytes) {
  __shared__ float a_tile[kTile][kTileK + 1];
  __shared__ float b_tile[kTile][kTileK + 1];
  const int64_t g = blockIdx.z;
  int64_t begin, end;
  group_rows(splits, g, m, &begin, &end);
  const int64_t tile_row = static_cast<int64_t>(blockIdx.y) * kTile;
  if (begin + tile_row >= end) return;
  const StridedOperand A{a, in_dtype, k, 1};
  const StridedOperand B{static_cast<const char*>(b) + g * b_group_bytes, b_dtype,
                         b_k_major ? k : 1, b_k_major ? 1 : n};
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t row = begin + tile_row + ty;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kTile + tx;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < k; k0 += kTileK) {
    for (int i = ty * kTile + tx; i < kTile * kTileK; i += kTile * kTile) {
      const int r = i / kTileK, c = i % kTileK;
      const int64_t kk = k0 + c, a_row = begin + tile_row + r, b_row = static_cast<int64_t>(blockIdx.x) * kTile + r;
      a_tile[r][c] = (a_row < end && kk < k) ? A.at(a_row, kk) : 0.0f;
      b_tile[r][c] = (b_row < n && kk < k) ? B.at(b_row, kk) : 0.0f;
    }
    __syncthreads();
    for (int c = 0; c < kTileK && k0 + c < k; ++c) acc = acc + a_tile[ty][c] * b_tile[tx][c];
    __syncthreads();
  }
  if (row >= end || col >= n) return;
  store_value(out, out_dtype, row * n + col, acc);
  if (bias) {  // the GEMM output rounded to out's dtype, then fl(y + b): the CPU kernel's bytes
    const float y = load_value(out, out_dtype, row * n + col);
    store_value(out, out_dtype, row * n + col, y + load_value(bias, bias_dtype, g * n + col));
  }
}

// Ragged contraction: grid (K tiles, N tiles, G); out[g] (n, k) sums the group's rows.
__global__ void grouped_wgrad_kernel(const void* a, TweDType a_dtype, bool a_k_major, const void* b, TweDType b_dtype,
                                     void* out, TweDType out_dtype, const int32_t* splits, int64_t m, int64_t n,
                                     int64_t k) {
  __shared__ float a_tile[kTile][kTileK + 1];
  __shared__ float b_tile[kTile][kTileK + 1];
  const int64_t g = blockIdx.z;
  int64_t begin, end;
  group_rows(splits, g, m, &begin, &end);
  // Logical A (n, rows): stored (M, n) read transposed, or (1, M); logical B (k, rows): stored (M, k).
  const StridedOperand A{a, a_dtype, a_k_major ? m : 1, a_k_major ? 1 : n};
  const StridedOperand B{b, b_dtype, 1, k};
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t row = static_cast<int64_t>(blockIdx.y) * kTile + ty;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kTile + tx;
  float acc = 0.0f;
  for (int64_t k0 = begin; k0 < end; k0 += kTileK) {
    for (int i = ty * kTile + tx; i < kTile * kTileK; i += kTile * kTile) {
      const int r = i / kTileK, c = i % kTileK;
      const int64_t kk = k0 + c;
      const int64_t a_row = static_cast<int64_t>(blockIdx.y) * kTile + r;
      const int64_t b_row = static_cast<int64_t>(blockIdx.x) * kTile + r;
      a_tile[r][c] = (a_row < n && kk < end) ? A.at(a_row, kk) : 0.0f;
      b_tile[r][c] = (b_row < k && kk < end) ? B.at(b_row, kk) : 0.0f;
    }
    __syncthreads();
    for (int c = 0; c < kTileK && k0 + c < end; ++c) acc = acc + a_tile[ty][c] * b_tile[tx][c];
    __syncthreads();
  }
  if (row < n && col < k) store_value(out, out_dtype, g * n * k + row * k + col, acc);
}

}  // namespace

TweStatus grouped_gemm(const GroupedGemmArgs& args) {
  cudaStream_t stream = static_cast<cudaStream_t>(args.stream);
  const dim3 threads(kTile, kTile);
  const int32_t* splits = static_cast<const int32_t*>(args.m_splits->data);
  if (!args.ragged_k) {
    // Rows past the groups stay zero; every group row is then written by exactly one block.
    cudaError_t err = cudaMemsetAsync(args.out->data, 0, static_cast<size_t>(args.m * args.n *
                                                                               element_size(args.out->dtype)), stream);
    if (err != cudaSuccess) return fail(kTweCudaError, std::string("cudaMemsetAsync failed: ") + cudaGetErrorString(err));
    if (args.m == 0 || args.n == 0) return kTweSuccess;
    const dim3 blocks(static_cast<unsigned>(ceil_div(args.n, kTile)), static_cast<unsigned>(ceil_div(args.m, kTile)),
                      static_cast<unsigned>(args.groups));
    grouped_gemm_kernel<<<blocks, threads, 0, stream>>>(
        args.a->data, args.b->data, args.bias ? args.bias->data : nullptr, args.a->dtype, args.b->dtype,
        args.bias ? args.bias->dtype : kTweFloat32, args.out->data, args.out->dtype, splits, args.m, args.n, args.k,
        args.b_k_major, args.n * args.k * element_size(args.b->dtype));
  } else {
    const dim3 blocks(static_cast<unsigned>(ceil_div(args.k, kTile)), static_cast<unsigned>(ceil_div(args.n, kTile)),
                      static_cast<unsigned>(args.groups));
    grouped_wgrad_kernel<<<blocks, threads, 0, stream>>>(args.a->data, args.a->dtype, args.a_k_major, args.b->data,
                                                         args.b->dtype, args.out->data, args.out->dtype, splits,
                                                         args.m, args.n, args.k);
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return fail(kTweCudaError, std::string("grouped gemm kernel launch failed: ") + cudaGetErrorString(err));
  }
  return kTweSuccess;
}

}  // namespace cuda
}  // namespace twe
