// Validated arguments of the dropout family and the per-device kernel entry points.
#ifndef TWINENGINE_INTERNAL_DROPOUT_H_
#define TWINENGINE_INTERNAL_DROPOUT_H_

#include "internal/common.h"
#include "twinengine/dropout.h"

namespace twe {

/*! One dropout call after the ABI layer checked every view: `in` is x (forward) or dy
 *  (backward), `out` y or dx, `mask` written (forward) or read (backward). */
struct DropoutArgs {
  const TweTensorView* in;
  const TweTensorView* rng;  // forward only
  TweTensorView* out;
  TweTensorView* mask;
  float p;
  int64_t n;  // elements
  void* stream;
};

#define TWE_DROPOUT_KERNELS(NS)                              \
  namespace NS {                                             \
  TweStatus dropout_forward(const DropoutArgs& args);        \
  TweStatus dropout_backward(const DropoutArgs& args);       \
  }

TWE_DROPOUT_KERNELS(cpu)
#ifdef TWE_WITH_CUDA
TWE_DROPOUT_KERNELS(cuda)
#endif
#undef TWE_DROPOUT_KERNELS

}  // namespace twe

#endif  // TWINENGINE_INTERNAL_DROPOUT_H_
