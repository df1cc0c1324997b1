// CUDA kernels of the quantize family: loops, tiling and memory movement only. Every value
// (amax, scale, E8M0 exponent, element cast, decode) comes from the numerics.h functions the
// CPU kernels call, so both produce identical bytes (compiled with --fmad=false, IEEE division
// and subnormals: no fast-math flags).
//
// Every op runs asynchronously on the caller's stream (the current device must be the views'
// device) and never synchronises with the host: a per-tensor amax is reduced on the device and
// read back from device memory by the next kernel, so the ops can be captured into CUDA graphs
// (PyTorch) and XLA command buffers.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "internal/quantize.h"

namespace twe {
namespace cuda {
namespace {

using numerics::FP8Format;

// ---- launch plumbing ----------------------------------------------------------------------

TweStatus cuda_check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return kTweSuccess;
  return fail(kTweCudaError, std::string("CUDA error in ") + what + ": " + cudaGetErrorName(err) + " (" +
                                 cudaGetErrorString(err) + ")");
}

/*! Status of the launch just made (launch-configuration errors surface here). */
TweStatus check_launch(const char* kernel) { return cuda_check(cudaGetLastError(), kernel); }

cudaStream_t stream_of(const void* stream) { return static_cast<cudaStream_t>(const_cast<void*>(stream)); }

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <typename T>
T* data_of(const TweTensorView& v) {
  return static_cast<T*>(v.data);
}

template <typename T>
T* data_if_present(const TweTensorView& v) {
  return present(&v) ? static_cast<T*>(v.data) : nullptr;
}

float format_max(TweFP8Format f) { return f == kTweE5M2 ? numerics::kE5M2Max : numerics::kE4M3Max; }

/*! Calls fn(std::integral_constant<FP8Format, F>{}) for the runtime format. */
template <typename Fn>
TweStatus dispatch_format(bool e5m2, Fn&& fn) {
  if (e5m2) return fn(std::integral_constant<FP8Format, FP8Format::kE5M2>{});
  return fn(std::integral_constant<FP8Format, FP8Format::kE4M3>{});
}

// ---- device helpers -----------------------------------------------------------------------

__host__ __device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/*! Elements of T in one 16-byte vector load. */
template <typename T>
struct VecWidth {
  static constexpr int value = static_cast<int>(16 / sizeof(T));
};

/*! Loads n_valid (<= VecWidth) elements from p as fp32; one 16-byte load when allowed.
 *  Elements past n_valid read as 0 (they never reach an output). */
template <typename T>
__device__ __forceinline__ void load_chunk(const T* p, int n_valid, bool vector_ok, float (&out)[VecWidth<T>::value]) {
  constexpr int kV = VecWidth<T>::value;
  if (vector_ok && n_valid == kV) {
    union {
      uint4 raw;
      T v[kV];
    } u;
    u.raw = __ldg(reinterpret_cast<const uint4*>(p));
#pragma unroll
    for (int i = 0; i < kV; ++i) out[i] = to_float(u.v[i]);
  } else {
#pragma unroll
    for (int i = 0; i < kV; ++i) out[i] = i < n_valid ? to_float(p[i]) : 0.0f;
  }
}

/*! Stores n_valid (<= N, N in {4, 8}) FP8 codes at p; one 4- or 8-byte store when allowed. */
template <int N>
__device__ __forceinline__ void store_codes(uint8_t* p, const uint8_t (&q)[N], int n_valid, bool vector_ok) {
  static_assert(N == 4 || N == 8, "4 or 8 codes per store");
  if (vector_ok && n_valid == N) {
    union {
      uint8_t b[N];
      uint32_t w[N / 4];
    } u;
#pragma unroll
    for (int i = 0; i < N; ++i) u.b[i] = q[i];
    if constexpr (N == 8) *reinterpret_cast<uint2*>(p) = make_uint2(u.w[0], u.w[1]);
    else *reinterpret_cast<uint32_t*>(p) = u.w[0];
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i)
      if (i < n_valid) p[i] = q[i];
  }
}

/*! NaN-skipping amax of the whole block (valid in thread 0). All threads must call it. */
__device__ __forceinline__ float block_amax(float a) {
  __shared__ float warp_amax[32];
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) a = numerics::amax_update(a, __shfl_xor_sync(0xFFFFFFFFu, a, offset));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_amax[warp] = a;
  __syncthreads();
  if (warp == 0) {
    a = lane < static_cast<int>(blockDim.x / 32) ? warp_amax[lane] : 0.0f;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) a = numerics::amax_update(a, __shfl_xor_sync(0xFFFFFFFFu, a, offset));
  }
  return a;
}

/*! Raises *amax (which must start at +0) to the amax `a`, by atomicMax on amax keys (the
 *  order of the keys is the order of the amaxes). */
__device__ __forceinline__ void atomic_amax(float* amax, float a) {
  const uint32_t key = numerics::amax_key(a);
  if (key != 0u) atomicMax(reinterpret_cast<unsigned int*>(amax), key);
}

/*! The per-tensor encode scale: read from `src` (delayed), or computed from the amax in `src`
 *  (current scaling, NUMERICS.md §2 with inf_value = FLT_MAX). */
__device__ __forceinline__ float per_tensor_scale(const float* src, bool src_is_amax, float fmt_max, float epsilon,
                                                  bool pow2) {
  const float v = *src;
  return src_is_amax ? numerics::scale_from_amax(v, fmt_max, epsilon, pow2, numerics::kFloatMax) : v;
}

// ---- per-tensor FP8 -----------------------------------------------------------------------

constexpr int kAmaxThreads = 256;
constexpr int kAmaxUnroll = 4;
constexpr int64_t kAmaxMaxBlocks = 2048;

/*! Raises *amax (pre-zeroed) to the NaN-skipping amax of x[0, n). */
template <typename T>
__global__ void __launch_bounds__(kAmaxThreads) amax_kernel(const T* __restrict__ x, int64_t n, bool vector_ok,
                                                            float* amax) {
  constexpr int kV = VecWidth<T>::value;
  const int64_t chunks = (n + kV - 1) / kV;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kAmaxThreads * kAmaxUnroll;
  float a = 0.0f;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kAmaxThreads * kAmaxUnroll; base < chunks; base += step) {
    float v[kAmaxUnroll][kV];
#pragma unroll
    for (int u = 0; u < kAmaxUnroll; ++u) {
      const int64_t c = base + u * kAmaxThreads + threadIdx.x;
      const int n_valid = c < chunks ? static_cast<int>(min64(kV, n - c * kV)) : 0;
      if (n_valid > 0) {
        load_chunk(x + c * kV, n_valid, vector_ok, v[u]);
      } else {
        for (int i = 0; i < kV; ++i) v[u][i] = 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < kAmaxUnroll; ++u)
#pragma unroll
      for (int i = 0; i < kV; ++i) a = numerics::amax_update(a, v[u][i]);
  }
  a = block_amax(a);
  if (threadIdx.x == 0) atomic_amax(amax, a);
}

constexpr int kPtTile = 64;  // 64x64 element tiles: rowwise stores + a shared-memory transpose
constexpr int kPtThreads = 256;

struct PerTensorCast {
  int64_t rows;
  int64_t cols;
  uint8_t* rowwise;        // (R, K) or null
  uint8_t* columnwise;     // (K, R) or null
  const float* scale_src;  // the scale (delayed) or the amax (current)
  bool src_is_amax;
  float epsilon;
  bool pow2;
  float* amax_accum;  // delayed: raised to the input amax (pre-zeroed); current: null
  bool load_vec;      // x 16-byte aligned and K a multiple of the vector width
  bool row_vec;       // rowwise 8-byte aligned and K a multiple of the vector width
  bool col_vec;       // columnwise 4-byte aligned and R % 4 == 0
};

/*! q = RNE_sat(fl(x · s)) for one 64x64 tile, written rowwise (R, K) and/or transposed (K, R)
 *  in the same pass: the codes go through shared memory so both stores are coalesced. */
template <FP8Format F, typename T>
__global__ void __launch_bounds__(kPtThreads) per_tensor_cast_kernel(const T* __restrict__ x, PerTensorCast a) {
  constexpr int kV = VecWidth<T>::value;
  constexpr int kChunksPerRow = kPtTile / kV;
  constexpr int kIters = kPtTile * kChunksPerRow / kPtThreads;
  constexpr int kWordsPerRow = kPtTile / 4 + 1;  // +1 word of padding against bank conflicts
  __shared__ uint32_t tile[kPtTile][kWordsPerRow];

  const int64_t R = a.rows, K = a.cols;
  const int64_t tiles_k = (K + kPtTile - 1) / kPtTile;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) / tiles_k * kPtTile;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) % tiles_k * kPtTile;
  const float scale = per_tensor_scale(a.scale_src, a.src_is_amax, numerics::FP8Traits<F>::kMax, a.epsilon, a.pow2);

  float v[kIters][kV];
  int n_valid[kIters];
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int c = it * kPtThreads + threadIdx.x;
    const int64_t r = r0 + c / kChunksPerRow, k = k0 + c % kChunksPerRow * kV;
    n_valid[it] = r < R ? static_cast<int>(min64(kV, K - k)) : 0;
    if (n_valid[it] > 0) {
      load_chunk(x + r * K + k, n_valid[it], a.load_vec, v[it]);
    } else {
      for (int i = 0; i < kV; ++i) v[it][i] = 0.0f;
    }
  }

  float amax = 0.0f;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int c = it * kPtThreads + threadIdx.x;
    const int rr = c / kChunksPerRow, kk = c % kChunksPerRow * kV;
    uint8_t q[kV];
#pragma unroll
    for (int i = 0; i < kV; ++i) {
      amax = numerics::amax_update(amax, v[it][i]);
      q[i] = numerics::float_to_fp8<F>(v[it][i] * scale);
    }
    if (a.rowwise && n_valid[it] > 0) store_codes(a.rowwise + (r0 + rr) * K + k0 + kk, q, n_valid[it], a.row_vec);
    if (a.columnwise) {
#pragma unroll
      for (int w = 0; w < kV / 4; ++w) {
        tile[rr][kk / 4 + w] = static_cast<uint32_t>(q[4 * w]) | static_cast<uint32_t>(q[4 * w + 1]) << 8 |
                               static_cast<uint32_t>(q[4 * w + 2]) << 16 | static_cast<uint32_t>(q[4 * w + 3]) << 24;
      }
    }
  }
  if (a.amax_accum) {
    amax = block_amax(amax);
    if (threadIdx.x == 0) atomic_amax(a.amax_accum, amax);
  }
  if (!a.columnwise) return;
  __syncthreads();

  // Columnwise: output row k holds the tile's column k; each thread writes 4 consecutive rows r.
  const uint8_t* tile_bytes = reinterpret_cast<const uint8_t*>(tile);
  constexpr int kRowBytes = kWordsPerRow * 4;
  constexpr int kQuadsPerRow = kPtTile / 4;
#pragma unroll
  for (int it = 0; it < kPtTile * kQuadsPerRow / kPtThreads; ++it) {
    const int c = it * kPtThreads + threadIdx.x;
    const int kk = c / kQuadsPerRow, rr = c % kQuadsPerRow * 4;
    const int64_t k = k0 + kk, r = r0 + rr;
    if (k >= K || r >= R) continue;
    uint8_t q[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) q[j] = tile_bytes[(rr + j) * kRowBytes + kk];
    store_codes(a.columnwise + k * R + r, q, static_cast<int>(min64(4, R - r)), a.col_vec);
  }
}

/*! Writes scale_inv = 1/s to each present output and, for current scaling, the amax output
 *  when it is not the buffer the amax was reduced into. Runs after the cast kernel. */
__global__ void per_tensor_scalars_kernel(const float* scale_src, bool src_is_amax, float fmt_max, float epsilon,
                                          bool pow2, float* rowwise_scale_inv, float* columnwise_scale_inv,
                                          float* amax_out) {
  const float src = *scale_src;
  const float scale = per_tensor_scale(scale_src, src_is_amax, fmt_max, epsilon, pow2);
  const float scale_inv = 1.0f / scale;
  if (rowwise_scale_inv) *rowwise_scale_inv = scale_inv;
  if (columnwise_scale_inv) *columnwise_scale_inv = scale_inv;
  if (amax_out) *amax_out = src;
}

template <FP8Format F, typename T>
TweStatus launch_per_tensor_cast(const T* x, const PerTensorCast& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return kTweSuccess;
  const int64_t tiles = (p.rows + kPtTile - 1) / kPtTile * ((p.cols + kPtTile - 1) / kPtTile);
  per_tensor_cast_kernel<F, T><<<static_cast<unsigned>(tiles), kPtThreads, 0, stream>>>(x, p);
  return check_launch("per_tensor_cast_kernel");
}

/*! The cast parameters shared by current and delayed scaling. */
template <typename T>
PerTensorCast per_tensor_cast_params(const QuantizeArgs& a, const T* x) {
  constexpr int kV = VecWidth<T>::value;
  PerTensorCast p{};
  p.rows = a.rows;
  p.cols = a.cols;
  p.rowwise = data_if_present<uint8_t>(a.output->rowwise_data);
  p.columnwise = data_if_present<uint8_t>(a.output->columnwise_data);
  p.epsilon = a.params.amax_epsilon;
  p.pow2 = a.params.force_pow2_scales != 0;
  p.load_vec = aligned(x, 16) && a.cols % kV == 0;
  p.row_vec = aligned(p.rowwise, 8) && a.cols % kV == 0;
  p.col_vec = aligned(p.columnwise, 4) && a.rows % 4 == 0;
  return p;
}

// ---- MXFP8 --------------------------------------------------------------------------------

constexpr int kMxRows = 32;  // one columnwise block (or 2D tile) high
constexpr int kMxCols = 128;
constexpr int kMxThreads = 128;
constexpr int kMxGroups = kMxThreads / 32;     // row groups in the columnwise pass
constexpr int kMxGroupRows = kMxRows / kMxGroups;

struct MxArgs {
  int64_t rows;
  int64_t cols;
  uint8_t* row_data;
  uint8_t* row_scales;
  int64_t row_stride;
  uint8_t* col_data;
  uint8_t* col_scales;
  int64_t col_stride;
  bool two_d;
  bool load_vec;   // x 16-byte aligned
  bool store_vec;  // data outputs 8-byte aligned
};

/*! One 32x128 tile: rowwise 1x32 blocks straight from registers, then the fp32 tile in shared
 *  memory gives the 32x1 columnwise blocks (or the 32x32 2D tiles) in the same pass. */
template <FP8Format F, typename T>
__global__ void __launch_bounds__(kMxThreads) mxfp8_kernel(const T* __restrict__ x, MxArgs a) {
  constexpr int kV = VecWidth<T>::value;
  constexpr int kChunksPerRow = kMxCols / kV;
  constexpr int kIters = kMxRows * kChunksPerRow / kMxThreads;
  constexpr int kLanesPerBlock = 32 / kV;  // lanes holding one 1x32 rowwise block
  __shared__ __align__(16) float tile[kMxRows][kMxCols];
  __shared__ float partial_amax[kMxGroups][kMxCols];

  const int64_t K = a.cols;
  const int64_t tiles_k = (K + kMxCols - 1) / kMxCols;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) / tiles_k * kMxRows;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) % tiles_k * kMxCols;
  const bool rowwise_1d = a.row_data != nullptr && !a.two_d;
  const bool use_tile = a.col_data != nullptr || a.two_d;

  // K is a multiple of 32, so a chunk (and a 1x32 block) is entirely inside or outside.
  float v[kIters][kV];
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int c = it * kMxThreads + threadIdx.x;
    const int64_t r = r0 + c / kChunksPerRow, k = k0 + c % kChunksPerRow * kV;
    if (k < K) {
      load_chunk(x + r * K + k, kV, a.load_vec, v[it]);
    } else {
      for (int i = 0; i < kV; ++i) v[it][i] = 0.0f;
    }
  }

#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int c = it * kMxThreads + threadIdx.x;
    const int rr = c / kChunksPerRow, kk = c % kChunksPerRow * kV;
    const int64_t r = r0 + rr, k = k0 + kk;
    if (rowwise_1d) {
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < kV; ++i) amax = numerics::amax_update(amax, v[it][i]);
#pragma unroll
      for (int offset = 1; offset < kLanesPerBlock; offset <<= 1)
        amax = numerics::amax_update(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
      if (k < K) {
        const uint8_t e = numerics::mxfp8_block_exponent<F>(amax);
        const float m = numerics::e8m0_encode_multiplier(e);
        uint8_t q[kV];
#pragma unroll
        for (int i = 0; i < kV; ++i) q[i] = numerics::float_to_fp8<F>(v[it][i] * m);
        store_codes(a.row_data + r * K + k, q, kV, a.store_vec);
        if (threadIdx.x % kLanesPerBlock == 0) a.row_scales[r * a.row_stride + k / 32] = e;
      }
    }
    if (use_tile) {
#pragma unroll
      for (int i = 0; i < kV; i += 4)
        *reinterpret_cast<float4*>(&tile[rr][kk + i]) = make_float4(v[it][i], v[it][i + 1], v[it][i + 2], v[it][i + 3]);
    }
  }
  if (!use_tile) return;
  __syncthreads();

  // Columnwise pass: warp g covers rows 8g..8g+7, lane l columns 4l..4l+3 of the tile.
  const int group = threadIdx.x / 32;
  const int kk = threadIdx.x % 32 * 4;
  const int64_t k = k0 + kk;
  float amax[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int j = 0; j < kMxGroupRows; ++j) {
    const float4 t = *reinterpret_cast<const float4*>(&tile[group * kMxGroupRows + j][kk]);
    amax[0] = numerics::amax_update(amax[0], t.x);
    amax[1] = numerics::amax_update(amax[1], t.y);
    amax[2] = numerics::amax_update(amax[2], t.z);
    amax[3] = numerics::amax_update(amax[3], t.w);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) partial_amax[group][kk + i] = amax[i];
  __syncthreads();
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    amax[i] = partial_amax[0][kk + i];
#pragma unroll
    for (int g = 1; g < kMxGroups; ++g) amax[i] = numerics::amax_update(amax[i], partial_amax[g][kk + i]);
  }
  if (a.two_d) {
    // A 32x32 tile spans 8 lanes (32 columns).
    float t = numerics::amax_update(numerics::amax_update(amax[0], amax[1]), numerics::amax_update(amax[2], amax[3]));
#pragma unroll
    for (int offset = 1; offset < 8; offset <<= 1) t = numerics::amax_update(t, __shfl_xor_sync(0xFFFFFFFFu, t, offset));
#pragma unroll
    for (int i = 0; i < 4; ++i) amax[i] = t;
  }
  if (k >= K) return;
  uint8_t e[4];
  float m[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    e[i] = numerics::mxfp8_block_exponent<F>(amax[i]);
    m[i] = numerics::e8m0_encode_multiplier(e[i]);
  }
  if (group == 0 && a.col_scales) {
#pragma unroll
    for (int i = 0; i < 4; ++i) a.col_scales[r0 / kMxRows * a.col_stride + k + i] = e[i];
  }
  if (a.two_d && a.row_scales && threadIdx.x % 8 == 0) {
    for (int j = 0; j < kMxGroupRows; ++j) a.row_scales[(r0 + group * kMxGroupRows + j) * a.row_stride + k / 32] = e[0];
  }
  uint8_t* const row_out = a.two_d ? a.row_data : nullptr;
#pragma unroll
  for (int j = 0; j < kMxGroupRows; ++j) {
    const int rr = group * kMxGroupRows + j;
    const float4 t = *reinterpret_cast<const float4*>(&tile[rr][kk]);
    const uint8_t q[4] = {numerics::float_to_fp8<F>(t.x * m[0]), numerics::float_to_fp8<F>(t.y * m[1]),
                          numerics::float_to_fp8<F>(t.z * m[2]), numerics::float_to_fp8<F>(t.w * m[3])};
    const int64_t offset = (r0 + rr) * K + k;
    if (a.col_data) store_codes(a.col_data + offset, q, 4, a.store_vec);
    if (row_out) store_codes(row_out + offset, q, 4, a.store_vec);
  }
}

/*! Zeroes the padding of a (rows_total, cols_total) scale tensor whose live part is
 *  (rows_valid, cols_valid): a 2-D memset beside the live columns, a 1-D one below the rows. */
TweStatus zero_scale_padding(uint8_t* scales, int64_t rows_total, int64_t cols_total, int64_t rows_valid,
                             int64_t cols_valid, cudaStream_t stream) {
  if (cols_valid < cols_total && rows_valid > 0) {
    const cudaError_t err = cudaMemset2DAsync(scales + cols_valid, static_cast<size_t>(cols_total), 0,
                                              static_cast<size_t>(cols_total - cols_valid),
                                              static_cast<size_t>(rows_valid), stream);
    if (err != cudaSuccess) return cuda_check(err, "cudaMemset2DAsync (MXFP8 scale padding)");
  }
  if (rows_valid < rows_total) {
    const cudaError_t err = cudaMemsetAsync(scales + rows_valid * cols_total, 0,
                                            static_cast<size_t>((rows_total - rows_valid) * cols_total), stream);
    if (err != cudaSuccess) return cuda_check(err, "cudaMemsetAsync (MXFP8 scale padding)");
  }
  return kTweSuccess;
}

int64_t last_dim(const TweTensorView& v) { return v.shape[v.ndim - 1]; }

// ---- dequantize ---------------------------------------------------------------------------

constexpr int kDqThreads = 256;
constexpr int64_t kDqMaxBlocks = 4096;

/*! Loads codes q[i, i+4) (fewer at the end) into c; one 4-byte load when allowed. */
__device__ __forceinline__ int load_codes4(const uint8_t* q, int64_t i, int64_t n, bool vector_ok, uint8_t (&c)[4]) {
  const int n_valid = static_cast<int>(min64(4, n - i));
  if (vector_ok && n_valid == 4) {
    const uint32_t w = __ldg(reinterpret_cast<const unsigned int*>(q + i));
#pragma unroll
    for (int j = 0; j < 4; ++j) c[j] = static_cast<uint8_t>(w >> (8 * j));
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) c[j] = j < n_valid ? q[i + j] : 0;
  }
  return n_valid;
}

/*! x̂ = fl(q · s_inv) for a rowwise (R, K) copy, 4 elements per thread. */
template <FP8Format F, typename Out>
__global__ void __launch_bounds__(kDqThreads) dequantize_fp8_kernel(const uint8_t* __restrict__ q,
                                                                    const float* scale_inv, Out* __restrict__ out,
                                                                    int64_t n, bool vector_ok) {
  const float s = *scale_inv;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kDqThreads * 4;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * kDqThreads + threadIdx.x) * 4; i < n; i += step) {
    uint8_t c[4];
    const int n_valid = load_codes4(q, i, n, vector_ok, c);
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (j < n_valid) out[i + j] = FromFloat<Out>::apply(numerics::fp8_to_float<F>(c[j]) * s);
  }
}

constexpr int kTrTile = 32;
constexpr int kTrRowsPerPass = 8;

/*! x̂ = fl(q · s_inv) for a transposed (K, R) columnwise copy, written as (R, K) through a
 *  32x32 shared-memory tile. */
template <FP8Format F, typename Out>
__global__ void __launch_bounds__(kTrTile* kTrRowsPerPass) dequantize_fp8_transposed_kernel(
    const uint8_t* __restrict__ q, const float* scale_inv, Out* __restrict__ out, int64_t R, int64_t K) {
  __shared__ float tile[kTrTile][kTrTile + 1];
  const float s = *scale_inv;
  const int64_t tiles_r = (R + kTrTile - 1) / kTrTile;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) / tiles_r * kTrTile;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) % tiles_r * kTrTile;
  const int tx = threadIdx.x % kTrTile, ty = threadIdx.x / kTrTile;
  for (int j = ty; j < kTrTile; j += kTrRowsPerPass) {
    const int64_t k = k0 + j, r = r0 + tx;
    if (k < K && r < R) tile[j][tx] = numerics::fp8_to_float<F>(q[k * R + r]) * s;
  }
  __syncthreads();
  for (int j = ty; j < kTrTile; j += kTrRowsPerPass) {
    const int64_t r = r0 + j, k = k0 + tx;
    if (r < R && k < K) out[r * K + k] = FromFloat<Out>::apply(tile[tx][j]);
  }
}

/*! x̂ = q · 2^(e−127) for an MXFP8 copy (R, K); 4 elements per thread (K % 32 == 0, so the 4
 *  share a row). */
template <FP8Format F, typename Out>
__global__ void __launch_bounds__(kDqThreads) dequantize_mxfp8_kernel(const uint8_t* __restrict__ q,
                                                                      const uint8_t* __restrict__ scales,
                                                                      int64_t stride, Out* __restrict__ out,
                                                                      int64_t R, int64_t K, bool columnwise,
                                                                      bool vector_ok) {
  const int64_t n = R * K;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kDqThreads * 4;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * kDqThreads + threadIdx.x) * 4; i < n; i += step) {
    uint8_t c[4];
    const int n_valid = load_codes4(q, i, n, vector_ok, c);
    const int64_t r = i / K, k = i % K;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (j >= n_valid) break;
      const uint8_t e = columnwise ? scales[r / 32 * stride + k + j] : scales[r * stride + (k + j) / 32];
      out[i + j] = FromFloat<Out>::apply(numerics::fp8_to_float<F>(c[j]) * numerics::e8m0_to_float(e));
    }
  }
}

unsigned grid_stride_blocks(int64_t n, int64_t per_block, int64_t max_blocks) {
  return static_cast<unsigned>(std::min(max_blocks, (n + per_block - 1) / per_block));
}

/*! Calls fn(F tag, Out tag) for the data's FP8 format and the output dtype. */
template <typename Fn>
TweStatus dispatch_dequantize(const DequantizeArgs& a, Fn&& fn) {
  return dispatch_format(a.data->dtype == kTweFloat8E5M2, [&](auto format) {
    return dispatch_high_precision(a.output->dtype, [&](auto out_tag) { return fn(format, out_tag); });
  });
}

// ---- delayed-scaling update ---------------------------------------------------------------

/*! NUMERICS.md §3 per slot n (one thread each): same loop as the CPU kernel. */
__global__ void update_delayed_scaling_kernel(const float* __restrict__ hist, const float* __restrict__ scale,
                                              float* __restrict__ new_hist, float* __restrict__ new_scale,
                                              int64_t L, int64_t N, float fmt_max, int margin, bool algo_max) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const float a_new = hist[n];
  if (a_new == 0.0f) {  // unused slot: no roll, same scale
    for (int64_t l = 0; l < L; ++l) new_hist[l * N + n] = hist[l * N + n];
    new_scale[n] = scale[n];
    return;
  }
  float amax_star = a_new;
  if (algo_max)
    for (int64_t l = 1; l < L; ++l) amax_star = numerics::amax_update(amax_star, hist[l * N + n]);
  for (int64_t l = 0; l < L; ++l) new_hist[l * N + n] = hist[((l + 1) % L) * N + n];
  new_hist[n] = 0.0f;
  new_scale[n] = numerics::delayed_scale_update(scale[n], amax_star, fmt_max, margin);
}

}  // namespace

// ---- entry points -------------------------------------------------------------------------

TweStatus quantize_fp8_current(const QuantizeArgs& a) {
  const cudaStream_t stream = stream_of(a.stream);
  const TweQuantizedTensor& o = *a.output;
  float* row_scale_inv = present(&o.rowwise_data) ? data_of<float>(o.rowwise_scale_inv) : nullptr;
  float* col_scale_inv = present(&o.columnwise_data) ? data_of<float>(o.columnwise_scale_inv) : nullptr;
  float* amax_out = data_if_present<float>(o.amax);
  // The amax is reduced into the amax output, or (when none is requested) into a scale_inv
  // output that the last kernel overwrites with 1/s.
  float* amax_buf = amax_out ? amax_out : (row_scale_inv ? row_scale_inv : col_scale_inv);
  const float fmt_max = format_max(a.params.format);
  TweStatus st = cuda_check(cudaMemsetAsync(amax_buf, 0, sizeof(float), stream), "cudaMemsetAsync (amax)");
  if (st) return st;
  st = dispatch_high_precision(a.input->dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = data_of<const T>(*a.input);
    const int64_t n = a.rows * a.cols;
    if (n > 0) {
      const int64_t chunks = (n + VecWidth<T>::value - 1) / VecWidth<T>::value;
      amax_kernel<T><<<grid_stride_blocks(chunks, kAmaxThreads * kAmaxUnroll, kAmaxMaxBlocks), kAmaxThreads, 0,
                       stream>>>(x, n, aligned(x, 16), amax_buf);
      TweStatus s = check_launch("amax_kernel");
      if (s) return s;
    }
    PerTensorCast p = per_tensor_cast_params(a, x);
    p.scale_src = amax_buf;
    p.src_is_amax = true;
    return dispatch_format(a.params.format == kTweE5M2, [&](auto format) {
      return launch_per_tensor_cast<decltype(format)::value>(x, p, stream);
    });
  });
  if (st) return st;
  per_tensor_scalars_kernel<<<1, 1, 0, stream>>>(amax_buf, true, fmt_max, a.params.amax_epsilon,
                                                 a.params.force_pow2_scales != 0, row_scale_inv, col_scale_inv,
                                                 amax_out == amax_buf ? nullptr : amax_out);
  return check_launch("per_tensor_scalars_kernel");
}

TweStatus quantize_fp8_delayed(const QuantizeArgs& a) {
  const cudaStream_t stream = stream_of(a.stream);
  const TweQuantizedTensor& o = *a.output;
  float* row_scale_inv = present(&o.rowwise_data) ? data_of<float>(o.rowwise_scale_inv) : nullptr;
  float* col_scale_inv = present(&o.columnwise_data) ? data_of<float>(o.columnwise_scale_inv) : nullptr;
  float* amax_out = data_of<float>(o.amax);
  const float* scale = data_of<const float>(*a.scale);
  TweStatus st = cuda_check(cudaMemsetAsync(amax_out, 0, sizeof(float), stream), "cudaMemsetAsync (amax)");
  if (st) return st;
  st = dispatch_high_precision(a.input->dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = data_of<const T>(*a.input);
    PerTensorCast p = per_tensor_cast_params(a, x);
    p.scale_src = scale;
    p.src_is_amax = false;
    p.amax_accum = amax_out;
    return dispatch_format(a.params.format == kTweE5M2, [&](auto format) {
      return launch_per_tensor_cast<decltype(format)::value>(x, p, stream);
    });
  });
  if (st) return st;
  per_tensor_scalars_kernel<<<1, 1, 0, stream>>>(scale, false, format_max(a.params.format), 0.0f, false,
                                                 row_scale_inv, col_scale_inv, nullptr);
  return check_launch("per_tensor_scalars_kernel");
}

TweStatus quantize_mxfp8(const QuantizeArgs& a) {
  const cudaStream_t stream = stream_of(a.stream);
  const TweQuantizedTensor& o = *a.output;
  const int64_t R = a.rows, K = a.cols;
  MxArgs p{};
  p.rows = R;
  p.cols = K;
  p.two_d = a.params.two_d != 0;
  TweStatus st;
  if (present(&o.rowwise_data)) {
    p.row_data = data_of<uint8_t>(o.rowwise_data);
    p.row_scales = data_of<uint8_t>(o.rowwise_scale_inv);
    p.row_stride = last_dim(o.rowwise_scale_inv);
    if ((st = zero_scale_padding(p.row_scales, rows(o.rowwise_scale_inv), p.row_stride, R, K / 32, stream))) return st;
  }
  if (present(&o.columnwise_data)) {
    p.col_data = data_of<uint8_t>(o.columnwise_data);
    p.col_scales = data_of<uint8_t>(o.columnwise_scale_inv);
    p.col_stride = last_dim(o.columnwise_scale_inv);
    if ((st = zero_scale_padding(p.col_scales, rows(o.columnwise_scale_inv), p.col_stride, R / 32, K, stream))) {
      return st;
    }
  }
  p.store_vec = aligned(p.row_data, 8) && aligned(p.col_data, 8);
  const int64_t tiles = R / kMxRows * ((K + kMxCols - 1) / kMxCols);
  if (tiles == 0) return kTweSuccess;
  return dispatch_high_precision(a.input->dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = data_of<const T>(*a.input);
    p.load_vec = aligned(x, 16);
    return dispatch_format(a.params.format == kTweE5M2, [&](auto format) {
      mxfp8_kernel<decltype(format)::value, T><<<static_cast<unsigned>(tiles), kMxThreads, 0, stream>>>(x, p);
      return check_launch("mxfp8_kernel");
    });
  });
}

TweStatus dequantize_fp8(const DequantizeArgs& a) {
  const cudaStream_t stream = stream_of(a.stream);
  const int64_t R = a.rows, K = a.cols, n = R * K;
  if (n == 0) return kTweSuccess;
  const uint8_t* q = data_of<const uint8_t>(*a.data);
  const float* scale_inv = data_of<const float>(*a.scale_inv);
  return dispatch_dequantize(a, [&](auto format, auto out_tag) {
    constexpr FP8Format F = decltype(format)::value;
    using Out = decltype(out_tag);
    Out* out = data_of<Out>(*a.output);
    if (a.columnwise) {
      const int64_t tiles = (R + kTrTile - 1) / kTrTile * ((K + kTrTile - 1) / kTrTile);
      dequantize_fp8_transposed_kernel<F, Out>
          <<<static_cast<unsigned>(tiles), kTrTile * kTrRowsPerPass, 0, stream>>>(q, scale_inv, out, R, K);
      return check_launch("dequantize_fp8_transposed_kernel");
    }
    dequantize_fp8_kernel<F, Out><<<grid_stride_blocks(n, kDqThreads * 4, kDqMaxBlocks), kDqThreads, 0, stream>>>(
        q, scale_inv, out, n, aligned(q, 4));
    return check_launch("dequantize_fp8_kernel");
  });
}

TweStatus dequantize_mxfp8(const DequantizeArgs& a) {
  const cudaStream_t stream = stream_of(a.stream);
  const int64_t R = a.rows, K = a.cols, n = R * K;
  if (n == 0) return kTweSuccess;
  const uint8_t* q = data_of<const uint8_t>(*a.data);
  const uint8_t* scales = data_of<const uint8_t>(*a.scale_inv);
  const int64_t stride = last_dim(*a.scale_inv);
  return dispatch_dequantize(a, [&](auto format, auto out_tag) {
    using Out = decltype(out_tag);
    dequantize_mxfp8_kernel<decltype(format)::value, Out>
        <<<grid_stride_blocks(n, kDqThreads * 4, kDqMaxBlocks), kDqThreads, 0, stream>>>(
            q, scales, stride, data_of<Out>(*a.output), R, K, a.columnwise, aligned(q, 4));
    return check_launch("dequantize_mxfp8_kernel");
  });
}

TweStatus update_delayed_scaling(const DelayedUpdateArgs& a) {
  const cudaStream_t stream = stream_of(a.stream);
  const int64_t N = a.slots;
  if (N == 0) return kTweSuccess;
  constexpr int kThreads = 256;
  update_delayed_scaling_kernel<<<static_cast<unsigned>((N + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      data_of<const float>(*a.amax_history), data_of<const float>(*a.scale), data_of<float>(*a.new_amax_history),
      data_of<float>(*a.new_scale), a.history_length, N, format_max(a.params.format), a.params.margin,
      a.params.algorithm == kTweAmaxMax);
  return check_launch("update_delayed_scaling_kernel");
}

}  // namespace cuda
}  // namespace twe
