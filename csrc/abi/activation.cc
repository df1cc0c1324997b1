// C ABI of the activation family: argument checks, then dispatch to the CPU or CUDA kernels.
// The fused entry points run the activation kernel, then the bias-gradient and quantize
// kernels (twe_bias_grad, twe_quantize) on its output, on the same stream; on the CPU the
// forward quantize (FP8 per-tensor, MXFP8) and the bias gradient run inside the activation pass.
#include <exception>
#include <string>

#include "internal/activation.h"
#include "internal/quantize.h"
#include "twinengine/bias.h"

namespace twe {
namespace {

TweStatus check_params(const TweActivationParams* p) {
  if (!p) return fail(kTweInvalidArgument, "params must not be NULL");
  if (p->kind < kTweActGelu || p->kind > kTweActClampedSwiglu) return fail(kTweInvalidArgument, "unknown activation");
  if (!(p->limit >= 0.0f)) return fail(kTweInvalidArgument, "limit must be >= 0");
  if (numerics::is_nan(p->alpha)) return fail(kTweInvalidArgument, "alpha must not be NaN");
  return kTweSuccess;
}

/*! Checks x (and the output columns of act(x)); fills args.x, rows, cols, kind, limit, alpha. */
TweStatus check_input(const TweTensorView* x, const TweActivationParams* p, ActivationArgs* args, int64_t* out_cols) {
  TweStatus st = check_params(p);
  if (st) return st;
  if (x == nullptr || (x->data == nullptr && numel(*x) != 0)) return fail(kTweInvalidArgument, "x is missing");
  if (x->ndim < 1 || x->ndim > TWE_MAX_DIMS) return fail(kTweInvalidArgument, "x must have rank >= 1");
  if (!is_high_precision(x->dtype)) {
    return fail(kTweInvalidArgument, std::string("x must be float32, bfloat16 or float16, got ") + dtype_name(x->dtype));
  }
  const auto kind = static_cast<numerics::Activation>(p->kind);
  const int64_t k = cols(*x);
  const bool gated = numerics::activation_is_gated(kind);
  if (gated && k % 2 != 0) return fail(kTweInvalidArgument, "a gated activation needs an even last dimension");
  *args = ActivationArgs{x, nullptr, nullptr, nullptr, kind, p->limit, p->alpha, rows(*x), k, nullptr};
  *out_cols = gated ? k / 2 : k;
  return kTweSuccess;
}

TweStatus forward(const TweTensorView* x, TweTensorView* y, const TweActivationParams* p, void* stream) {
  ActivationArgs args;
  int64_t out_cols;
  TweStatus st = check_input(x, p, &args, &out_cols);
  if (st) return st;
  if ((st = check_view_allow_empty(y, "y", x->dtype, args.rows, out_cols, x->device))) return st;
  args.out = y;
  args.stream = stream;
  if (args.rows * args.cols == 0) return kTweSuccess;
  return run_on_device(x->device, args, TWE_DEVICE_FNS(activation_forward));
}

/*! Checks a backward call; `dbias` (optional) is the fused bias gradient (K,) of any high-precision dtype. */
TweStatus check_backward(const TweTensorView* dy, const TweTensorView* x, TweTensorView* dx,
                         const TweActivationParams* p, TweTensorView* dbias, void* stream, ActivationArgs* args) {
  int64_t out_cols;
  TweStatus st = check_input(x, p, args, &out_cols);
  if (st) return st;
  if ((st = check_view_allow_empty(dy, "dy", x->dtype, args->rows, out_cols, x->device))) return st;
  if ((st = check_view_allow_empty(dx, "dx", x->dtype, args->rows, args->cols, x->device))) return st;
  if (dbias != nullptr) {
    if (!is_high_precision(dbias->dtype)) return fail(kTweInvalidArgument, "dbias must be float32, bfloat16 or float16");
    if ((st = check_view_allow_empty(dbias, "dbias", dbias->dtype, -1, args->cols, x->device))) return st;
  }
  args->dy = dy;
  args->out = dx;
  args->dbias = dbias;
  args->stream = stream;
  return kTweSuccess;
}

TweStatus backward(const TweTensorView* dy, const TweTensorView* x, TweTensorView* dx, const TweActivationParams* p,
                   void* stream) {
  ActivationArgs args;
  TweStatus st = check_backward(dy, x, dx, p, nullptr, stream, &args);
  if (st) return st;
  if (args.rows * args.cols == 0) return kTweSuccess;
  return run_on_device(x->device, args, TWE_DEVICE_FNS(activation_backward));
}

/*! On the CPU, the quantizations cpu::activation_forward_quantized fuses into the activation's
 *  pass (after the forward's and the quantize family's own checks on y); kTweSuccess with *fused
 *  false for every other case (twe_quantize then runs on y and gives its own errors). */
TweStatus run_fused_forward_cpu(const TweTensorView* x, const TweTensorView* scale, const TweTensorView* rng,
                                TweTensorView* y, TweQuantizedTensor* output, const TweActivationParams* p,
                                const TweQuantizeParams* qparams, TweScalingMode mode, void* stream, bool* fused) {
  *fused = false;
  if (x == nullptr || x->device != kTweCPU || output == nullptr || qparams == nullptr || present(rng)) return kTweSuccess;
  if (mode != kTweScalingFP8Current && mode != kTweScalingFP8Delayed && mode != kTweScalingMXFP8) return kTweSuccess;
  if (present(scale) && mode != kTweScalingFP8Delayed) return kTweSuccess;
  ActivationArgs args;
  int64_t out_cols;
  TweStatus st = check_input(x, p, &args, &out_cols);
  if (st) return st;
  if ((st = check_view_allow_empty(y, "y", x->dtype, args.rows, out_cols, x->device))) return st;
  if (args.rows * args.cols == 0) return kTweSuccess;
  switch (mode) {
    case kTweScalingFP8Current: st = check_quantize_fp8_current(y, output, qparams); break;
    case kTweScalingFP8Delayed: st = check_quantize_fp8_delayed(y, scale, output, qparams); break;
    default: st = check_quantize_mxfp8(y, output, qparams); break;
  }
  if (st) return st;
  args.out = y;
  args.stream = stream;
  *fused = true;
  try {
    CpuStreamScope scope(stream);
    const TweActivationQuantize q{mode, mode == kTweScalingFP8Delayed ? scale : nullptr, output, *qparams};
    return cpu::activation_forward_quantized(args, q);
  } catch (const std::exception& e) {
    return fail(kTweInternalError, std::string("kernel failed: ") + e.what());
  }
}

}  // namespace
}  // namespace twe

using namespace twe;

extern "C" {

TweStatus twe_activation_forward(const TweTensorView* x, TweTensorView* y, const TweActivationParams* params,
                                 void* stream) {
  const TweStatus st = forward(x, y, params, stream);
  return st ? st : succeed();
}

TweStatus twe_activation_forward_quantize(const TweTensorView* x, const TweTensorView* scale, const TweTensorView* rng,
                                          TweTensorView* y, TweQuantizedTensor* output,
                                          const TweActivationParams* params, const TweQuantizeParams* qparams,
                                          TweScalingMode mode, void* stream) {
  bool fused = false;
  TweStatus st = run_fused_forward_cpu(x, scale, rng, y, output, params, qparams, mode, stream, &fused);
  if (st) return st;
  if (fused) return succeed();
  if ((st = forward(x, y, params, stream))) return st;
  return twe_quantize(y, scale, rng, output, qparams, mode, stream);
}

TweStatus twe_activation_backward(const TweTensorView* dy, const TweTensorView* x, TweTensorView* dx,
                                  const TweActivationParams* params, void* stream) {
  const TweStatus st = backward(dy, x, dx, params, stream);
  return st ? st : succeed();
}

TweStatus twe_activation_backward_dbias(const TweTensorView* dy, const TweTensorView* x, TweTensorView* dx,
                                        TweTensorView* dbias, const TweActivationParams* params, void* stream) {
  // CPU: one kernel computes dx and its canonical column sums (the same bytes as the two kernels
  // below). CUDA: the activation kernel, then the bias-gradient kernel on its output.
  if (x != nullptr && x->device == kTweCPU && dbias != nullptr && dbias->data != nullptr) {
    ActivationArgs args;
    const TweStatus st = check_backward(dy, x, dx, params, dbias, stream, &args);
    if (st) return st;
    const auto no_cuda = [](const ActivationArgs&) {
      return fail(kTweInternalError, "the fused CPU activation backward was dispatched for a CUDA view");
    };
    const TweStatus run = run_on_device(kTweCPU, args, cpu::activation_backward_dbias, no_cuda);
    return run ? run : succeed();
  }
  const TweStatus st = backward(dy, x, dx, params, stream);
  if (st) return st;
  return twe_bias_grad(dx, dbias, stream);
}

TweStatus twe_activation_backward_dbias_quantize(const TweTensorView* dy, const TweTensorView* x,
                                                 const TweTensorView* scale, const TweTensorView* rng,
                                                 TweTensorView* dx, TweTensorView* dbias, TweQuantizedTensor* output,
                                                 const TweActivationParams* params, const TweQuantizeParams* qparams,
                                                 TweScalingMode mode, void* stream) {
  // CPU, per-tensor FP8: dx's amax is taken in the fused dx + dbias pass, then one cast pass.
  const bool per_tensor = mode == kTweScalingFP8Current || mode == kTweScalingFP8Delayed;
  if (x != nullptr && x->device == kTweCPU && present(dbias) && per_tensor && output != nullptr &&
      qparams != nullptr && !present(rng) && (mode == kTweScalingFP8Delayed || !present(scale))) {
    ActivationArgs args;
    TweStatus st = check_backward(dy, x, dx, params, dbias, stream, &args);
    if (st) return st;
    if (args.rows * args.cols != 0) {
      st = mode == kTweScalingFP8Current ? check_quantize_fp8_current(dx, output, qparams)
                                         : check_quantize_fp8_delayed(dx, scale, output, qparams);
      if (st) return st;
      const TweActivationQuantize q{mode, mode == kTweScalingFP8Delayed ? scale : nullptr, output, *qparams};
      const auto run = [&q](const ActivationArgs& a) { return cpu::activation_backward_dbias_quantized(a, q); };
      const auto no_cuda = [](const ActivationArgs&) {
        return fail(kTweInternalError, "the fused CPU activation backward was dispatched for a CUDA view");
      };
      st = run_on_device(kTweCPU, args, run, no_cuda);
      return st ? st : succeed();
    }
  }
  const TweStatus st = twe_activation_backward_dbias(dy, x, dx, dbias, params, stream);
  if (st) return st;
  return twe_quantize(dx, scale, rng, output, qparams, mode, stream);
}

}  // extern "C"
