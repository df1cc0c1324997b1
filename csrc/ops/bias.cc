// Adapters of the bias family: generic call -> C ABI. Input and output order and attribute
// names follow core/ops/bias.py.
#include "ops/registry.h"
#include "twinengine/bias.h"

namespace twe {
namespace ops {
namespace {

/*! The single output of a call. */
TweTensorView only_output(OpCall& call) {
  TweTensorView out = call.take_output();
  call.expect_all_outputs_taken();
  return out;
}

// inputs: x, bias | outputs: y
TweStatus bias_add(OpCall& call) {
  TweTensorView y = only_output(call);
  return twe_bias_add(call.input(0), call.input(1), &y, call.stream);
}

// inputs: x, y | outputs: z
TweStatus add(OpCall& call) {
  TweTensorView z = only_output(call);
  return twe_bias_add_residual(call.input(0), call.input(1), &z, call.stream);
}

// inputs: x | outputs: y
TweStatus scale(OpCall& call) {
  TweTensorView y = only_output(call);
  TweScaleParams p{};
  p.c = call.attrs->get_float("c");
  return twe_bias_scale(call.input(0), &y, &p, call.stream);
}

// inputs: dy | outputs: dbias
TweStatus bias_grad(OpCall& call) {
  TweTensorView db = only_output(call);
  return twe_bias_grad(call.input(0), &db, call.stream);
}

// inputs: dy, m_splits | outputs: dbias (G, K)
TweStatus bias_grad_grouped(OpCall& call) {
  TweTensorView db = only_output(call);
  return twe_bias_grad_grouped(call.input(0), call.input(1), &db, call.stream);
}

}  // namespace

TWE_REGISTER_OP(bias_add, bias_add);
TWE_REGISTER_OP(add, add);
TWE_REGISTER_OP(scale, scale);
TWE_REGISTER_OP(bias_grad, bias_grad);
TWE_REGISTER_OP(bias_grad_grouped, bias_grad_grouped);

}  // namespace ops
}  // namespace twe
