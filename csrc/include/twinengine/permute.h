/*! \file permute.h
 *  \brief MoE token permutation: routing maps, permute / unpermute and chunk sorting
 *         (NUMERICS.md §10).
 *
 *  Map types:
 *  - index map: `routing_map` int32 (T, topK) of expert ids. Destination rows are ordered
 *    by expert id, stable in flattened (token, k) order; `row_id_map` int32 (topK·T,) laid
 *    out [k][t] holds the destination row, or −1 when the pair is dropped (row ≥
 *    num_out_tokens: highest expert ids drop first) or its expert id is negative.
 *  - mask map: `routing_map` uint8 or int32 (T, E), nonzero = routed. Destination rows are
 *    expert-major (expert 0's tokens in token order, then expert 1, …). `row_id_map` int32
 *    (T, 2E+1): row t holds its n kept destination rows in ascending expert order in
 *    [0, n), their expert ids in [E, E+n), −1 in the other entries of [0, 2E) and n in the
 *    last column.
 *  - chunk map (sort_chunks_by_index): an index map with topK = 1.
 *
 *  Permuted data moves as raw bytes (any element type, including FP8 data and uint8
 *  scale rows); rows of an output that no kept pair targets are zero. Sums (unpermute and
 *  the gradients) are fp32, accumulated in ascending k / expert / hidden order, rounded
 *  to the output dtype once. Row ids read from a `row_id_map` outside the valid range are
 *  skipped, never dereferenced (a map naming one destination row twice, which the map
 *  builders never produce, leaves an unspecified one of the copies there). CPU and CUDA
 *  produce identical bytes; CUDA kernels never synchronize with the host. Element offsets
 *  are 64-bit.
 */
#ifndef TWINENGINE_PERMUTE_H_
#define TWINENGINE_PERMUTE_H_

#include "twinengine/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/*! \brief Layout of a row_id_map. */
typedef enum {
  kTweMapIndex = 0, /*!< (topK·T,), [k][t] */
  kTweMapMask = 1,  /*!< (T, 2E+1) */
} TweMapType;

/*! \brief Sizes shared by every permute call. */
typedef struct {
  TweMapType map_type;
  int64_t num_tokens;     /*!< T: rows of the unpermuted tensor */
  int64_t num_slots;      /*!< topK (index map) or E (mask map) */
  int64_t num_out_tokens; /*!< capacity: destination rows >= this are dropped */
} TwePermuteParams;

/*! \brief Builds an index-map row_id_map from expert ids.
 *  \param[in]  routing_map  int32 (T, topK) expert ids; negative ids are dropped.
 *  \param[out] row_id_map   int32 (topK·T,).
 *  \param[out] workspace    int64 (2·T·topK,) scratch.
 *  \param[in]  params       map_type = kTweMapIndex, num_tokens, num_slots = topK, num_out_tokens.
 *  \param[in]  stream       cudaStream_t for CUDA views, ignored for CPU views.
 */
TweStatus twe_permute_row_id_map_index(const TweTensorView* routing_map, TweTensorView* row_id_map,
                                       TweTensorView* workspace, const TwePermuteParams* params, void* stream);

/*! \brief Builds a mask-map row_id_map from a routing mask.
 *  \param[in]  routing_map  uint8 or int32 (T, E), nonzero = routed.
 *  \param[out] row_id_map   int32 (T, 2E+1).
 *  \param[out] workspace    int64 (E,) scratch (per-expert counts).
 *  \param[in]  params       map_type = kTweMapMask, num_tokens, num_slots = E, num_out_tokens.
 *  \param[in]  stream       cudaStream_t for CUDA views.
 */
TweStatus twe_permute_row_id_map_mask(const TweTensorView* routing_map, TweTensorView* row_id_map,
                                      TweTensorView* workspace, const TwePermuteParams* params, void* stream);

/*! \brief Builds the index map (topK = 1) of sort_chunks_by_index: chunk c (rows
 *  [Σ_{c'<c} split[c'], …+split[c]) of the input) moves to the position of its first
 *  occurrence in `sorted_index`. Rows of chunks absent from `sorted_index`, rows past the
 *  chunks and rows mapped to ≥ num_out_tokens get −1; negative split sizes count as 0.
 *  \param[in]  split_sizes   int32 (C,).
 *  \param[in]  sorted_index  int32 (C,).
 *  \param[out] row_id_map    int32 (T,).
 *  \param[in]  params        map_type = kTweMapIndex, num_tokens = num_out_tokens = T, num_slots = 1.
 *  \param[in]  stream        cudaStream_t for CUDA views.
 */
TweStatus twe_permute_chunk_map(const TweTensorView* split_sizes, const TweTensorView* sorted_index,
                                TweTensorView* row_id_map, const TwePermuteParams* params, void* stream);

/*! \brief Permutes rows: out[row] = inp[t] for every kept (t, slot) pair; permuted_probs[row]
 *  = probs[t, slot] (index map) or probs[t, expert] (mask map).
 *  \param[in]  inp             (R ≥ T, W) of any dtype; rows ≥ T are not read.
 *  \param[in]  row_id_map      int32, the layout of params.map_type.
 *  \param[in]  probs           optional fp32/bf16/fp16 (T, topK or E).
 *  \param[out] out             (R_out ≥ num_out_tokens, W), inp's dtype; untargeted rows are 0.
 *  \param[out] permuted_probs  probs' dtype (num_out_tokens,), present iff probs is.
 *  \param[in]  params          map_type, num_tokens, num_slots, num_out_tokens.
 *  \param[in]  stream          cudaStream_t for CUDA views.
 */
TweStatus twe_permute_rows(const TweTensorView* inp, const TweTensorView* row_id_map, const TweTensorView* probs,
                           TweTensorView* out, TweTensorView* permuted_probs, const TwePermuteParams* params,
                           void* stream);

/*! \brief Gradient of twe_permute_rows: grad_inp[t] = Σ over kept pairs of grad_out[row]
 *  (fp32, ascending slot order); grad_probs[t, slot] = grad_permuted_probs[row] for kept
 *  pairs, 0 elsewhere.
 *  \param[in]  grad_out             fp32/bf16/fp16 (num_out_tokens, H).
 *  \param[in]  grad_permuted_probs  optional (num_out_tokens,).
 *  \param[in]  row_id_map           int32.
 *  \param[out] grad_inp             grad_out's dtype (T, H).
 *  \param[out] grad_probs           grad_permuted_probs' dtype (T, topK or E), present iff it is.
 *  \param[in]  params               as for twe_permute_rows.
 *  \param[in]  stream               cudaStream_t for CUDA views.
 */
TweStatus twe_permute_rows_backward(const TweTensorView* grad_out, const TweTensorView* grad_permuted_probs,
                                    const TweTensorView* row_id_map, TweTensorView* grad_inp,
                                    TweTensorView* grad_probs, const TwePermuteParams* params, void* stream);

/*! \brief Unpermute: out[t] = Σ over kept pairs of fl(y[row] · p) (p = merging_probs[t, slot]
 *  or [t, expert], 1 without merging_probs), fp32 in ascending slot order from +0.
 *  \param[in]  y              fp32/bf16/fp16 (num_out_tokens, H).
 *  \param[in]  row_id_map     int32.
 *  \param[in]  merging_probs  optional fp32/bf16/fp16 (T, topK or E).
 *  \param[out] out            y's dtype (T, H).
 *  \param[in]  params         as for twe_permute_rows.
 *  \param[in]  stream         cudaStream_t for CUDA views.
 */
TweStatus twe_permute_unpermute(const TweTensorView* y, const TweTensorView* row_id_map,
                                const TweTensorView* merging_probs, TweTensorView* out,
                                const TwePermuteParams* params, void* stream);

/*! \brief Gradient of twe_permute_unpermute: grad_y[row] = fl(grad_out[t] · p) for kept
 *  pairs (0 in other rows); grad_merging_probs[t, slot] = Σ_h fl(grad_out[t, h] · y[row, h])
 *  in fp32, ascending h (0 for pairs not kept).
 *  \param[in]  grad_out            y's dtype (T, H).
 *  \param[in]  y                   the forward input (num_out_tokens, H).
 *  \param[in]  row_id_map          int32.
 *  \param[in]  merging_probs       optional (T, topK or E).
 *  \param[out] grad_y              y's dtype (num_out_tokens, H).
 *  \param[out] grad_merging_probs  merging_probs' dtype, present iff merging_probs is.
 *  \param[in]  params              as for twe_permute_rows.
 *  \param[in]  stream              cudaStream_t for CUDA views.
 */
TweStatus twe_permute_unpermute_backward(const TweTensorView* grad_out, const TweTensorView* y,
                                         const TweTensorView* row_id_map, const TweTensorView* merging_probs,
                                         TweTensorView* grad_y, TweTensorView* grad_merging_probs,
                                         const TwePermuteParams* params, void* stream);

/*! \brief Padding of per-expert row blocks to a multiple of `align_size` (fused permute-and-pad).
 *  With c_e = max(counts[e], 0): padded_counts[e] = roundup(c_e, align_size) and
 *  pad_offsets[e] = Σ_{j<e} (padded_counts[j] − c_j), the shift of expert e's rows.
 *  \param[in]  counts         int32 (E,) rows per expert (E ≥ 1).
 *  \param[out] pad_offsets    int32 (E,).
 *  \param[out] padded_counts  int32 (E,).
 *  \param[in]  align_size     block alignment ≥ 1.
 *  \param[in]  stream         cudaStream_t for CUDA views.
 */
TweStatus twe_permute_pad_offsets(const TweTensorView* counts, TweTensorView* pad_offsets, TweTensorView* padded_counts,
                                  int64_t align_size, void* stream);

/*! \brief Shifts the rows of a mask-map row_id_map into padded expert blocks: every kept pair
 *  (row, expert) becomes (row + pad_offsets[expert], expert); everything else is copied.
 *  \param[in]  row_id_map   int32 (T, 2E+1) mask map.
 *  \param[in]  pad_offsets  int32 (E,) from twe_permute_pad_offsets.
 *  \param[out] out          int32 (T, 2E+1).
 *  \param[in]  params       map_type = kTweMapMask, num_tokens, num_slots = E, num_out_tokens (unused).
 *  \param[in]  stream       cudaStream_t for CUDA views.
 */
TweStatus twe_permute_pad_map(const TweTensorView* row_id_map, const TweTensorView* pad_offsets, TweTensorView* out,
                              const TwePermuteParams* params, void* stream);

/*! \brief Index map (topK = 1) padding consecutive row blocks: row r of block g (rows
 *  [Σ_{g'<g} split[g'], …+split[g]), negative sizes count as 0) goes to r + pad_offsets[g]; rows
 *  past the blocks, and rows sent to ≥ num_out_tokens, get −1.
 *  \param[in]  split_sizes  int32 (G,).
 *  \param[in]  pad_offsets  int32 (G,).
 *  \param[out] row_id_map   int32 (T,).
 *  \param[in]  params       map_type = kTweMapIndex, num_tokens = T, num_slots = 1, num_out_tokens = padded rows.
 *  \param[in]  stream       cudaStream_t for CUDA views.
 */
TweStatus twe_permute_split_pad_map(const TweTensorView* split_sizes, const TweTensorView* pad_offsets,
                                    TweTensorView* row_id_map, const TwePermuteParams* params, void* stream);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // TWINENGINE_PERMUTE_H_
