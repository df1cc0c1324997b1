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

#define TWE_GEMM_KERNELS(NS)              \
  namespace NS {                          \
  TweStatus gemm(const GemmArgs& args);   \
  }

TWE_GEMM_KERNELS(cpu)
#ifdef TWE_WITH_CUDA
TWE_GEMM_KERNELS(cuda)
#endif
#undef TWE_GEMM_KERNELS

}  // namespace twe

#endif  // TWINENGINE_INTERNAL_GEMM_H_
