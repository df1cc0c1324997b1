// Index math of cuBLASLt's 128x4 tiled ("swizzled") block-scale layout (NUMERICS.md §5), shared
// by the host function (csrc/cpu/gemm_swizzle.cc) and the CUDA kernel (csrc/cuda/gemm_swizzle.cu):
// both move element (r, c) of the compact layout to swizzled_scale_offset(r, c) and back.
#ifndef TWINENGINE_INTERNAL_GEMM_SWIZZLE_H_
#define TWINENGINE_INTERNAL_GEMM_SWIZZLE_H_

#include <cstdint>

#include "internal/common.h"

namespace twe {

constexpr int64_t kSwizzleTileRows = 128;
constexpr int64_t kSwizzleTileCols = 4;

/*! Offset of scale (row r, block c) in the tiled layout of a (rows, blocks) scale tensor with
 *  blocks a multiple of 4: 128×4 tiles, row-major over tiles, 512 bytes each; inside a tile
 *  (r mod 32)·16 + floor((r mod 128)/32)·4 + (c mod 4). */
TWE_HOST_DEVICE int64_t swizzled_scale_offset(int64_t r, int64_t c, int64_t blocks) {
  const int64_t tile = (r / kSwizzleTileRows) * (blocks / kSwizzleTileCols) + c / kSwizzleTileCols;
  const int64_t in_tile = r % kSwizzleTileRows;
  return tile * (kSwizzleTileRows * kSwizzleTileCols) + (in_tile % 32) * 16 + (in_tile / 32) * 4 + c % kSwizzleTileCols;
}

/*! Offset of scale (row r, block c) in the compact layout: (rows, blocks) row-major, or
 *  (blocks, rows) row-major when transposed (MXFP8 columnwise scales). */
TWE_HOST_DEVICE int64_t compact_scale_offset(int64_t r, int64_t c, int64_t rows, int64_t blocks, bool transposed) {
  return transposed ? c * rows + r : r * blocks + c;
}

/*! Moves element i (row-major over (rows, blocks)) between the two layouts. */
TWE_HOST_DEVICE void swizzle_scale_element(const uint8_t* in, uint8_t* out, int64_t i, int64_t rows, int64_t blocks,
                                           bool transposed, bool inverse) {
  const int64_t r = i / blocks, c = i % blocks;
  const int64_t tiled = swizzled_scale_offset(r, c, blocks);
  const int64_t compact = compact_scale_offset(r, c, rows, blocks, transposed);
  if (inverse) out[compact] = in[tiled];
  else out[tiled] = in[compact];
}

/*! A validated swizzle call: the logical (rows, blocks) of the scales. */
struct SwizzleArgs {
  const TweTensorView* in;
  TweTensorView* out;
  int64_t rows;
  int64_t blocks;
  bool transposed;
  bool inverse;
  void* stream;
};

#define TWE_GEMM_SWIZZLE_KERNELS(NS)                  \
  namespace NS {                                      \
  TweStatus gemm_swizzle_scales(const SwizzleArgs& args); \
  }

TWE_GEMM_SWIZZLE_KERNELS(cpu)
#ifdef TWE_WITH_CUDA
TWE_GEMM_SWIZZLE_KERNELS(cuda)
namespace cuda {
/*! Launches the swizzle kernel on raw pointers (the GEMM's scale staging). */
TweStatus launch_swizzle(const uint8_t* in, uint8_t* out, int64_t rows, int64_t blocks, bool transposed, bool inverse,
                         void* stream);
}  // namespace cuda
#endif
#undef TWE_GEMM_SWIZZLE_KERNELS

}  // namespace twe

#endif  // TWINENGINE_INTERNAL_GEMM_SWIZZLE_H_
