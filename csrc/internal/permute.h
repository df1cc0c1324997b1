// Validated arguments of the permute family, the row_id_map walk both device paths share, and
// the per-device kernel entry points.
#ifndef TWINENGINE_INTERNAL_PERMUTE_H_
#define TWINENGINE_INTERNAL_PERMUTE_H_

#include "internal/common.h"
#include "twinengine/permute.h"

namespace twe {

/*! Sort-key value of a negative (invalid) expert id: after every valid (int32 >= 0) id. */
constexpr uint64_t kInvalidExpertKey = 0xFFFFFFFFull;

/*! Index-map sort key of pair f = t·topK + k: the expert id in the high word, f in the low word.
 *  Keys are unique and ascending key order is the stable expert order of NUMERICS.md §10. */
TWE_HOST_DEVICE uint64_t pair_key(int32_t expert, int64_t f) {
  const uint64_t id = expert >= 0 ? static_cast<uint64_t>(expert) : kInvalidExpertKey;
  return (id << 32) | static_cast<uint64_t>(f);
}

/*! A row_id_map as the kernels read it. Row ids come from the caller (unpermute takes a map it
 *  did not build), so every read is range-checked by pair(). */
struct RowIdMap {
  const int32_t* data;
  TweMapType type;
  int64_t num_tokens;
  int64_t num_slots;  // candidate pairs per token: topK (index map) or E (mask map)
  int64_t num_rows;  // destination rows: a row id must lie in [0, num_rows)

  /*! The i-th pair of token t: false when absent or out of range; else its destination row
   *  and the probs column it uses (k for the index map, the expert id for the mask map). */
  TWE_HOST_DEVICE bool pair(int64_t t, int64_t i, int64_t* row, int64_t* col) const {
    if (type == kTweMapIndex) {
      *row = data[i * num_tokens + t];
      *col = i;
    } else {
      const int32_t* entry = data + t * (2 * num_slots + 1);
      const int64_t n = entry[2 * num_slots];
      if (i >= n) return false;
      *row = entry[i];
      *col = entry[num_slots + i];
      if (*col < 0 || *col >= num_slots) return false;
    }
    return *row >= 0 && *row < num_rows;
  }
};

/*! Destination row of row r when consecutive blocks of `split` (G sizes, negative = 0) are
 *  shifted by `pad_offsets`: r + pad_offsets[g] for r in block g, −1 past the blocks or at
 *  ≥ num_out (host and device). */
TWE_HOST_DEVICE int64_t split_pad_row(const int32_t* split, const int32_t* pad_offsets, int64_t groups, int64_t r,
                                      int64_t num_out) {
  int64_t start = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t size = split[g] > 0 ? split[g] : 0;
    if (r < start + size) {
      const int64_t dst = r + pad_offsets[g];
      return dst >= 0 && dst < num_out ? dst : -1;
    }
    start += size;
  }
  return -1;
}

/*! twe_permute_pad_offsets over E experts, one pass in expert order (host and device). */
TWE_HOST_DEVICE void pad_offsets_of(const int32_t* counts, int64_t experts, int64_t align, int32_t* offsets,
                                    int32_t* padded) {
  int64_t shift = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t c = counts[e] > 0 ? counts[e] : 0;
    const int64_t p = (c + align - 1) / align * align;
    offsets[e] = static_cast<int32_t>(shift);
    padded[e] = static_cast<int32_t>(p);
    shift += p - c;
  }
}

/*! The padded form of one mask-map entry (2E+1 int32 values) (host and device). */
TWE_HOST_DEVICE void pad_map_entry(const int32_t* in, const int32_t* pad_offsets, int64_t experts, int32_t* out) {
  const int64_t n = in[2 * experts];
  for (int64_t i = 0; i < 2 * experts + 1; ++i) out[i] = in[i];
  for (int64_t i = 0; i < n && i < experts; ++i) {
    const int32_t e = in[experts + i];
    if (in[i] >= 0 && e >= 0 && e < experts) out[i] = in[i] + pad_offsets[e];
  }
}

inline RowIdMap row_id_map_of(const TweTensorView* map, const TwePermuteParams& p) {
  return RowIdMap{static_cast<const int32_t*>(map->data), p.map_type, p.num_tokens, p.num_slots,
                  p.num_out_tokens};
}

/*! Element i of a high-precision array of dtype d, widened to fp32. */
TWE_HOST_DEVICE float load_high_precision(const void* data, TweDType d, int64_t i) {
  if (d == kTweBFloat16) return to_float(static_cast<const BFloat16*>(data)[i]);
  if (d == kTweFloat16) return to_float(static_cast<const Float16*>(data)[i]);
  return static_cast<const float*>(data)[i];
}

/*! Stores v, rounded (RNE) to dtype d, as element i. */
TWE_HOST_DEVICE void store_high_precision(void* data, TweDType d, int64_t i, float v) {
  if (d == kTweBFloat16) static_cast<BFloat16*>(data)[i] = FromFloat<BFloat16>::apply(v);
  else if (d == kTweFloat16) static_cast<Float16*>(data)[i] = FromFloat<Float16>::apply(v);
  else static_cast<float*>(data)[i] = v;
}

/*! One permute-family call after the ABI layer checked every view. Unused members are null. */
struct PermuteArgs {
  const TweTensorView* in;          // routing_map / inp / y / grad_out / split_sizes
  const TweTensorView* in2;         // sorted_index (chunk map), y (unpermute backward)
  const TweTensorView* row_id_map;
  const TweTensorView* probs;       // probs / merging_probs / grad_permuted_probs
  TweTensorView* out;               // row_id_map (map builders) or the data output
  TweTensorView* out_probs;         // permuted_probs / grad_probs / grad_merging_probs
  TweTensorView* workspace;
  TwePermuteParams params;
  int64_t in_rows;   // rows of `in` (>= num_tokens for twe_permute_rows)
  int64_t out_rows;  // rows of `out`
  int64_t width;     // elements per row (hidden size; or bytes per row for twe_permute_rows)
  void* stream;
  int64_t align = 0;  // block alignment (twe_permute_pad_offsets)
};

#define TWE_PERMUTE_KERNELS(NS)                                  \
  namespace NS {                                                 \
  TweStatus permute_row_id_map_index(const PermuteArgs& args);   \
  TweStatus permute_row_id_map_mask(const PermuteArgs& args);    \
  TweStatus permute_chunk_map(const PermuteArgs& args);          \
  TweStatus permute_rows(const PermuteArgs& args);               \
  TweStatus permute_rows_backward(const PermuteArgs& args);      \
  TweStatus permute_unpermute(const PermuteArgs& args);          \
  TweStatus permute_unpermute_backward(const PermuteArgs& args); \
  TweStatus permute_pad_offsets(const PermuteArgs& args);        \
  TweStatus permute_pad_map(const PermuteArgs& args);            \
  TweStatus permute_split_pad_map(const PermuteArgs& args);      \
  }

TWE_PERMUTE_KERNELS(cpu)
#ifdef TWE_WITH_CUDA
TWE_PERMUTE_KERNELS(cuda)
#endif
#undef TWE_PERMUTE_KERNELS

}  // namespace twe

#endif  // TWINENGINE_INTERNAL_PERMUTE_H_
