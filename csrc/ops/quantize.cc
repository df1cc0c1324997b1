// Adapters of the quantize family: generic call -> C ABI. Input and output order and attribute
// names follow core/ops/quantize.py (the one description both frontends use).
#include "ops/registry.h"
#include "twinengine/quantize.h"

namespace twe {
namespace ops {
namespace {

TweQuantizeParams quantize_params(const Attrs& attrs) {
  TweQuantizeParams p{};
  p.format = static_cast<TweFP8Format>(attrs.get_int("fp8_format"));
  p.amax_epsilon = attrs.get_float("amax_epsilon");
  p.force_pow2_scales = static_cast<int32_t>(attrs.get_int("force_pow2_scales"));
  p.two_d = static_cast<int32_t>(attrs.get_int("two_d"));
  return p;
}

/*! Outputs in core order: [rowwise_data, rowwise_scale_inv] if rowwise,
 *  [columnwise_data, columnwise_scale_inv] if columnwise, [amax] if with_amax. */
TweQuantizedTensor quantized_outputs(OpCall& call, bool with_amax) {
  TweQuantizedTensor out{};
  if (call.attrs->get_int("rowwise")) {
    out.rowwise_data = call.take_output();
    out.rowwise_scale_inv = call.take_output();
  }
  if (call.attrs->get_int("columnwise")) {
    out.columnwise_data = call.take_output();
    out.columnwise_scale_inv = call.take_output();
  }
  if (with_amax) out.amax = call.take_output();
  call.expect_all_outputs_taken();
  return out;
}

// inputs: x | outputs: quantized (+ amax)
TweStatus quantize_fp8_current(OpCall& call) {
  TweQuantizedTensor out = quantized_outputs(call, true);
  TweQuantizeParams p = quantize_params(*call.attrs);
  return twe_quantize_fp8_current(call.input(0), &out, &p, call.stream);
}

// inputs: x, scale | outputs: quantized + amax
TweStatus quantize_fp8_delayed(OpCall& call) {
  TweQuantizedTensor out = quantized_outputs(call, true);
  TweQuantizeParams p = quantize_params(*call.attrs);
  return twe_quantize_fp8_delayed(call.input(0), call.input(1), &out, &p, call.stream);
}

// inputs: x | outputs: quantized
TweStatus quantize_mxfp8(OpCall& call) {
  TweQuantizedTensor out = quantized_outputs(call, false);
  TweQuantizeParams p = quantize_params(*call.attrs);
  return twe_quantize_mxfp8(call.input(0), &out, &p, call.stream);
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
TWE_REGISTER_OP(quantize_fp8_delayed, quantize_fp8_delayed);
TWE_REGISTER_OP(quantize_mxfp8, quantize_mxfp8);
TWE_REGISTER_OP(dequantize_fp8, dequantize_fp8);
TWE_REGISTER_OP(dequantize_mxfp8, dequantize_mxfp8);
TWE_REGISTER_OP(update_delayed_scaling, update_delayed_scaling);

}  // namespace ops
}  // namespace twe
