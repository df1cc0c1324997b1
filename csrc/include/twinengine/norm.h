/*! \file norm.h
 *  \brief LayerNorm, RMSNorm and L2Normalization forward and backward, with an optional fused
 *  quantization of the normalized output (NUMERICS.md §11).
 *
 *  Every per-row reduction is the canonical 32-lane sum Σc, and the column sums of the
 *  parameter gradients are Σc over the row index, so CPU and CUDA give the same bytes.
 *  Inputs are fp32, bf16 or fp16 (widened exactly), contiguous, viewed as 2-D (R, K) with K
 *  the normalized (last) dimension, K >= 1; R may be 0. Parameters γ, β are (K,) of any of
 *  those dtypes (independently of x). ε is an fp32 value >= 0.
 *
 *  Fused quantization: y is first rounded to its dtype and written, then quantized exactly as
 *  the quantize family does (twe_quantize_*), in the same call and on the same stream, so the
 *  quantized bytes equal norm-then-quantize. Supported formats: per-tensor FP8 current and
 *  delayed scaling, MXFP8 (1D, 2D), FP8 block scaling (1D, 2D), NVFP4 (incl. RHT and
 *  stochastic rounding); see quantize.h for their layouts and shape rules.
 */
#ifndef TWINENGINE_NORM_H_
#define TWINENGINE_NORM_H_

#include "twinengine/common.h"
#include "twinengine/quantize.h"

#ifdef __cplusplus
extern "C" {
#endif

/*! \brief Parameters of every norm call. */
typedef struct {
  float eps;                     /*!< ε (fp32, >= 0) added to the variance / mean square / sum of squares */
  int32_t zero_centered_gamma;   /*!< 1: the gain is fl(1 + γ) instead of γ (LayerNorm, RMSNorm) */
} TweNormParams;

/*! \brief Which quantization a forward call fuses (the quantize entry point it runs on y). */
typedef enum {
  kTweNormQuantizeNone = 0,
  kTweNormQuantizeFP8Current = 1, /*!< twe_quantize_fp8_current */
  kTweNormQuantizeFP8Delayed = 2, /*!< twe_quantize_fp8_delayed (needs `scale`) */
  kTweNormQuantizeMXFP8 = 3,      /*!< twe_quantize_mxfp8 */
  kTweNormQuantizeFP8Block = 4,   /*!< twe_quantize_fp8_block */
  kTweNormQuantizeNVFP4 = 5,      /*!< twe_quantize_nvfp4 (`rng` with stochastic rounding) */
} TweNormQuantizeMode;

/*! \brief The fused quantization of a forward call's output y. */
typedef struct {
  TweNormQuantizeMode mode;
  const TweTensorView* scale;  /*!< fp32 (1,) encode scale (delayed scaling), else NULL */
  const TweTensorView* rng;    /*!< [seed, offset] (NVFP4 stochastic rounding), else NULL */
  TweQuantizedTensor* output;  /*!< the quantized copies of y, as quantize.h describes */
  TweQuantizeParams params;    /*!< the quantize parameters of `mode` */
} TweNormQuantize;

/*! \brief LayerNorm forward: μ, rstd per row, y = fl(fl(x̂ · g') + β) rounded to y's dtype.
 *  \param[in]     x         fp32/bf16/fp16 (R, K).
 *  \param[in]     gamma     (K,) γ.
 *  \param[in]     beta      (K,) β.
 *  \param[out]    y         x's dtype and shape.
 *  \param[out]    mu        fp32, R elements.
 *  \param[out]    rstd      fp32, R elements.
 *  \param[in,out] quantize  fused quantization of y, or NULL for none.
 *  \param[in]     params    ε, zero_centered_gamma.
 *  \param[in]     stream    cudaStream_t for CUDA views, ignored for CPU views.
 */
TweStatus twe_norm_layernorm_fwd(const TweTensorView* x, const TweTensorView* gamma, const TweTensorView* beta,
                                 TweTensorView* y, TweTensorView* mu, TweTensorView* rstd,
                                 const TweNormQuantize* quantize, const TweNormParams* params, void* stream);

/*! \brief LayerNorm backward from the saved μ and rstd (x̂ recomputed as in the forward).
 *  \param[in]  dy      x's shape, fp32/bf16/fp16.
 *  \param[in]  x       fp32/bf16/fp16 (R, K).
 *  \param[in]  mu      fp32, R elements.
 *  \param[in]  rstd    fp32, R elements.
 *  \param[in]  gamma   (K,) γ.
 *  \param[out] dx      x's dtype and shape.
 *  \param[out] dgamma  (K,) γ's dtype: Σc over rows of fl(dy · x̂).
 *  \param[out] dbeta   (K,) γ's dtype: Σc over rows of dy.
 *  \param[in]  params  zero_centered_gamma (ε is not used).
 *  \param[in]  stream  cudaStream_t for CUDA views.
 */
TweStatus twe_norm_layernorm_bwd(const TweTensorView* dy, const TweTensorView* x, const TweTensorView* mu,
                                 const TweTensorView* rstd, const TweTensorView* gamma, TweTensorView* dx,
                                 TweTensorView* dgamma, TweTensorView* dbeta, const TweNormParams* params,
                                 void* stream);

/*! \brief RMSNorm forward: rstd per row, y = fl(x̂ · g') rounded to y's dtype.
 *  \param[in]     x         fp32/bf16/fp16 (R, K).
 *  \param[in]     gamma     (K,) γ.
 *  \param[out]    y         x's dtype and shape.
 *  \param[out]    rstd      fp32, R elements.
 *  \param[in,out] quantize  fused quantization of y, or NULL for none.
 *  \param[in]     params    ε, zero_centered_gamma.
 *  \param[in]     stream    cudaStream_t for CUDA views.
 */
TweStatus twe_norm_rmsnorm_fwd(const TweTensorView* x, const TweTensorView* gamma, TweTensorView* y,
                               TweTensorView* rstd, const TweNormQuantize* quantize, const TweNormParams* params,
                               void* stream);

/*! \brief RMSNorm backward from the saved rstd.
 *  \param[in]  dy      x's shape.
 *  \param[in]  x       fp32/bf16/fp16 (R, K).
 *  \param[in]  rstd    fp32, R elements.
 *  \param[in]  gamma   (K,) γ.
 *  \param[out] dx      x's dtype and shape.
 *  \param[out] dgamma  (K,) γ's dtype: Σc over rows of fl(dy · x̂).
 *  \param[in]  params  zero_centered_gamma.
 *  \param[in]  stream  cudaStream_t for CUDA views.
 */
TweStatus twe_norm_rmsnorm_bwd(const TweTensorView* dy, const TweTensorView* x, const TweTensorView* rstd,
                               const TweTensorView* gamma, TweTensorView* dx, TweTensorView* dgamma,
                               const TweNormParams* params, void* stream);

/*! \brief L2Normalization forward: rstd = 1/sqrt(Σc x² + ε) per row, y = fl(x · rstd).
 *  \param[in]     x         fp32/bf16/fp16 (R, K).
 *  \param[out]    y         x's dtype and shape.
 *  \param[out]    rstd      fp32, R elements.
 *  \param[in,out] quantize  fused quantization of y, or NULL for none.
 *  \param[in]     params    ε (zero_centered_gamma is not used).
 *  \param[in]     stream    cudaStream_t for CUDA views.
 */
TweStatus twe_norm_l2norm_fwd(const TweTensorView* x, TweTensorView* y, TweTensorView* rstd,
                              const TweNormQuantize* quantize, const TweNormParams* params, void* stream);

/*! \brief L2Normalization backward, y = fl(x · rstd) recomputed in fp32 from the saved rstd.
 *  \param[in]  dy      x's shape.
 *  \param[in]  x       fp32/bf16/fp16 (R, K).
 *  \param[in]  rstd    fp32, R elements.
 *  \param[out] dx      x's dtype and shape.
 *  \param[in]  params  unused fields only (may be NULL).
 *  \param[in]  stream  cudaStream_t for CUDA views.
 */
TweStatus twe_norm_l2norm_bwd(const TweTensorView* dy, const TweTensorView* x, const TweTensorView* rstd,
                              TweTensorView* dx, const TweNormParams* params, void* stream);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // TWINENGINE_NORM_H_
