// Validated arguments of the quantize family and the per-device kernel entry points.
#ifndef TWINENGINE_INTERNAL_QUANTIZE_H_
#define TWINENGINE_INTERNAL_QUANTIZE_H_

#include "internal/common.h"
#include "twinengine/quantize.h"

namespace twe {

/*! A quantize call after the ABI layer checked every view against the input's (R, K). */
struct QuantizeArgs {
  const TweTensorView* input;
  const TweTensorView* scale;  // delayed scaling only
  const TweTensorView* rng;    // NVFP4 stochastic rounding only
  TweQuantizedTensor* output;
  TweQuantizeParams params;
  int64_t rows;
  int64_t cols;
  void* stream;
  const TweTensorView* amax = nullptr;  // NVFP4 given global amaxes [rowwise, columnwise], or NULL
};

/*! A dequantize call: `data` (R, K) or transposed (K, R) when columnwise; output (R, K). */
struct DequantizeArgs {
  const TweTensorView* data;
  const TweTensorView* scale_inv;
  const TweTensorView* amax;  // NVFP4 only
  TweTensorView* output;
  bool columnwise;
  bool two_d;  // FP8 block only
  int64_t rows;
  int64_t cols;
  void* stream;
};

struct DelayedUpdateArgs {
  const TweTensorView* amax_history;
  const TweTensorView* scale;
  TweTensorView* new_amax_history;
  TweTensorView* new_scale;
  TweDelayedScalingParams params;
  int64_t history_length;
  int64_t slots;
  void* stream;
};

/*! The argument checks of twe_quantize_fp8_current / _fp8_delayed / _mxfp8, same texts (a fused
 *  kernel that quantizes its own output runs them first). */
TweStatus check_quantize_fp8_current(const TweTensorView* input, TweQuantizedTensor* output,
                                     const TweQuantizeParams* params);
TweStatus check_quantize_fp8_delayed(const TweTensorView* input, const TweTensorView* scale,
                                     TweQuantizedTensor* output, const TweQuantizeParams* params);
TweStatus check_quantize_mxfp8(const TweTensorView* input, TweQuantizedTensor* output,
                               const TweQuantizeParams* params);

#define TWE_QUANTIZE_KERNELS(NS)                                 \
  namespace NS {                                                 \
  TweStatus quantize_fp8_current(const QuantizeArgs& args);      \
  TweStatus quantize_fp8_delayed(const QuantizeArgs& args);      \
  TweStatus quantize_mxfp8(const QuantizeArgs& args);            \
  TweStatus quantize_fp8_block(const QuantizeArgs& args);        \
  TweStatus quantize_nvfp4(const QuantizeArgs& args);            \
  TweStatus dequantize_fp8(const DequantizeArgs& args);          \
  TweStatus dequantize_mxfp8(const DequantizeArgs& args);        \
  TweStatus dequantize_fp8_block(const DequantizeArgs& args);    \
  TweStatus dequantize_nvfp4(const DequantizeArgs& args);        \
  TweStatus update_delayed_scaling(const DelayedUpdateArgs& args); \
  }

TWE_QUANTIZE_KERNELS(cpu)

namespace cpu {
/*! Per-tensor FP8 of a.input given its NaN-skipping amax (the tensor_amax bytes, e.g. taken by
 *  the kernel that wrote the input): the scale from that amax (current scaling, a.scale null)
 *  or a.scale (delayed scaling), one cast pass, then scale_inv and amax. Same bytes as
 *  quantize_fp8_current / quantize_fp8_delayed. */
TweStatus quantize_fp8_per_tensor_with_amax(const QuantizeArgs& args, float amax);

/*! Max of numerics::amax_key over x[0..n): the NaN-skipping amax as bits (the quantize
 *  kernels' amax pass; float, BFloat16 and Float16 instantiated in cpu/quantize.cc). */
template <typename T>
uint32_t amax_key_bits(const T* x, int64_t n);
/*! twe_grouped_quantize_fp8_current after the ABI checks: quantize_fp8_current per row block. */
TweStatus grouped_quantize_fp8_current(const QuantizeArgs& args, const TweTensorView& m_splits);
/*! twe_grouped_quantize_fp8_delayed after the ABI checks: quantize_fp8_delayed per row block. */
TweStatus grouped_quantize_fp8_delayed(const QuantizeArgs& args, const TweTensorView& m_splits);
/*! twe_grouped_quantize_fp8_block after the ABI checks: quantize_fp8_block per row block. */
TweStatus grouped_quantize_fp8_block(const QuantizeArgs& args, const TweTensorView& m_splits);
/*! twe_grouped_quantize_mxfp8 after the ABI checks: quantize_mxfp8 per row block. */
TweStatus grouped_quantize_mxfp8(const QuantizeArgs& args, const TweTensorView& m_splits);
/*! twe_grouped_quantize_nvfp4 after the ABI checks: quantize_nvfp4 per row block (rng offset + g). */
TweStatus grouped_quantize_nvfp4(const QuantizeArgs& args, const TweTensorView& m_splits);
}  // namespace cpu

#ifdef TWE_WITH_CUDA
TWE_QUANTIZE_KERNELS(cuda)
#endif
#undef TWE_QUANTIZE_KERNELS

}  // namespace twe

#endif  // TWINENGINE_INTERNAL_QUANTIZE_H_
