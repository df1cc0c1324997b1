// Validated arguments of the gemm family and the per-device kernel entry points.
#ifndef TWINENGINE_INTERNAL_GEMM_H_
#define TWINENGINE_INTERNAL_GEMM_H_

#include "internal/common.h"
#include "twinengine/gemm.h"

namespace twe {

/*! MXFP8 GEMM K-block length (NUMERICS.md §5, §8). */
constexpr int64_t kMxfp8GemmBlock = 32;

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
