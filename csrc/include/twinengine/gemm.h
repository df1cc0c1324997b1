/*! \file gemm.h
 *  \brief GEMM over quantized or high-precision operands: out = A · Bᵀ (+ bias) (NUMERICS.md §8).
 *
 *  A is logically (M, K) and B logically (N, K); K is the contraction dimension. Each operand
 *  is stored either K-major, as (rows, K), or K-minor, as (K, rows) (then the kernel reads it
 *  transposed). Views of higher rank are flattened to 2-D (R, C) with C the last dimension.
 *
 *  Supported operand formats (both operands share one):
 *  - high precision: fp32 / bf16 / fp16 data (widened exactly to fp32), no scales;
 *  - per-tensor FP8 (E4M3 or E5M2, mixable): fp32 (1,) scale_inv each;
 *    out = fl(fl(Σ q_a·q_b) · s_inv_a) · s_inv_b;
 *  - MXFP8 (E4M3 or E5M2, mixable): uint8 E8M0 scales per 32 consecutive K. K-major operands
 *    carry the rowwise scale layout (roundup(rows,128), roundup(K/32,4)), K-minor operands the
 *    columnwise layout (roundup(K/32,4), roundup(rows,128));
 *  - FP8 block (E4M3 or E5M2): K-major data, fp32 scale_inv per 128 consecutive K: 1D
 *    (ceil(K/128), roundup(rows,4)) indexed [k/128, row], or 2D 128×128 tiles
 *    (ceil(rows/128), roundup(ceil(K/128),4)) indexed [row/128, k/128]; not both operands 2D;
 *  - NVFP4: K-major packed E2M1 data (rows, K/2) uint8 (even K index in the low nibble), E4M3
 *    scale codes per 16 consecutive K (roundup(rows,128), roundup(ceil(K/16),4)), and the
 *    copy's fp32 (1,) global amax A; the result is finally scaled by S_dec_a then S_dec_b,
 *    S_dec = 1 / min(2688 / A, FLT_MAX) (1 when A is 0).
 *  Block formats scale each K-block's fp32 partial sum, fl(fl(p · s_a) · s_b), and accumulate
 *  the blocks in fp32 in K order (a last, shorter block when K is not a multiple).
 *
 *  Accumulation is fp32. Bias (N,) fp32/bf16/fp16 is added in fp32 after the scaling; the sum
 *  is rounded (RNE) once to the output dtype fp32 / bf16 / fp16. The CPU path computes every
 *  partial sum with the bundled sgemm (deterministic for a given shape); the CUDA path runs a
 *  dequantize-in-registers tiled GEMM with the same block structure, equal to the CPU path
 *  within fp32 summation-order error.
 */
#ifndef TWINENGINE_GEMM_H_
#define TWINENGINE_GEMM_H_

#include "twinengine/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/*! \brief Operand format of a GEMM. */
typedef enum {
  kTweGemmHighPrecision = 0, /*!< fp32 / bf16 / fp16 data, no scales */
  kTweGemmFP8PerTensor = 1,  /*!< FP8 data, fp32 (1,) scale_inv */
  kTweGemmMXFP8 = 2,         /*!< FP8 data, E8M0 scales per 32 K-elements */
  kTweGemmFP8Block = 3,      /*!< FP8 data, fp32 scales per 128 K-elements (1D) or 128×128 tile (2D) */
  kTweGemmNVFP4 = 4,         /*!< packed E2M1 data, E4M3 scales per 16 K-elements, global amax */
} TweGemmScaling;

/*! \brief One GEMM operand. */
typedef struct {
  TweTensorView data;      /*!< (rows, K) if k_major, else (K, rows), after flattening to 2-D */
  TweTensorView scale_inv; /*!< decode scales (absent for high precision) */
  TweTensorView amax;      /*!< NVFP4: fp32 (1,) global amax of this copy; absent otherwise */
  int32_t k_major;         /*!< 1: K is the innermost (contiguous) dimension of `data` */
  int32_t block_2d;        /*!< FP8 block: 1 for 128×128 tile scales, 0 for 1×128 */
} TweGemmOperand;

/*! \brief GEMM parameters. */
typedef struct {
  TweGemmScaling scaling; /*!< format of both operands */
} TweGemmParams;

/*! \brief out (M, N) = A (M, K) · B (N, K)ᵀ (+ bias), fp32 accumulation.
 *  \param[in]  a       operand A, logically (M, K) (NVFP4 data (M, K/2)).
 *  \param[in]  b       operand B, logically (N, K).
 *  \param[in]  bias    (N,) fp32/bf16/fp16, or NULL / data == NULL for none.
 *  \param[out] out     (M, N) fp32/bf16/fp16.
 *  \param[in]  params  operand format.
 *  \param[in]  stream  cudaStream_t for CUDA views, ignored for CPU views.
 */
TweStatus twe_gemm(const TweGemmOperand* a, const TweGemmOperand* b, const TweTensorView* bias, TweTensorView* out,
                   const TweGemmParams* params, void* stream);

/*! \brief Parameters of a grouped GEMM. */
typedef struct {
  TweGemmScaling scaling; /*!< kTweGemmHighPrecision; kTweGemmFP8PerTensor (one scale_inv per group) or
                               kTweGemmMXFP8 (each group's scales in its own region, as
                               twe_grouped_quantize_mxfp8 lays them out; weights: m_g = N), CPU only */
  int32_t a_k_major; /*!< grouped_gemm: 1 (A is (M, K)); wgrad: 0 for A stored (M, N), 1 for A held as
                          per-group K-major blocks (N, m_g) one after another, passed as (N, M) */
  int32_t b_k_major; /*!< grouped_gemm: 1 for B (G, N, K), 0 for B (G, K, N); wgrad: 0 for B stored (M, K),
                          1 for per-group K-major blocks (K, m_g) one after another, passed as (K, M) */
} TweGroupedGemmParams;

/*! \brief Grouped GEMM with ragged rows (the fprop and dgrad of G experts in one call):
 *  out[rows_g] = A[rows_g] · B_gᵀ (+ bias_g) for g < G, rows_g the g-th block of m_splits[g]
 *  consecutive rows (negative sizes count as 0, blocks clipped to M); rows past the blocks are 0.
 *  Each group's numerics are exactly twe_gemm's on that group's rows. Per-tensor FP8 operands
 *  (scaling kTweGemmFP8PerTensor, CPU only) carry fp32 scale_inv (G,): group g uses entry g.
 *  \param[in]  a         fp32/bf16/fp16 (M, K).
 *  \param[in]  b         fp32/bf16/fp16 (G, N, K) (b_k_major) or (G, K, N).
 *  \param[in]  m_splits  int32 (G,), read on the device of the operands (no host sync on CUDA).
 *  \param[in]  bias      optional fp32/bf16/fp16 (G, N).
 *  \param[out] out       fp32/bf16/fp16 (M, N).
 *  \param[in]  params    operand layouts.
 *  \param[in]  stream    cudaStream_t for CUDA views.
 */
TweStatus twe_grouped_gemm(const TweTensorView* a, const TweTensorView* a_scale_inv, const TweTensorView* b,
                           const TweTensorView* b_scale_inv, const TweTensorView* m_splits, const TweTensorView* bias,
                           TweTensorView* out, const TweGroupedGemmParams* params, void* stream);

/*! \brief Grouped GEMM with a ragged contraction (the wgrad of G experts in one call):
 *  out_g = A[:, rows_g] · B[rows_g] for g < G (an fp32 sum over the group's rows, 0 for an empty
 *  group), exactly twe_gemm(A_g, B_g, a_columnwise, b_columnwise) on the group's rows.
 *  \param[in]  a         fp32/bf16/fp16, stored (M, N) (a_k_major = 0) or (1, M) (a_k_major = 1, N = 1).
 *  \param[in]  b         fp32/bf16/fp16 (M, K).
 *  \param[in]  m_splits  int32 (G,).
 *  \param[out] out       fp32/bf16/fp16 (G, N, K).
 *  \param[in]  params    operand layouts.
 *  \param[in]  stream    cudaStream_t for CUDA views.
 */
TweStatus twe_grouped_gemm_wgrad(const TweTensorView* a, const TweTensorView* a_scale_inv, const TweTensorView* b,
                                 const TweTensorView* b_scale_inv, const TweTensorView* m_splits, TweTensorView* out,
                                 const TweGroupedGemmParams* params, void* stream);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // TWINENGINE_GEMM_H_
