// Validated arguments of the activation family and the per-device kernel entry points.
#ifndef TWINENGINE_INTERNAL_ACTIVATION_H_
#define TWINENGINE_INTERNAL_ACTIVATION_H_

#include "internal/common.h"
#include "twinengine/activation.h"
#include "twinengine/quantize.h"

namespace twe {

/*! One activation call after the ABI layer checked every view. x is (rows, cols); gated kinds
 *  read a = x[:, :cols/2], b = x[:, cols/2:] and their output / dy has cols/2 columns. */
struct ActivationArgs {
  const TweTensorView* x;
  const TweTensorView* dy;  // backward only
  TweTensorView* out;       // y (forward) or dx (backward)
  TweTensorView* dbias;     // backward with the bias gradient fused: Σc over rows of dx, else nullptr
  numerics::Activation kind;
  float limit;
  float alpha;
  int64_t rows;
  int64_t cols;
  void* stream;
};

#define TWE_ACTIVATION_KERNELS(NS)                              \
  namespace NS {                                                \
  TweStatus activation_forward(const ActivationArgs& args);     \
  TweStatus activation_backward(const ActivationArgs& args);    \
  }

/*! The quantization of a fused CPU activation (after the quantize family's checks on its
 *  output): mode kTweScalingFP8Current / FP8Delayed (`scale`) / MXFP8. */
struct TweActivationQuantize {
  TweScalingMode mode;
  const TweTensorView* scale;
  TweQuantizedTensor* output;
  TweQuantizeParams params;
};

namespace cpu {
/*! CPU only: dx and dbias = Σc over rows of dx (as stored), one pass over x and dy. */
TweStatus activation_backward_dbias(const ActivationArgs& args);
/*! CPU only: activation_forward fused with the quantization of y — MXFP8 per 32-row block while
 *  the block is in cache, per-tensor FP8 with y's amax taken as each row is written. Same bytes
 *  as activation_forward followed by the quantize kernel. */
TweStatus activation_forward_quantized(const ActivationArgs& args, const TweActivationQuantize& quantize);
/*! CPU only: activation_backward_dbias fused with the per-tensor FP8 quantization of dx (mode
 *  FP8Current / FP8Delayed): dx's amax taken as each row is stored, then one cast pass. Same bytes
 *  as activation_backward_dbias followed by the quantize kernel. */
TweStatus activation_backward_dbias_quantized(const ActivationArgs& args, const TweActivationQuantize& quantize);
}

TWE_ACTIVATION_KERNELS(cpu)
#ifdef TWE_WITH_CUDA
TWE_ACTIVATION_KERNELS(cuda)
#endif
#undef TWE_ACTIVATION_KERNELS

}  // namespace twe

#endif  // TWINENGINE_INTERNAL_ACTIVATION_H_
