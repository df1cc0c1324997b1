/*! \file bias.h
 *  \brief Bias add, residual add, constant scale and the bias gradient (NUMERICS.md §11).
 *
 *  Elementwise ops compute in fp32 on exactly widened inputs (fp32, bf16, fp16, dtypes may
 *  differ) with one rounding, then round (RNE) to the first input's dtype. The bias gradient
 *  is the canonical 32-lane sum Σc over the rows (lane l adds rows l, l+32, ...; the 32
 *  partials folded by halves), rounded to the output's dtype. Views are contiguous, (R, K)
 *  with K the last dimension, R may be 0. CPU and CUDA produce identical bytes.
 */
#ifndef TWINENGINE_BIAS_H_
#define TWINENGINE_BIAS_H_

#include "twinengine/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/*! \brief y = fl(x + bias), bias broadcast over rows.
 *  \param[in]  x       (R, K).
 *  \param[in]  bias    (K,).
 *  \param[out] y       (R, K), x's dtype.
 *  \param[in]  stream  cudaStream_t for CUDA views, ignored for CPU views.
 */
TweStatus twe_bias_add(const TweTensorView* x, const TweTensorView* bias, TweTensorView* y, void* stream);

/*! \brief z = fl(x + y), elementwise (residual add).
 *  \param[in]  x       any shape.
 *  \param[in]  y       x's shape.
 *  \param[out] z       x's shape and dtype.
 *  \param[in]  stream  cudaStream_t for CUDA views, ignored for CPU views.
 */
TweStatus twe_bias_add_residual(const TweTensorView* x, const TweTensorView* y, TweTensorView* z, void* stream);

/*! \brief Parameters of twe_bias_scale. */
typedef struct {
  float c; /*!< the constant factor (fp32) */
} TweScaleParams;

/*! \brief y = fl(x · c).
 *  \param[in]  x       any shape.
 *  \param[out] y       x's shape and dtype.
 *  \param[in]  params  c.
 *  \param[in]  stream  cudaStream_t for CUDA views, ignored for CPU views.
 */
TweStatus twe_bias_scale(const TweTensorView* x, TweTensorView* y, const TweScaleParams* params, void* stream);

/*! \brief dbias = Σc over the rows of dy.
 *  \param[in]  dy      (R, K).
 *  \param[out] dbias   (K,), fp32/bf16/fp16 (zeros for R = 0).
 *  \param[in]  stream  cudaStream_t for CUDA views, ignored for CPU views.
 */
TweStatus twe_bias_grad(const TweTensorView* dy, TweTensorView* dbias, void* stream);

/*! \brief Bias gradient of each group of rows: dbias[g] = Σc over rows of group g (NUMERICS.md §11),
 *         the groups being consecutive row blocks of sizes max(m_splits[g], 0) clipped to R.
 *  \param[in]     dy        fp32/bf16/fp16 (R, K).
 *  \param[in]     m_splits  int32 (G,), read on the host: CPU views only.
 *  \param[in,out] dbias     (G, K) of any high-precision dtype.
 *  \param[in]     stream    ignored (CPU only).
 */
TweStatus twe_bias_grad_grouped(const TweTensorView* dy, const TweTensorView* m_splits, TweTensorView* dbias,
                                void* stream);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // TWINENGINE_BIAS_H_
