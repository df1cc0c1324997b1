// C ABI of the bias family: argument checks, then dispatch to the CPU or CUDA kernels.
#include <string>

#include "internal/bias.h"

namespace twe {
namespace {

TweStatus check_high_precision(const TweTensorView* v, const char* name) {
  if (v == nullptr || (v->data == nullptr && numel(*v) != 0)) {
    return fail(kTweInvalidArgument, std::string(name) + " is missing");
  }
  if (v->ndim < 1 || v->ndim > TWE_MAX_DIMS) return fail(kTweInvalidArgument, std::string(name) + " must have rank >= 1");
  if (!is_high_precision(v->dtype)) {
    return fail(kTweInvalidArgument, std::string(name) + " must be float32, bfloat16 or float16, got " +
                                         dtype_name(v->dtype));
  }
  return kTweSuccess;
}

TweStatus run(const BiasArgs& args, TweDevice dev) {
  if (args.rows * args.cols == 0) return succeed();
  TweStatus st = run_on_device(dev, args, TWE_DEVICE_FNS(bias_elementwise));
  return st ? st : succeed();
}

}  // namespace
}  // namespace twe

using namespace twe;

extern "C" {

TweStatus twe_bias_add(const TweTensorView* x, const TweTensorView* bias, TweTensorView* y, void* stream) {
  TweStatus st = check_high_precision(x, "x");
  if (st || (st = check_high_precision(bias, "bias"))) return st;
  const TweDevice dev = x->device;
  const int64_t r = rows(*x), k = cols(*x);
  if ((st = check_view_allow_empty(bias, "bias", bias->dtype, -1, k, dev))) return st;
  if (bias->ndim != 1) return fail(kTweInvalidArgument, "bias must be 1-D");
  if ((st = check_view_allow_empty(y, "y", x->dtype, r, k, dev))) return st;
  return run(BiasArgs{x, bias, y, BiasOp::kAddBias, 0.0f, r, k, stream}, dev);
}

TweStatus twe_bias_add_residual(const TweTensorView* x, const TweTensorView* y, TweTensorView* z, void* stream) {
  TweStatus st = check_high_precision(x, "x");
  if (st || (st = check_high_precision(y, "y"))) return st;
  const TweDevice dev = x->device;
  const int64_t r = rows(*x), k = cols(*x);
  if ((st = check_view_allow_empty(y, "y", y->dtype, r, k, dev))) return st;
  if ((st = check_view_allow_empty(z, "z", x->dtype, r, k, dev))) return st;
  return run(BiasArgs{x, y, z, BiasOp::kAddResidual, 0.0f, r, k, stream}, dev);
}

TweStatus twe_bias_scale(const TweTensorView* x, TweTensorView* y, const TweScaleParams* params, void* stream) {
  if (!params) return fail(kTweInvalidArgument, "params must not be NULL");
  TweStatus st = check_high_precision(x, "x");
  if (st) return st;
  const TweDevice dev = x->device;
  const int64_t r = rows(*x), k = cols(*x);
  if ((st = check_view_allow_empty(y, "y", x->dtype, r, k, dev))) return st;
  return run(BiasArgs{x, nullptr, y, BiasOp::kScale, params->c, r, k, stream}, dev);
}

TweStatus twe_bias_grad(const TweTensorView* dy, TweTensorView* dbias, void* stream) {
  TweStatus st = check_high_precision(dy, "dy");
  if (st || (st = check_high_precision(dbias, "dbias"))) return st;
  const TweDevice dev = dy->device;
  const int64_t r = rows(*dy), k = cols(*dy);
  if ((st = check_view_allow_empty(dbias, "dbias", dbias->dtype, -1, k, dev))) return st;
  if (k == 0) return succeed();
  BiasArgs args{dy, nullptr, dbias, BiasOp::kAddBias, 0.0f, r, k, stream};
  st = run_on_device(dev, args, TWE_DEVICE_FNS(bias_grad));
  return st ? st : succeed();
}

TweStatus twe_bias_grad_grouped(const TweTensorView* dy, const TweTensorView* m_splits, TweTensorView* dbias,
                                void* stream) {
  TweStatus st = check_high_precision(dy, "dy");
  if (st || (st = check_high_precision(dbias, "dbias"))) return st;
  if (!present(m_splits) || m_splits->dtype != kTweInt32 || m_splits->ndim != 1) {
    return fail(kTweInvalidArgument, "m_splits must be a 1-D int32 tensor");
  }
  if (dy->device != kTweCPU || m_splits->device != kTweCPU || dbias->device != kTweCPU) {
    return fail(kTweUnsupported, "the grouped bias gradient reads m_splits on the host: CPU tensors only");
  }
  const int64_t r = rows(*dy), k = cols(*dy), groups = m_splits->shape[0];
  if ((st = check_view_allow_empty(dbias, "dbias", dbias->dtype, groups, k, kTweCPU))) return st;
  const int32_t* splits = static_cast<const int32_t*>(m_splits->data);
  const int64_t dy_bytes = element_size(dy->dtype), db_bytes = element_size(dbias->dtype);
  int64_t start = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t size = splits[g] > 0 ? splits[g] : 0;
    const int64_t begin = start < r ? start : r, end = start + size < r ? start + size : r;
    start += size;
    TweTensorView group_dy{};  // rows [begin, end) of dy as (end - begin, K)
    group_dy.data = static_cast<char*>(dy->data) + begin * k * dy_bytes;
    group_dy.dtype = dy->dtype;
    group_dy.device = kTweCPU;
    group_dy.ndim = 2;
    group_dy.shape[0] = end - begin;
    group_dy.shape[1] = k;
    TweTensorView group_db{};  // row g of dbias as (K,)
    group_db.data = static_cast<char*>(dbias->data) + g * k * db_bytes;
    group_db.dtype = dbias->dtype;
    group_db.device = kTweCPU;
    group_db.ndim = 1;
    group_db.shape[0] = k;
    if ((st = twe_bias_grad(&group_dy, &group_db, stream))) return st;
  }
  return succeed();
}

}  // extern "C"
