/*! \file activation.h
 *  \brief Activations, their gradients, and the fusions activation + quantize and
 *         activation-gradient + bias-gradient (+ quantize) (NUMERICS.md §11).
 *
 *  Kinds: GELU (tanh form), QGELU, ReLU, SReLU, SiLU, the gated GEGLU, QGEGLU, ReGLU, SReGLU,
 *  SwiGLU (the last dimension split into [a | b], act(a)·b) and ClampedSwiGLU(limit, alpha).
 *  All math is fp32 on exactly widened inputs, one rounding per written step, with the
 *  portable exp / tanh of twinengine/numerics.h; results are rounded (RNE) to the input's
 *  dtype. Inputs fp32, bf16 or fp16, contiguous, viewed as (R, K) with K the last dimension;
 *  R may be 0. CPU and CUDA produce identical bytes; CUDA kernels run on `stream`.
 */
#ifndef TWINENGINE_ACTIVATION_H_
#define TWINENGINE_ACTIVATION_H_

#include "twinengine/common.h"
#include "twinengine/quantize.h"

#ifdef __cplusplus
extern "C" {
#endif

/*! \brief Activation kind (core/ops/activation.py ACTIVATION_KINDS order). */
typedef enum {
  kTweActGelu = 0,
  kTweActGeglu = 1,
  kTweActQGelu = 2,
  kTweActQGeglu = 3,
  kTweActRelu = 4,
  kTweActReglu = 5,
  kTweActSRelu = 6,
  kTweActSReglu = 7,
  kTweActSilu = 8,
  kTweActSwiglu = 9,
  kTweActClampedSwiglu = 10,
} TweActivationKind;

/*! \brief Activation parameters. */
typedef struct {
  TweActivationKind kind;
  float limit; /*!< ClampedSwiGLU: a' = min(a, limit), b' = clamp(b, -limit, limit); >= 0 */
  float alpha; /*!< ClampedSwiGLU: sigmoid slope */
} TweActivationParams;

/*! \brief y = act(x).
 *  \param[in]  x       (R, K) fp32/bf16/fp16; K even for gated kinds.
 *  \param[out] y       (R, K) or (R, K/2) for gated kinds, x's dtype.
 *  \param[in]  params  kind, limit, alpha.
 *  \param[in]  stream  cudaStream_t for CUDA views, ignored for CPU views.
 */
TweStatus twe_activation_forward(const TweTensorView* x, TweTensorView* y, const TweActivationParams* params,
                                 void* stream);

/*! \brief y = act(x), then y (rounded to x's dtype) quantized by twe_quantize(mode) on the same stream.
 *  \param[in]     x        as twe_activation_forward.
 *  \param[in]     scale    delayed scaling's fp32 (1,) encode scale, else NULL.
 *  \param[in]     rng      NVFP4 stochastic rounding's [seed, offset], else NULL.
 *  \param[out]    y        as twe_activation_forward.
 *  \param[in,out] output   the quantized y, as the quantize function of `mode` describes.
 *  \param[in]     params   activation parameters.
 *  \param[in]     qparams  quantization parameters.
 *  \param[in]     mode     which quantize function runs.
 *  \param[in]     stream   cudaStream_t for CUDA views, ignored for CPU views.
 */
TweStatus twe_activation_forward_quantize(const TweTensorView* x, const TweTensorView* scale, const TweTensorView* rng,
                                          TweTensorView* y, TweQuantizedTensor* output,
                                          const TweActivationParams* params, const TweQuantizeParams* qparams,
                                          TweScalingMode mode, void* stream);

/*! \brief dx = act'(x)·dy (gated: da = act'(a)·dy·b, db = dy·act(a)).
 *  \param[in]  dy      the activation output's shape, x's dtype.
 *  \param[in]  x       the activation input (R, K).
 *  \param[out] dx      (R, K), x's dtype.
 *  \param[in]  params  kind, limit, alpha.
 *  \param[in]  stream  cudaStream_t for CUDA views, ignored for CPU views.
 */
TweStatus twe_activation_backward(const TweTensorView* dy, const TweTensorView* x, TweTensorView* dx,
                                  const TweActivationParams* params, void* stream);

/*! \brief dx as twe_activation_backward and dbias = Σc over rows of dx (the rounded values),
 *         rounded to dbias's dtype (twe_bias_grad).
 *  \param[in]  dy      as twe_activation_backward.
 *  \param[in]  x       as twe_activation_backward.
 *  \param[out] dx      as twe_activation_backward.
 *  \param[out] dbias   (K,) fp32/bf16/fp16.
 *  \param[in]  params  kind, limit, alpha.
 *  \param[in]  stream  cudaStream_t for CUDA views, ignored for CPU views.
 */
TweStatus twe_activation_backward_dbias(const TweTensorView* dy, const TweTensorView* x, TweTensorView* dx,
                                        TweTensorView* dbias, const TweActivationParams* params, void* stream);

/*! \brief twe_activation_backward_dbias, then dx quantized by twe_quantize(mode) on the same stream.
 *  \param[in]     dy       as twe_activation_backward.
 *  \param[in]     x        as twe_activation_backward.
 *  \param[in]     scale    delayed scaling's fp32 (1,) encode scale, else NULL.
 *  \param[in]     rng      NVFP4 stochastic rounding's [seed, offset], else NULL.
 *  \param[out]    dx       as twe_activation_backward.
 *  \param[out]    dbias    as twe_activation_backward_dbias.
 *  \param[in,out] output   the quantized dx.
 *  \param[in]     params   activation parameters.
 *  \param[in]     qparams  quantization parameters.
 *  \param[in]     mode     which quantize function runs.
 *  \param[in]     stream   cudaStream_t for CUDA views, ignored for CPU views.
 */
TweStatus twe_activation_backward_dbias_quantize(const TweTensorView* dy, const TweTensorView* x,
                                                 const TweTensorView* scale, const TweTensorView* rng,
                                                 TweTensorView* dx, TweTensorView* dbias, TweQuantizedTensor* output,
                                                 const TweActivationParams* params, const TweQuantizeParams* qparams,
                                                 TweScalingMode mode, void* stream);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // TWINENGINE_ACTIVATION_H_
