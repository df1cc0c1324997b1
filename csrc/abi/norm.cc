// C ABI of the norm family: argument checks, dispatch to the CPU or CUDA kernels, then the fused
// quantization of y through the quantize family's own entry points (same bytes by construction).
// On the CPU, MXFP8 (whose blocks never span more than 32 rows) runs norm and quantize block by
// block of rows, so each block of y is quantized while it is still in cache.
#include <cmath>
#include <string>

#include "internal/cpu.h"
#include "internal/norm.h"

namespace twe {
namespace {

TweStatus check_high_precision(const TweTensorView* v, const char* name) {
  if (!present(v)) return fail(kTweInvalidArgument, std::string(name) + " is missing");
  if (!is_high_precision(v->dtype)) {
    return fail(kTweInvalidArgument, std::string(name) + " must be float32, bfloat16 or float16, got " +
                                         dtype_name(v->dtype));
  }
  return kTweSuccess;
}

/*! x: high precision, rank >= 1, K >= 1 (R may be 0). */
TweStatus check_x(const TweTensorView* x) {
  TweStatus st = check_high_precision(x, "x");
  if (st) return st;
  if (x->ndim < 1) return fail(kTweInvalidArgument, "x must have rank >= 1");
  if (cols(*x) < 1) return fail(kTweInvalidArgument, "x's last dimension (the normalized size) must be >= 1");
  return kTweSuccess;
}

/*! A (K,) parameter of any high-precision dtype on x's device. */
TweStatus check_param(const TweTensorView* p, const char* name, const TweTensorView* x) {
  TweStatus st = check_high_precision(p, name);
  if (st) return st;
  return check_view(p, name, p->dtype, -1, cols(*x), x->device);
}

/*! mu / rstd: fp32 with one element per row of x. */
TweStatus check_row_stat(const TweTensorView* v, const char* name, const TweTensorView* x) {
  return check_view(v, name, kTweFloat32, -1, rows(*x), x->device);
}

/*! An array of x's dtype (or `dtype`) and x's (R, K). */
TweStatus check_like_x(const TweTensorView* v, const char* name, TweDType dtype, const TweTensorView* x) {
  return check_view(v, name, dtype, rows(*x), cols(*x), x->device);
}

TweStatus check_params(const TweNormParams* params, bool uses_eps) {
  if (!params) return fail(kTweInvalidArgument, "params must not be NULL");
  if (uses_eps && !(params->eps >= 0.0f)) return fail(kTweInvalidArgument, "eps must be >= 0 (and not NaN)");
  return kTweSuccess;
}

/*! Quantizes y (already written, rounded to its dtype) as `q` asks. */
TweStatus quantize_output(const TweTensorView* y, const TweNormQuantize* q, void* stream) {
  if (!q || q->mode == kTweNormQuantizeNone) return kTweSuccess;
  if (!q->output) return fail(kTweInvalidArgument, "the fused quantization needs its output tensors");
  if (rows(*y) * cols(*y) == 0) return fail(kTweInvalidArgument, "the fused quantization needs a non-empty x");
  switch (q->mode) {
    case kTweNormQuantizeFP8Current: return twe_quantize_fp8_current(y, q->output, &q->params, stream);
    case kTweNormQuantizeFP8Delayed: return twe_quantize_fp8_delayed(y, q->scale, q->output, &q->params, stream);
    case kTweNormQuantizeMXFP8: return twe_quantize_mxfp8(y, q->output, &q->params, stream);
    case kTweNormQuantizeFP8Block: return twe_quantize_fp8_block(y, q->output, &q->params, stream);
    case kTweNormQuantizeNVFP4: return twe_quantize_nvfp4(y, q->rng, q->output, &q->params, stream);
    default: return fail(kTweInvalidArgument, "unknown fused quantization mode");
  }
}

/*! Rows [row0, row0 + nrows) of `v` flattened to 2-D (rows, cols), as a 2-D view. */
TweTensorView row_block(const TweTensorView& v, int64_t row0, int64_t nrows) {
  TweTensorView out = v;
  const int64_t width = cols(v);
  out.ndim = 2;
  out.shape[0] = nrows;
  out.shape[1] = width;
  out.data = static_cast<char*>(v.data) + row0 * width * element_size(v.dtype);
  return out;
}

/*! Elements [first, first + n) of `v` (any shape, contiguous), as a 1-D view. */
TweTensorView flat_block(const TweTensorView& v, int64_t first, int64_t n) {
  TweTensorView out = v;
  out.ndim = 1;
  out.shape[0] = n;
  out.data = static_cast<char*>(v.data) + first * element_size(v.dtype);
  return out;
}

/*! The MXFP8 outputs of y's rows [row0, row0 + nrows), row0 a multiple of 128: data rows, and the
 *  scale rows of those rows (rowwise: one per row, columnwise: one per 32 rows) plus, for the last
 *  block, the padding rows after them — exactly what the whole-tensor call writes there. */
TweQuantizedTensor mxfp8_block(const TweQuantizedTensor& q, int64_t row0, int64_t nrows) {
  TweQuantizedTensor out{};
  if (present(&q.rowwise_data)) {
    out.rowwise_data = row_block(q.rowwise_data, row0, nrows);
    out.rowwise_scale_inv = row_block(q.rowwise_scale_inv, row0, round_up(nrows, 128));
  }
  if (present(&q.columnwise_data)) {
    out.columnwise_data = row_block(q.columnwise_data, row0, nrows);
    out.columnwise_scale_inv = row_block(q.columnwise_scale_inv, row0 / 32, round_up(nrows / 32, 4));
  }
  return out;
}

/*! Whether the MXFP8 outputs have the whole tensor's layout (else the whole-tensor call reports it). */
bool mxfp8_outputs_match(const TweQuantizedTensor& q, int64_t r, int64_t k) {
  auto has = [](const TweTensorView& v, int64_t rows_, int64_t cols_) {
    return present(&v) && v.ndim >= 2 && rows(v) == rows_ && cols(v) == cols_;
  };
  const bool row = present(&q.rowwise_data), col = present(&q.columnwise_data);
  if (!row && !col) return false;
  if (row && !(has(q.rowwise_data, r, k) && has(q.rowwise_scale_inv, round_up(r, 128), round_up(k / 32, 4)))) {
    return false;
  }
  return !col || (has(q.columnwise_data, r, k) && has(q.columnwise_scale_inv, round_up(r / 32, 4), round_up(k, 128)));
}

/*! CPU norm + MXFP8 block by block of rows, each block quantized right after it is normalized (the
 *  bytes of the whole-tensor call: MXFP8 blocks lie within 32 rows). Returns false, doing nothing,
 *  where the whole-tensor path applies (CUDA, other formats, one block, a layout to report). */
bool run_fwd_blocked_mxfp8(const NormFwdArgs& args, const TweNormQuantize* q, TweStatus* status) {
  const int64_t r = args.rows, k = args.cols;
  if (args.x->device != kTweCPU || !q || q->mode != kTweNormQuantizeMXFP8 || r % 32 != 0 || k % 32 != 0) return false;
  const int64_t block = cpu::parallel_block_rows(k, 128);
  if (block >= r || !mxfp8_outputs_match(*q->output, r, k)) return false;
  for (int64_t row0 = 0; row0 < r; row0 += block) {
    const int64_t n = std::min(block, r - row0);
    TweTensorView x = row_block(*args.x, row0, n), y = row_block(*args.y, row0, n);
    TweTensorView rstd = flat_block(*args.rstd, row0, n), mu = args.mu ? flat_block(*args.mu, row0, n) : TweTensorView{};
    NormFwdArgs b = args;
    b.x = &x;
    b.y = &y;
    b.mu = args.mu ? &mu : nullptr;
    b.rstd = &rstd;
    b.rows = n;
    TweQuantizedTensor out = mxfp8_block(*q->output, row0, n);
    if ((*status = run_on_device(kTweCPU, b, TWE_DEVICE_FNS(norm_fwd)))) return true;
    if ((*status = twe_quantize_mxfp8(&y, &out, &q->params, args.stream))) return true;
  }
  *status = succeed();
  return true;
}

TweStatus run_fwd(const NormFwdArgs& args, const TweNormQuantize* quantize) {
  TweStatus st;
  if (run_fwd_blocked_mxfp8(args, quantize, &st)) return st;
  st = run_on_device(args.x->device, args, TWE_DEVICE_FNS(norm_fwd));
  if (st) return st;
  if ((st = quantize_output(args.y, quantize, args.stream))) return st;
  return succeed();
}

}  // namespace
}  // namespace twe

using namespace twe;

extern "C" {

TweStatus twe_norm_layernorm_fwd(const TweTensorView* x, const TweTensorView* gamma, const TweTensorView* beta,
                                 TweTensorView* y, TweTensorView* mu, TweTensorView* rstd,
                                 const TweNormQuantize* quantize, const TweNormParams* params, void* stream) {
  TweStatus st;
  if ((st = check_x(x)) || (st = check_param(gamma, "gamma", x)) || (st = check_param(beta, "beta", x)) ||
      (st = check_like_x(y, "y", x->dtype, x)) || (st = check_row_stat(mu, "mu", x)) ||
      (st = check_row_stat(rstd, "rstd", x)) || (st = check_params(params, true)))
    return st;
  NormFwdArgs args{NormKind::kLayerNorm, x, gamma, beta, y, mu, rstd, params->eps,
                   params->zero_centered_gamma != 0, rows(*x), cols(*x), stream};
  return run_fwd(args, quantize);
}

TweStatus twe_norm_layernorm_bwd(const TweTensorView* dy, const TweTensorView* x, const TweTensorView* mu,
                                 const TweTensorView* rstd, const TweTensorView* gamma, TweTensorView* dx,
                                 TweTensorView* dgamma, TweTensorView* dbeta, const TweNormParams* params,
                                 void* stream) {
  TweStatus st;
  if ((st = check_x(x)) || (st = check_high_precision(dy, "dy")) || (st = check_like_x(dy, "dy", dy->dtype, x)) ||
      (st = check_row_stat(mu, "mu", x)) || (st = check_row_stat(rstd, "rstd", x)) ||
      (st = check_param(gamma, "gamma", x)) || (st = check_like_x(dx, "dx", x->dtype, x)) ||
      (st = check_view(dgamma, "dgamma", gamma->dtype, -1, cols(*x), x->device)) ||
      (st = check_view(dbeta, "dbeta", gamma->dtype, -1, cols(*x), x->device)) || (st = check_params(params, false)))
    return st;
  NormBwdArgs args{NormKind::kLayerNorm, dy, x, mu, rstd, gamma, dx, dgamma, dbeta,
                   params->zero_centered_gamma != 0, rows(*x), cols(*x), stream};
  st = run_on_device(x->device, args, TWE_DEVICE_FNS(norm_bwd));
  return st ? st : succeed();
}

TweStatus twe_norm_rmsnorm_fwd(const TweTensorView* x, const TweTensorView* gamma, TweTensorView* y,
                               TweTensorView* rstd, const TweNormQuantize* quantize, const TweNormParams* params,
                               void* stream) {
  TweStatus st;
  if ((st = check_x(x)) || (st = check_param(gamma, "gamma", x)) || (st = check_like_x(y, "y", x->dtype, x)) ||
      (st = check_row_stat(rstd, "rstd", x)) || (st = check_params(params, true)))
    return st;
  NormFwdArgs args{NormKind::kRMSNorm, x, gamma, nullptr, y, nullptr, rstd, params->eps,
                   params->zero_centered_gamma != 0, rows(*x), cols(*x), stream};
  return run_fwd(args, quantize);
}

TweStatus twe_norm_rmsnorm_bwd(const TweTensorView* dy, const TweTensorView* x, const TweTensorView* rstd,
                               const TweTensorView* gamma, TweTensorView* dx, TweTensorView* dgamma,
                               const TweNormParams* params, void* stream) {
  TweStatus st;
  if ((st = check_x(x)) || (st = check_high_precision(dy, "dy")) || (st = check_like_x(dy, "dy", dy->dtype, x)) ||
      (st = check_row_stat(rstd, "rstd", x)) || (st = check_param(gamma, "gamma", x)) ||
      (st = check_like_x(dx, "dx", x->dtype, x)) ||
      (st = check_view(dgamma, "dgamma", gamma->dtype, -1, cols(*x), x->device)) || (st = check_params(params, false)))
    return st;
  NormBwdArgs args{NormKind::kRMSNorm, dy, x, nullptr, rstd, gamma, dx, dgamma, nullptr,
                   params->zero_centered_gamma != 0, rows(*x), cols(*x), stream};
  st = run_on_device(x->device, args, TWE_DEVICE_FNS(norm_bwd));
  return st ? st : succeed();
}

TweStatus twe_norm_l2norm_fwd(const TweTensorView* x, TweTensorView* y, TweTensorView* rstd,
                              const TweNormQuantize* quantize, const TweNormParams* params, void* stream) {
  TweStatus st;
  if ((st = check_x(x)) || (st = check_like_x(y, "y", x->dtype, x)) || (st = check_row_stat(rstd, "rstd", x)) ||
      (st = check_params(params, true)))
    return st;
  NormFwdArgs args{NormKind::kL2Norm, x, nullptr, nullptr, y, nullptr, rstd, params->eps, false,
                   rows(*x), cols(*x), stream};
  return run_fwd(args, quantize);
}

TweStatus twe_norm_l2norm_bwd(const TweTensorView* dy, const TweTensorView* x, const TweTensorView* rstd,
                              TweTensorView* dx, const TweNormParams* params, void* stream) {
  (void)params;
  TweStatus st;
  if ((st = check_x(x)) || (st = check_high_precision(dy, "dy")) || (st = check_like_x(dy, "dy", dy->dtype, x)) ||
      (st = check_row_stat(rstd, "rstd", x)) || (st = check_like_x(dx, "dx", x->dtype, x)))
    return st;
  NormBwdArgs args{NormKind::kL2Norm, dy, x, nullptr, rstd, nullptr, dx, nullptr, nullptr, false,
                   rows(*x), cols(*x), stream};
  st = run_on_device(x->device, args, TWE_DEVICE_FNS(norm_bwd));
  return st ? st : succeed();
}

}  // extern "C"
