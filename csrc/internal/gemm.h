// Validated arguments of the gemm family and the per-device kernel entry points.
#ifndef TWINENGINE_INTERNAL_GEMM_H_
#define TWINENGINE_INTERNAL_GEMM_H_

#include "internal/common.h"
#include "twinengine/gemm.h"

namespace twe {

/*! K-block length of a block-scaled format (NUMERICS.md §5–§7), 0 for the others. */
TWE_HOST_DEVICE int64_t gemm_block_length(TweGemmScaling scaling) {
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

/*! Decoded value x̂ of element (row r, K index kk) of an operand (rows, k): the stored value
 *  times its decode scale (per-tensor scale_inv, or the K-block scale); NVFP4 without the
 *  global factor S_dec, which the GEMM applies once (alpha). `scale_stride` is the scale
 *  tensor's last dimension. Host and device (the dequantize-then-GEMM fallback). */
TWE_HOST_DEVICE float gemm_decoded_value(TweGemmScaling scaling, const TweGemmOperand& op, int64_t rows, int64_t k,
                                         int64_t scale_stride, int64_t r, int64_t kk) {
  float q;
  if (scaling == kTweGemmNVFP4) {  // K-major packed E2M1, even K index in the low nibble
    const uint8_t byte = static_cast<const uint8_t*>(op.data.data)[r * (k / 2) + kk / 2];
    q = numerics::e2m1_to_float(static_cast<uint8_t>((kk & 1) ? byte >> 4 : byte & 0xF));
  } else {
    const int64_t i = op.k_major ? r * k + kk : kk * rows + r;
    switch (op.data.dtype) {
      case kTweFloat32: q = static_cast<const float*>(op.data.data)[i]; break;
      case kTweBFloat16: q = numerics::bf16_to_float(static_cast<const uint16_t*>(op.data.data)[i]); break;
      case kTweFloat16: q = numerics::fp16_to_float(static_cast<const uint16_t*>(op.data.data)[i]); break;
      case kTweFloat8E4M3:
        q = numerics::fp8_to_float<numerics::FP8Format::kE4M3>(static_cast<const uint8_t*>(op.data.data)[i]);
        break;
      default: q = numerics::fp8_to_float<numerics::FP8Format::kE5M2>(static_cast<const uint8_t*>(op.data.data)[i]);
    }
  }
  switch (scaling) {
    case kTweGemmHighPrecision: return q;
    case kTweGemmFP8PerTensor: return q * *static_cast<const float*>(op.scale_inv.data);
    default: return q * gemm_block_scale(scaling, op, scale_stride, r, kk / gemm_block_length(scaling));
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
  TweTensorView* workspace;   // nullptr when absent (CPU)
};

/*! cublasLtMatmulMatrixScale_t values the plan uses (csrc/cuda/gemm_cublaslt.cu checks them
 *  against cublasLt.h at compile time; the table itself builds without cuBLAS). */
enum GemmScaleMode : int32_t {
  kScaleNone = -1,
  kScaleScalar32F = 0,
  kScaleVec16UE4M3 = 1,
  kScaleVec32UE8M0 = 2,
  kScaleVec128_32F = 4,
  kScaleBlk128x128_32F = 5,
};

/*! Byte offsets of the workspace parts (header gemm.h): each part starts at a multiple of 256. */
struct GemmWorkspaceLayout {
  int64_t cublas = 0, a_stage = 0, b_stage = 0, out_stage = 0, scalars = 0, total = 0;
  int64_t cublas_bytes = 0;
};

/*! Bytes of one operand's staging buffer. */
int64_t gemm_staging_bytes(TweGemmStaging staging, int64_t rows, int64_t k, int64_t scale_bytes);

/*! The workspace layout of a plan (zero-sized unless cuBLASLt runs). */
GemmWorkspaceLayout gemm_workspace_layout(const TweGemmPlan& plan, const TweGemmPlanQuery& query);

/*! The dispatcher table (csrc/abi/gemm_plan.cc); records an error for impossible combinations. */
TweStatus gemm_plan(const TweGemmPlanQuery& query, TweGemmPlan* plan);

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
  bool a_block_2d;  // kTweGemmFP8Block: 128x128 tiles (else 1x128 blocks)
  bool b_block_2d;
  const TweTensorView* a_amax = nullptr;  // kTweGemmNVFP4: (G,) global amax per group, else nullptr
  const TweTensorView* b_amax = nullptr;
};

/*! Elements of the fp32 FP8-block scale tensor of a K-major data block (rows, cols) (NUMERICS.md
 *  §6, rows and cols multiples of 128): 1x128 blocks (cols/128, rows), 128x128 tiles
 *  (rows/128, roundup(cols/128, 4)). Host and device. */
TWE_HOST_DEVICE void fp8_block_scale_dims(int64_t rows, int64_t cols, bool two_d, int64_t* sr, int64_t* sc) {
  if (two_d) {
    *sr = rows / 128;
    *sc = (cols / 128 + 3) / 4 * 4;
  } else {
    *sr = cols / 128;
    *sc = rows;
  }
}

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
namespace cuda {
/*! cublasLtGetVersion() of the dynamically loaded cuBLASLt, 0 when it cannot be loaded. */
int64_t cublaslt_version();
/*! The tiled dequantize-in-registers kernel (csrc/cuda/gemm.cu). */
TweStatus gemm_tiled(const GemmArgs& args);
/*! Writes an operand's staging into `dst` (csrc/cuda/gemm_staging.cu): swizzled scales, or the
 *  decoded values x̂ (gemm_decoded_value) as bf16 / fp32 in the operand's stored layout. */
TweStatus stage_operand(const TweGemmOperand& op, TweGemmScaling scaling, TweGemmStaging staging, int64_t rows,
                        int64_t k, uint8_t* dst, void* stream);
/*! scalars[0] = fl(S_dec_a · S_dec_b) (NVFP4 global decode scales), scalars[1] = 0, on the device. */
TweStatus launch_nvfp4_alpha(const float* amax_a, const float* amax_b, float* scalars, void* stream);
/*! out (m, n) = RNE(fl(acc (+ bias))) from an fp32 (m, n) accumulator (may alias an fp32 out). */
TweStatus launch_gemm_epilogue(const GemmArgs& args, const float* acc);
}  // namespace cuda
#endif
#undef TWE_GEMM_KERNELS

}  // namespace twe

#endif  // TWINENGINE_INTERNAL_GEMM_H_
