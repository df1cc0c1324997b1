// Adapters of the norm family: generic call -> C ABI. Input and output order and attribute
// names follow core/ops/norm.py; a fused quantization appends quantize's own inputs (scale for
// delayed scaling, rng for stochastic rounding), outputs and attributes (core/ops/quantize.py).
#include "ops/quantize.h"
#include "twinengine/norm.h"

namespace twe {
namespace ops {
namespace {

/*! Forward calls carry `eps` (and `zero_centered_gamma` when the norm has a gain); backward
 *  calls carry only `zero_centered_gamma`. */
TweNormParams norm_params(const Attrs& attrs, bool with_eps, bool with_gamma) {
  TweNormParams p{};
  p.eps = with_eps ? attrs.get_float("eps") : 0.0f;
  p.zero_centered_gamma = with_gamma ? static_cast<int32_t>(attrs.get_int("zero_centered_gamma")) : 0;
  return p;
}

/*! The fused quantization of a forward call: attribute `quantize` (a TweNormQuantizeMode), its
 *  extra inputs after the norm's `num_inputs`, and its outputs after the norm's. */
struct FusedQuantize {
  TweQuantizedTensor output{};
  TweNormQuantize spec{};

  FusedQuantize(OpCall& call, size_t num_inputs) {
    spec.mode = static_cast<TweNormQuantizeMode>(call.attrs->get_int("quantize"));
    if (spec.mode == kTweNormQuantizeNone) return;
    AmaxOutputs amax = AmaxOutputs::kNone;
    if (spec.mode == kTweNormQuantizeFP8Current || spec.mode == kTweNormQuantizeFP8Delayed) amax = AmaxOutputs::kTensor;
    if (spec.mode == kTweNormQuantizeNVFP4) amax = AmaxOutputs::kPerCopy;
    output = take_quantized_outputs(call, amax);
    spec.params = quantize_params(*call.attrs);
    if (spec.mode == kTweNormQuantizeFP8Delayed) spec.scale = call.input(num_inputs);
    if (spec.mode == kTweNormQuantizeNVFP4 && call.inputs.size() > num_inputs) spec.rng = call.input(num_inputs);
    spec.output = &output;
  }
  const TweNormQuantize* get() const { return spec.mode == kTweNormQuantizeNone ? nullptr : &spec; }
};

// inputs: x, weight, bias (, scale | rng) | outputs: y, mu, rstd (, quantized y)
TweStatus layernorm_fwd(OpCall& call) {
  TweTensorView y = call.take_output(), mu = call.take_output(), rstd = call.take_output();
  FusedQuantize q(call, 3);
  call.expect_all_outputs_taken();
  TweNormParams p = norm_params(*call.attrs, true, true);
  return twe_norm_layernorm_fwd(call.input(0), call.input(1), call.input(2), &y, &mu, &rstd, q.get(), &p,
                                call.stream);
}

// inputs: dy, x, mu, rstd, weight | outputs: dx, dweight, dbias
TweStatus layernorm_bwd(OpCall& call) {
  TweTensorView dx = call.take_output(), dgamma = call.take_output(), dbeta = call.take_output();
  call.expect_all_outputs_taken();
  TweNormParams p = norm_params(*call.attrs, false, true);
  return twe_norm_layernorm_bwd(call.input(0), call.input(1), call.input(2), call.input(3), call.input(4), &dx,
                                &dgamma, &dbeta, &p, call.stream);
}

// inputs: x, weight (, scale | rng) | outputs: y, rstd (, quantized y)
TweStatus rmsnorm_fwd(OpCall& call) {
  TweTensorView y = call.take_output(), rstd = call.take_output();
  FusedQuantize q(call, 2);
  call.expect_all_outputs_taken();
  TweNormParams p = norm_params(*call.attrs, true, true);
  return twe_norm_rmsnorm_fwd(call.input(0), call.input(1), &y, &rstd, q.get(), &p, call.stream);
}

// inputs: dy, x, rstd, weight | outputs: dx, dweight
TweStatus rmsnorm_bwd(OpCall& call) {
  TweTensorView dx = call.take_output(), dgamma = call.take_output();
  call.expect_all_outputs_taken();
  TweNormParams p = norm_params(*call.attrs, false, true);
  return twe_norm_rmsnorm_bwd(call.input(0), call.input(1), call.input(2), call.input(3), &dx, &dgamma, &p,
                              call.stream);
}

// inputs: x (, scale | rng) | outputs: y, rstd (, quantized y)
TweStatus l2norm_fwd(OpCall& call) {
  TweTensorView y = call.take_output(), rstd = call.take_output();
  FusedQuantize q(call, 1);
  call.expect_all_outputs_taken();
  TweNormParams p = norm_params(*call.attrs, true, false);
  return twe_norm_l2norm_fwd(call.input(0), &y, &rstd, q.get(), &p, call.stream);
}

// inputs: dy, x, rstd | outputs: dx
TweStatus l2norm_bwd(OpCall& call) {
  TweTensorView dx = call.take_output();
  call.expect_all_outputs_taken();
  return twe_norm_l2norm_bwd(call.input(0), call.input(1), call.input(2), &dx, nullptr, call.stream);
}

}  // namespace

TWE_REGISTER_OP(layernorm_fwd, layernorm_fwd);
TWE_REGISTER_OP(layernorm_bwd, layernorm_bwd);
TWE_REGISTER_OP(rmsnorm_fwd, rmsnorm_fwd);
TWE_REGISTER_OP(rmsnorm_bwd, rmsnorm_bwd);
TWE_REGISTER_OP(l2norm_fwd, l2norm_fwd);
TWE_REGISTER_OP(l2norm_bwd, l2norm_bwd);

}  // namespace ops
}  // namespace twe
