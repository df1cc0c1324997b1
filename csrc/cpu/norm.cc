// CPU kernels of the norm family: loops and memory movement only. Row reductions are
// numerics::canonical_sum; column sums (dγ, dβ) run lane l over rows l, l+32, ... and end in
// numerics::canonical_fold, so they are Σc over the row index, the order one CUDA warp uses.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "internal/cpu.h"
#include "internal/norm.h"
#include "internal/quantize.h"

namespace twe {
namespace cpu {
namespace {

using numerics::canonical_fold;
using numerics::canonical_sum;
using numerics::kSumLanes;

/*! dst[i] = element offset + i of high-precision view v, widened exactly to fp32. */
void widen(const TweTensorView* v, int64_t offset, int64_t n, float* dst) {
  dispatch_high_precision(v->dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* src = static_cast<const T*>(v->data) + offset;
    for (int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
    return kTweSuccess;
  });
}

/*! Elements offset .. offset + n - 1 of view v = src rounded (RNE) to v's dtype. */
void narrow(const float* src, int64_t n, TweTensorView* v, int64_t offset) {
  dispatch_high_precision(v->dtype, [&](auto tag) {
    using T = decltype(tag);
    T* dst = static_cast<T*>(v->data) + offset;
    for (int64_t i = 0; i < n; ++i) dst[i] = FromFloat<T>::apply(src[i]);
    return kTweSuccess;
  });
}

/*! The gain g' of every column: γ, or fl(1 + γ) with zero-centered gamma. */
std::vector<float> gains(const TweTensorView* gamma, int64_t k, bool zero_centered_gamma) {
  std::vector<float> g(static_cast<size_t>(k));
  widen(gamma, 0, k, g.data());
  for (float& v : g) v = numerics::norm_gain(v, zero_centered_gamma);
  return g;
}

/*! narrow, also returning the max amax_key of the rounded elements. */
uint32_t narrow_amax_key(const float* src, int64_t n, TweTensorView* v, int64_t offset) {
  uint32_t key = 0;
  dispatch_high_precision(v->dtype, [&](auto tag) {
    using T = decltype(tag);
    T* dst = static_cast<T*>(v->data) + offset;
    for (int64_t i = 0; i < n; ++i) dst[i] = FromFloat<T>::apply(src[i]);
    key = amax_key_bits(dst, n);  // the row just written, still in L1
    return kTweSuccess;
  });
  return key;
}

/*! Rows begin .. end - 1 of the forward; with `amax_key`, also the max amax_key of every y
 *  element written (per row into amax_key[r]). */
void forward_rows(const NormFwdArgs& a, const float* gain, const float* beta, int64_t begin, int64_t end,
                  uint32_t* amax_key = nullptr) {
  const int64_t k = a.cols;
  std::vector<float> x(static_cast<size_t>(k)), y(static_cast<size_t>(k));
  float* mu_out = a.mu ? static_cast<float*>(a.mu->data) : nullptr;
  float* rstd_out = static_cast<float*>(a.rstd->data);
  for (int64_t r = begin; r < end; ++r) {
    widen(a.x, r * k, k, x.data());
    const float* xr = x.data();
    float rstd;
    switch (a.kind) {
      case NormKind::kLayerNorm: {
        const float mu = numerics::norm_mean(canonical_sum(k, [xr](int64_t i) { return xr[i]; }), k);
        const float var = numerics::norm_mean(
            canonical_sum(k, [xr, mu](int64_t i) { return numerics::square(xr[i] - mu); }), k);
        rstd = numerics::norm_rstd(var, a.eps);
        for (int64_t i = 0; i < k; ++i) {
          y[i] = numerics::layernorm_output(numerics::layernorm_xhat(xr[i], mu, rstd), gain[i], beta[i]);
        }
        mu_out[r] = mu;
        break;
      }
      case NormKind::kRMSNorm: {
        const float ms = numerics::norm_mean(canonical_sum(k, [xr](int64_t i) { return numerics::square(xr[i]); }), k);
        rstd = numerics::norm_rstd(ms, a.eps);
        for (int64_t i = 0; i < k; ++i) y[i] = numerics::rmsnorm_output(xr[i], rstd, gain[i]);
        break;
      }
      default: {
        const float sum_sq = canonical_sum(k, [xr](int64_t i) { return numerics::square(xr[i]); });
        rstd = numerics::norm_rstd(sum_sq, a.eps);
        for (int64_t i = 0; i < k; ++i) y[i] = xr[i] * rstd;
        break;
      }
    }
    rstd_out[r] = rstd;
    if (amax_key) amax_key[r] = narrow_amax_key(y.data(), k, a.y, r * k);
    else narrow(y.data(), k, a.y, r * k);
  }
}

/*! dx of row r; adds fl(dy · x̂) and dy of the row into the lane partials dg / db (when given). */
void backward_row(const NormBwdArgs& a, const float* gain, int64_t r, float* x, float* dy, float* xhat, float* ghat,
                  float* dg, float* db) {
  const int64_t k = a.cols;
  widen(a.x, r * k, k, x);
  widen(a.dy, r * k, k, dy);
  const float rstd = static_cast<const float*>(a.rstd->data)[r];
  float* dx = x;  // x is dead once x̂ (or y) is formed: dx reuses its buffer
  switch (a.kind) {
    case NormKind::kLayerNorm:
    case NormKind::kRMSNorm: {
      const bool layernorm = a.kind == NormKind::kLayerNorm;
      const float mu = layernorm ? static_cast<const float*>(a.mu->data)[r] : 0.0f;
      for (int64_t i = 0; i < k; ++i) {
        xhat[i] = layernorm ? numerics::layernorm_xhat(x[i], mu, rstd) : x[i] * rstd;
        ghat[i] = dy[i] * gain[i];
      }
      const float b = numerics::norm_mean(canonical_sum(k, [xhat, ghat](int64_t i) { return ghat[i] * xhat[i]; }), k);
      if (layernorm) {
        const float mean = numerics::norm_mean(canonical_sum(k, [ghat](int64_t i) { return ghat[i]; }), k);
        for (int64_t i = 0; i < k; ++i) dx[i] = numerics::layernorm_dx(rstd, ghat[i], mean, xhat[i], b);
      } else {
        for (int64_t i = 0; i < k; ++i) dx[i] = numerics::rmsnorm_dx(rstd, ghat[i], xhat[i], b);
      }
      for (int64_t i = 0; i < k; ++i) dg[i] = dg[i] + dy[i] * xhat[i];
      if (db) {
        for (int64_t i = 0; i < k; ++i) db[i] = db[i] + dy[i];
      }
      break;
    }
    default: {
      float* y = xhat;
      for (int64_t i = 0; i < k; ++i) y[i] = x[i] * rstd;
      const float s = canonical_sum(k, [dy, y](int64_t i) { return dy[i] * y[i]; });
      for (int64_t i = 0; i < k; ++i) dx[i] = numerics::l2norm_dx(rstd, dy[i], y[i], s);
      break;
    }
  }
  narrow(dx, k, a.dx, r * k);
}

/*! out[i] = canonical_fold of the 32 lane partials of column i, rounded to out's dtype. */
void fold_columns(const std::vector<float>& partials, int64_t k, TweTensorView* out) {
  std::vector<float> result(static_cast<size_t>(k));
  float lanes[kSumLanes];
  for (int64_t i = 0; i < k; ++i) {
    for (int l = 0; l < kSumLanes; ++l) lanes[l] = partials[static_cast<size_t>(l * k + i)];
    result[i] = canonical_fold(lanes);
  }
  narrow(result.data(), k, out, 0);
}

}  // namespace

TweStatus norm_fwd(const NormFwdArgs& a) {
  ScopedIeeeSubnormals ieee;
  const int64_t k = a.cols;
  std::vector<float> gain, beta(static_cast<size_t>(k), 0.0f);
  if (a.gamma) gain = gains(a.gamma, k, a.zero_centered_gamma);
  if (a.beta) widen(a.beta, 0, k, beta.data());
  parallel_for(a.rows, a.rows * k, [&](int64_t begin, int64_t end) {
    forward_rows(a, gain.data(), beta.data(), begin, end);
  });
  return kTweSuccess;
}

TweStatus norm_fwd_quantized(const NormFwdArgs& a, const TweNormQuantize& q) {
  ScopedIeeeSubnormals ieee;
  const int64_t k = a.cols, r_total = a.rows;
  std::vector<float> gain, beta(static_cast<size_t>(k), 0.0f);
  if (a.gamma) gain = gains(a.gamma, k, a.zero_centered_gamma);
  if (a.beta) widen(a.beta, 0, k, beta.data());
  const TweQuantizedTensor& o = *q.output;
  if (q.mode == kTweNormQuantizeMXFP8) {
    // Per 32-row block: the norm's rows, then quantize_mxfp8 of just that block while its y is
    // in cache. MXFP8 blocks never cross a 32-row block (1D or 2D), so each block's bytes are
    // those the whole-tensor quantize writes; the scale padding is zeroed here once.
    const bool row = present(&o.rowwise_data), col = present(&o.columnwise_data);
    const int64_t row_stride = row ? o.rowwise_scale_inv.shape[o.rowwise_scale_inv.ndim - 1] : 0;
    const int64_t col_stride = col ? o.columnwise_scale_inv.shape[o.columnwise_scale_inv.ndim - 1] : 0;
    if (row) std::memset(o.rowwise_scale_inv.data, 0, static_cast<size_t>(numel(o.rowwise_scale_inv)));
    if (col) std::memset(o.columnwise_scale_inv.data, 0, static_cast<size_t>(numel(o.columnwise_scale_inv)));
    std::atomic<int> status{kTweSuccess};
    parallel_for(r_total / 32, r_total * k, [&](int64_t block_begin, int64_t block_end) {
      for (int64_t b = block_begin; b < block_end; ++b) {
        const int64_t r0 = b * 32;
        forward_rows(a, gain.data(), beta.data(), r0, r0 + 32);
        const TweTensorView input = view_2d(*a.y, r0 * k, 32, k);
        TweQuantizedTensor out{};
        if (row) {
          out.rowwise_data = view_2d(o.rowwise_data, r0 * k, 32, k);
          out.rowwise_scale_inv = view_2d(o.rowwise_scale_inv, r0 * row_stride, 32, row_stride);
        }
        if (col) {
          out.columnwise_data = view_2d(o.columnwise_data, r0 * k, 32, k);
          out.columnwise_scale_inv = view_2d(o.columnwise_scale_inv, b * col_stride, 1, col_stride);
        }
        const QuantizeArgs block{&input, nullptr, nullptr, &out, q.params, 32, k, a.stream};
        const TweStatus st = quantize_mxfp8(block);
        if (st) status.store(st);
      }
    });
    return static_cast<TweStatus>(status.load());
  }
  // Per-tensor FP8: the amax of y taken while the norm writes it, then one cast pass.
  std::vector<uint32_t> keys(static_cast<size_t>(r_total), 0u);
  parallel_for(r_total, r_total * k, [&](int64_t begin, int64_t end) {
    forward_rows(a, gain.data(), beta.data(), begin, end, keys.data());
  });
  uint32_t key = 0;
  for (uint32_t v : keys) key = v > key ? v : key;
  const TweTensorView* scale = q.mode == kTweNormQuantizeFP8Delayed ? q.scale : nullptr;
  const QuantizeArgs qa{a.y, scale, nullptr, q.output, q.params, r_total, k, a.stream};
  return quantize_fp8_per_tensor_with_amax(qa, numerics::bits_to_float(key));
}

TweStatus norm_bwd(const NormBwdArgs& a) {
  ScopedIeeeSubnormals ieee;
  const int64_t k = a.cols, r_total = a.rows;
  std::vector<float> gain;
  if (a.gamma) gain = gains(a.gamma, k, a.zero_centered_gamma);
  const bool params = a.dgamma != nullptr;
  std::vector<float> dg(params ? static_cast<size_t>(kSumLanes * k) : 0, 0.0f);
  std::vector<float> db(a.dbeta ? static_cast<size_t>(kSumLanes * k) : 0, 0.0f);
  // Lane l owns rows l, l+32, ... in order: its dγ / dβ partials are sequential in the row index.
  const int64_t lanes = std::min<int64_t>(kSumLanes, r_total);
  parallel_for(lanes, r_total * k, [&](int64_t lane_begin, int64_t lane_end) {
    std::vector<float> x(static_cast<size_t>(k)), dy(static_cast<size_t>(k)), xhat(static_cast<size_t>(k)),
        ghat(static_cast<size_t>(k));
    for (int64_t lane = lane_begin; lane < lane_end; ++lane) {
      float* dg_lane = params ? dg.data() + lane * k : nullptr;
      float* db_lane = a.dbeta ? db.data() + lane * k : nullptr;
      for (int64_t r = lane; r < r_total; r += kSumLanes) {
        backward_row(a, gain.data(), r, x.data(), dy.data(), xhat.data(), ghat.data(), dg_lane, db_lane);
      }
    }
  });
  if (params) fold_columns(dg, k, a.dgamma);
  if (a.dbeta) fold_columns(db, k, a.dbeta);
  return kTweSuccess;
}

}  // namespace cpu
}  // namespace twe
