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
 *  partial sum with the bundled sgemm (deterministic for a given shape). The CUDA path follows
 *  the plan of twe_gemm_plan (one table): cuBLASLt on the stored operands where the device
 *  runs the format natively (per-tensor FP8 sm_89+, FP8 block sm_90 with cuBLASLt >= 12.9,
 *  MXFP8 / NVFP4 sm_100+, high precision everywhere), else the operands are dequantized into
 *  the workspace and multiplied by a bf16 / fp32 cuBLASLt GEMM, else (no cuBLASLt, K == 0) a
 *  dequantize-in-registers tiled kernel. CUDA results equal the CPU path within the documented
 *  per-format tolerance (docs/cuda.md): cuBLASLt's accumulation order is its own.
 *
 *  Workspace: CUDA GEMMs take a uint8 workspace whose size the caller computes from the plan
 *  (core/ops/gemm.py gemm_workspace_bytes; TweGemmPlan.workspace_bytes is the same number).
 *  Layout, each part starting at a multiple of 256 bytes: the cuBLASLt workspace
 *  (kTweGemmCublasWorkspaceBytes when cuBLASLt runs), then A's staging, then B's staging
 *  (swizzled scales: the padded scale tensor's bytes; dequantized data: rows·K·2 (bf16) or
 *  ·4 (fp32)), then the fp32 (M, N) output staging, then 256 bytes of device scalars, plus
 *  256 bytes of slack so an unaligned base pointer can be rounded up to 256.
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

/*! \brief Bytes of the cuBLASLt workspace part (32 MiB, NVIDIA's recommendation for Hopper/Blackwell). */
#define kTweGemmCublasWorkspaceBytes ((int64_t)33554432)

/*! \brief Which kernel computes a GEMM. */
typedef enum {
  kTweGemmPathNone = 0,           /*!< nothing to compute: M or N is 0 */
  kTweGemmPathCpu = 1,            /*!< the CPU kernel (CPU views) */
  kTweGemmPathTiled = 2,          /*!< CUDA dequantize-in-registers tiled kernel (no cuBLASLt, or K == 0) */
  kTweGemmPathCublasLt = 3,       /*!< cuBLASLt on the stored operands (native format) */
  kTweGemmPathDequantCublasLt = 4 /*!< dequantize/widen into the workspace, then cuBLASLt bf16/fp32 */
} TweGemmPath;

/*! \brief What an operand needs before cuBLASLt reads it. */
typedef enum {
  kTweGemmStageNone = 0,    /*!< read as stored */
  kTweGemmStageSwizzle = 1, /*!< block scales into the 128x4 tiled layout (NUMERICS.md §5) */
  kTweGemmStageBF16 = 2,    /*!< decoded values (x̂ exactly representable) as bf16 */
  kTweGemmStageFP32 = 3     /*!< decoded or widened values as fp32 */
} TweGemmStaging;

/*! \brief How bias and the output rounding are applied. */
typedef enum {
  kTweGemmEpilogueDirect = 0,    /*!< cuBLASLt writes out; no bias */
  kTweGemmEpilogueBias = 1,      /*!< cuBLASLt's bias epilogue (bias dtype == out dtype, bf16/fp16 out) */
  kTweGemmEpilogueBiasAdd = 2,   /*!< cuBLASLt writes fp32 out, then out = fl(out + bias) */
  kTweGemmEpilogueStaged = 3     /*!< cuBLASLt writes fp32 staging, then out = RNE(fl(acc (+ bias))) */
} TweGemmEpilogue;

/*! \brief A GEMM as the dispatcher sees it (operand views reduced to dtypes, layouts, sizes). */
typedef struct {
  TweGemmScaling scaling;
  TweDType a_dtype;          /*!< stored data dtype of A (uint8 for NVFP4) */
  TweDType b_dtype;
  TweDType out_dtype;
  TweDType bias_dtype;       /*!< ignored without bias */
  int32_t has_bias;
  int32_t a_k_major;
  int32_t b_k_major;
  int32_t a_block_2d;
  int32_t b_block_2d;
  int64_t m;
  int64_t n;
  int64_t k;
  int64_t a_scale_bytes;     /*!< bytes of A's scale_inv tensor (swizzle staging size), 0 if none */
  int64_t b_scale_bytes;
  TweDevice device;
  int32_t sm;                /*!< CUDA compute capability, major·10 + minor (ignored on CPU) */
  int32_t cublaslt_version;  /*!< cublasLtGetVersion() of the loaded library, 0 when none loads */
} TweGemmPlanQuery;

/*! \brief The dispatcher's decision. A and B are this ABI's operands; cuBLASLt sees the
 *  column-major product outᵀ (N, M) = B · Aᵀ, so its "A" is our B and its "B" our A. */
typedef struct {
  TweGemmPath path;
  int32_t cublas_transa;       /*!< cuBLASLt op of its A (our B): 0 = N, 1 = T */
  int32_t cublas_transb;       /*!< cuBLASLt op of its B (our A): 0 = N, 1 = T */
  int32_t a_scale_mode;        /*!< cublasLtMatmulMatrixScale_t of our A, -1 for none */
  int32_t b_scale_mode;
  TweGemmStaging a_staging;
  TweGemmStaging b_staging;
  TweDType a_compute_dtype;    /*!< element type cuBLASLt reads for A (uint8 = packed E2M1) */
  TweDType b_compute_dtype;
  TweGemmEpilogue epilogue;
  int64_t workspace_bytes;     /*!< bytes of workspace the CUDA path needs (0 for CPU / none) */
  char reason[160];            /*!< why this path (e.g. why not native), for errors and docs */
} TweGemmPlan;

/*! \brief The dispatcher: format × device capability × layout → kernel choice (one table).
 *  \param[in]  query  the GEMM.
 *  \param[out] plan   the decision.
 *  \return kTweInvalidArgument (with a message) for impossible combinations.
 */
TweStatus twe_gemm_plan(const TweGemmPlanQuery* query, TweGemmPlan* plan);

/*! \brief Parameters of the scale swizzle. */
typedef struct {
  int32_t transposed;  /*!< 1: the compact scales are stored (blocks, rows) (MXFP8 columnwise), else (rows, blocks) */
  int32_t inverse;     /*!< 1: unswizzle (tiled -> compact), 0: swizzle (compact -> tiled) */
} TweGemmSwizzleParams;

/*! \brief Moves block scales between the compact padded layout and cuBLASLt's 128×4 tiled layout
 *  (NUMERICS.md §5): compact (rows, blocks) — or (blocks, rows) when transposed — with rows a
 *  multiple of 128 and blocks a multiple of 4; tiled: 128×4 tiles row-major over tiles, 512
 *  bytes each, element (r, c) of a tile at (r mod 32)·16 + floor(r/32)·4 + c.
 *  \param[in]  in      uint8 scales, 2-D (compact when swizzling, tiled when unswizzling).
 *  \param[out] out     uint8 scales, same shape as `in`.
 *  \param[in]  params  direction and compact orientation.
 *  \param[in]  stream  cudaStream_t for CUDA views, ignored for CPU views.
 */
TweStatus twe_gemm_swizzle_scales(const TweTensorView* in, TweTensorView* out, const TweGemmSwizzleParams* params,
                                  void* stream);

/*! \brief cublasLtGetVersion() of the cuBLASLt library the CUDA path loads (0 when it cannot be
 *  loaded, or in a build without CUDA). */
int64_t twe_gemm_cublaslt_version(void);

/*! \brief out (M, N) = A (M, K) · B (N, K)ᵀ (+ bias), fp32 accumulation.
 *  \param[in]  a          operand A, logically (M, K) (NVFP4 data (M, K/2)).
 *  \param[in]  b          operand B, logically (N, K).
 *  \param[in]  bias       (N,) fp32/bf16/fp16, or NULL / data == NULL for none.
 *  \param[out] out        (M, N) fp32/bf16/fp16.
 *  \param[out] workspace  uint8 (bytes,) scratch on out's device, at least the plan's
 *                         workspace_bytes (CUDA); NULL / absent for CPU views.
 *  \param[in]  params     operand format.
 *  \param[in]  stream     cudaStream_t for CUDA views, ignored for CPU views.
 */
TweStatus twe_gemm(const TweGemmOperand* a, const TweGemmOperand* b, const TweTensorView* bias, TweTensorView* out,
                   TweTensorView* workspace, const TweGemmParams* params, void* stream);

/*! \brief Parameters of a grouped GEMM. */
typedef struct {
  TweGemmScaling scaling; /*!< kTweGemmHighPrecision; kTweGemmFP8PerTensor (one scale_inv per group) or
                               kTweGemmMXFP8 (each group's scales in its own region, as
                               twe_grouped_quantize_mxfp8 lays them out; weights: m_g = N), kTweGemmFP8Block,
                               or kTweGemmNVFP4 (packed K-major data, flat uint8 scales of each group one
                               after another as twe_grouped_quantize_nvfp4 lays them out, and an fp32 (G,)
                               global amax per operand); quantized ones CPU only */
  int32_t a_k_major; /*!< grouped_gemm: 1 (A is (M, K)); wgrad: 0 for A stored (M, N), 1 for A held as
                          per-group K-major blocks (N, m_g) one after another, passed as (N, M) */
  int32_t b_k_major; /*!< grouped_gemm: 1 for B (G, N, K), 0 for B (G, K, N); wgrad: 0 for B stored (M, K),
                          1 for per-group K-major blocks (K, m_g) one after another, passed as (K, M) */
  int32_t a_block_2d; /*!< kTweGemmFP8Block: A's scales are 128x128 tiles (else 1x128 blocks) */
  int32_t b_block_2d; /*!< kTweGemmFP8Block: B's scales are 128x128 tiles (else 1x128 blocks). FP8 block
                           scales are flat fp32 arrays holding each group's scale tensor (the shape
                           twe_quantize_fp8_block gives its data block) one after another, as
                           twe_grouped_quantize_fp8_block lays them out */
} TweGroupedGemmParams;

/*! \brief Grouped GEMM with ragged rows (the fprop and dgrad of G experts in one call):
 *  out[rows_g] = A[rows_g] · B_gᵀ (+ bias_g) for g < G, rows_g the g-th block of m_splits[g]
 *  consecutive rows. On the CPU the sizes must be >= 0 and sum to M (kTweInvalidArgument with
 *  core's m_splits text otherwise); CUDA reads them on the device unchecked (negative sizes count
 *  as 0, blocks are clipped to M, rows past the blocks are 0).
 *  Each group's numerics are exactly twe_gemm's on that group's rows. Per-tensor FP8 operands
 *  (scaling kTweGemmFP8PerTensor, CPU only) carry fp32 scale_inv (G,): group g uses entry g;
 *  NVFP4 operands (CPU only) also an amax (G,) each: group g's global amaxes (§7).
 *  \param[in]  a         fp32/bf16/fp16 (M, K); NVFP4: packed uint8 (M, K/2).
 *  \param[in]  a_amax    NVFP4: fp32 (G,), else NULL (likewise b_amax).
 *  \param[in]  b         fp32/bf16/fp16 (G, N, K) (b_k_major) or (G, K, N).
 *  \param[in]  m_splits  int32 (G,), read on the device of the operands (no host sync on CUDA).
 *  \param[in]  bias      optional fp32/bf16/fp16 (G, N).
 *  \param[out] out       fp32/bf16/fp16 (M, N).
 *  \param[in]  params    operand layouts.
 *  \param[in]  stream    cudaStream_t for CUDA views.
 */
TweStatus twe_grouped_gemm(const TweTensorView* a, const TweTensorView* a_scale_inv, const TweTensorView* a_amax,
                           const TweTensorView* b, const TweTensorView* b_scale_inv, const TweTensorView* b_amax,
                           const TweTensorView* m_splits, const TweTensorView* bias, TweTensorView* out,
                           const TweGroupedGemmParams* params, void* stream);

/*! \brief Grouped GEMM with a ragged contraction (the wgrad of G experts in one call):
 *  out_g = A[:, rows_g] · B[rows_g] for g < G (an fp32 sum over the group's rows, 0 for an empty
 *  group), exactly twe_gemm(A_g, B_g, a_columnwise, b_columnwise) on the group's rows.
 *  \param[in]  a         fp32/bf16/fp16, stored (M, N) (a_k_major = 0) or (1, M) (a_k_major = 1, N = 1);
 *                        NVFP4: the packed (N, m_g/2) blocks one after another, passed as (N, M/2).
 *  \param[in]  a_amax    NVFP4: fp32 (G,), else NULL (likewise b_amax).
 *  \param[in]  b         fp32/bf16/fp16 (M, K).
 *  \param[in]  m_splits  int32 (G,).
 *  \param[out] out       fp32/bf16/fp16 (G, N, K).
 *  \param[in]  params    operand layouts.
 *  \param[in]  stream    cudaStream_t for CUDA views.
 */
TweStatus twe_grouped_gemm_wgrad(const TweTensorView* a, const TweTensorView* a_scale_inv, const TweTensorView* a_amax,
                                 const TweTensorView* b, const TweTensorView* b_scale_inv, const TweTensorView* b_amax,
                                 const TweTensorView* m_splits, TweTensorView* out, const TweGroupedGemmParams* params,
                                 void* stream);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // TWINENGINE_GEMM_H_
