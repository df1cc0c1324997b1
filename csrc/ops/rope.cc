// Adapters of the rope family: generic call -> C ABI. Input and output order and attribute
// names follow core/ops/rope.py.
#include "ops/registry.h"
#include "twinengine/rope.h"

namespace twe {
namespace ops {
namespace {

TweRopeParams params_of(const OpCall& call) {
  TweRopeParams p{};
  p.format = static_cast<int32_t>(call.attrs->get_int("format"));
  p.interleaved = static_cast<int32_t>(call.attrs->get_int("interleaved"));
  return p;
}

/*! The third input (cu_seqlens) when the call has one. */
const TweTensorView* optional_cu_seqlens(OpCall& call) { return call.inputs.size() > 2 ? call.input(2) : nullptr; }

// inputs: x, freqs[, cu_seqlens] | outputs: y | attrs: format, interleaved
TweStatus rope_fwd(OpCall& call) {
  TweTensorView y = call.take_output();
  call.expect_all_outputs_taken();
  const TweRopeParams p = params_of(call);
  return twe_rope_forward(call.input(0), call.input(1), optional_cu_seqlens(call), &y, &p, call.stream);
}

// inputs: dy, freqs[, cu_seqlens] | outputs: dx | attrs: format, interleaved
TweStatus rope_bwd(OpCall& call) {
  TweTensorView dx = call.take_output();
  call.expect_all_outputs_taken();
  const TweRopeParams p = params_of(call);
  return twe_rope_backward(call.input(0), call.input(1), optional_cu_seqlens(call), &dx, &p, call.stream);
}

}  // namespace

TWE_REGISTER_OP(rope_fwd, rope_fwd);
TWE_REGISTER_OP(rope_bwd, rope_bwd);

}  // namespace ops
}  // namespace twe
