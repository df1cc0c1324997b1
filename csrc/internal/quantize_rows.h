// CPU only: a kernel that writes a high-precision (R, K) output row by row (a norm, an activation)
// quantizes it in the same pass with the quantize family's own kernels, so the bytes are those of
// quantizing the finished output afterwards: MXFP8 per 32-row block while the block is in cache,
// per-tensor FP8 from row amaxes taken while each row is written (no separate amax pass).
#ifndef TWINENGINE_INTERNAL_QUANTIZE_ROWS_H_
#define TWINENGINE_INTERNAL_QUANTIZE_ROWS_H_

#include <atomic>
#include <cstring>
#include <vector>

#include "internal/cpu.h"
#include "internal/quantize.h"

namespace twe {
namespace cpu {

/*! advise_huge_pages for a whole (freshly allocated) view. */
inline void advise_view(const TweTensorView& v) { advise_huge_pages(v.data, numel(v) * element_size(v.dtype)); }

/*! MXFP8 of y (R, K), R a multiple of 32 (the ABI's check): for each 32-row block, produce(r0, r0 + 32)
 *  writes y's rows, then quantize_mxfp8 of just that block. MXFP8 blocks never cross a 32-row
 *  block (1D or 2D), so each block's bytes are those the whole-tensor quantize writes; the scale
 *  padding is zeroed here once. `work` sizes the parallel split (elements times cost). */
template <typename Produce>
TweStatus quantize_mxfp8_by_row_blocks(const TweTensorView& y, const TweQuantizedTensor& o,
                                       const TweQuantizeParams& params, int64_t rows, int64_t k, int64_t work,
                                       void* stream, Produce&& produce) {
  const bool row = present(&o.rowwise_data), col = present(&o.columnwise_data);
  // The whole outputs get the huge-page advice the per-block quantize calls (too small) skip.
  advise_view(y);
  if (row) advise_view(o.rowwise_data);
  if (col) advise_view(o.columnwise_data);
  const int64_t row_stride = row ? o.rowwise_scale_inv.shape[o.rowwise_scale_inv.ndim - 1] : 0;
  const int64_t col_stride = col ? o.columnwise_scale_inv.shape[o.columnwise_scale_inv.ndim - 1] : 0;
  if (row) std::memset(o.rowwise_scale_inv.data, 0, static_cast<size_t>(numel(o.rowwise_scale_inv)));
  if (col) std::memset(o.columnwise_scale_inv.data, 0, static_cast<size_t>(numel(o.columnwise_scale_inv)));
  std::atomic<int> status{kTweSuccess};
  parallel_for(rows / 32, work, [&](int64_t block_begin, int64_t block_end) {
    for (int64_t b = block_begin; b < block_end; ++b) {
      const int64_t r0 = b * 32;
      produce(r0, r0 + 32);
      const TweTensorView input = view_2d(y, r0 * k, 32, k);
      TweQuantizedTensor out{};
      if (row) {
        out.rowwise_data = view_2d(o.rowwise_data, r0 * k, 32, k);
        out.rowwise_scale_inv = view_2d(o.rowwise_scale_inv, r0 * row_stride, 32, row_stride);
      }
      if (col) {
        out.columnwise_data = view_2d(o.columnwise_data, r0 * k, 32, k);
        out.columnwise_scale_inv = view_2d(o.columnwise_scale_inv, b * col_stride, 1, col_stride);
      }
      const QuantizeArgs block{&input, nullptr, nullptr, &out, params, 32, k, stream};
      const TweStatus st = quantize_mxfp8(block);
      if (st) status.store(st);
    }
  });
  return static_cast<TweStatus>(status.load());
}

/*! Per-tensor FP8 (current scaling, or delayed with `scale`) of y (R, K): produce(r0, r1, keys)
 *  writes rows [r0, r1) and keys[r] = the max numerics::amax_key of row r as written; then the
 *  scale from the max key and one cast pass (quantize_fp8_per_tensor_with_amax). */
template <typename Produce>
TweStatus quantize_fp8_per_tensor_by_rows(const TweTensorView& y, const TweTensorView* scale,
                                          TweQuantizedTensor* output, const TweQuantizeParams& params, int64_t rows,
                                          int64_t k, int64_t work, void* stream, Produce&& produce) {
  std::vector<uint32_t> keys(static_cast<size_t>(rows), 0u);
  advise_view(y);
  parallel_for(rows, work, [&](int64_t begin, int64_t end) { produce(begin, end, keys.data()); });
  uint32_t key = 0;
  for (uint32_t v : keys) key = v > key ? v : key;
  const QuantizeArgs qa{&y, scale, nullptr, output, params, rows, k, stream};
  return quantize_fp8_per_tensor_with_amax(qa, numerics::bits_to_float(key));
}

}  // namespace cpu
}  // namespace twe

#endif  // TWINENGINE_INTERNAL_QUANTIZE_ROWS_H_
