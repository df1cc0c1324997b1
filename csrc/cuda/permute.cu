// CUDA kernels of the permute family: the same bytes as csrc/cpu/permute.cc (same map order,
// same fp32 sums in the same order via numerics::weighted_accumulate), launched on the caller's
// stream without host synchronization.
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <string>

#include "internal/permute.h"

namespace twe {
namespace cuda {
namespace {

constexpr int kThreads = 256;

inline unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

TweStatus check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return fail(kTweCudaError, std::string(what) + ": " + cudaGetErrorString(err));
  return kTweSuccess;
}

TweStatus memset_async(void* data, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return kTweSuccess;
  const cudaError_t err = cudaMemsetAsync(data, 0, bytes, stream);
  if (err != cudaSuccess) return fail(kTweCudaError, std::string("cudaMemsetAsync: ") + cudaGetErrorString(err));
  return kTweSuccess;
}

// ---- index map: merge sort of unique 64-bit keys -----------------------------------------------

__global__ void make_keys_kernel(const int32_t* ids, int64_t n, uint64_t* keys) {
  const int64_t f = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (f < n) keys[f] = pair_key(ids[f], f);
}

/*! One bottom-up merge pass: runs of `width` sorted keys merged pairwise from src into dst. Keys are
 *  unique, so a key's place is its index in its run plus the partner run's count of smaller keys. */
__global__ void merge_pass_kernel(const uint64_t* src, uint64_t* dst, int64_t n, int64_t width) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  const int64_t run = i / width;
  const int64_t start = (run / 2) * 2 * width;
  const bool left = run % 2 == 0;
  const int64_t lo = left ? start + width : start;
  const int64_t hi = left ? min(start + 2 * width, n) : start + width;
  const uint64_t key = src[i];
  int64_t a = lo, b = max(lo, hi);
  while (a < b) {
    const int64_t mid = a + (b - a) / 2;
    if (src[mid] < key) a = mid + 1;
    else b = mid;
  }
  const int64_t own = left ? i - start : i - (start + width);
  dst[start + own + (a - lo)] = key;
}

__global__ void index_map_kernel(const uint64_t* sorted, int64_t n, int64_t T, int64_t K, int64_t num_out,
                                 int32_t* map) {
  const int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (p >= n) return;
  const int64_t f = static_cast<int64_t>(sorted[p] & 0xFFFFFFFFull);
  const bool kept = (sorted[p] >> 32) != kInvalidExpertKey && p < num_out;
  map[(f % K) * T + f / K] = kept ? static_cast<int32_t>(p) : -1;
}

// ---- mask map ----------------------------------------------------------------------------------

template <typename M>
__global__ void expert_count_kernel(const M* routing, int64_t T, int64_t E, int64_t* counts) {
  using Reduce = cub::BlockReduce<int64_t, kThreads>;
  __shared__ typename Reduce::TempStorage storage;
  const int64_t e = blockIdx.x;
  int64_t count = 0;
  for (int64_t t = threadIdx.x; t < T; t += kThreads) count += routing[t * E + e] != 0;
  const int64_t total = Reduce(storage).Sum(count);
  if (threadIdx.x == 0) counts[e] = total;
}

/*! Destination row of every (t, e) pair of expert e = blockIdx.x, written to map[t][e] (−1 when not
 *  routed or dropped); the compaction kernel then packs each token's row. */
template <typename M>
__global__ void expert_rows_kernel(const M* routing, int64_t T, int64_t E, int64_t num_out, const int64_t* counts,
                                   int32_t* map) {
  using Scan = cub::BlockScan<int64_t, kThreads>;
  __shared__ typename Scan::TempStorage storage;
  __shared__ int64_t offset;
  const int64_t e = blockIdx.x;
  if (threadIdx.x == 0) {
    int64_t sum = 0;
    for (int64_t x = 0; x < e; ++x) sum += counts[x];
    offset = sum;
  }
  __syncthreads();
  int64_t running = offset;
  for (int64_t base = 0; base < T; base += kThreads) {
    const int64_t t = base + threadIdx.x;
    const int64_t routed = t < T && routing[t * E + e] != 0;
    int64_t rank, tile_total;
    Scan(storage).ExclusiveSum(routed, rank, tile_total);
    __syncthreads();
    if (t < T) {
      const int64_t row = running + rank;
      map[t * (2 * E + 1) + e] = routed && row < num_out ? static_cast<int32_t>(row) : -1;
    }
    running += tile_total;
  }
}

__global__ void compact_mask_map_kernel(int64_t T, int64_t E, int32_t* map) {
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (t >= T) return;
  int32_t* entry = map + t * (2 * E + 1);
  int64_t n = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int32_t row = entry[e];
    if (row < 0) continue;
    entry[n] = row;
    entry[E + n] = static_cast<int32_t>(e);
    ++n;
  }
  for (int64_t i = n; i < E; ++i) {
    entry[i] = -1;
    entry[E + i] = -1;
  }
  entry[2 * E] = static_cast<int32_t>(n);
}

// ---- chunk map ---------------------------------------------------------------------------------

__global__ void chunk_map_kernel(const int32_t* split, const int32_t* order, int64_t C, int64_t T, int64_t num_out,
                                 int32_t* map) {
  const int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (r >= T) return;
  int64_t src = 0, c = 0;
  for (; c < C; ++c) {
    const int64_t size = max(split[c], 0);
    if (r < src + size) break;
    src += size;
  }
  int32_t result = -1;
  if (c < C) {
    int64_t offset = 0;
    for (int64_t j = 0; j < C; ++j) {
      const int64_t x = order[j];
      if (x < 0 || x >= C) continue;
      if (x == c) {
        const int64_t dst = offset + (r - src);
        if (dst < num_out) result = static_cast<int32_t>(dst);
        break;
      }
      offset += max(split[x], 0);
    }
  }
  map[r] = result;
}

// ---- row movement and sums ---------------------------------------------------------------------

/*! One block per (t, slot) pair: copies the token's row to its destination row. */
template <typename V>
__global__ void permute_rows_kernel(const uint8_t* in, uint8_t* out, int64_t row_bytes, RowIdMap map,
                                    const void* probs, void* permuted_probs, TweDType probs_dtype) {
  const int64_t t = blockIdx.x / map.num_slots, i = blockIdx.x % map.num_slots;
  int64_t row, col;
  if (!map.pair(t, i, &row, &col)) return;
  const V* src = reinterpret_cast<const V*>(in + t * row_bytes);
  V* dst = reinterpret_cast<V*>(out + row * row_bytes);
  for (int64_t x = threadIdx.x; x < row_bytes / int64_t{sizeof(V)}; x += blockDim.x) dst[x] = src[x];
  if (probs && threadIdx.x == 0) {
    store_high_precision(permuted_probs, probs_dtype, row,
                         load_high_precision(probs, probs_dtype, t * map.num_slots + col));
  }
}

/*! One block per token: out[t, h] = Σ kept pairs of fl(y[row, h] · w), ascending slot order. */
template <typename T>
__global__ void unpermute_kernel(const T* y, T* out, int64_t H, RowIdMap map, const void* probs, TweDType probs_dtype) {
  const int64_t t = blockIdx.x;
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
    float acc = 0.0f;
    for (int64_t i = 0; i < map.num_slots; ++i) {
      int64_t row, col;
      if (!map.pair(t, i, &row, &col)) continue;
      const float w = probs ? load_high_precision(probs, probs_dtype, t * map.num_slots + col) : 1.0f;
      acc = numerics::weighted_accumulate(acc, to_float(y[row * H + h]), w);
    }
    out[t * H + h] = FromFloat<T>::apply(acc);
  }
}

__global__ void gather_probs_kernel(const void* grad_pp, void* grad_probs, TweDType dtype, RowIdMap map) {
  const int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (p >= map.num_tokens * map.num_slots) return;
  const int64_t t = p / map.num_slots, i = p % map.num_slots;
  int64_t row, col;
  if (!map.pair(t, i, &row, &col)) return;
  store_high_precision(grad_probs, dtype, t * map.num_slots + col, load_high_precision(grad_pp, dtype, row));
}

/*! One block per (t, slot) pair: grad_y[row] = fl(grad_out[t] · w); thread 0 sums the
 *  merging-probs gradient in ascending h (the CPU order). */
template <typename T>
__global__ void unpermute_backward_kernel(const T* grad_out, const T* y, T* grad_y, int64_t H, RowIdMap map,
                                          const void* probs, void* grad_probs, TweDType probs_dtype) {
  const int64_t t = blockIdx.x / map.num_slots, i = blockIdx.x % map.num_slots;
  int64_t row, col;
  if (!map.pair(t, i, &row, &col)) return;
  const T* g = grad_out + t * H;
  T* dst = grad_y + row * H;
  if (!probs) {
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x) dst[h] = g[h];
    return;
  }
  const float w = load_high_precision(probs, probs_dtype, t * map.num_slots + col);
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) dst[h] = FromFloat<T>::apply(to_float(g[h]) * w);
  if (threadIdx.x == 0) {
    const T* src = y + row * H;
    // §10: Σc_h fl(grad_out · y), the canonical 32-lane sum (the CPU kernel's bytes).
    const float dot = numerics::canonical_sum(H, [g, src](int64_t h) { return to_float(g[h]) * to_float(src[h]); });
    store_high_precision(grad_probs, probs_dtype, t * map.num_slots + col, dot);
  }
}

TweStatus unpermute_rows(const PermuteArgs& a, const void* probs) {
  const RowIdMap map = row_id_map_of(a.row_id_map, a.params);
  cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
  const TweDType probs_dtype = probs ? a.probs->dtype : kTweFloat32;
  if (a.params.num_tokens == 0 || a.width == 0) return kTweSuccess;
  return dispatch_high_precision(a.in->dtype, [&](auto tag) {
    using T = decltype(tag);
    unpermute_kernel<T><<<static_cast<unsigned>(a.params.num_tokens), kThreads, 0, stream>>>(
        static_cast<const T*>(a.in->data), static_cast<T*>(a.out->data), a.width, map, probs, probs_dtype);
    return check_launch("unpermute_kernel");
  });
}

}  // namespace

TweStatus permute_row_id_map_index(const PermuteArgs& a) {
  const int64_t T = a.params.num_tokens, K = a.params.num_slots, n = T * K;
  if (n == 0) return kTweSuccess;
  cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
  uint64_t* src = static_cast<uint64_t*>(a.workspace->data);
  uint64_t* dst = src + n;
  make_keys_kernel<<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const int32_t*>(a.in->data), n, src);
  for (int64_t width = 1; width < n; width *= 2) {
    merge_pass_kernel<<<blocks_for(n), kThreads, 0, stream>>>(src, dst, n, width);
    uint64_t* tmp = src;
    src = dst;
    dst = tmp;
  }
  index_map_kernel<<<blocks_for(n), kThreads, 0, stream>>>(src, n, T, K, a.params.num_out_tokens,
                                                           static_cast<int32_t*>(a.out->data));
  return check_launch("permute_row_id_map_index");
}

TweStatus permute_row_id_map_mask(const PermuteArgs& a) {
  const int64_t T = a.params.num_tokens, E = a.params.num_slots;
  if (T == 0) return kTweSuccess;
  cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
  int64_t* counts = static_cast<int64_t*>(a.workspace->data);
  int32_t* map = static_cast<int32_t*>(a.out->data);
  auto run = [&](auto tag) {
    using M = decltype(tag);
    const M* routing = static_cast<const M*>(a.in->data);
    expert_count_kernel<M><<<static_cast<unsigned>(E), kThreads, 0, stream>>>(routing, T, E, counts);
    expert_rows_kernel<M><<<static_cast<unsigned>(E), kThreads, 0, stream>>>(routing, T, E, a.params.num_out_tokens,
                                                                             counts, map);
  };
  if (a.in->dtype == kTweUInt8) run(uint8_t{});
  else run(int32_t{});
  compact_mask_map_kernel<<<blocks_for(T), kThreads, 0, stream>>>(T, E, map);
  return check_launch("permute_row_id_map_mask");
}

TweStatus permute_chunk_map(const PermuteArgs& a) {
  const int64_t T = a.params.num_tokens;
  if (T == 0) return kTweSuccess;
  chunk_map_kernel<<<blocks_for(T), kThreads, 0, static_cast<cudaStream_t>(a.stream)>>>(
      static_cast<const int32_t*>(a.in->data), static_cast<const int32_t*>(a.in2->data), a.in_rows, T,
      a.params.num_out_tokens, static_cast<int32_t*>(a.out->data));
  return check_launch("permute_chunk_map");
}

TweStatus permute_rows(const PermuteArgs& a) {
  cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
  const bool with_probs = present(a.probs);
  TweStatus st = memset_async(a.out->data, static_cast<size_t>(a.out_rows * a.width), stream);
  if (st) return st;
  if (with_probs) {
    st = memset_async(a.out_probs->data, static_cast<size_t>(a.params.num_out_tokens * element_size(a.probs->dtype)),
                      stream);
    if (st) return st;
  }
  const int64_t pairs = a.params.num_tokens * a.params.num_slots;
  if (pairs == 0) return kTweSuccess;
  const RowIdMap map = row_id_map_of(a.row_id_map, a.params);
  const uint8_t* in = static_cast<const uint8_t*>(a.in->data);
  uint8_t* out = static_cast<uint8_t*>(a.out->data);
  const void* probs = with_probs ? a.probs->data : nullptr;
  void* out_probs = with_probs ? a.out_probs->data : nullptr;
  const TweDType probs_dtype = with_probs ? a.probs->dtype : kTweFloat32;
  const bool vec16 = a.width % 16 == 0 && reinterpret_cast<uintptr_t>(in) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const unsigned grid = static_cast<unsigned>(pairs);
  if (vec16) {
    permute_rows_kernel<uint4><<<grid, kThreads, 0, stream>>>(in, out, a.width, map, probs, out_probs, probs_dtype);
  } else {
    permute_rows_kernel<uint8_t><<<grid, kThreads, 0, stream>>>(in, out, a.width, map, probs, out_probs, probs_dtype);
  }
  return check_launch("permute_rows_kernel");
}

TweStatus permute_rows_backward(const PermuteArgs& a) {
  TweStatus st = unpermute_rows(a, nullptr);
  if (st || !present(a.probs)) return st;
  cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
  const int64_t pairs = a.params.num_tokens * a.params.num_slots;
  st = memset_async(a.out_probs->data, static_cast<size_t>(pairs * element_size(a.probs->dtype)), stream);
  if (st || pairs == 0) return st;
  gather_probs_kernel<<<blocks_for(pairs), kThreads, 0, stream>>>(a.probs->data, a.out_probs->data, a.probs->dtype,
                                                                  row_id_map_of(a.row_id_map, a.params));
  return check_launch("gather_probs_kernel");
}

TweStatus permute_unpermute(const PermuteArgs& a) {
  return unpermute_rows(a, a.probs ? a.probs->data : nullptr);
}

TweStatus permute_unpermute_backward(const PermuteArgs& a) {
  cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
  const bool with_probs = present(a.probs);
  const int64_t pairs = a.params.num_tokens * a.params.num_slots;
  TweStatus st = memset_async(a.out->data, static_cast<size_t>(a.out_rows * a.width * element_size(a.in->dtype)),
                              stream);
  if (st) return st;
  if (with_probs) {
    st = memset_async(a.out_probs->data, static_cast<size_t>(pairs * element_size(a.probs->dtype)), stream);
    if (st) return st;
  }
  if (pairs == 0 || a.width == 0) return kTweSuccess;
  const RowIdMap map = row_id_map_of(a.row_id_map, a.params);
  return dispatch_high_precision(a.in->dtype, [&](auto tag) {
    using T = decltype(tag);
    unpermute_backward_kernel<T><<<static_cast<unsigned>(pairs), kThreads, 0, stream>>>(
        static_cast<const T*>(a.in->data), static_cast<const T*>(a.in2->data), static_cast<T*>(a.out->data), a.width,
        map, with_probs ? a.probs->data : nullptr, with_probs ? a.out_probs->data : nullptr,
        with_probs ? a.probs->dtype : kTweFloat32);
    return check_launch("unpermute_backward_kernel");
  });
}

namespace {

__global__ void pad_offsets_kernel(const int32_t* counts, int64_t E, int64_t align, int32_t* offsets,
                                   int32_t* padded) {
  pad_offsets_of(counts, E, align, offsets, padded);
}

__global__ void pad_map_kernel(const int32_t* in, const int32_t* offsets, int64_t T, int64_t E, int32_t* out) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t < T) pad_map_entry(in + t * (2 * E + 1), offsets, E, out + t * (2 * E + 1));
}

__global__ void split_pad_map_kernel(const int32_t* split, const int32_t* offsets, int64_t G, int64_t T,
                                     int64_t num_out, int32_t* map) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r < T) map[r] = static_cast<int32_t>(split_pad_row(split, offsets, G, r, num_out));
}

}  // namespace

TweStatus permute_pad_offsets(const PermuteArgs& a) {
  pad_offsets_kernel<<<1, 1, 0, static_cast<cudaStream_t>(a.stream)>>>(
      static_cast<const int32_t*>(a.in->data), a.in_rows, a.align, static_cast<int32_t*>(a.out->data),
      static_cast<int32_t*>(a.out_probs->data));
  return check_launch("pad_offsets_kernel");
}

TweStatus permute_pad_map(const PermuteArgs& a) {
  const int64_t T = a.params.num_tokens;
  if (T == 0) return kTweSuccess;
  pad_map_kernel<<<blocks_for(T), kThreads, 0, static_cast<cudaStream_t>(a.stream)>>>(
      static_cast<const int32_t*>(a.row_id_map->data), static_cast<const int32_t*>(a.in2->data), T,
      a.params.num_slots, static_cast<int32_t*>(a.out->data));
  return check_launch("pad_map_kernel");
}

TweStatus permute_split_pad_map(const PermuteArgs& a) {
  const int64_t T = a.params.num_tokens;
  if (T == 0) return kTweSuccess;
  split_pad_map_kernel<<<blocks_for(T), kThreads, 0, static_cast<cudaStream_t>(a.stream)>>>(
      static_cast<const int32_t*>(a.in->data), static_cast<const int32_t*>(a.in2->data), a.in_rows, T,
      a.params.num_out_tokens, static_cast<int32_t*>(a.out->data));
  return check_launch("split_pad_map_kernel");
}

}  // namespace cuda
}  // namespace twe
