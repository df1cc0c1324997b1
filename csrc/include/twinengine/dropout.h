/*! \file dropout.h
 *  \brief Dropout with an explicit [seed, offset] rng and a 1-bit mask (NUMERICS.md §11).
 *
 *  Element i (row-major) draws Philox4x32-10 with key (seed, 0) and counter
 *  (floor(i/4) mod 2^32, floor(i/2^34), offset, 0x44524F50), word x_{i mod 4}; it is kept iff
 *  the word >= floor(p·2^32). Kept values are fl(x·fl(1/fl(1−p))), dropped ones +0.0. The
 *  mask holds bit i % 8 of byte i / 8 per element (padding bits 0); the backward reads it,
 *  never regenerates it. Inputs fp32, bf16 or fp16; CPU and CUDA produce identical bytes.
 */
#ifndef TWINENGINE_DROPOUT_H_
#define TWINENGINE_DROPOUT_H_

#include "twinengine/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/*! \brief Dropout parameters. */
typedef struct {
  float p; /*!< drop probability, in [0, 1) */
} TweDropoutParams;

/*! \brief y = dropout(x), mask = the kept bits.
 *  \param[in]  x       any shape, fp32/bf16/fp16, n elements.
 *  \param[in]  rng     (2,) [seed, offset], uint32 / int32 / int64 (low 32 bits used).
 *  \param[out] y       x's shape and dtype.
 *  \param[out] mask    uint8 (ceil(n/8),).
 *  \param[in]  params  p.
 *  \param[in]  stream  cudaStream_t for CUDA views, ignored for CPU views.
 */
TweStatus twe_dropout_forward(const TweTensorView* x, const TweTensorView* rng, TweTensorView* y, TweTensorView* mask,
                              const TweDropoutParams* params, void* stream);

/*! \brief dx = fl(dy·fl(1/fl(1−p))) where the mask bit is set, +0.0 elsewhere.
 *  \param[in]  dy      any shape, fp32/bf16/fp16, n elements.
 *  \param[in]  mask    uint8 (ceil(n/8),) from twe_dropout_forward.
 *  \param[out] dx      dy's shape and dtype.
 *  \param[in]  params  p (the forward's).
 *  \param[in]  stream  cudaStream_t for CUDA views, ignored for CPU views.
 */
TweStatus twe_dropout_backward(const TweTensorView* dy, const TweTensorView* mask, TweTensorView* dx,
                               const TweDropoutParams* params, void* stream);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // TWINENGINE_DROPOUT_H_
