/*! \file quantize.h
 *  \brief Quantize / dequantize and the delayed-scaling update (NUMERICS.md §1–§7).
 *
 *  Supported formats:
 *  - per-tensor FP8 (E4M3, E5M2), current scaling and delayed scaling (§3, §4);
 *  - MXFP8: 1×32 blocks with E8M0 scales, 1D and 32×32 2D (§5);
 *  - FP8 block scaling: 1×128 blocks or 128×128 tiles with fp32 scales (§6);
 *  - NVFP4: E2M1 data, E4M3 scales per 1×16 block (or 16×16 tile), fp32 global amax, optional
 *    16-point RHT on the columnwise copy and stochastic rounding (§7).
 *
 *  Inputs are fp32, bf16 or fp16, contiguous, viewed as 2-D (R, K) with K the last
 *  dimension. A TweQuantizedTensor member whose `data` is NULL is not produced.
 *  CPU and CUDA implementations produce identical bytes.
 *
 *  CUDA views: the calling thread's current device must be the views' device; the kernels
 *  run asynchronously on `stream` and never synchronise with the host (a per-tensor amax is
 *  reduced and consumed in device memory), so calls can be captured into CUDA graphs and
 *  XLA command buffers.
 */
#ifndef TWINENGINE_QUANTIZE_H_
#define TWINENGINE_QUANTIZE_H_

#include "twinengine/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/*! \brief FP8 element format. */
typedef enum {
  kTweE4M3 = 0,
  kTweE5M2 = 1,
} TweFP8Format;

/*! \brief The tensors a quantize call writes (absent ones have data == NULL). */
typedef struct {
  TweTensorView rowwise_data;
  TweTensorView rowwise_scale_inv;
  TweTensorView columnwise_data;
  TweTensorView columnwise_scale_inv;
  TweTensorView amax;            /*!< fp32 (1,): amax of the input (per-tensor formats) */
  TweTensorView columnwise_amax; /*!< fp32 (1,): amax of the columnwise copy (NVFP4) */
} TweQuantizedTensor;

/*! \brief Quantization parameters (fields unused by a format are ignored). */
typedef struct {
  TweFP8Format format;       /*!< element format of FP8 data */
  float amax_epsilon;        /*!< lower bound on the amax (§2 step 1) */
  int32_t force_pow2_scales; /*!< truncate scales to powers of two (§2 step 5) */
  int32_t two_d;             /*!< 2D tiles: MXFP8 32×32, FP8 block 128×128, NVFP4 16×16 */
  int32_t with_rht;          /*!< NVFP4: RHT on the columnwise copy (bf16 input) */
  int32_t stochastic_rounding; /*!< NVFP4: stochastic rounding from the rng state */
} TweQuantizeParams;

/*! \brief Which quantize kernel a fused call runs on its output (core/ops/quantize.py
 *  SCALING_MODE_CODES). */
typedef enum {
  kTweScalingFP8Current = 0, /*!< twe_quantize_fp8_current */
  kTweScalingFP8Delayed = 1, /*!< twe_quantize_fp8_delayed (needs `scale`) */
  kTweScalingMXFP8 = 2,      /*!< twe_quantize_mxfp8 */
  kTweScalingFP8Block = 3,   /*!< twe_quantize_fp8_block */
  kTweScalingNVFP4 = 4,      /*!< twe_quantize_nvfp4 (`rng` with stochastic rounding) */
} TweScalingMode;

/*! \brief Per-tensor current scaling (§4): amax pass, scale from amax (§2), cast.
 *  \param[in]     input   fp32/bf16/fp16 (R, K).
 *  \param[in,out] output  rowwise_data (R, K) and/or columnwise_data (K, R) of the FP8 dtype,
 *                         rowwise/columnwise_scale_inv fp32 (1,), amax fp32 (1,).
 *  \param[in]     params  format, amax_epsilon, force_pow2_scales.
 *  \param[in]     stream  cudaStream_t for CUDA views, ignored for CPU views.
 */
TweStatus twe_quantize_fp8_current(const TweTensorView* input, TweQuantizedTensor* output,
                                   const TweQuantizeParams* params, void* stream);

/*! \brief Per-tensor delayed scaling (§3): cast with a given scale, report the input amax.
 *  \param[in]     input   fp32/bf16/fp16 (R, K).
 *  \param[in]     scale   fp32 (1,): the encode scale s.
 *  \param[in,out] output  as for twe_quantize_fp8_current; scale_inv = 1/s; amax of the
 *                         unscaled input.
 *  \param[in]     params  format.
 *  \param[in]     stream  cudaStream_t for CUDA views.
 */
TweStatus twe_quantize_fp8_delayed(const TweTensorView* input, const TweTensorView* scale,
                                   TweQuantizedTensor* output, const TweQuantizeParams* params,
                                   void* stream);

/*! \brief MXFP8 (§5): 1×32 rowwise and/or 32×1 columnwise blocks (or 32×32 tiles).
 *  \param[in]     input   fp32/bf16/fp16 (R, K), R and K multiples of 32.
 *  \param[in,out] output  rowwise_data (R, K) FP8 + rowwise_scale_inv uint8
 *                         (roundup(R,128), roundup(K/32,4)); columnwise_data (R, K) FP8 +
 *                         columnwise_scale_inv uint8 (roundup(R/32,4), roundup(K,128)).
 *                         Scale padding is written as 0.
 *  \param[in]     params  format, two_d.
 *  \param[in]     stream  cudaStream_t for CUDA views.
 */
TweStatus twe_quantize_mxfp8(const TweTensorView* input, TweQuantizedTensor* output,
                             const TweQuantizeParams* params, void* stream);

/*! \brief FP8 block scaling (§6): 1×128 blocks (two_d = 0) or 128×128 tiles (two_d = 1).
 *  Block scales follow §2 with pow2 = force_pow2_scales, ε = amax_epsilon and inf_value the
 *  largest finite value of the input dtype.
 *  \param[in]     input   fp32/bf16/fp16 (R, K), R and K multiples of 128.
 *  \param[in,out] output  rowwise_data (R, K) FP8 + rowwise_scale_inv fp32, 1D
 *                         (K/128, roundup(R,4)) [kb][r], 2D (R/128, roundup(K/128,4)) [rb][kb];
 *                         columnwise_data (K, R) FP8 (1D: 1×128 blocks of the transpose; 2D:
 *                         the transposed rowwise bytes) + columnwise_scale_inv fp32, 1D
 *                         (R/128, roundup(K,4)) [rb][k], 2D (K/128, roundup(R/128,4)) [kb][rb].
 *                         Scale padding is written as 0.
 *  \param[in]     params  format, amax_epsilon, force_pow2_scales, two_d.
 *  \param[in]     stream  cudaStream_t for CUDA views.
 */
TweStatus twe_quantize_fp8_block(const TweTensorView* input, TweQuantizedTensor* output,
                                 const TweQuantizeParams* params, void* stream);

/*! \brief NVFP4 (§7): per copy a global amax A, E4M3 block decode scales, E2M1 data packed two
 *  per byte (even index in the low nibble).
 *  \param[in]     input   fp32/bf16/fp16 (R, K), R and K multiples of 16; bf16 when with_rht
 *                         and columnwise_data is requested.
 *  \param[in]     rng     the [seed, offset] state, shape (2,), dtype uint32, int32 or int64
 *                         (the low 32 bits of each element are used); required iff
 *                         stochastic_rounding, else NULL or absent.
 *  \param[in,out] output  rowwise_data uint8 (R, K/2) + rowwise_scale_inv uint8 E4M3 codes
 *                         (roundup(R,128), roundup(K/16,4)) + amax fp32 (1,);
 *                         columnwise_data uint8 (K, R/2) (the transpose, RHT'd when with_rht) +
 *                         columnwise_scale_inv uint8 (roundup(K,128), roundup(R/16,4)) +
 *                         columnwise_amax fp32 (1,). Scale padding is written as 0.
 *  \param[in]     params  two_d, with_rht, stochastic_rounding.
 *  \param[in]     stream  cudaStream_t for CUDA views.
 */
TweStatus twe_quantize_nvfp4(const TweTensorView* input, const TweTensorView* rng, TweQuantizedTensor* output,
                             const TweQuantizeParams* params, void* stream);

/*! \brief twe_quantize_nvfp4 with given global amaxes (§7 step 1's optional all-reduce MAX: the
 *  amax of the whole tensor a shard belongs to) instead of the input's own.
 *  \param[in]     amax    fp32 (2,): [A of the rowwise copy, A of the columnwise copy (after RHT
 *                          when with_rht)]; the entry of an absent copy is ignored. Written to the
 *                          output's amax / columnwise_amax. NULL: twe_quantize_nvfp4.
 *  Other parameters as twe_quantize_nvfp4.
 */
TweStatus twe_quantize_nvfp4_with_amax(const TweTensorView* input, const TweTensorView* rng,
                                       const TweTensorView* amax, TweQuantizedTensor* output,
                                       const TweQuantizeParams* params, void* stream);

/*! \brief Dequantize per-tensor FP8 data: x̂ = fl(q · s_inv), rounded to the output dtype.
 *  \param[in]  data       FP8 (R, K), or (K, R) when `columnwise`.
 *  \param[in]  scale_inv  fp32 (1,).
 *  \param[out] output     fp32/bf16/fp16 (R, K).
 *  \param[in]  columnwise 1 if `data` is the transposed columnwise copy.
 *  \param[in]  stream     cudaStream_t for CUDA views.
 */
TweStatus twe_dequantize_fp8(const TweTensorView* data, const TweTensorView* scale_inv,
                             TweTensorView* output, int32_t columnwise, void* stream);

/*! \brief Dequantize MXFP8 data: x̂ = q · 2^(e−127), rounded to the output dtype.
 *  \param[in]  data       FP8 (R, K).
 *  \param[in]  scale_inv  uint8 E8M0 codes in the padded rowwise or columnwise layout.
 *  \param[out] output     fp32/bf16/fp16 (R, K).
 *  \param[in]  columnwise 1 if `data`/`scale_inv` are the columnwise (32×1 block) copy.
 *  \param[in]  stream     cudaStream_t for CUDA views.
 */
TweStatus twe_dequantize_mxfp8(const TweTensorView* data, const TweTensorView* scale_inv,
                               TweTensorView* output, int32_t columnwise, void* stream);

/*! \brief Dequantize FP8 block-scaled data: x̂ = fl(q · s_inv_b), rounded to the output dtype.
 *  \param[in]  data       FP8 (R, K), or the transposed (K, R) when `columnwise`.
 *  \param[in]  scale_inv  fp32 in the layout twe_quantize_fp8_block writes for that copy.
 *  \param[out] output     fp32/bf16/fp16 (R, K), R and K multiples of 128.
 *  \param[in]  columnwise 1 for the columnwise copy (transposed back to (R, K)).
 *  \param[in]  two_d      1 for 128×128 tiles, 0 for 1×128 blocks.
 *  \param[in]  stream     cudaStream_t for CUDA views.
 */
TweStatus twe_dequantize_fp8_block(const TweTensorView* data, const TweTensorView* scale_inv,
                                   TweTensorView* output, int32_t columnwise, int32_t two_d, void* stream);

/*! \brief Dequantize NVFP4 data: x̂ = fl(q · fl(fl(float(d_b) · A) · fl(1/2688))) (§7 step 6),
 *  rounded to the output dtype. A columnwise copy made with the RHT gives the transformed values.
 *  \param[in]  data       uint8 packed E2M1, (R, K/2), or (K, R/2) when `columnwise`.
 *  \param[in]  scale_inv  uint8 E4M3 codes in that copy's padded layout.
 *  \param[in]  amax       fp32 (1,): the global amax A of that copy.
 *  \param[out] output     fp32/bf16/fp16 (R, K), R and K multiples of 16.
 *  \param[in]  columnwise 1 for the columnwise copy (transposed back to (R, K)).
 *  \param[in]  stream     cudaStream_t for CUDA views.
 */
TweStatus twe_dequantize_nvfp4(const TweTensorView* data, const TweTensorView* scale_inv,
                               const TweTensorView* amax, TweTensorView* output, int32_t columnwise,
                               void* stream);

/*! \brief Runs the quantize kernel of `mode` on `input`: the entry point of fused kernels
 *         (activation + quantize, ...), which quantize their own output on the same stream.
 *  \param[in]     input   fp32/bf16/fp16 (R, K).
 *  \param[in]     scale   fp32 (1,) encode scale for kTweScalingFP8Delayed, else NULL.
 *  \param[in]     rng     [seed, offset] for NVFP4 stochastic rounding, else NULL.
 *  \param[in,out] output  as the quantize function of `mode` describes.
 *  \param[in]     params  as the quantize function of `mode` describes.
 *  \param[in]     mode    which quantize function runs.
 *  \param[in]     stream  cudaStream_t for CUDA views, ignored for CPU views.
 */
TweStatus twe_quantize(const TweTensorView* input, const TweTensorView* scale, const TweTensorView* rng,
                       TweQuantizedTensor* output, const TweQuantizeParams* params, TweScalingMode mode, void* stream);

/*! \brief Delayed-scaling algorithm for the amax history reduction. */
typedef enum {
  kTweAmaxMax = 0,
  kTweAmaxMostRecent = 1,
} TweAmaxAlgorithm;

/*! \brief Parameters of the delayed-scaling update (§3). */
typedef struct {
  TweFP8Format format;
  int32_t margin;
  TweAmaxAlgorithm algorithm;
} TweDelayedScalingParams;

/*! \brief Per-tensor current scaling of G consecutive row blocks, each on its own (§4): block g
 *  (rows [Σ_{j<g} m_splits[j], …+m_splits[g]); sizes >= 0 summing to R, else kTweInvalidArgument) gets exactly the
 *  bytes twe_quantize_fp8_current gives that block alone. CPU only (the block sizes are read on
 *  the host).
 *  \param[in]     input     fp32/bf16/fp16 (R, K).
 *  \param[in]     m_splits  int32 (G,).
 *  \param[in,out] output    rowwise_data (R, K) FP8; rowwise_scale_inv fp32 (G,); columnwise_data
 *                            (R·K,) FP8 holding each block's transposed copy (K, m_g) one after
 *                            another; columnwise_scale_inv fp32 (G,); amax fp32 (G,).
 *  \param[in]     params    format, amax_epsilon, force_pow2_scales.
 *  \param[in]     stream    ignored (CPU).
 */
TweStatus twe_grouped_quantize_fp8_current(const TweTensorView* input, const TweTensorView* m_splits,
                                           TweQuantizedTensor* output, const TweQuantizeParams* params, void* stream);

/*! \brief Delayed-scaling FP8 (§3) of G consecutive row blocks, each with its own scale: block g
 *  (m_splits[g] rows) gets exactly the bytes twe_quantize_fp8_delayed gives that block alone with
 *  scale[g] (an empty block: amax 0, scale_inv 1/scale[g]). Outputs as
 *  twe_grouped_quantize_fp8_current. CPU only (the block sizes are read on the host).
 *  \param[in]     input     fp32/bf16/fp16 (R, K).
 *  \param[in]     m_splits  int32 (G,).
 *  \param[in]     scale     fp32 (G,): block g is cast as x·scale[g].
 *  \param[in,out] output    as twe_grouped_quantize_fp8_current (amax: each block's unscaled amax).
 *  \param[in]     params    format.
 *  \param[in]     stream    ignored (CPU).
 */
TweStatus twe_grouped_quantize_fp8_delayed(const TweTensorView* input, const TweTensorView* m_splits,
                                           const TweTensorView* scale, TweQuantizedTensor* output,
                                           const TweQuantizeParams* params, void* stream);

/*! \brief FP8 block scaling (§6) of G consecutive row blocks, each on its own: block g (m_splits[g]
 *  rows, a multiple of 128) gets exactly the bytes twe_quantize_fp8_block gives that block alone.
 *  rowwise_data (R, K); columnwise_data (R·K,) holding each block's (K, m_g) copy one after
 *  another; the scales are flat fp32 arrays holding each block's scale tensor (of
 *  twe_quantize_fp8_block's shape) one after another. CPU only.
 *  \param[in]     input     fp32/bf16/fp16 (R, K), K a multiple of 128.
 *  \param[in]     m_splits  int32 (G,), each a multiple of 128, Σ = R.
 *  \param[in,out] output    as above; scale arrays 1-D, large enough for Σ of the blocks' scales.
 *  \param[in]     params    format, amax_epsilon, force_pow2_scales, two_d.
 *  \param[in]     stream    ignored (CPU).
 */
TweStatus twe_grouped_quantize_fp8_block(const TweTensorView* input, const TweTensorView* m_splits,
                                         TweQuantizedTensor* output, const TweQuantizeParams* params, void* stream);

/*! \brief MXFP8 (§5) of G consecutive row blocks, each on its own: block g (m_splits[g] rows, a
 *  multiple of 32) gets exactly the bytes twe_quantize_mxfp8 gives that block alone. Data is
 *  (R, K) for both copies; each block's scales sit in their own region: rowwise at scale row
 *  Σ_{j<g} roundup(m_j, 128) (roundup(m_g, 128) rows of roundup(K/32, 4) codes), columnwise at
 *  scale row Σ_{j<g} roundup(m_j/32, 4) (roundup(m_g/32, 4) rows of roundup(K, 128) codes). CPU only.
 *  \param[in]     input     fp32/bf16/fp16 (R, K), K a multiple of 32.
 *  \param[in]     m_splits  int32 (G,), each a multiple of 32, Σ = R.
 *  \param[in,out] output    rowwise_data, columnwise_data (R, K) FP8; rowwise_scale_inv uint8
 *                            (≥ Σ roundup(m_g, 128), roundup(K/32, 4)); columnwise_scale_inv uint8
 *                            (≥ Σ roundup(m_g/32, 4), roundup(K, 128)).
 *  \param[in]     params    format.
 *  \param[in]     stream    ignored (CPU).
 */
TweStatus twe_grouped_quantize_mxfp8(const TweTensorView* input, const TweTensorView* m_splits,
                                     TweQuantizedTensor* output, const TweQuantizeParams* params, void* stream);

/*! \brief NVFP4 (§7) of G consecutive row blocks, each on its own: block g (m_splits[g] rows, a
 *  multiple of 16) gets exactly the bytes twe_quantize_nvfp4 gives that block alone, rounding
 *  stochastically (when enabled) with rng [seed, offset + g] (mod 2^32). Rowwise data (R, K/2);
 *  columnwise_data (R·K/2,) holding each block's transposed (K, m_g/2) copy one after another;
 *  the scales are flat uint8 arrays holding each block's E4M3 scale tensor (of
 *  twe_quantize_nvfp4's shape: rowwise (roundup(m_g, 128), roundup(K/16, 4)), columnwise
 *  (roundup(K, 128), roundup(m_g/16, 4))) one after another, zero past them; amax and
 *  columnwise_amax (G,) each block's global amaxes (0 for an empty block). CPU only.
 *  \param[in]     input     fp32/bf16/fp16 (R, K), K a multiple of 16 (bf16 when with_rht).
 *  \param[in]     m_splits  int32 (G,), each a multiple of 16, Σ = R.
 *  \param[in]     rng       [seed, offset] for stochastic rounding, else NULL.
 *  \param[in,out] output    as above.
 *  \param[in]     params    two_d, with_rht, stochastic_rounding.
 *  \param[in]     stream    ignored (CPU).
 */
TweStatus twe_grouped_quantize_nvfp4(const TweTensorView* input, const TweTensorView* m_splits,
                                     const TweTensorView* rng, TweQuantizedTensor* output,
                                     const TweQuantizeParams* params, void* stream);

/*! \brief Delayed-scaling update (§3), functional: reads the state, writes the next state.
 *  \param[in]  amax_history      fp32 (L, N): row 0 is the live amax of each of N slots.
 *  \param[in]  scale             fp32 (N,).
 *  \param[out] new_amax_history  fp32 (L, N): rolled history (unchanged for unused slots).
 *  \param[out] new_scale         fp32 (N,).
 *  \param[in]  params            format, margin, algorithm.
 *  \param[in]  stream            cudaStream_t for CUDA views.
 */
TweStatus twe_quantize_update_delayed_scaling(const TweTensorView* amax_history,
                                              const TweTensorView* scale,
                                              TweTensorView* new_amax_history,
                                              TweTensorView* new_scale,
                                              const TweDelayedScalingParams* params,
                                              void* stream);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // TWINENGINE_QUANTIZE_H_
