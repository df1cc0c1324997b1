/*! \file rope.h
 *  \brief Rotary position embedding (TE's apply_rotary_pos_emb), forward and backward.
 *
 *  t holds rows of D channels, one row per (token, head); freqs (S_f, 1, 1, D2) fp32 holds the
 *  angle of each position p and rotary channel i < D2 (D2 even, D2 <= D). Channel i < D2 of a
 *  row at position p becomes fl(fl(x_i·cos_i) + fl(x'_i·sin_i)) with cos_i / sin_i those of
 *  freqs[p, i] (numerics::rope_sincos) and x'_i the partner channel: −x_{i+D2/2} for i < D2/2,
 *  x_{i−D2/2} otherwise (interleaved: −x_{i+1} for even i, x_{i−1} for odd i); channels
 *  i >= D2 are copied. The backward is the exact transpose: dx_i = fl(fl(dy_i·cos_i) +
 *  fl(±dy_j·sin_j)) with j the partner of i. Results are rounded (RNE) to t's dtype; CPU and
 *  CUDA give identical bytes (docs/numerics.md, "Rotary position embedding").
 */
#ifndef TWINENGINE_ROPE_H_
#define TWINENGINE_ROPE_H_

#include "twinengine/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/*! \brief Layout of t. */
typedef enum {
  kTweRopeSbhd = 0, /*!< (S, B, H, D): position = index along dim 0 */
  kTweRopeBshd = 1, /*!< (B, S, H, D): position = index along dim 1 */
  kTweRopeThd = 2,  /*!< (T, H, D) packed sequences: position = token − cu_seqlens[b] */
} TweRopeFormat;

/*! \brief Parameters of twe_rope_forward / twe_rope_backward. */
typedef struct {
  int32_t format;      /*!< a TweRopeFormat */
  int32_t interleaved; /*!< 0: rotate halves; 1: rotate adjacent pairs */
} TweRopeParams;

/*! \brief y = rope(x).
 *  \param[in]  x           fp32/bf16/fp16, rank 4 (sbhd, bshd) or 3 (thd).
 *  \param[in]  freqs       fp32 (S_f, 1, 1, D2); S_f >= the sequence length (every position used).
 *  \param[in]  cu_seqlens  int32 (B + 1,) non-decreasing offsets into T (thd only, else NULL).
 *                          Tokens outside [cu_seqlens[0], cu_seqlens[B]) are copied. On the CPU the
 *                          offsets and the longest sequence (<= S_f) are checked; CUDA reads them
 *                          unchecked and copies tokens whose position is >= S_f.
 *  \param[out] y           x's shape and dtype.
 *  \param[in]  params      layout and interleaving.
 *  \param[in]  stream      cudaStream_t for CUDA views, the CPU executor (or NULL) for CPU views.
 */
TweStatus twe_rope_forward(const TweTensorView* x, const TweTensorView* freqs, const TweTensorView* cu_seqlens,
                           TweTensorView* y, const TweRopeParams* params, void* stream);

/*! \brief dx = the transpose of rope applied to dy (arguments as twe_rope_forward). */
TweStatus twe_rope_backward(const TweTensorView* dy, const TweTensorView* freqs, const TweTensorView* cu_seqlens,
                            TweTensorView* dx, const TweRopeParams* params, void* stream);

#ifdef __cplusplus
}
#endif

#endif  // TWINENGINE_ROPE_H_
