// C ABI of the dropout family: argument checks, then dispatch to the CPU or CUDA kernels.
#include <string>

#include "internal/dropout.h"

namespace twe {
namespace {

TweStatus check_data(const TweTensorView* v, const char* name) {
  if (v == nullptr || (v->data == nullptr && numel(*v) != 0)) {
    return fail(kTweInvalidArgument, std::string(name) + " is missing");
  }
  if (v->ndim < 0 || v->ndim > TWE_MAX_DIMS) return fail(kTweInvalidArgument, std::string(name) + " has a bad rank");
  if (!is_high_precision(v->dtype)) {
    return fail(kTweInvalidArgument, std::string(name) + " must be float32, bfloat16 or float16, got " +
                                         dtype_name(v->dtype));
  }
  return kTweSuccess;
}

TweStatus check_p(const TweDropoutParams* params) {
  if (!params) return fail(kTweInvalidArgument, "params must not be NULL");
  if (!(params->p >= 0.0f && params->p < 1.0f)) return fail(kTweInvalidArgument, "p must be in [0, 1)");
  return kTweSuccess;
}

}  // namespace
}  // namespace twe

using namespace twe;

extern "C" {

TweStatus twe_dropout_forward(const TweTensorView* x, const TweTensorView* rng, TweTensorView* y, TweTensorView* mask,
                              const TweDropoutParams* params, void* stream) {
  TweStatus st = check_p(params);
  if (st || (st = check_data(x, "x"))) return st;
  const TweDevice dev = x->device;
  const int64_t n = numel(*x);
  if (!present(rng)) return fail(kTweInvalidArgument, "dropout needs the rng state [seed, offset]");
  if (rng->dtype != kTweUInt32 && rng->dtype != kTweInt32 && rng->dtype != kTweInt64) {
    return fail(kTweInvalidArgument, std::string("rng must have dtype uint32, int32 or int64, got ") +
                                         dtype_name(rng->dtype));
  }
  if ((st = check_view(rng, "rng", rng->dtype, -1, 2, dev))) return st;
  if ((st = check_view_allow_empty(y, "y", x->dtype, -1, n, dev))) return st;
  if ((st = check_view_allow_empty(mask, "mask", kTweUInt8, -1, ceil_div(n, 8), dev))) return st;
  if (n == 0) return succeed();
  DropoutArgs args{x, rng, y, mask, params->p, n, stream};
  st = run_on_device(dev, args, TWE_DEVICE_FNS(dropout_forward));
  return st ? st : succeed();
}

TweStatus twe_dropout_backward(const TweTensorView* dy, const TweTensorView* mask, TweTensorView* dx,
                               const TweDropoutParams* params, void* stream) {
  TweStatus st = check_p(params);
  if (st || (st = check_data(dy, "dy"))) return st;
  const TweDevice dev = dy->device;
  const int64_t n = numel(*dy);
  if ((st = check_view_allow_empty(mask, "mask", kTweUInt8, -1, ceil_div(n, 8), dev))) return st;
  if ((st = check_view_allow_empty(dx, "dx", dy->dtype, -1, n, dev))) return st;
  if (n == 0) return succeed();
  DropoutArgs args{dy, nullptr, dx, const_cast<TweTensorView*>(mask), params->p, n, stream};
  st = run_on_device(dev, args, TWE_DEVICE_FNS(dropout_backward));
  return st ? st : succeed();
}

}  // extern "C"
