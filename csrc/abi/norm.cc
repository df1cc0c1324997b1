// C ABI of the norm family: argument checks, dispatch to the CPU or CUDA kernels, then the fused
// quantization of y through the quantize family's own entry points (same bytes by construction).
#include <string>

#include <exception>

#include "internal/norm.h"
#include "internal/quantize.h"

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

/*! On the CPU, the quantizations cpu::norm_fwd_quantized fuses into the norm's pass (after the
 *  quantize family's own checks on y); kTweSuccess with *fused false for every other case. */
TweStatus run_fused_cpu(const NormFwdArgs& args, const TweNormQuantize* q, bool* fused) {
  *fused = false;
  if (!q || args.x->device != kTweCPU || args.rows * args.cols == 0 || !q->output) return kTweSuccess;
  TweStatus st;
  switch (q->mode) {
    case kTweNormQuantizeFP8Current: st = check_quantize_fp8_current(args.y, q->output, &q->params); break;
    case kTweNormQuantizeFP8Delayed: st = check_quantize_fp8_delayed(args.y, q->scale, q->output, &q->params); break;
    case kTweNormQuantizeMXFP8: st = check_quantize_mxfp8(args.y, q->output, &q->params); break;
    default: return kTweSuccess;
  }
  if (st) return st;
  *fused = true;
  try {
    CpuStreamScope scope(args.stream);
    return cpu::norm_fwd_quantized(args, *q);
  } catch (const std::exception& e) {
    return fail(kTweInternalError, std::string("kernel failed: ") + e.what());
  }
}

TweStatus run_fwd(const NormFwdArgs& args, const TweNormQuantize* quantize) {
  bool fused = false;
  TweStatus st = run_fused_cpu(args, quantize, &fused);
  if (st) return st;
  if (fused) return succeed();
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
