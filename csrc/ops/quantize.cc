// Adapters of the quantize family: generic call -> C ABI. Input and output order and attribute
// names follow core/ops/quantize.py (the one description both frontends use).
#include "ops/quantize.h"

namespace twe {
namespace ops {

TweQuantizeParams quantize_params(const Attrs& attrs) {
  TweQuantizeParams p{};
  p.format = static_cast<TweFP8Format>(attrs.get_int("fp8_format"));
  p.amax_epsilon = attrs.get_float("amax_epsilon");
  p.force_pow2_scales = static_cast<int32_t>(attrs.get_int("force_pow2_scales"));
  p.two_d = static_cast<int32_t>(attrs.get_int("two_d"));
  p.with_rht = static_cast<int32_t>(attrs.get_int("with_rht"));
  p.stochastic_rounding = static_cast<int32_t>(attrs.get_int("stochastic_rounding"));
  return p;
}

/*! Outputs in core order: [rowwise_data, rowwise_scale_inv] if rowwise,
 *  [columnwise_data, columnwise_scale_inv] if columnwise, then [amax] for kTensor, or
 *  [amax] if rowwise and [columnwise_amax] if columnwise for kPerCopy. */
TweQuantizedTensor quantized_outputs(OpCall& call, AmaxOutputs amax) {
  TweQuantizedTensor out = take_quantized_outputs(call, amax);
  call.expect_all_outputs_taken();
  return out;
}

TweQuantizedTensor take_quantized_outputs(OpCall& call, AmaxOutputs amax) {
  TweQuantizedTensor out{};
  const bool rowwise = call.attrs->get_int("rowwise") != 0;
  const bool columnwise = call.attrs->get_int("columnwise") != 0;
  if (rowwise) {
    out.rowwise_data = call.take_output();
    out.rowwise_scale_inv = call.take_output();
  }
  if (columnwise) {
    out.columnwise_data = call.take_output();
    out.columnwise_scale_inv = call.take_output();
  }
  if (amax == AmaxOutputs::kTensor) out.amax = call.take_output();
  if (amax == AmaxOutputs::kPerCopy && rowwise) out.amax = call.take_output();
  if (amax == AmaxOutputs::kPerCopy && columnwise) out.columnwise_amax = call.take_output();
  return out;
}

TweQuantizedTensor quantized_outputs(OpCall& call, TweScalingMode mode) {
  switch (mode) {
    case kTweScalingFP8Current: case kTweScalingFP8Delayed: return quantized_outputs(call, AmaxOutputs::kTensor);
    case kTweScalingNVFP4: return quantized_outputs(call, AmaxOutputs::kPerCopy);
    default: return quantized_outputs(call, AmaxOutputs::kNone);
  }
}

namespace {

// inputs: x, m_splits | outputs: rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv, amax
TweStatus grouped_quantize_fp8_current(OpCall& call) {
  TweQuantizedTensor out = quantized_outputs(call, AmaxOutputs::kTensor);
  TweQuantizeParams p = quantize_params(*call.attrs);
  return twe_grouped_quantize_fp8_current(call.input(0), call.input(1), &out, &p, call.stream);
}

// inputs: x, m_splits, scale | outputs: rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv, amax
TweStatus grouped_quantize_fp8_delayed(OpCall& call) {
  TweQuantizedTensor out = quantized_outputs(call, AmaxOutputs::kTensor);
  TweQuantizeParams p = quantize_params(*call.attrs);
  return twe_grouped_quantize_fp8_delayed(call.input(0), call.input(1), call.input(2), &out, &p, call.stream);
}

// inputs: x, m_splits | outputs: rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv
TweStatus grouped_quantize_fp8_block(OpCall& call) {
  TweQuantizedTensor out = quantized_outputs(call, AmaxOutputs::kNone);
  TweQuantizeParams p = quantize_params(*call.attrs);
  return twe_grouped_quantize_fp8_block(call.input(0), call.input(1), &out, &p, call.stream);
}

// inputs: x, m_splits | outputs: rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv
TweStatus grouped_quantize_mxfp8(OpCall& call) {
  TweQuantizedTensor out = quantized_outputs(call, AmaxOutputs::kNone);
  TweQuantizeParams p = quantize_params(*call.attrs);
  return twe_grouped_quantize_mxfp8(call.input(0), call.input(1), &out, &p, call.stream);
}

// inputs: x, m_splits[, rng] | outputs: rowwise_data, rowwise_scale_inv, columnwise_data,
// columnwise_scale_inv, amax, columnwise_amax
TweStatus grouped_quantize_nvfp4(OpCall& call) {
  TweQuantizedTensor out = quantized_outputs(call, AmaxOutputs::kPerCopy);
  TweQuantizeParams p = quantize_params(*call.attrs);
  const TweTensorView* rng = call.inputs.size() > 2 ? call.input(2) : nullptr;
  return twe_grouped_quantize_nvfp4(call.input(0), call.input(1), rng, &out, &p, call.stream);
}

// inputs: x | outputs: quantized (+ amax)
TweStatus quantize_fp8_current(OpCall& call) {
  TweQuantizedTensor out = quantized_outputs(call, AmaxOutputs::kTensor);
  TweQuantizeParams p = quantize_params(*call.attrs);
  return twe_quantize_fp8_current(call.input(0), &out, &p, call.stream);
}

// inputs: x, scale | outputs: quantized + amax
TweStatus quantize_fp8_delayed(OpCall& call) {
  TweQuantizedTensor out = quantized_outputs(call, AmaxOutputs::kTensor);
  TweQuantizeParams p = quantize_params(*call.attrs);
  return twe_quantize_fp8_delayed(call.input(0), call.input(1), &out, &p, call.stream);
}

// inputs: x | outputs: quantized
TweStatus quantize_mxfp8(OpCall& call) {
  TweQuantizedTensor out = quantized_outputs(call, AmaxOutputs::kNone);
  TweQuantizeParams p = quantize_params(*call.attrs);
  return twe_quantize_mxfp8(call.input(0), &out, &p, call.stream);
}

// inputs: x | outputs: quantized
TweStatus quantize_fp8_block(OpCall& call) {
  TweQuantizedTensor out = quantized_outputs(call, AmaxOutputs::kNone);
  TweQuantizeParams p = quantize_params(*call.attrs);
  return twe_quantize_fp8_block(call.input(0), &out, &p, call.stream);
}

// inputs: x (, rng when stochastic_rounding) (, amax: given global amaxes (2,)) | outputs: quantized + per-copy amax
TweStatus quantize_nvfp4(OpCall& call) {
  TweQuantizedTensor out = quantized_outputs(call, AmaxOutputs::kPerCopy);
  TweQuantizeParams p = quantize_params(*call.attrs);
  size_t next = 1;
  const TweTensorView* rng = p.stochastic_rounding && call.inputs.size() > next ? call.input(next++) : nullptr;
  const TweTensorView* amax = call.inputs.size() > next ? call.input(next) : nullptr;
  return twe_quantize_nvfp4_with_amax(call.input(0), rng, amax, &out, &p, call.stream);
}

// inputs: data, scale_inv | outputs: x_hat
TweStatus dequantize_fp8(OpCall& call) {
  TweTensorView out = call.take_output();
  call.expect_all_outputs_taken();
  return twe_dequantize_fp8(call.input(0), call.input(1), &out,
                            static_cast<int32_t>(call.attrs->get_int("columnwise")), call.stream);
}

// inputs: data, scale_inv | outputs: x_hat
TweStatus dequantize_mxfp8(OpCall& call) {
  TweTensorView out = call.take_output();
  call.expect_all_outputs_taken();
  return twe_dequantize_mxfp8(call.input(0), call.input(1), &out,
                              static_cast<int32_t>(call.attrs->get_int("columnwise")), call.stream);
}

// inputs: data, scale_inv | outputs: x_hat
TweStatus dequantize_fp8_block(OpCall& call) {
  TweTensorView out = call.take_output();
  call.expect_all_outputs_taken();
  return twe_dequantize_fp8_block(call.input(0), call.input(1), &out,
                                  static_cast<int32_t>(call.attrs->get_int("columnwise")),
                                  static_cast<int32_t>(call.attrs->get_int("two_d")), call.stream);
}

// inputs: data, scale_inv, amax (of that copy) | outputs: x_hat
TweStatus dequantize_nvfp4(OpCall& call) {
  TweTensorView out = call.take_output();
  call.expect_all_outputs_taken();
  return twe_dequantize_nvfp4(call.input(0), call.input(1), call.input(2), &out,
                              static_cast<int32_t>(call.attrs->get_int("columnwise")), call.stream);
}

// inputs: amax_history, scale | outputs: new_amax_history, new_scale
TweStatus update_delayed_scaling(OpCall& call) {
  TweTensorView new_history = call.take_output();
  TweTensorView new_scale = call.take_output();
  call.expect_all_outputs_taken();
  TweDelayedScalingParams p{};
  p.format = static_cast<TweFP8Format>(call.attrs->get_int("fp8_format"));
  p.margin = static_cast<int32_t>(call.attrs->get_int("margin"));
  p.algorithm = static_cast<TweAmaxAlgorithm>(call.attrs->get_int("algorithm"));
  return twe_quantize_update_delayed_scaling(call.input(0), call.input(1), &new_history, &new_scale, &p,
                                             call.stream);
}

}  // namespace

TWE_REGISTER_OP(quantize_fp8_current, quantize_fp8_current);
TWE_REGISTER_OP(grouped_quantize_fp8_current, grouped_quantize_fp8_current);
TWE_REGISTER_OP(grouped_quantize_fp8_delayed, grouped_quantize_fp8_delayed);
TWE_REGISTER_OP(grouped_quantize_fp8_block, grouped_quantize_fp8_block);
TWE_REGISTER_OP(grouped_quantize_mxfp8, grouped_quantize_mxfp8);
TWE_REGISTER_OP(grouped_quantize_nvfp4, grouped_quantize_nvfp4);
TWE_REGISTER_OP(quantize_fp8_delayed, quantize_fp8_delayed);
TWE_REGISTER_OP(quantize_mxfp8, quantize_mxfp8);
TWE_REGISTER_OP(quantize_fp8_block, quantize_fp8_block);
TWE_REGISTER_OP(quantize_nvfp4, quantize_nvfp4);
TWE_REGISTER_OP(dequantize_fp8, dequantize_fp8);
TWE_REGISTER_OP(dequantize_mxfp8, dequantize_mxfp8);
TWE_REGISTER_OP(dequantize_fp8_block, dequantize_fp8_block);
TWE_REGISTER_OP(dequantize_nvfp4, dequantize_nvfp4);
TWE_REGISTER_OP(update_delayed_scaling, update_delayed_scaling);

}  // namespace ops
}  // namespace twe
