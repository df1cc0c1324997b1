// Adapters of the dropout family: generic call -> C ABI. Input and output order and attribute
// names follow core/ops/dropout.py.
#include "ops/registry.h"
#include "twinengine/dropout.h"

namespace twe {
namespace ops {
namespace {

TweDropoutParams dropout_params(const Attrs& attrs) {
  TweDropoutParams p{};
  p.p = attrs.get_float("p");
  return p;
}

// inputs: x, rng | outputs: y, mask
TweStatus dropout_fwd(OpCall& call) {
  TweTensorView y = call.take_output();
  TweTensorView mask = call.take_output();
  call.expect_all_outputs_taken();
  TweDropoutParams p = dropout_params(*call.attrs);
  return twe_dropout_forward(call.input(0), call.input(1), &y, &mask, &p, call.stream);
}

// inputs: dy, mask | outputs: dx
TweStatus dropout_bwd(OpCall& call) {
  TweTensorView dx = call.take_output();
  call.expect_all_outputs_taken();
  TweDropoutParams p = dropout_params(*call.attrs);
  return twe_dropout_backward(call.input(0), call.input(1), &dx, &p, call.stream);
}

}  // namespace

TWE_REGISTER_OP(dropout_fwd, dropout_fwd);
TWE_REGISTER_OP(dropout_bwd, dropout_bwd);

}  // namespace ops
}  // namespace twe
