// Validated arguments of the gemm family and the per-device kernel entry points.
#ifndef TWINENGINE_INTERNAL_GEMM_H_
#define TWINENGINE_INTERNAL_GEMM_H_

#include "internal/common.h"
#include "twinengine/gemm.h"

namespace twe {

/*! K-block length of a block-scaled format (NUMERICS.md §5–§7), 0 for the others. */
inline int64_t gemm_block_length(TweGemmScaling scaling) {
  switch (scaling) {
    case kTweGemmMXFP8: return 32;
    case kTweGemmFP8Block: return 128;
    case kTweGemmNVFP4: return 16;
    default: return 0;
  }
}

/*! Decode scale of K-block `block` of row `row` of a block-scaled operand (host and device). */
TWE_HOST_DEVICE float gemm_block_scale(TweGemmScaling scaling, const TweGemmOperand& op, int64_t stride, int64_t row,
                                       int64_t block) {
  switch (scaling) {
    case kTweGemmMXFP8: {
      const uint8_t* codes = static_cast<const uint8_t*>(op.scale_inv.data);
      return numerics::e8m0_to_float(op.k_major ? codes[row * stride + block] : codes[block * stride + row]);
    }
    case kTweGemmFP8Block: {
      const float* scales = static_cast<const float*>(op.scale_inv.data);
      return op.block_2d ? scales[(row / 128) * stride + block] : scales[block * stride + row];
    }
    default: {
      const uint8_t* codes = static_cast<const uint8_t*>(op.scale_inv.data);
      return numerics::fp8_to_float<numerics::FP8Format::kE4M3>(codes[row * stride + block]);
    }
  }
}

/*! A gemm call after the ABI layer checked every view: out (m, n) = A (m, k) · B (n, k)ᵀ. */
struct GemmArgs {
  const TweGemmOperand* a;
  const TweGemmOperand* b;
  const TweTensorView* bias;  // nullptr when absent
  TweTensorView* out;
  TweGemmScaling scaling;
  int64_t m;
  int64_t n;
  int64_t k;
  void* stream;
};

/*! A grouped GEMM after the ABI checks: G groups of rows given by m_splits (int32 (G,)).
 *  ragged_k = false: out (m, n) rows of group g = a rows · b[g]ᵀ (+ bias[g]);
 *  ragged_k = true: out[g] (n, k) = a[:, rows]ᵀ-contraction with b rows (wgrad). */
struct GroupedGemmArgs {
  const TweTensorView* a;
  const TweTensorView* b;
  const TweTensorView* m_splits;
  const TweTensorView* bias;  // nullptr when absent
  TweTensorView* out;
  const TweTensorView* a_scale_inv;  // (G,) per-tensor FP8, else nullptr
  const TweTensorView* b_scale_inv;
  TweGemmScaling scaling;
  bool ragged_k;
  bool a_k_major;
  bool b_k_major;
  int64_t groups;
  int64_t m;  // rows split into groups
  int64_t n;
  int64_t k;
  void* stream;
};

/*! [begin, end) of group g's rows: sizes < 0 count as 0, blocks clipped to m (host and device). */
TWE_HOST_DEVICE void group_rows(const int32_t* splits, int64_t g, int64_t m, int64_t* begin, int64_t* end) {
  int64_t start = 0;
  for (int64_t i = 0; i < g; ++i) start += splits[i] > 0 ? splits[i] : 0;
  const int64_t size = splits[g] > 0 ? splits[g] : 0;
  *begin = start < m ? start : m;
  *end = start + size < m ? start + size : m;
}

#define TWE_GEMM_KERNELS(NS)                              \
  namespace NS {                                          \
  TweStatus gemm(const GemmArgs& args);                   \
  TweStatus grouped_gemm(const GroupedGemmArgs& args);    \
  }

TWE_GEMM_KERNELS(cpu)
#ifdef TWE_WITH_CUDA
TWE_GEMM_KERNELS(cuda)
#endif
#undef TWE_GEMM_KERNELS

}  // namespace twe

#endif  // TWINENGINE_INTERNAL_GEMM_H_
