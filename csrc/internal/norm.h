// Validated arguments of the norm family and the per-device kernel entry points.
#ifndef TWINENGINE_INTERNAL_NORM_H_
#define TWINENGINE_INTERNAL_NORM_H_

#include "internal/common.h"
#include "twinengine/norm.h"

namespace twe {

enum class NormKind { kLayerNorm, kRMSNorm, kL2Norm };

/*! A forward call after the ABI layer checked every view against x's (R, K). Absent views
 *  (gamma / beta / mu for the norms that have none) are nullptr. */
struct NormFwdArgs {
  NormKind kind;
  const TweTensorView* x;
  const TweTensorView* gamma;
  const TweTensorView* beta;
  TweTensorView* y;
  TweTensorView* mu;
  TweTensorView* rstd;
  float eps;
  bool zero_centered_gamma;
  int64_t rows;
  int64_t cols;
  void* stream;
};

/*! A backward call; dgamma / dbeta / mu / gamma are nullptr where the norm has none. */
struct NormBwdArgs {
  NormKind kind;
  const TweTensorView* dy;
  const TweTensorView* x;
  const TweTensorView* mu;
  const TweTensorView* rstd;
  const TweTensorView* gamma;
  TweTensorView* dx;
  TweTensorView* dgamma;
  TweTensorView* dbeta;
  bool zero_centered_gamma;
  int64_t rows;
  int64_t cols;
  void* stream;
};

#define TWE_NORM_KERNELS(NS)                      \
  namespace NS {                                  \
  TweStatus norm_fwd(const NormFwdArgs& args);    \
  TweStatus norm_bwd(const NormBwdArgs& args);    \
  }

TWE_NORM_KERNELS(cpu)

namespace cpu {
/*! norm_fwd fused with the quantization of y (modes MXFP8, FP8 current, FP8 delayed; the ABI
 *  has run the quantize family's checks on y): MXFP8 per 32-row block while the block is in
 *  cache, per-tensor FP8 with y's amax taken in the norm pass. Same bytes as norm_fwd followed
 *  by the quantize kernel. */
TweStatus norm_fwd_quantized(const NormFwdArgs& args, const TweNormQuantize& quantize);
}  // namespace cpu
#ifdef TWE_WITH_CUDA
TWE_NORM_KERNELS(cuda)
#endif
#undef TWE_NORM_KERNELS

}  // namespace twe

#endif  // TWINENGINE_INTERNAL_NORM_H_
