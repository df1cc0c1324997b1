// Adapters of the attention family: generic call -> C ABI. Input and output order and attribute
// names follow core/ops/attention.py: the optional inputs (seqlens_q, seqlens_kv, rng) follow
// the fixed ones in that order, each present iff its has_* attribute is 1.
#include "ops/registry.h"
#include "twinengine/attention.h"

namespace twe {
namespace ops {
namespace {

TweAttentionParams attention_params(const Attrs& attrs) {
  TweAttentionParams p{};
  p.layout = static_cast<TweAttentionLayout>(attrs.get_int("layout"));
  p.mask_type = static_cast<TweAttentionMask>(attrs.get_int("mask_type"));
  p.window_left = attrs.get_int("window_left");
  p.window_right = attrs.get_int("window_right");
  p.softmax_scale = attrs.get_float("softmax_scale");
  p.dropout_p = attrs.get_float("dropout_p");
  p.fp8 = static_cast<int32_t>(attrs.get_int("fp8"));
  return p;
}

/*! The optional inputs after the `fixed` ones, in the order seqlens_q, seqlens_kv, rng. */
struct OptionalInputs {
  const TweTensorView* seqlens_q = nullptr;
  const TweTensorView* seqlens_kv = nullptr;
  const TweTensorView* rng = nullptr;

  OptionalInputs(OpCall& call, size_t fixed) {
    size_t next = fixed;
    if (call.attrs->get_int("has_seqlens_q")) seqlens_q = call.input(next++);
    if (call.attrs->get_int("has_seqlens_kv")) seqlens_kv = call.input(next++);
    if (call.attrs->get_int("has_rng")) rng = call.input(next++);
    if (next != call.inputs.size()) throw OpError("unexpected number of inputs");
  }
};

// inputs: q, k, v (, seqlens_q) (, seqlens_kv) (, rng) | outputs: out, lse
TweStatus attention_fwd(OpCall& call) {
  TweTensorView out = call.take_output(), lse = call.take_output();
  call.expect_all_outputs_taken();
  OptionalInputs opt(call, 3);
  TweAttentionParams p = attention_params(*call.attrs);
  return twe_attention_fwd(call.input(0), call.input(1), call.input(2), opt.seqlens_q, opt.seqlens_kv, opt.rng, &out,
                           &lse, &p, call.stream);
}

// inputs: dout, q, k, v, out, lse (, seqlens_q) (, seqlens_kv) (, rng) | outputs: dq, dk, dv
TweStatus attention_bwd(OpCall& call) {
  TweTensorView dq = call.take_output(), dk = call.take_output(), dv = call.take_output();
  call.expect_all_outputs_taken();
  OptionalInputs opt(call, 6);
  TweAttentionParams p = attention_params(*call.attrs);
  return twe_attention_bwd(call.input(0), call.input(1), call.input(2), call.input(3), call.input(4), call.input(5),
                           opt.seqlens_q, opt.seqlens_kv, opt.rng, &dq, &dk, &dv, &p, call.stream);
}

}  // namespace

TWE_REGISTER_OP(attention_fwd, attention_fwd);
TWE_REGISTER_OP(attention_bwd, attention_bwd);

}  // namespace ops
}  // namespace twe
