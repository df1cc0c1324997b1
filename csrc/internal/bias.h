// Validated arguments of the bias family and the per-device kernel entry points.
#ifndef TWINENGINE_INTERNAL_BIAS_H_
#define TWINENGINE_INTERNAL_BIAS_H_

#include "internal/common.h"
#include "twinengine/bias.h"

namespace twe {

/*! Which elementwise op a BiasArgs call runs. */
enum class BiasOp { kAddBias, kAddResidual, kScale };

/*! One bias-family call after the ABI layer checked every view. `a` is (rows, cols); `b` is the
 *  bias (cols,) for kAddBias, a same-shape tensor for kAddResidual, unused otherwise. */
struct BiasArgs {
  const TweTensorView* a;
  const TweTensorView* b;
  TweTensorView* out;
  BiasOp op;
  float c;  // kScale
  int64_t rows;
  int64_t cols;
  void* stream;
};

#define TWE_BIAS_KERNELS(NS)                          \
  namespace NS {                                      \
  TweStatus bias_elementwise(const BiasArgs& args);   \
  TweStatus bias_grad(const BiasArgs& args);          \
  }

TWE_BIAS_KERNELS(cpu)
#ifdef TWE_WITH_CUDA
TWE_BIAS_KERNELS(cuda)
#endif
#undef TWE_BIAS_KERNELS

}  // namespace twe

#endif  // TWINENGINE_INTERNAL_BIAS_H_
