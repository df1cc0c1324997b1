// Adapters of the activation family: generic call -> C ABI. Input and output order and
// attribute names follow core/ops/activation.py; the fused *_quantize ops append the
// quantize family's inputs (scale, rng), outputs and attributes (ops/quantize.h) and the
// int64 attribute scaling_mode.
#include "ops/quantize.h"
#include "twinengine/activation.h"

namespace twe {
namespace ops {
namespace {

TweActivationParams activation_params(const Attrs& attrs) {
  TweActivationParams p{};
  p.kind = static_cast<TweActivationKind>(attrs.get_int("kind"));
  p.limit = attrs.get_float("limit");
  p.alpha = attrs.get_float("alpha");
  return p;
}

/*! The optional scale (delayed scaling) and rng (NVFP4 SR) inputs after the `first` data inputs. */
void quantize_inputs(OpCall& call, size_t first, TweScalingMode mode, TweTensorView* scale, TweTensorView* rng) {
  *scale = TweTensorView{};
  *rng = TweTensorView{};
  if (call.inputs.size() <= first) return;
  if (mode == kTweScalingFP8Delayed) *scale = *call.input(first);
  else *rng = *call.input(first);
}

// inputs: x | outputs: y
TweStatus activation_fwd(OpCall& call) {
  TweTensorView y = call.take_output();
  call.expect_all_outputs_taken();
  TweActivationParams p = activation_params(*call.attrs);
  return twe_activation_forward(call.input(0), &y, &p, call.stream);
}

// inputs: x (, scale | rng) | outputs: y, quantized y
TweStatus activation_fwd_quantize(OpCall& call) {
  const auto mode = static_cast<TweScalingMode>(call.attrs->get_int("scaling_mode"));
  TweTensorView y = call.take_output();
  TweQuantizedTensor q = quantized_outputs(call, mode);
  TweTensorView scale, rng;
  quantize_inputs(call, 1, mode, &scale, &rng);
  TweActivationParams p = activation_params(*call.attrs);
  TweQuantizeParams qp = quantize_params(*call.attrs);
  return twe_activation_forward_quantize(call.input(0), &scale, &rng, &y, &q, &p, &qp, mode, call.stream);
}

// inputs: dy, x | outputs: dx
TweStatus activation_bwd(OpCall& call) {
  TweTensorView dx = call.take_output();
  call.expect_all_outputs_taken();
  TweActivationParams p = activation_params(*call.attrs);
  return twe_activation_backward(call.input(0), call.input(1), &dx, &p, call.stream);
}

// inputs: dy, x | outputs: dx, dbias
TweStatus activation_bwd_dbias(OpCall& call) {
  TweTensorView dx = call.take_output();
  TweTensorView dbias = call.take_output();
  call.expect_all_outputs_taken();
  TweActivationParams p = activation_params(*call.attrs);
  return twe_activation_backward_dbias(call.input(0), call.input(1), &dx, &dbias, &p, call.stream);
}

// inputs: dy, x (, scale | rng) | outputs: dx, dbias, quantized dx
TweStatus activation_bwd_dbias_quantize(OpCall& call) {
  const auto mode = static_cast<TweScalingMode>(call.attrs->get_int("scaling_mode"));
  TweTensorView dx = call.take_output();
  TweTensorView dbias = call.take_output();
  TweQuantizedTensor q = quantized_outputs(call, mode);
  TweTensorView scale, rng;
  quantize_inputs(call, 2, mode, &scale, &rng);
  TweActivationParams p = activation_params(*call.attrs);
  TweQuantizeParams qp = quantize_params(*call.attrs);
  return twe_activation_backward_dbias_quantize(call.input(0), call.input(1), &scale, &rng, &dx, &dbias, &q, &p, &qp,
                                                mode, call.stream);
}

}  // namespace

TWE_REGISTER_OP(activation_fwd, activation_fwd);
TWE_REGISTER_OP(activation_fwd_quantize, activation_fwd_quantize);
TWE_REGISTER_OP(activation_bwd, activation_bwd);
TWE_REGISTER_OP(activation_bwd_dbias, activation_bwd_dbias);
TWE_REGISTER_OP(activation_bwd_dbias_quantize, activation_bwd_dbias_quantize);

}  // namespace ops
}  // namespace twe
