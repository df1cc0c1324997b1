#ifndef TWE_SIMD_LANES_PASS
// CPU kernels of the norm family: loops and memory movement only. Row reductions are
// numerics::canonical_sum; column sums (dγ, dβ) run lane l over rows l, l+32, ... and end in
// numerics::canonical_fold, so they are Σc over the row index, the order one CUDA warp uses.
// Row math runs in W-lane vectors (internal/simd.h: AVX-512 or AVX2, picked at run time) or in the
// scalar loops below; the vector rows perform the scalar rows' operations lane by lane (the 32
// canonical lanes are 32/W registers), so every variant writes the same bytes. Row scratch is
// padded to a multiple of 32 floats so vector loops run whole registers; padding lanes never
// reach an output or a sum.
#include <algorithm>
#include <cstring>
#include <vector>

#include "internal/cpu.h"
#include "internal/norm.h"
#include "internal/quantize.h"
#include "internal/quantize_rows.h"
#include "internal/simd.h"

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

/*! Row scratch length: k rounded up to the 32 canonical lanes. */
int64_t padded(int64_t k) { return round_up(k, numerics::kSumLanes); }

/*! The gain g' of every column: γ, or fl(1 + γ) with zero-centered gamma (padded with zeros). */
std::vector<float> gains(const TweTensorView* gamma, int64_t k, bool zero_centered_gamma) {
  std::vector<float> g(static_cast<size_t>(padded(k)), 0.0f);
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

/*! Rows begin .. end - 1 of the forward, scalar; with `amax_key`, also the max amax_key of every
 *  y element written (per row into amax_key[r]). */
void forward_rows_scalar(const NormFwdArgs& a, const float* gain, const float* beta, int64_t begin, int64_t end,
                         uint32_t* amax_key) {
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

/*! dx of row r, scalar; adds fl(dy · x̂) and dy of the row into the lane partials dg / db (when given). */
void backward_row_scalar(const NormBwdArgs& a, const float* gain, int64_t r, float* x, float* dy, float* xhat,
                         float* ghat, float* dg, float* db) {
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

}  // namespace
}  // namespace cpu
}  // namespace twe

// The vector rows (the #else part below), once per x86 vector ISA.
#define TWE_SIMD_LANES_FILE "cpu/norm.cc"
#include "internal/simd_foreach.h"

namespace twe {
namespace cpu {
namespace {

/*! Rows begin .. end - 1 of the forward on the widest variant (simd::elementwise_isa()); with
 *  `amax_key`, also the max amax_key of every y element written (per row into amax_key[r]). */
void forward_rows(const NormFwdArgs& a, const float* gain, const float* beta, int64_t begin, int64_t end,
                  uint32_t* amax_key = nullptr) {
#if defined(TWE_SIMD_X86)
  const simd::Isa isa = simd::elementwise_isa();
  if (isa != simd::Isa::kScalar) {
    const size_t kp = static_cast<size_t>(padded(a.cols));
    std::vector<float> x(kp, 0.0f);
    if (isa == simd::Isa::kAvx512) avx512::forward_rows(a, gain, beta, begin, end, amax_key, x.data());
    else avx2::forward_rows(a, gain, beta, begin, end, amax_key, x.data());
    return;
  }
#endif
  forward_rows_scalar(a, gain, beta, begin, end, amax_key);
}

/*! Backward rows of lanes lane_begin .. lane_end - 1 (lane l: rows l, l+32, ... in order), adding
 *  into the lane partials dg / db (stride padded(k); nullptr when absent). */
void backward_lanes(const NormBwdArgs& a, const float* gain, int64_t lane_begin, int64_t lane_end, float* dg,
                    float* db) {
  const int64_t k = a.cols, kp = padded(k);
  std::vector<float> scratch(static_cast<size_t>(4 * kp), 0.0f);
  std::vector<float> unused(dg ? 0 : static_cast<size_t>(kp), 0.0f);  // dγ partials of L2Normalization
#if defined(TWE_SIMD_X86)
  const simd::Isa isa = simd::elementwise_isa();
  if (isa != simd::Isa::kScalar) {
    for (int64_t lane = lane_begin; lane < lane_end; ++lane) {
      float* dg_lane = dg ? dg + lane * kp : unused.data();
      float* db_lane = db ? db + lane * kp : nullptr;
      if (isa == simd::Isa::kAvx512) avx512::backward_lane(a, gain, lane, scratch.data(), dg_lane, db_lane);
      else avx2::backward_lane(a, gain, lane, scratch.data(), dg_lane, db_lane);
    }
    return;
  }
#endif
  float* s = scratch.data();
  for (int64_t lane = lane_begin; lane < lane_end; ++lane) {
    float* dg_lane = dg ? dg + lane * kp : unused.data();
    float* db_lane = db ? db + lane * kp : nullptr;
    for (int64_t r = lane; r < a.rows; r += kSumLanes) {
      backward_row_scalar(a, gain, r, s, s + kp, s + 2 * kp, s + 3 * kp, dg_lane, db_lane);
    }
  }
}

/*! out[i] = canonical_fold of the 32 lane partials of column i (lane stride padded(k)), rounded
 *  to out's dtype. */
void fold_columns(const std::vector<float>& partials, int64_t k, TweTensorView* out) {
  const int64_t kp = padded(k);
  std::vector<float> result(static_cast<size_t>(k));
  float lanes[kSumLanes];
  for (int64_t i = 0; i < k; ++i) {
    for (int l = 0; l < kSumLanes; ++l) lanes[l] = partials[static_cast<size_t>(l * kp + i)];
    result[i] = canonical_fold(lanes);
  }
  narrow(result.data(), k, out, 0);
}

}  // namespace

TweStatus norm_fwd(const NormFwdArgs& a) {
  ScopedIeeeSubnormals ieee;
  const int64_t k = a.cols;
  std::vector<float> gain, beta(static_cast<size_t>(padded(k)), 0.0f);
  if (a.gamma) gain = gains(a.gamma, k, a.zero_centered_gamma);
  if (a.beta) widen(a.beta, 0, k, beta.data());
  advise_view(*a.y);
  parallel_for(a.rows, a.rows * k, [&](int64_t begin, int64_t end) {
    forward_rows(a, gain.data(), beta.data(), begin, end);
  });
  return kTweSuccess;
}

TweStatus norm_fwd_quantized(const NormFwdArgs& a, const TweNormQuantize& q) {
  ScopedIeeeSubnormals ieee;
  const int64_t k = a.cols, r_total = a.rows;
  std::vector<float> gain, beta(static_cast<size_t>(padded(k)), 0.0f);
  if (a.gamma) gain = gains(a.gamma, k, a.zero_centered_gamma);
  if (a.beta) widen(a.beta, 0, k, beta.data());
  const int64_t work = r_total * k;
  if (q.mode == kTweNormQuantizeMXFP8) {
    return quantize_mxfp8_by_row_blocks(*a.y, *q.output, q.params, r_total, k, work, a.stream,
                                        [&](int64_t r0, int64_t r1) { forward_rows(a, gain.data(), beta.data(), r0, r1); });
  }
  // Per-tensor FP8: the amax of y taken while the norm writes it, then one cast pass.
  const TweTensorView* scale = q.mode == kTweNormQuantizeFP8Delayed ? q.scale : nullptr;
  return quantize_fp8_per_tensor_by_rows(*a.y, scale, q.output, q.params, r_total, k, work, a.stream,
                                         [&](int64_t r0, int64_t r1, uint32_t* keys) {
                                           forward_rows(a, gain.data(), beta.data(), r0, r1, keys);
                                         });
}

TweStatus norm_bwd(const NormBwdArgs& a) {
  ScopedIeeeSubnormals ieee;
  const int64_t k = a.cols, r_total = a.rows, kp = padded(k);
  std::vector<float> gain;
  if (a.gamma) gain = gains(a.gamma, k, a.zero_centered_gamma);
  const bool params = a.dgamma != nullptr;
  std::vector<float> dg(params ? static_cast<size_t>(kSumLanes * kp) : 0, 0.0f);
  std::vector<float> db(a.dbeta ? static_cast<size_t>(kSumLanes * kp) : 0, 0.0f);
  // Lane l owns rows l, l+32, ... in order: its dγ / dβ partials are sequential in the row index.
  const int64_t lanes = std::min<int64_t>(kSumLanes, r_total);
  advise_view(*a.dx);
  parallel_for(lanes, r_total * k, [&](int64_t lane_begin, int64_t lane_end) {
    backward_lanes(a, gain.data(), lane_begin, lane_end, params ? dg.data() : nullptr,
                   a.dbeta ? db.data() : nullptr);
  });
  if (params) fold_columns(dg, k, a.dgamma);
  if (a.dbeta) fold_columns(db, k, a.dbeta);
  return kTweSuccess;
}

}  // namespace cpu
}  // namespace twe

#else  // TWE_SIMD_LANES_PASS: the vector rows for ISA TWE_SIMD_NS (internal/simd_foreach.h)

namespace twe {
namespace cpu {
namespace TWE_SIMD_NS {
namespace {

/*! dst[0:n] = src[0:n] widened to fp32 (whole vectors, then a scalar tail). */
template <typename T>
TWE_SIMD_INLINE void widen_typed(const T* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + W <= n; i += W) store(dst + i, load_float(src + i));
  for (; i < n; ++i) dst[i] = to_float(src[i]);
}

TWE_SIMD_INLINE void widen(const TweTensorView* v, int64_t offset, int64_t n, float* dst) {
  switch (v->dtype) {
    case kTweFloat32: return widen_typed(static_cast<const float*>(v->data) + offset, n, dst);
    case kTweBFloat16: return widen_typed(static_cast<const BFloat16*>(v->data) + offset, n, dst);
    default: return widen_typed(static_cast<const Float16*>(v->data) + offset, n, dst);
  }
}

template <typename T, typename Value>
TWE_SIMD_INLINE void write_typed(T* dst, int64_t n, Value value) {
  int64_t i = 0;
  for (; i + W <= n; i += W) store_rounded(dst + i, value(i));
  if (i < n) {
    float tail[W];
    store(tail, value(i));
    for (int64_t j = 0; i + j < n; ++j) dst[i + j] = FromFloat<T>::apply(tail[j]);
  }
}

/*! Elements offset .. offset + n - 1 of view v = value(i) rounded to v's dtype (write_typed); with
 *  `key`, also *key = the max amax_key of the rounded elements. */
template <typename Value>
TWE_SIMD_INLINE void write_output(TweTensorView* v, int64_t offset, int64_t n, uint32_t* key, Value value) {
  switch (v->dtype) {
    case kTweFloat32: {
      float* dst = static_cast<float*>(v->data) + offset;
      write_typed(dst, n, value);
      if (key) *key = amax_key_bits(dst, n);
      return;
    }
    case kTweBFloat16: {
      BFloat16* dst = static_cast<BFloat16*>(v->data) + offset;
      write_typed(dst, n, value);
      if (key) *key = amax_key_bits(dst, n);
      return;
    }
    default: {
      Float16* dst = static_cast<Float16*>(v->data) + offset;
      write_typed(dst, n, value);
      if (key) *key = amax_key_bits(dst, n);
      return;
    }
  }
}

/*! forward_rows_scalar's rows in W-lane vectors, y rounded and stored as it is computed; x:
 *  padded(k) floats of scratch. */
void forward_rows(const NormFwdArgs& a, const float* gain, const float* beta, int64_t begin, int64_t end,
                  uint32_t* amax_key, float* x) {
  const int64_t k = a.cols;
  float* mu_out = a.mu ? static_cast<float*>(a.mu->data) : nullptr;
  float* rstd_out = static_cast<float*>(a.rstd->data);
  for (int64_t r = begin; r < end; ++r) {
    widen(a.x, r * k, k, x);
    uint32_t* key = amax_key ? amax_key + r : nullptr;
    float rstd;
    switch (a.kind) {
      case NormKind::kLayerNorm: {
        const float mu = numerics::norm_mean(
            canonical_sum(k, [x](int64_t i) { return load<F>(x + i); }), k);
        const float var = numerics::norm_mean(canonical_sum(k, [x, mu](int64_t i) {
                                                const F d = load<F>(x + i) - mu;
                                                return d * d;
                                              }), k);
        rstd = numerics::norm_rstd(var, a.eps);
        write_output(a.y, r * k, k, key, [x, mu, rstd, gain, beta](int64_t i) {
          const F d = load<F>(x + i) - mu;  // layernorm_xhat, then layernorm_output
          const F xhat = d * rstd;
          const F scaled = xhat * load<F>(gain + i);
          return scaled + load<F>(beta + i);
        });
        mu_out[r] = mu;
        break;
      }
      case NormKind::kRMSNorm: {
        const float ms = numerics::norm_mean(canonical_sum(k, [x](int64_t i) {
                                               const F v = load<F>(x + i);
                                               return v * v;
                                             }), k);
        rstd = numerics::norm_rstd(ms, a.eps);
        write_output(a.y, r * k, k, key, [x, rstd, gain](int64_t i) {
          const F xhat = load<F>(x + i) * rstd;  // rmsnorm_output
          return xhat * load<F>(gain + i);
        });
        break;
      }
      default: {
        const float sum_sq = canonical_sum(k, [x](int64_t i) {
          const F v = load<F>(x + i);
          return v * v;
        });
        rstd = numerics::norm_rstd(sum_sq, a.eps);
        write_output(a.y, r * k, k, key, [x, rstd](int64_t i) { return load<F>(x + i) * rstd; });
        break;
      }
    }
    rstd_out[r] = rstd;
  }
}

/*! backward_row_scalar in W-lane vectors; scratch and dg / db hold padded(k) floats. */
TWE_SIMD_INLINE void backward_row(const NormBwdArgs& a, const float* gain, int64_t r, float* x, float* dy, float* xhat,
                                  float* ghat, float* dg, float* db) {
  const int64_t k = a.cols;
  widen(a.x, r * k, k, x);
  widen(a.dy, r * k, k, dy);
  const float rstd = static_cast<const float*>(a.rstd->data)[r];
  switch (a.kind) {
    case NormKind::kLayerNorm:
    case NormKind::kRMSNorm: {
      const bool layernorm = a.kind == NormKind::kLayerNorm;
      const float mu = layernorm ? static_cast<const float*>(a.mu->data)[r] : 0.0f;
      for (int64_t i = 0; i < k; i += W) {
        const F xv = load<F>(x + i);
        const F xh = layernorm ? (xv - mu) * rstd : xv * rstd;
        store(xhat + i, xh);
        store(ghat + i, load<F>(dy + i) * load<F>(gain + i));
      }
      const float b = numerics::norm_mean(canonical_sum(k, [xhat, ghat](int64_t i) {
                                            return load<F>(ghat + i) * load<F>(xhat + i);
                                          }), k);
      if (layernorm) {
        const float mean = numerics::norm_mean(
            canonical_sum(k, [ghat](int64_t i) { return load<F>(ghat + i); }), k);
        write_output(a.dx, r * k, k, nullptr, [ghat, xhat, mean, b, rstd](int64_t i) {  // layernorm_dx
          const F centered = load<F>(ghat + i) - mean;
          const F projection = load<F>(xhat + i) * b;
          const F diff = centered - projection;
          return rstd * diff;
        });
      } else {
        write_output(a.dx, r * k, k, nullptr, [ghat, xhat, b, rstd](int64_t i) {  // rmsnorm_dx
          const F projection = load<F>(xhat + i) * b;
          const F diff = load<F>(ghat + i) - projection;
          return rstd * diff;
        });
      }
      for (int64_t i = 0; i < k; i += W) {
        const F dyv = load<F>(dy + i);
        store(dg + i, load<F>(dg + i) + dyv * load<F>(xhat + i));
        if (db) store(db + i, load<F>(db + i) + dyv);
      }
      break;
    }
    default: {
      float* y = xhat;
      for (int64_t i = 0; i < k; i += W) store(y + i, load<F>(x + i) * rstd);
      const float s = canonical_sum(k, [dy, y](int64_t i) {
        return load<F>(dy + i) * load<F>(y + i);
      });
      write_output(a.dx, r * k, k, nullptr, [y, dy, s, rstd](int64_t i) {  // l2norm_dx
        const F yv = load<F>(y + i);
        const F projection = yv * s;
        const F diff = load<F>(dy + i) - projection;
        return rstd * diff;
      });
      break;
    }
  }
}

/*! Rows of one backward lane: r = lane, lane + 32, ... (the scalar order). */
void backward_lane(const NormBwdArgs& a, const float* gain, int64_t lane, float* scratch, float* dg,
                                   float* db) {
  const int64_t kp = padded(a.cols);
  for (int64_t r = lane; r < a.rows; r += numerics::kSumLanes) {
    backward_row(a, gain, r, scratch, scratch + kp, scratch + 2 * kp, scratch + 3 * kp, dg, db);
  }
}

}  // namespace
}  // namespace TWE_SIMD_NS
}  // namespace cpu
}  // namespace twe

#endif  // TWE_SIMD_LANES_PASS
