// CPU kernels of the permute family: loops and memory movement only; the fp32 sums use
// numerics::weighted_accumulate so the CUDA kernels give the same bytes.
#include <algorithm>
#include <cstring>
#include <vector>

#include "internal/cpu.h"
#include "internal/permute.h"

namespace twe {
namespace cpu {
namespace {

template <typename T>
void unpermute_typed(const PermuteArgs& a, const RowIdMap& map, const T* y, T* out) {
  const int64_t H = a.width;
  parallel_for(a.params.num_tokens, a.params.num_tokens * H * int64_t{sizeof(T)}, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(static_cast<size_t>(H));
    for (int64_t t = begin; t < end; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t i = 0; i < map.num_slots; ++i) {
        int64_t row, col;
        if (!map.pair(t, i, &row, &col)) continue;
        const float w = present(a.probs) ? load_high_precision(a.probs->data, a.probs->dtype, t * map.num_slots + col)
                                         : 1.0f;
        const T* src = y + row * H;
        for (int64_t h = 0; h < H; ++h) acc[h] = numerics::weighted_accumulate(acc[h], to_float(src[h]), w);
      }
      T* dst = out + t * H;
      for (int64_t h = 0; h < H; ++h) dst[h] = FromFloat<T>::apply(acc[h]);
    }
  });
}

/*! out[t] = Σ kept pairs of w · y[row] (w = 1 without probs); shared by unpermute and the
 *  gradient of permute. */
TweStatus unpermute_rows(const PermuteArgs& a) {
  const RowIdMap map = row_id_map_of(a.row_id_map, a.params);
  return dispatch_high_precision(a.in->dtype, [&](auto tag) {
    using T = decltype(tag);
    unpermute_typed(a, map, static_cast<const T*>(a.in->data), static_cast<T*>(a.out->data));
    return kTweSuccess;
  });
}

template <typename T>
void unpermute_backward_typed(const PermuteArgs& a, const RowIdMap& map) {
  const int64_t H = a.width, slots = map.num_slots;
  const T* grad_out = static_cast<const T*>(a.in->data);
  const T* y = static_cast<const T*>(a.in2->data);
  T* grad_y = static_cast<T*>(a.out->data);
  std::fill(grad_y, grad_y + a.out_rows * H, FromFloat<T>::apply(0.0f));
  const bool with_probs = present(a.probs);
  parallel_for(a.params.num_tokens, a.out_rows * H * int64_t{sizeof(T)}, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const T* g = grad_out + t * H;
      if (with_probs) {
        for (int64_t i = 0; i < slots; ++i) {
          store_high_precision(a.out_probs->data, a.out_probs->dtype, t * slots + i, 0.0f);
        }
      }
      for (int64_t i = 0; i < slots; ++i) {
        int64_t row, col;
        if (!map.pair(t, i, &row, &col)) continue;
        T* dst = grad_y + row * H;
        if (!with_probs) {
          std::memcpy(dst, g, static_cast<size_t>(H) * sizeof(T));
          continue;
        }
        const float w = load_high_precision(a.probs->data, a.probs->dtype, t * slots + col);
        const T* src = y + row * H;
        for (int64_t h = 0; h < H; ++h) dst[h] = FromFloat<T>::apply(to_float(g[h]) * w);
        // §10: the merging_probs gradient is Σc_h fl(grad_out · y) (32 lanes, then the fold).
        const float dot = numerics::canonical_sum(H, [g, src](int64_t h) { return to_float(g[h]) * to_float(src[h]); });
        store_high_precision(a.out_probs->data, a.out_probs->dtype, t * slots + col, dot);
      }
    }
  });
}

}  // namespace

TweStatus permute_row_id_map_index(const PermuteArgs& a) {
  const int64_t T = a.params.num_tokens, K = a.params.num_slots, n = T * K;
  const int32_t* ids = static_cast<const int32_t*>(a.in->data);
  int32_t* map = static_cast<int32_t*>(a.out->data);
  uint64_t* keys = static_cast<uint64_t*>(a.workspace->data);
  for (int64_t f = 0; f < n; ++f) keys[f] = pair_key(ids[f], f);
  std::sort(keys, keys + n);
  for (int64_t p = 0; p < n; ++p) {
    const int64_t f = static_cast<int64_t>(keys[p] & 0xFFFFFFFFull);
    const bool kept = (keys[p] >> 32) != kInvalidExpertKey && p < a.params.num_out_tokens;
    map[(f % K) * T + f / K] = kept ? static_cast<int32_t>(p) : -1;
  }
  return kTweSuccess;
}

TweStatus permute_row_id_map_mask(const PermuteArgs& a) {
  const int64_t T = a.params.num_tokens, E = a.params.num_slots;
  int64_t* next_row = static_cast<int64_t*>(a.workspace->data);
  int32_t* map = static_cast<int32_t*>(a.out->data);
  auto routed = [&](int64_t t, int64_t e) {
    const int64_t i = t * E + e;
    return a.in->dtype == kTweUInt8 ? static_cast<const uint8_t*>(a.in->data)[i] != 0
                                    : static_cast<const int32_t*>(a.in->data)[i] != 0;
  };
  std::fill(next_row, next_row + E, int64_t{0});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) next_row[e] += routed(t, e);
  int64_t offset = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t count = next_row[e];
    next_row[e] = offset;
    offset += count;
  }
  for (int64_t t = 0; t < T; ++t) {
    int32_t* entry = map + t * (2 * E + 1);
    int64_t n = 0;
    for (int64_t e = 0; e < E; ++e) {
      if (!routed(t, e)) continue;
      const int64_t row = next_row[e]++;
      if (row >= a.params.num_out_tokens) continue;
      entry[n] = static_cast<int32_t>(row);
      entry[E + n] = static_cast<int32_t>(e);
      ++n;
    }
    std::fill(entry + n, entry + E, -1);
    std::fill(entry + E + n, entry + 2 * E, -1);
    entry[2 * E] = static_cast<int32_t>(n);
  }
  return kTweSuccess;
}

TweStatus permute_chunk_map(const PermuteArgs& a) {
  const int64_t C = a.in_rows, T = a.params.num_tokens;
  const int32_t* split = static_cast<const int32_t*>(a.in->data);
  const int32_t* order = static_cast<const int32_t*>(a.in2->data);
  int32_t* map = static_cast<int32_t*>(a.out->data);
  std::fill(map, map + T, -1);
  auto size_of = [&](int64_t c) { return std::max<int64_t>(split[c], 0); };
  std::vector<int64_t> dst_offset(static_cast<size_t>(C), -1);
  int64_t offset = 0;
  for (int64_t j = 0; j < C; ++j) {
    const int64_t c = order[j];
    if (c < 0 || c >= C) continue;
    if (dst_offset[c] < 0) dst_offset[c] = offset;
    offset += size_of(c);
  }
  int64_t src = 0;
  for (int64_t c = 0; c < C && src < T; ++c) {
    const int64_t end = std::min(T, src + size_of(c));
    for (int64_t r = src; r < end && dst_offset[c] >= 0; ++r) {
      const int64_t dst = dst_offset[c] + (r - src);
      if (dst < a.params.num_out_tokens) map[r] = static_cast<int32_t>(dst);
    }
    src += size_of(c);
  }
  return kTweSuccess;
}

TweStatus permute_rows(const PermuteArgs& a) {
  ScopedIeeeSubnormals ieee;
  const RowIdMap map = row_id_map_of(a.row_id_map, a.params);
  const size_t row_bytes = static_cast<size_t>(a.width);
  const uint8_t* in = static_cast<const uint8_t*>(a.in->data);
  uint8_t* out = static_cast<uint8_t*>(a.out->data);
  const bool with_probs = present(a.probs);
  // Each output row is written once: copied from its token or, if no pair targets it, zeroed.
  std::vector<uint8_t> written(static_cast<size_t>(a.out_rows), 0);
  const int64_t out_bytes = a.out_rows * static_cast<int64_t>(row_bytes);
  advise_huge_pages(out, out_bytes);
  parallel_for(a.params.num_tokens, out_bytes, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t i = 0; i < map.num_slots; ++i) {
        int64_t row, col;
        if (!map.pair(t, i, &row, &col)) continue;
        std::memcpy(out + row * row_bytes, in + t * row_bytes, row_bytes);
        written[row] = 1;
        if (with_probs) {
          const float p = load_high_precision(a.probs->data, a.probs->dtype, t * map.num_slots + col);
          store_high_precision(a.out_probs->data, a.out_probs->dtype, row, p);
        }
      }
    }
  });
  for (int64_t r = 0; r < a.out_rows; ++r) {
    if (written[r]) continue;
    std::memset(out + r * row_bytes, 0, row_bytes);
    if (with_probs && r < a.params.num_out_tokens) store_high_precision(a.out_probs->data, a.out_probs->dtype, r, 0.0f);
  }
  return kTweSuccess;
}

TweStatus permute_rows_backward(const PermuteArgs& a) {
  ScopedIeeeSubnormals ieee;
  PermuteArgs sum = a;
  sum.probs = nullptr;
  TweStatus st = unpermute_rows(sum);
  if (st || !present(a.probs)) return st;
  const RowIdMap map = row_id_map_of(a.row_id_map, a.params);
  for (int64_t t = 0; t < a.params.num_tokens; ++t) {
    for (int64_t i = 0; i < map.num_slots; ++i) {
      store_high_precision(a.out_probs->data, a.out_probs->dtype, t * map.num_slots + i, 0.0f);
    }
    for (int64_t i = 0; i < map.num_slots; ++i) {
      int64_t row, col;
      if (!map.pair(t, i, &row, &col)) continue;
      const float g = load_high_precision(a.probs->data, a.probs->dtype, row);
      store_high_precision(a.out_probs->data, a.out_probs->dtype, t * map.num_slots + col, g);
    }
  }
  return kTweSuccess;
}

TweStatus permute_unpermute(const PermuteArgs& a) {
  ScopedIeeeSubnormals ieee;
  return unpermute_rows(a);
}

TweStatus permute_unpermute_backward(const PermuteArgs& a) {
  ScopedIeeeSubnormals ieee;
  const RowIdMap map = row_id_map_of(a.row_id_map, a.params);
  return dispatch_high_precision(a.in->dtype, [&](auto tag) {
    unpermute_backward_typed<decltype(tag)>(a, map);
    return kTweSuccess;
  });
}

TweStatus permute_pad_offsets(const PermuteArgs& a) {
  pad_offsets_of(static_cast<const int32_t*>(a.in->data), a.in_rows, a.align, static_cast<int32_t*>(a.out->data),
                 static_cast<int32_t*>(a.out_probs->data));
  return kTweSuccess;
}

TweStatus permute_pad_map(const PermuteArgs& a) {
  const int64_t E = a.params.num_slots;
  const int32_t* in = static_cast<const int32_t*>(a.row_id_map->data);
  const int32_t* offsets = static_cast<const int32_t*>(a.in2->data);
  int32_t* out = static_cast<int32_t*>(a.out->data);
  for (int64_t t = 0; t < a.params.num_tokens; ++t) {
    pad_map_entry(in + t * (2 * E + 1), offsets, E, out + t * (2 * E + 1));
  }
  return kTweSuccess;
}

TweStatus permute_split_pad_map(const PermuteArgs& a) {
  const int32_t* split = static_cast<const int32_t*>(a.in->data);
  const int32_t* offsets = static_cast<const int32_t*>(a.in2->data);
  int32_t* map = static_cast<int32_t*>(a.out->data);
  for (int64_t r = 0; r < a.params.num_tokens; ++r) {
    map[r] = static_cast<int32_t>(split_pad_row(split, offsets, a.in_rows, r, a.params.num_out_tokens));
  }
  return kTweSuccess;
}

}  // namespace cpu
}  // namespace twe
