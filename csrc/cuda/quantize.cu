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

/*! Blocks for a grid-stride loop over n items, per_block items per block and pass. */
unsigned grid_stride_blocks(int64_t n, int64_t per_block, int64_t max_blocks) {
  return static_cast<unsigned>(std::min(max_blocks, (n + per_block - 1) / per_block));
}

float format_max(TweFP8Format f) { return f == kTweE5M2 ? numerics::kE5M2Max : numerics::kE4M3Max; }

/*! Calls fn(std::integral_constant<FP8Format, F>{}) for the runtime format. */
template <typename Fn>
TweStatus dispatch_format(bool e5m2, Fn&& fn) {
  if (e5m2) return fn(std::integral_constant<FP8Format, FP8Format::kE5M2>{});
  return fn(std::integral_constant<FP8Format, FP8Format::kE4M3>{});
}

/*! Calls fn(format tag, element tag) for the FP8 format and the input dtype of a quantize call. */
template <typename Fn>
TweStatus dispatch_input_format(const QuantizeArgs& a, Fn&& fn) {
  return dispatch_high_precision(a.input->dtype, [&](auto tag) {
    return dispatch_format(a.params.format == kTweE5M2, [&](auto format) { return fn(format, tag); });
  });
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

/*! NaN-skipping amax over the whole thread block, returned to every thread. All threads must
 *  call it, at most once per kernel. */
__device__ __forceinline__ float block_amax(float a) {
  __shared__ float warp_amax[32];
  __shared__ float result;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) a = numerics::amax_update(a, __shfl_xor_sync(0xFFFFFFFFu, a, offset));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_amax[warp] = a;
  __syncthreads();
  if (warp == 0) {
    a = lane < static_cast<int>(blockDim.x / 32) ? warp_amax[lane] : 0.0f;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) a = numerics::amax_update(a, __shfl_xor_sync(0xFFFFFFFFu, a, offset));
    if (lane == 0) result = a;
  }
  __syncthreads();
  return result;
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

/*! Raises *amax (and *amax2 when not null), pre-zeroed, to the NaN-skipping amax of x[0, n). */
template <typename T>
__global__ void __launch_bounds__(kAmaxThreads) amax_kernel(const T* __restrict__ x, int64_t n, bool vector_ok,
                                                            float* amax, float* amax2) {
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
  if (threadIdx.x == 0) {
    atomic_amax(amax, a);
    if (amax2) atomic_amax(amax2, a);
  }
}

/*! Launches amax_kernel over the n elements of x (nothing for n == 0). */
template <typename T>
TweStatus launch_amax(const T* x, int64_t n, float* amax, float* amax2, cudaStream_t stream) {
  if (n == 0) return kTweSuccess;
  const int64_t chunks = (n + VecWidth<T>::value - 1) / VecWidth<T>::value;
  amax_kernel<T><<<grid_stride_blocks(chunks, kAmaxThreads * kAmaxUnroll, kAmaxMaxBlocks), kAmaxThreads, 0, stream>>>(
      x, n, aligned(x, 16), amax, amax2);
  return check_launch("amax_kernel");
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

/*! Zeroes the padding of a scale tensor (rows_total, cols_total) whose live part is
 *  (rows_valid, cols_valid): a 2-D memset beside the live columns, a 1-D one below the rows.
 *  Both are stream operations (capturable); the kernels never touch the padding. */
TweStatus zero_scale_padding(const TweTensorView& scales, int64_t rows_valid, int64_t cols_valid,
                             cudaStream_t stream) {
  const size_t elem = scales.dtype == kTweFloat32 ? sizeof(float) : 1;
  const int64_t rows_total = rows(scales), cols_total = cols(scales);
  char* base = static_cast<char*>(scales.data);
  if (cols_valid < cols_total && rows_valid > 0) {
    const cudaError_t err = cudaMemset2DAsync(base + cols_valid * elem, cols_total * elem, 0,
                                              (cols_total - cols_valid) * elem, static_cast<size_t>(rows_valid),
                                              stream);
    if (err != cudaSuccess) return cuda_check(err, "cudaMemset2DAsync (scale padding)");
  }
  if (rows_valid < rows_total) {
    const cudaError_t err = cudaMemsetAsync(base + rows_valid * cols_total * elem, 0,
                                            (rows_total - rows_valid) * cols_total * elem, stream);
    if (err != cudaSuccess) return cuda_check(err, "cudaMemsetAsync (scale padding)");
  }
  return kTweSuccess;
}

// ---- FP8 block scaling (NUMERICS.md §6) -----------------------------------------------------

constexpr int kFbTile = numerics::kFP8BlockSize;  // 128x128 input tile per thread block
constexpr int kFbThreads = 256;
constexpr int kFbWords = kFbTile / 8;  // 8-byte words of one transposed output row (128 codes)

struct Fp8BlockArgs {
  int64_t rows;
  int64_t cols;
  uint8_t* row_data;   // (R, K) or null
  float* row_scales;   // 1D [kb][r], 2D [rb][kb]
  int64_t row_stride;
  uint8_t* col_data;   // (K, R) or null
  float* col_scales;   // 1D [rb][k], 2D [kb][rb]
  int64_t col_stride;
  float epsilon;
  bool pow2;
  float inf_value;  // largest finite value of the input dtype
  bool two_d;
  bool load_vec;   // x 16-byte aligned
  bool store_vec;  // rowwise data 8-byte, columnwise data 16-byte aligned
};

/*! One 128x128 tile. Thread (group g, lane l) holds rows [g·RT, g·RT+RT) x columns
 *  [l·V, l·V+V) (V = 16-byte vector width) in registers: rowwise 1x128 blocks reduce across the
 *  lanes of a row by shuffles; columnwise blocks (1x128 of the transpose) reduce through shared
 *  memory; the columnwise codes are transposed through a swizzled shared-memory tile so every
 *  (K, R) row segment is written as coalesced 16-byte stores. In 2D mode one scale serves the
 *  tile and the columnwise copy is the transposed rowwise bytes. */
template <FP8Format F, typename T>
__global__ void __launch_bounds__(kFbThreads) fp8_block_kernel(const T* __restrict__ x, Fp8BlockArgs a) {
  constexpr int kV = VecWidth<T>::value;
  constexpr int kLanesPerRow = kFbTile / kV;             // 16 (16-bit inputs) or 32 (fp32)
  constexpr int kGroups = kFbThreads / kLanesPerRow;     // 16 or 8
  constexpr int kRowsPerThread = kFbTile / kGroups;      // 8 or 16
  __shared__ float partial_amax[kGroups][kFbTile];
  __shared__ float col_scale[kFbTile];
  __shared__ __align__(16) uint2 transposed[kFbTile][kFbWords];

  const int64_t R = a.rows, K = a.cols;
  const int64_t tiles_k = K / kFbTile;
  const int64_t rb = static_cast<int64_t>(blockIdx.x) / tiles_k, kb = static_cast<int64_t>(blockIdx.x) % tiles_k;
  const int64_t r0 = rb * kFbTile, k0 = kb * kFbTile;
  const int lane = threadIdx.x % kLanesPerRow, group = threadIdx.x / kLanesPerRow;
  const int kk = lane * kV, rr = group * kRowsPerThread;
  const float fmt_max = numerics::FP8Traits<F>::kMax;

  float v[kRowsPerThread][kV];
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) load_chunk(x + (r0 + rr + i) * K + k0 + kk, kV, a.load_vec, v[i]);

  float tile_scale = 0.0f;  // 2D only
  if (a.two_d) {
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i)
#pragma unroll
      for (int j = 0; j < kV; ++j) amax = numerics::amax_update(amax, v[i][j]);
    amax = block_amax(amax);
    tile_scale = numerics::scale_from_amax(amax, fmt_max, a.epsilon, a.pow2, a.inf_value);
    if (threadIdx.x == 0) {
      if (a.row_scales) a.row_scales[rb * a.row_stride + kb] = 1.0f / tile_scale;
      if (a.col_scales) a.col_scales[kb * a.col_stride + rb] = 1.0f / tile_scale;
    }
  }

  if (a.row_data) {
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      float s = tile_scale;
      if (!a.two_d) {
        float amax = 0.0f;
#pragma unroll
        for (int j = 0; j < kV; ++j) amax = numerics::amax_update(amax, v[i][j]);
#pragma unroll
        for (int offset = 1; offset < kLanesPerRow; offset <<= 1)
          amax = numerics::amax_update(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
        s = numerics::scale_from_amax(amax, fmt_max, a.epsilon, a.pow2, a.inf_value);
        if (lane == 0) a.row_scales[kb * a.row_stride + r0 + rr + i] = 1.0f / s;
      }
      uint8_t q[kV];
#pragma unroll
      for (int j = 0; j < kV; ++j) q[j] = numerics::float_to_fp8<F>(v[i][j] * s);
      store_codes(a.row_data + (r0 + rr + i) * K + k0 + kk, q, kV, a.store_vec);
    }
  }
  if (!a.col_data) return;

  if (!a.two_d) {  // one scale per column of the tile (a 1x128 block of the transpose)
#pragma unroll
    for (int j = 0; j < kV; ++j) {
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) amax = numerics::amax_update(amax, v[i][j]);
      partial_amax[group][kk + j] = amax;
    }
    __syncthreads();
    if (threadIdx.x < kFbTile) {
      float amax = partial_amax[0][threadIdx.x];
#pragma unroll
      for (int g = 1; g < kGroups; ++g) amax = numerics::amax_update(amax, partial_amax[g][threadIdx.x]);
      const float s = numerics::scale_from_amax(amax, fmt_max, a.epsilon, a.pow2, a.inf_value);
      col_scale[threadIdx.x] = s;
      a.col_scales[rb * a.col_stride + k0 + threadIdx.x] = 1.0f / s;
    }
    __syncthreads();
  }

  // Codes of column kk + j, rows rr.. as 8-byte words; word w of column k sits at w ^ swizzle(k)
  // so that the lanes of a warp hit distinct banks both here and in the read-out below.
  const int swizzle = lane & (kFbWords - 1);
#pragma unroll
  for (int j = 0; j < kV; ++j) {
    const float s = a.two_d ? tile_scale : col_scale[kk + j];
#pragma unroll
    for (int w = 0; w < kRowsPerThread / 8; ++w) {
      uint32_t lo = 0, hi = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        lo |= static_cast<uint32_t>(numerics::float_to_fp8<F>(v[8 * w + b][j] * s)) << (8 * b);
        hi |= static_cast<uint32_t>(numerics::float_to_fp8<F>(v[8 * w + 4 + b][j] * s)) << (8 * b);
      }
      transposed[kk + j][(rr / 8 + w) ^ swizzle] = make_uint2(lo, hi);
    }
  }
  __syncthreads();

  // Row k of the (K, R) output gets 128 codes: 8 threads write 16 bytes each.
#pragma unroll
  for (int it = 0; it < kFbTile * (kFbWords / 2) / kFbThreads; ++it) {
    const int c = it * kFbThreads + threadIdx.x;
    const int k = c / (kFbWords / 2), m = c % (kFbWords / 2);  // words 2m, 2m+1: rows 16m..16m+15
    const int sw = (k / kV) & (kFbWords - 1);
    const uint4 pair = *reinterpret_cast<const uint4*>(&transposed[k][2 * (m ^ (sw >> 1))]);
    const uint4 out = (sw & 1) ? make_uint4(pair.z, pair.w, pair.x, pair.y) : pair;
    uint8_t* dst = a.col_data + (k0 + k) * R + r0 + 16 * m;
    if (a.store_vec) {
      *reinterpret_cast<uint4*>(dst) = out;
    } else {
      const uint32_t words[4] = {out.x, out.y, out.z, out.w};
#pragma unroll
      for (int b = 0; b < 16; ++b) dst[b] = static_cast<uint8_t>(words[b / 4] >> (8 * (b % 4)));
    }
  }
}

// ---- NVFP4 (NUMERICS.md §7) -----------------------------------------------------------------

constexpr int kFp4Block = numerics::kNVFP4BlockSize;  // 16
constexpr int kFp4Threads = 256;
constexpr int kFp4Tile = 64;  // columnwise: 64x64 input tile through shared memory

/*! Stochastic rounding state read on the device from the [seed, offset] array. */
struct SrState {
  bool enabled;
  uint32_t seed;
  uint32_t offset;
};

/*! One NVFP4 copy of `rows` x `cols` elements (the rowwise (R, K) or the transposed (K, R)). */
struct Nvfp4Copy {
  int64_t rows;
  int64_t cols;
  uint8_t* data;    // packed, (rows, cols / 2)
  uint8_t* scales;  // E4M3 codes [row][block]
  int64_t scale_stride;
  const float* global_amax;  // reduced earlier on the stream
  bool two_d;
  bool stochastic;
  const void* rng;  // [seed, offset]: uint32 / int32, or int64 (low 32 bits)
  bool rng_int64;
  bool store_vec;  // data 8-byte aligned
};

__device__ __forceinline__ SrState read_sr_state(const Nvfp4Copy& c) {
  if (!c.stochastic) return SrState{false, 0u, 0u};
  if (c.rng_int64) {
    const int64_t* r = static_cast<const int64_t*>(c.rng);
    return SrState{true, static_cast<uint32_t>(r[0]), static_cast<uint32_t>(r[1])};
  }
  const uint32_t* r = static_cast<const uint32_t*>(c.rng);
  return SrState{true, r[0], r[1]};
}

/*! Encodes block `group` (16 elements, group = element index / 16 in the copy's row-major
 *  order) with block amax `block_amax`: writes its E4M3 scale code and its 8 packed bytes. */
__device__ __forceinline__ void nvfp4_store_block(const Nvfp4Copy& c, const float (&v)[kFp4Block], float block_amax,
                                                  int64_t row, int64_t block, uint32_t copy, const SrState& sr) {
  const float s_enc = numerics::nvfp4_global_encode_scale(*c.global_amax);
  const float s_dec = 1.0f / s_enc;
  const uint8_t code = numerics::nvfp4_block_scale_code(block_amax, numerics::nvfp4_block_scale_factor(s_enc));
  const float m = numerics::nvfp4_encode_multiplier(code, s_dec);
  const int64_t group = row * (c.cols / kFp4Block) + block;
  numerics::Philox4x32 random{};
  if (sr.enabled) random = numerics::sr_random_block(static_cast<uint64_t>(group), copy, sr.seed, sr.offset);
  uint32_t words[2] = {0u, 0u};
#pragma unroll
  for (int j = 0; j < kFp4Block; j += 2) {
    uint8_t e[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float scaled = v[j + h] * m;
      e[h] = sr.enabled ? numerics::float_to_e2m1_stochastic(scaled, numerics::sr_random_byte(random, j + h))
                        : numerics::float_to_e2m1(scaled);
    }
    words[j / 8] |= static_cast<uint32_t>(numerics::pack_e2m1(e[0], e[1])) << (8 * ((j / 2) % 4));
  }
  uint8_t* dst = c.data + group * (kFp4Block / 2);
  if (c.store_vec) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(words[0], words[1]);
  } else {
#pragma unroll
    for (int b = 0; b < kFp4Block / 2; ++b) dst[b] = static_cast<uint8_t>(words[b / 4] >> (8 * (b % 4)));
  }
  c.scales[row * c.scale_stride + block] = code;
}

/*! Rowwise copy: 16 rows x 16 blocks (256 columns) per thread block, one 1x16 block per thread;
 *  2D tiles (16x16) reduce their amax through shared memory. */
template <typename T>
__global__ void __launch_bounds__(kFp4Threads) nvfp4_rowwise_kernel(const T* __restrict__ x, Nvfp4Copy c,
                                                                    bool load_vec) {
  constexpr int kV = VecWidth<T>::value;
  __shared__ float tile_amax[kFp4Block][kFp4Block];
  const int64_t blocks = c.cols / kFp4Block;
  const int64_t tiles_b = (blocks + kFp4Block - 1) / kFp4Block;
  const int tr = threadIdx.x / kFp4Block, tb = threadIdx.x % kFp4Block;
  const int64_t row = static_cast<int64_t>(blockIdx.x) / tiles_b * kFp4Block + tr;
  const int64_t block = static_cast<int64_t>(blockIdx.x) % tiles_b * kFp4Block + tb;
  const bool valid = block < blocks;  // rows % 16 == 0: rows are always in range
  float v[kFp4Block];
#pragma unroll
  for (int h = 0; h < kFp4Block / kV; ++h) {
    float chunk[kV];
    if (valid) {
      load_chunk(x + row * c.cols + block * kFp4Block + h * kV, kV, load_vec, chunk);
    } else {
      for (int i = 0; i < kV; ++i) chunk[i] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kV; ++i) v[h * kV + i] = chunk[i];
  }
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < kFp4Block; ++j) amax = numerics::amax_update(amax, v[j]);
  if (c.two_d) {
    tile_amax[tr][tb] = amax;
    __syncthreads();
    amax = tile_amax[0][tb];
#pragma unroll
    for (int i = 1; i < kFp4Block; ++i) amax = numerics::amax_update(amax, tile_amax[i][tb]);
  }
  if (valid) nvfp4_store_block(c, v, amax, row, block, 0u, read_sr_state(c));
}

/*! Columnwise copy (K, R): a 64x64 input tile goes through shared memory; thread (k, q) takes
 *  rows 16q..16q+15 of column k, applies the RHT when asked (numerics::rht_output, index
 *  order), and encodes that 1x16 block of the transpose. With `amax_out` set it only raises
 *  *amax_out to the amax of the (transformed) copy: the pass before the cast. */
template <typename T>
__global__ void __launch_bounds__(kFp4Threads) nvfp4_columnwise_kernel(const T* __restrict__ x, Nvfp4Copy c,
                                                                       bool load_vec, bool rht, float* amax_out) {
  constexpr int kV = VecWidth<T>::value;
  constexpr int kChunksPerRow = kFp4Tile / kV;
  constexpr int kQuads = kFp4Tile / kFp4Block;  // 16-row blocks per tile column
  __shared__ float tile[kFp4Tile][kFp4Tile + 1];
  __shared__ float block_amaxes[kFp4Tile][kQuads];
  const int64_t R = c.cols, K = c.rows;  // the copy is the transpose of the (R, K) input
  const int64_t tiles_k = (K + kFp4Tile - 1) / kFp4Tile;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) / tiles_k * kFp4Tile;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) % tiles_k * kFp4Tile;
#pragma unroll
  for (int it = 0; it < kFp4Tile * kChunksPerRow / kFp4Threads; ++it) {
    const int chunk_index = it * kFp4Threads + threadIdx.x;
    const int rr = chunk_index / kChunksPerRow, kk = chunk_index % kChunksPerRow * kV;
    float chunk[kV];
    // R and K are multiples of 16: a chunk is entirely inside or outside.
    if (r0 + rr < R && k0 + kk < K) {
      load_chunk(x + (r0 + rr) * K + k0 + kk, kV, load_vec, chunk);
    } else {
      for (int i = 0; i < kV; ++i) chunk[i] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kV; ++i) tile[rr][kk + i] = chunk[i];
  }
  __syncthreads();

  const int kk = threadIdx.x / kQuads, q = threadIdx.x % kQuads;
  const int64_t k = k0 + kk, r = r0 + q * kFp4Block;
  const bool valid = k < K && r < R;
  float column[kFp4Block], v[kFp4Block];
#pragma unroll
  for (int j = 0; j < kFp4Block; ++j) column[j] = tile[q * kFp4Block + j][kk];
#pragma unroll
  for (int i = 0; i < kFp4Block; ++i) v[i] = rht ? numerics::rht_output(column, i) : column[i];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kFp4Block; ++i) amax = numerics::amax_update(amax, v[i]);
  if (amax_out) {
    amax = block_amax(amax);
    if (threadIdx.x == 0) atomic_amax(amax_out, amax);
    return;
  }
  if (c.two_d) {  // a 16x16 tile of the copy: 16 consecutive columns k of the input
    block_amaxes[kk][q] = amax;
    __syncthreads();
    const int first = kk / kFp4Block * kFp4Block;
    amax = block_amaxes[first][q];
#pragma unroll
    for (int i = 1; i < kFp4Block; ++i) amax = numerics::amax_update(amax, block_amaxes[first + i][q]);
  }
  if (valid) nvfp4_store_block(c, v, amax, k, r / kFp4Block, 1u, read_sr_state(c));
}

// ---- dequantize ---------------------------------------------------------------------------

constexpr int kDqTile = 32;
constexpr int kDqThreads = 256;

/*! Per-tensor FP8: x̂ = fl(q · s_inv); the columnwise copy is (K, R). */
template <FP8Format F>
struct Fp8TensorDecoder {
  const uint8_t* q;
  const float* scale_inv;
  int64_t R, K;
  bool transposed;
  __device__ float operator()(int64_t r, int64_t k) const {
    return numerics::fp8_to_float<F>(transposed ? q[k * R + r] : q[r * K + k]) * *scale_inv;
  }
};

/*! MXFP8: x̂ = q · 2^(e−127); both copies are (R, K). */
template <FP8Format F>
struct Mxfp8Decoder {
  const uint8_t* q;
  const uint8_t* scales;
  int64_t stride;
  int64_t R, K;
  bool columnwise;
  bool transposed;  // always false: MXFP8 copies are not transposed
  __device__ float operator()(int64_t r, int64_t k) const {
    const uint8_t e = columnwise ? scales[r / 32 * stride + k] : scales[r * stride + k / 32];
    return numerics::fp8_to_float<F>(q[r * K + k]) * numerics::e8m0_to_float(e);
  }
};

/*! FP8 block: x̂ = fl(q · s_inv_b) in the scale layouts of NUMERICS.md §6. */
template <FP8Format F>
struct Fp8BlockDecoder {
  const uint8_t* q;
  const float* scales;
  int64_t stride;
  int64_t R, K;
  bool transposed;  // the columnwise copy, (K, R)
  bool two_d;
  __device__ float operator()(int64_t r, int64_t k) const {
    const int64_t rb = r / numerics::kFP8BlockSize, kb = k / numerics::kFP8BlockSize;
    float s;
    if (two_d) s = transposed ? scales[kb * stride + rb] : scales[rb * stride + kb];
    else s = transposed ? scales[rb * stride + k] : scales[kb * stride + r];
    return numerics::fp8_to_float<F>(transposed ? q[k * R + r] : q[r * K + k]) * s;
  }
};

/*! NVFP4: x̂ = fl(q · fl(fl(float(d_b) · A) · fl(1/2688))); the columnwise copy is (K, R). */
struct Nvfp4Decoder {
  const uint8_t* q;
  const uint8_t* scales;
  int64_t stride;
  const float* global_amax;
  int64_t R, K;
  bool transposed;
  __device__ float operator()(int64_t r, int64_t k) const {
    const int64_t i = transposed ? k : r, j = transposed ? r : k, cols = transposed ? R : K;
    const uint8_t byte = q[(i * cols + j) / 2];
    const uint8_t code = (j & 1) ? static_cast<uint8_t>(byte >> 4) : static_cast<uint8_t>(byte & 0xFu);
    const float m = numerics::nvfp4_decode_multiplier(scales[i * stride + j / kFp4Block], *global_amax);
    return numerics::e2m1_to_float(code) * m;
  }
};

/*! out (R, K) = decode(r, k), rounded to Out, over 32x32 tiles. A transposed source is read
 *  along r (its contiguous dimension) into shared memory and written out along k. */
template <typename Decoder, typename Out>
__global__ void __launch_bounds__(kDqThreads) dequantize_kernel(Decoder decode, Out* __restrict__ out, int64_t R,
                                                                int64_t K) {
  __shared__ float tile[kDqTile][kDqTile + 1];
  const int64_t tiles_k = (K + kDqTile - 1) / kDqTile;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) / tiles_k * kDqTile;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) % tiles_k * kDqTile;
  const int tx = threadIdx.x % kDqTile, ty = threadIdx.x / kDqTile;
  constexpr int kRowsPerPass = kDqThreads / kDqTile;
  if (!decode.transposed) {
    for (int j = ty; j < kDqTile; j += kRowsPerPass) {
      const int64_t r = r0 + j, k = k0 + tx;
      if (r < R && k < K) out[r * K + k] = FromFloat<Out>::apply(decode(r, k));
    }
    return;
  }
  for (int j = ty; j < kDqTile; j += kRowsPerPass) {
    const int64_t r = r0 + tx, k = k0 + j;
    if (r < R && k < K) tile[j][tx] = decode(r, k);
  }
  __syncthreads();
  for (int j = ty; j < kDqTile; j += kRowsPerPass) {
    const int64_t r = r0 + j, k = k0 + tx;
    if (r < R && k < K) out[r * K + k] = FromFloat<Out>::apply(tile[tx][j]);
  }
}

template <typename Decoder>
TweStatus launch_dequantize(const DequantizeArgs& a, const Decoder& decode) {
  const int64_t R = a.rows, K = a.cols;
  if (R * K == 0) return kTweSuccess;
  const int64_t tiles = (R + kDqTile - 1) / kDqTile * ((K + kDqTile - 1) / kDqTile);
  return dispatch_high_precision(a.output->dtype, [&](auto out_tag) {
    using Out = decltype(out_tag);
    dequantize_kernel<Decoder, Out><<<static_cast<unsigned>(tiles), kDqThreads, 0, stream_of(a.stream)>>>(
        decode, data_of<Out>(*a.output), R, K);
    return check_launch("dequantize_kernel");
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
  st = dispatch_input_format(a, [&](auto format, auto tag) {
    using T = decltype(tag);
    const T* x = data_of<const T>(*a.input);
    TweStatus s = launch_amax(x, a.rows * a.cols, amax_buf, nullptr, stream);
    if (s) return s;
    PerTensorCast p = per_tensor_cast_params(a, x);
    p.scale_src = amax_buf;
    p.src_is_amax = true;
    return launch_per_tensor_cast<decltype(format)::value>(x, p, stream);
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
  st = dispatch_input_format(a, [&](auto format, auto tag) {
    using T = decltype(tag);
    const T* x = data_of<const T>(*a.input);
    PerTensorCast p = per_tensor_cast_params(a, x);
    p.scale_src = scale;
    p.src_is_amax = false;
    p.amax_accum = amax_out;
    return launch_per_tensor_cast<decltype(format)::value>(x, p, stream);
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
    p.row_stride = cols(o.rowwise_scale_inv);
    if ((st = zero_scale_padding(o.rowwise_scale_inv, R, K / 32, stream))) return st;
  }
  if (present(&o.columnwise_data)) {
    p.col_data = data_of<uint8_t>(o.columnwise_data);
    p.col_scales = data_of<uint8_t>(o.columnwise_scale_inv);
    p.col_stride = cols(o.columnwise_scale_inv);
    if ((st = zero_scale_padding(o.columnwise_scale_inv, R / 32, K, stream))) return st;
  }
  p.store_vec = aligned(p.row_data, 8) && aligned(p.col_data, 8);
  const int64_t tiles = R / kMxRows * ((K + kMxCols - 1) / kMxCols);
  if (tiles == 0) return kTweSuccess;
  return dispatch_input_format(a, [&](auto format, auto tag) {
    using T = decltype(tag);
    const T* x = data_of<const T>(*a.input);
    p.load_vec = aligned(x, 16);
    mxfp8_kernel<decltype(format)::value, T><<<static_cast<unsigned>(tiles), kMxThreads, 0, stream>>>(x, p);
    return check_launch("mxfp8_kernel");
  });
}

TweStatus quantize_fp8_block(const QuantizeArgs& a) {
  const cudaStream_t stream = stream_of(a.stream);
  const TweQuantizedTensor& o = *a.output;
  const int64_t R = a.rows, K = a.cols;
  constexpr int64_t B = numerics::kFP8BlockSize;
  Fp8BlockArgs p{};
  p.rows = R;
  p.cols = K;
  p.epsilon = a.params.amax_epsilon;
  p.pow2 = a.params.force_pow2_scales != 0;
  p.inf_value = dtype_max(a.input->dtype);
  p.two_d = a.params.two_d != 0;
  TweStatus st;
  if (present(&o.rowwise_data)) {
    p.row_data = data_of<uint8_t>(o.rowwise_data);
    p.row_scales = data_of<float>(o.rowwise_scale_inv);
    p.row_stride = cols(o.rowwise_scale_inv);
    st = p.two_d ? zero_scale_padding(o.rowwise_scale_inv, R / B, K / B, stream)
                 : zero_scale_padding(o.rowwise_scale_inv, K / B, R, stream);
    if (st) return st;
  }
  if (present(&o.columnwise_data)) {
    p.col_data = data_of<uint8_t>(o.columnwise_data);
    p.col_scales = data_of<float>(o.columnwise_scale_inv);
    p.col_stride = cols(o.columnwise_scale_inv);
    st = p.two_d ? zero_scale_padding(o.columnwise_scale_inv, K / B, R / B, stream)
                 : zero_scale_padding(o.columnwise_scale_inv, R / B, K, stream);
    if (st) return st;
  }
  p.store_vec = aligned(p.row_data, 8) && aligned(p.col_data, 16);
  const int64_t tiles = R / B * (K / B);
  if (tiles == 0) return kTweSuccess;
  return dispatch_input_format(a, [&](auto format, auto tag) {
    using T = decltype(tag);
    const T* x = data_of<const T>(*a.input);
    p.load_vec = aligned(x, 16);
    fp8_block_kernel<decltype(format)::value, T><<<static_cast<unsigned>(tiles), kFbThreads, 0, stream>>>(x, p);
    return check_launch("fp8_block_kernel");
  });
}

TweStatus quantize_nvfp4(const QuantizeArgs& a) {
  const cudaStream_t stream = stream_of(a.stream);
  const TweQuantizedTensor& o = *a.output;
  const int64_t R = a.rows, K = a.cols;
  const bool rowwise = present(&o.rowwise_data), columnwise = present(&o.columnwise_data);
  const bool rht = columnwise && a.params.with_rht != 0;
  float* row_amax = rowwise ? data_of<float>(o.amax) : nullptr;
  float* col_amax = columnwise ? data_of<float>(o.columnwise_amax) : nullptr;
  Nvfp4Copy base{};
  base.two_d = a.params.two_d != 0;
  base.stochastic = a.params.stochastic_rounding != 0;
  if (base.stochastic) {
    base.rng = a.rng->data;
    base.rng_int64 = a.rng->dtype == kTweInt64;
  }
  auto copy = [&](const TweTensorView& data, const TweTensorView& scales, const float* amax, int64_t rows_,
                  int64_t cols_) {
    Nvfp4Copy c = base;
    c.rows = rows_;
    c.cols = cols_;
    c.data = data_of<uint8_t>(data);
    c.scales = data_of<uint8_t>(scales);
    c.scale_stride = cols(scales);
    c.global_amax = amax;
    c.store_vec = aligned(c.data, 8);
    return c;
  };
  TweStatus st;
  const float* given = a.amax ? data_of<const float>(*a.amax) : nullptr;
  for (int i = 0; i < 2; ++i) {  // given global amaxes copied in, else zeroed for the amax passes
    float* amax = i == 0 ? row_amax : col_amax;
    if (!amax) continue;
    st = given ? cuda_check(cudaMemcpyAsync(amax, given + i, sizeof(float), cudaMemcpyDeviceToDevice, stream),
                            "cudaMemcpyAsync (given amax)")
               : cuda_check(cudaMemsetAsync(amax, 0, sizeof(float), stream), "cudaMemsetAsync (amax)");
    if (st) return st;
  }
  if (rowwise && (st = zero_scale_padding(o.rowwise_scale_inv, R, K / kFp4Block, stream))) return st;
  if (columnwise && (st = zero_scale_padding(o.columnwise_scale_inv, K, R / kFp4Block, stream))) return st;
  if (R * K == 0) return kTweSuccess;
  return dispatch_high_precision(a.input->dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = data_of<const T>(*a.input);
    const bool load_vec = aligned(x, 16);
    // Global amaxes first (NUMERICS.md §7 step 1): the plain amax serves the rowwise copy and a
    // columnwise copy without RHT (the transpose has the same elements).
    // Given amaxes (a shard's group-wide values) replace both passes.
    float* plain = given ? nullptr : row_amax ? row_amax : (rht ? nullptr : col_amax);
    float* plain2 = !given && row_amax && !rht ? col_amax : nullptr;
    TweStatus s = plain ? launch_amax(x, R * K, plain, plain2, stream) : kTweSuccess;
    if (s) return s;
    const unsigned col_tiles = static_cast<unsigned>((R + kFp4Tile - 1) / kFp4Tile * ((K + kFp4Tile - 1) / kFp4Tile));
    const Nvfp4Copy col = columnwise ? copy(o.columnwise_data, o.columnwise_scale_inv, col_amax, K, R) : base;
    if (rht && !given) {
      nvfp4_columnwise_kernel<T><<<col_tiles, kFp4Threads, 0, stream>>>(x, col, load_vec, true, col_amax);
      if ((s = check_launch("nvfp4_columnwise_kernel (amax)"))) return s;
    }
    if (rowwise) {
      const Nvfp4Copy row = copy(o.rowwise_data, o.rowwise_scale_inv, row_amax, R, K);
      const int64_t tiles = R / kFp4Block * ((K / kFp4Block + kFp4Block - 1) / kFp4Block);
      nvfp4_rowwise_kernel<T><<<static_cast<unsigned>(tiles), kFp4Threads, 0, stream>>>(x, row, load_vec);
      if ((s = check_launch("nvfp4_rowwise_kernel"))) return s;
    }
    if (columnwise) {
      nvfp4_columnwise_kernel<T><<<col_tiles, kFp4Threads, 0, stream>>>(x, col, load_vec, rht, nullptr);
      if ((s = check_launch("nvfp4_columnwise_kernel"))) return s;
    }
    return kTweSuccess;
  });
}

TweStatus dequantize_fp8(const DequantizeArgs& a) {
  return dispatch_format(a.data->dtype == kTweFloat8E5M2, [&](auto format) {
    const Fp8TensorDecoder<decltype(format)::value> decode{data_of<const uint8_t>(*a.data),
                                                           data_of<const float>(*a.scale_inv), a.rows, a.cols,
                                                           a.columnwise};
    return launch_dequantize(a, decode);
  });
}

TweStatus dequantize_mxfp8(const DequantizeArgs& a) {
  return dispatch_format(a.data->dtype == kTweFloat8E5M2, [&](auto format) {
    const Mxfp8Decoder<decltype(format)::value> decode{data_of<const uint8_t>(*a.data),
                                                       data_of<const uint8_t>(*a.scale_inv), cols(*a.scale_inv),
                                                       a.rows, a.cols, a.columnwise, false};
    return launch_dequantize(a, decode);
  });
}

TweStatus dequantize_fp8_block(const DequantizeArgs& a) {
  return dispatch_format(a.data->dtype == kTweFloat8E5M2, [&](auto format) {
    const Fp8BlockDecoder<decltype(format)::value> decode{data_of<const uint8_t>(*a.data),
                                                          data_of<const float>(*a.scale_inv), cols(*a.scale_inv),
                                                          a.rows, a.cols, a.columnwise, a.two_d};
    return launch_dequantize(a, decode);
  });
}

TweStatus dequantize_nvfp4(const DequantizeArgs& a) {
  const Nvfp4Decoder decode{data_of<const uint8_t>(*a.data), data_of<const uint8_t>(*a.scale_inv),
                            cols(*a.scale_inv), data_of<const float>(*a.amax), a.rows, a.cols, a.columnwise};
  return launch_dequantize(a, decode);
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
