// CPU kernels of the quantize family: loops and tiling only; value math is in numerics.h.
#include <algorithm>
#include <cstring>
#include <vector>

#include "internal/cpu.h"
#include "internal/quantize.h"

namespace twe {
namespace cpu {
namespace {

using numerics::FP8Format;

constexpr int64_t kTile = 32;  // transpose tile for columnwise copies

template <typename T>
float block_amax(const T* x, int64_t n) {
  uint32_t key = 0;
  for (int64_t i = 0; i < n; ++i) key = std::max(key, numerics::amax_key(to_float(x[i])));
  return numerics::bits_to_float(key);
}

/*! NaN-skipping amax of n elements, in parallel chunks (max is exact in any order). */
template <typename T>
float tensor_amax(const T* x, int64_t n) {
  constexpr int64_t kChunk = int64_t(1) << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<float> partial(static_cast<size_t>(chunks), 0.0f);
  parallel_for(chunks, n, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c)
      partial[c] = block_amax(x + c * kChunk, std::min(kChunk, n - c * kChunk));
  });
  float amax = 0.0f;
  for (float p : partial) amax = numerics::amax_update(amax, p);
  return amax;
}

/*! Casts x * scale to FP8 into rowwise (R, K) and/or columnwise (K, R) outputs, in tiles. */
template <FP8Format F, typename T>
void cast_per_tensor(const T* x, float scale, int64_t R, int64_t K, uint8_t* rowwise, uint8_t* columnwise) {
  const int64_t row_tiles = (R + kTile - 1) / kTile;
  parallel_for(row_tiles, R * K, [&](int64_t tile_begin, int64_t tile_end) {
    uint8_t tile[kTile * kTile];
    for (int64_t r0 = tile_begin * kTile; r0 < std::min(R, tile_end * kTile); r0 += kTile) {
      const int64_t r1 = std::min(R, r0 + kTile);
      for (int64_t k0 = 0; k0 < K; k0 += kTile) {
        const int64_t k1 = std::min(K, k0 + kTile);
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t k = k0; k < k1; ++k)
            tile[(r - r0) * kTile + (k - k0)] = numerics::float_to_fp8<F>(to_float(x[r * K + k]) * scale);
        if (rowwise)
          for (int64_t r = r0; r < r1; ++r) std::memcpy(rowwise + r * K + k0, tile + (r - r0) * kTile, k1 - k0);
        if (columnwise)
          for (int64_t k = k0; k < k1; ++k)
            for (int64_t r = r0; r < r1; ++r) columnwise[k * R + r] = tile[(r - r0) * kTile + (k - k0)];
      }
    }
  });
}

template <typename T>
void per_tensor_cast(const QuantizeArgs& a, const T* x, float scale) {
  uint8_t* row = static_cast<uint8_t*>(a.output->rowwise_data.data);
  uint8_t* col = static_cast<uint8_t*>(a.output->columnwise_data.data);
  if (a.params.format == kTweE5M2) cast_per_tensor<FP8Format::kE5M2>(x, scale, a.rows, a.cols, row, col);
  else cast_per_tensor<FP8Format::kE4M3>(x, scale, a.rows, a.cols, row, col);
}

void write_per_tensor_scalars(const QuantizeArgs& a, float scale, float amax) {
  const float scale_inv = 1.0f / scale;
  if (present(&a.output->rowwise_scale_inv)) *static_cast<float*>(a.output->rowwise_scale_inv.data) = scale_inv;
  if (present(&a.output->columnwise_scale_inv)) *static_cast<float*>(a.output->columnwise_scale_inv.data) = scale_inv;
  if (present(&a.output->amax)) *static_cast<float*>(a.output->amax.data) = amax;
}

float format_max(TweFP8Format f) { return f == kTweE5M2 ? numerics::kE5M2Max : numerics::kE4M3Max; }

// ---- MXFP8 -------------------------------------------------------------------------------

template <FP8Format F, typename T>
void mxfp8_rowwise(const T* x, int64_t R, int64_t K, uint8_t* data, uint8_t* scales, int64_t scale_stride) {
  parallel_for(R, R * K, [&](int64_t row_begin, int64_t row_end) {
    for (int64_t r = row_begin; r < row_end; ++r) {
      for (int64_t kb = 0; kb < K / 32; ++kb) {
        const T* block = x + r * K + kb * 32;
        const uint8_t e = numerics::mxfp8_block_exponent<F>(block_amax(block, 32));
        const float m = numerics::e8m0_encode_multiplier(e);
        for (int64_t i = 0; i < 32; ++i) data[r * K + kb * 32 + i] = numerics::float_to_fp8<F>(to_float(block[i]) * m);
        scales[r * scale_stride + kb] = e;
      }
    }
  });
}

template <FP8Format F, typename T>
void mxfp8_columnwise(const T* x, int64_t R, int64_t K, uint8_t* data, uint8_t* scales, int64_t scale_stride) {
  parallel_for(R / 32, R * K, [&](int64_t rb_begin, int64_t rb_end) {
  std::vector<float> amax(static_cast<size_t>(K));
  std::vector<float> mult(static_cast<size_t>(K));
  for (int64_t rb = rb_begin; rb < rb_end; ++rb) {
    std::fill(amax.begin(), amax.end(), 0.0f);
    for (int64_t r = rb * 32; r < rb * 32 + 32; ++r)
      for (int64_t k = 0; k < K; ++k) amax[k] = numerics::amax_update(amax[k], to_float(x[r * K + k]));
    for (int64_t k = 0; k < K; ++k) {
      const uint8_t e = numerics::mxfp8_block_exponent<F>(amax[k]);
      scales[rb * scale_stride + k] = e;
      mult[k] = numerics::e8m0_encode_multiplier(e);
    }
    for (int64_t r = rb * 32; r < rb * 32 + 32; ++r)
      for (int64_t k = 0; k < K; ++k) data[r * K + k] = numerics::float_to_fp8<F>(to_float(x[r * K + k]) * mult[k]);
  }
  });
}

/*! 2D MXFP8: one exponent per 32x32 tile; data written once per requested copy. */
template <FP8Format F, typename T>
void mxfp8_2d(const T* x, int64_t R, int64_t K, uint8_t* row_data, uint8_t* row_scales, int64_t row_stride,
              uint8_t* col_data, uint8_t* col_scales, int64_t col_stride) {
  parallel_for(R / 32, R * K, [&](int64_t rb_begin, int64_t rb_end) {
  for (int64_t rb = rb_begin; rb < rb_end; ++rb) {
    for (int64_t kb = 0; kb < K / 32; ++kb) {
      float amax = 0.0f;
      for (int64_t r = rb * 32; r < rb * 32 + 32; ++r)
        for (int64_t k = kb * 32; k < kb * 32 + 32; ++k) amax = numerics::amax_update(amax, to_float(x[r * K + k]));
      const uint8_t e = numerics::mxfp8_block_exponent<F>(amax);
      const float m = numerics::e8m0_encode_multiplier(e);
      for (int64_t r = rb * 32; r < rb * 32 + 32; ++r) {
        for (int64_t k = kb * 32; k < kb * 32 + 32; ++k) {
          const uint8_t q = numerics::float_to_fp8<F>(to_float(x[r * K + k]) * m);
          if (row_data) row_data[r * K + k] = q;
          if (col_data) col_data[r * K + k] = q;
        }
        if (row_scales) row_scales[r * row_stride + kb] = e;
      }
      if (col_scales)
        for (int64_t k = kb * 32; k < kb * 32 + 32; ++k) col_scales[rb * col_stride + k] = e;
    }
  }
  });
}

template <FP8Format F, typename T>
void mxfp8(const QuantizeArgs& a, const T* x) {
  const TweQuantizedTensor& o = *a.output;
  uint8_t* row_data = static_cast<uint8_t*>(o.rowwise_data.data);
  uint8_t* col_data = static_cast<uint8_t*>(o.columnwise_data.data);
  uint8_t* row_scales = row_data ? static_cast<uint8_t*>(o.rowwise_scale_inv.data) : nullptr;
  uint8_t* col_scales = col_data ? static_cast<uint8_t*>(o.columnwise_scale_inv.data) : nullptr;
  const int64_t row_stride = row_data ? o.rowwise_scale_inv.shape[o.rowwise_scale_inv.ndim - 1] : 0;
  const int64_t col_stride = col_data ? o.columnwise_scale_inv.shape[o.columnwise_scale_inv.ndim - 1] : 0;
  if (row_scales) std::memset(row_scales, 0, static_cast<size_t>(numel(o.rowwise_scale_inv)));
  if (col_scales) std::memset(col_scales, 0, static_cast<size_t>(numel(o.columnwise_scale_inv)));
  if (a.params.two_d) {
    mxfp8_2d<F>(x, a.rows, a.cols, row_data, row_scales, row_stride, col_data, col_scales, col_stride);
    return;
  }
  if (row_data) mxfp8_rowwise<F>(x, a.rows, a.cols, row_data, row_scales, row_stride);
  if (col_data) mxfp8_columnwise<F>(x, a.rows, a.cols, col_data, col_scales, col_stride);
}

// ---- Dequantize ---------------------------------------------------------------------------

template <FP8Format F, typename Out>
void dequantize_fp8_typed(const DequantizeArgs& a) {
  const uint8_t* q = static_cast<const uint8_t*>(a.data->data);
  const float scale_inv = *static_cast<const float*>(a.scale_inv->data);
  Out* out = static_cast<Out*>(a.output->data);
  const int64_t R = a.rows, K = a.cols;
  parallel_for(R, R * K, [&](int64_t row_begin, int64_t row_end) {
    for (int64_t r = row_begin; r < row_end; ++r)
      for (int64_t k = 0; k < K; ++k) {
        const uint8_t code = a.columnwise ? q[k * R + r] : q[r * K + k];
        out[r * K + k] = FromFloat<Out>::apply(numerics::fp8_to_float<F>(code) * scale_inv);
      }
  });
}

template <FP8Format F, typename Out>
void dequantize_mxfp8_typed(const DequantizeArgs& a) {
  const uint8_t* q = static_cast<const uint8_t*>(a.data->data);
  const uint8_t* scales = static_cast<const uint8_t*>(a.scale_inv->data);
  const int64_t stride = a.scale_inv->shape[a.scale_inv->ndim - 1];
  Out* out = static_cast<Out*>(a.output->data);
  const int64_t R = a.rows, K = a.cols;
  parallel_for(R, R * K, [&](int64_t row_begin, int64_t row_end) {
    for (int64_t r = row_begin; r < row_end; ++r)
      for (int64_t k = 0; k < K; ++k) {
        const uint8_t e = a.columnwise ? scales[(r / 32) * stride + k] : scales[r * stride + k / 32];
        out[r * K + k] = FromFloat<Out>::apply(numerics::fp8_to_float<F>(q[r * K + k]) * numerics::e8m0_to_float(e));
      }
  });
}

template <template <FP8Format, typename> class Kernel>
TweStatus dispatch_dequantize(const DequantizeArgs& a) {
  ScopedIeeeSubnormals ieee;
  const bool e5m2 = a.data->dtype == kTweFloat8E5M2;
  return dispatch_high_precision(a.output->dtype, [&](auto out_tag) {
    using Out = decltype(out_tag);
    if (e5m2) Kernel<FP8Format::kE5M2, Out>::run(a);
    else Kernel<FP8Format::kE4M3, Out>::run(a);
    return kTweSuccess;
  });
}

template <FP8Format F, typename Out>
struct DequantizeFp8 { static void run(const DequantizeArgs& a) { dequantize_fp8_typed<F, Out>(a); } };
template <FP8Format F, typename Out>
struct DequantizeMxfp8 { static void run(const DequantizeArgs& a) { dequantize_mxfp8_typed<F, Out>(a); } };

}  // namespace

TweStatus quantize_fp8_current(const QuantizeArgs& a) {
  ScopedIeeeSubnormals ieee;
  return dispatch_high_precision(a.input->dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(a.input->data);
    const float amax = tensor_amax(x, a.rows * a.cols);
    const float scale = numerics::scale_from_amax(amax, format_max(a.params.format), a.params.amax_epsilon,
                                                  a.params.force_pow2_scales != 0, numerics::kFloatMax);
    per_tensor_cast(a, x, scale);
    write_per_tensor_scalars(a, scale, amax);
    return kTweSuccess;
  });
}

TweStatus quantize_fp8_delayed(const QuantizeArgs& a) {
  ScopedIeeeSubnormals ieee;
  return dispatch_high_precision(a.input->dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(a.input->data);
    const float scale = *static_cast<const float*>(a.scale->data);
    per_tensor_cast(a, x, scale);
    write_per_tensor_scalars(a, scale, tensor_amax(x, a.rows * a.cols));
    return kTweSuccess;
  });
}

TweStatus quantize_mxfp8(const QuantizeArgs& a) {
  ScopedIeeeSubnormals ieee;
  return dispatch_high_precision(a.input->dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(a.input->data);
    if (a.params.format == kTweE5M2) mxfp8<FP8Format::kE5M2>(a, x);
    else mxfp8<FP8Format::kE4M3>(a, x);
    return kTweSuccess;
  });
}

TweStatus dequantize_fp8(const DequantizeArgs& a) { return dispatch_dequantize<DequantizeFp8>(a); }

TweStatus dequantize_mxfp8(const DequantizeArgs& a) { return dispatch_dequantize<DequantizeMxfp8>(a); }

TweStatus update_delayed_scaling(const DelayedUpdateArgs& a) {
  ScopedIeeeSubnormals ieee;
  const float* hist = static_cast<const float*>(a.amax_history->data);
  const float* scale = static_cast<const float*>(a.scale->data);
  float* new_hist = static_cast<float*>(a.new_amax_history->data);
  float* new_scale = static_cast<float*>(a.new_scale->data);
  const int64_t L = a.history_length, N = a.slots;
  const float fmt_max = format_max(a.params.format);
  for (int64_t n = 0; n < N; ++n) {
    const float a_new = hist[n];
    if (a_new == 0.0f) {  // unused slot: no roll, same scale
      for (int64_t l = 0; l < L; ++l) new_hist[l * N + n] = hist[l * N + n];
      new_scale[n] = scale[n];
      continue;
    }
    float amax_star = a_new;
    if (a.params.algorithm == kTweAmaxMax)
      for (int64_t l = 1; l < L; ++l) amax_star = numerics::amax_update(amax_star, hist[l * N + n]);
    // Roll: H'[k] = H[k+1 mod L], then H'[0] = 0.
    for (int64_t l = 0; l < L; ++l) new_hist[l * N + n] = hist[((l + 1) % L) * N + n];
    new_hist[n] = 0.0f;
    new_scale[n] = numerics::delayed_scale_update(scale[n], amax_star, fmt_max, a.params.margin);
  }
  return kTweSuccess;
}

}  // namespace cpu
}  // namespace twe
