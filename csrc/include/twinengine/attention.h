/*! \file attention.h
 *  \brief Scaled dot-product attention forward and backward, high precision, layouts bshd and
 *  sbhd (docs/attention.md).
 *
 *  bshd: q (B, S_q, H, D), k (B, S_kv, H_kv, D), v (B, S_kv, H_kv, D_v); sbhd swaps the first
 *  two dimensions of q, k, v, out and the gradients. All one dtype (fp32, bf16 or
 *  fp16, widened exactly; math in fp32), contiguous. H must be a multiple of H_kv (GQA/MQA).
 *  The forward is blocked (64 keys per block) with an online softmax and writes the fp32
 *  logsumexp per query row; the backward recomputes the probabilities from it. No S_q × S_kv
 *  matrix is materialised. CUDA views run csrc/cuda/attention.cu (same bytes, high precision,
 *  head dimensions <= 256); FP8 attention (params.fp8) is CPU-only.
 */
#ifndef TWINENGINE_ATTENTION_H_
#define TWINENGINE_ATTENTION_H_

#include "twinengine/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/*! \brief Mask types (TE's attn_mask_type names). */
typedef enum {
  kTweAttnMaskNone = 0,
  kTweAttnMaskPadding = 1,
  kTweAttnMaskCausal = 2,                  /*!< top-left aligned */
  kTweAttnMaskPaddingCausal = 3,           /*!< top-left aligned, per-batch lengths */
  kTweAttnMaskCausalBottomRight = 4,       /*!< bottom-right aligned */
  kTweAttnMaskPaddingCausalBottomRight = 5 /*!< bottom-right aligned, per-batch lengths */
} TweAttentionMask;

/*! \brief Layout of q, k, v, out and their gradients (lse is always (B, H, S_q)). */
typedef enum {
  kTweAttnLayoutBSHD = 0, /*!< (batch, seq, heads, head_dim) */
  kTweAttnLayoutSBHD = 1, /*!< (seq, batch, heads, head_dim) */
  kTweAttnLayoutTHD = 2   /*!< (tokens, heads, head_dim): packed sequences; the seqlens_q /
                               seqlens_kv inputs are then cu_seqlens (n + 1,) int32 offsets and
                               lse is (H, T_q) */
} TweAttentionLayout;

/*! \brief Parameters of an attention call (forward and backward take the same). */
typedef struct {
  TweAttentionLayout layout;
  TweAttentionMask mask_type;
  int64_t window_left;   /*!< -1: unbounded; else keys >= i + δ − left */
  int64_t window_right;  /*!< -1: unbounded; else keys <= i + δ + right (0 for causal types) */
  float softmax_scale;   /*!< s, fp32 */
  float dropout_p;       /*!< fp32 in [0, 1); 0: no dropout (rng unused) */
  int32_t fp8;           /*!< 1: FP8 attention (docs/attention.md §9: E4M3 Q, K, V, P; E5M2 dO, dS;
                              per-tensor current scales computed in the kernel); 0: high precision */
} TweAttentionParams;

/*! \brief Attention forward.
 *  \param[in]  q           (B, S_q, H, D) (sbhd: (S_q, B, H, D); likewise below).
 *  \param[in]  k           (B, S_kv, H_kv, D), q's dtype.
 *  \param[in]  v           (B, S_kv, H_kv, D_v), q's dtype.
 *  \param[in]  seqlens_q   int32 (B,) actual query lengths (padding types), or NULL.
 *  \param[in]  seqlens_kv  int32 (B,) actual key lengths (padding types), or NULL.
 *  \param[in]  rng         [seed, offset] (uint32/int32/int64) when dropout_p > 0, else NULL.
 *  \param[out] out         (B, S_q, H, D_v), q's dtype.
 *  \param[out] lse         fp32 (B, H, S_q); −inf for fully masked rows.
 *  \param[in]  params      mask, window, scale, dropout.
 *  \param[in]  stream      cudaStream_t for CUDA views.
 */
TweStatus twe_attention_fwd(const TweTensorView* q, const TweTensorView* k, const TweTensorView* v,
                            const TweTensorView* seqlens_q, const TweTensorView* seqlens_kv, const TweTensorView* rng,
                            TweTensorView* out, TweTensorView* lse, const TweAttentionParams* params, void* stream);

/*! \brief Attention backward from the forward's out and lse (probabilities recomputed).
 *  \param[in]  dout        out's shape and dtype.
 *  \param[in]  q, k, v     as the forward.
 *  \param[in]  out         the forward's output.
 *  \param[in]  lse         the forward's fp32 logsumexp (B, H, S_q).
 *  \param[in]  seqlens_q, seqlens_kv, rng  as the forward (same values).
 *  \param[out] dq, dk, dv  q's, k's, v's shapes, q's dtype.
 *  \param[in]  params      as the forward.
 *  \param[in]  stream      cudaStream_t for CUDA views.
 */
TweStatus twe_attention_bwd(const TweTensorView* dout, const TweTensorView* q, const TweTensorView* k,
                            const TweTensorView* v, const TweTensorView* out, const TweTensorView* lse,
                            const TweTensorView* seqlens_q, const TweTensorView* seqlens_kv, const TweTensorView* rng,
                            TweTensorView* dq, TweTensorView* dk, TweTensorView* dv, const TweAttentionParams* params,
                            void* stream);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // TWINENGINE_ATTENTION_H_
