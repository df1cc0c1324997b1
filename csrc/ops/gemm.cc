// Adapter of the gemm family: generic call -> C ABI. Input order and attribute names follow
// core/ops/gemm.py (the one description both frontends use).
#include "ops/registry.h"
#include "twinengine/gemm.h"

namespace twe {
namespace ops {
namespace {

// inputs: a_data, [a_scale_inv, [a_amax]], b_data, [b_scale_inv, [b_amax]], [bias] (scales unless
// scaling == 0, amaxes for NVFP4, bias if has_bias) | outputs: out
// attrs: scaling, a_k_major, b_k_major, a_block_2d, b_block_2d, has_bias
TweStatus gemm(OpCall& call) {
  TweGemmParams params{};
  params.scaling = static_cast<TweGemmScaling>(call.attrs->get_int("scaling"));
  const bool quantized = params.scaling != kTweGemmHighPrecision;
  size_t next = 0;
  auto operand = [&](const char* k_major_attr, const char* block_2d_attr) {
    TweGemmOperand op{};
    op.data = *call.input(next++);
    if (quantized) op.scale_inv = *call.input(next++);
    if (params.scaling == kTweGemmNVFP4) op.amax = *call.input(next++);
    op.k_major = static_cast<int32_t>(call.attrs->get_int(k_major_attr));
    op.block_2d = static_cast<int32_t>(call.attrs->get_int(block_2d_attr));
    return op;
  };
  const TweGemmOperand a = operand("a_k_major", "a_block_2d");
  const TweGemmOperand b = operand("b_k_major", "b_block_2d");
  const TweTensorView* bias = call.attrs->get_int("has_bias") ? call.input(next++) : nullptr;
  if (next != call.inputs.size()) throw OpError("too many inputs");
  TweTensorView out = call.take_output();
  call.expect_all_outputs_taken();
  return twe_gemm(&a, &b, bias, &out, &params, call.stream);
}

TweGroupedGemmParams grouped_params(OpCall& call) {
  TweGroupedGemmParams params{};
  params.a_k_major = static_cast<int32_t>(call.attrs->get_int("a_k_major"));
  params.b_k_major = static_cast<int32_t>(call.attrs->get_int("b_k_major"));
  return params;
}

// inputs: a, b, m_splits[, bias] | outputs: out | attrs: a_k_major, b_k_major
TweStatus grouped_gemm(OpCall& call) {
  const TweGroupedGemmParams params = grouped_params(call);
  const TweTensorView* bias = call.inputs.size() > 3 ? call.input(3) : nullptr;
  TweTensorView out = call.take_output();
  call.expect_all_outputs_taken();
  return twe_grouped_gemm(call.input(0), call.input(1), call.input(2), bias, &out, &params, call.stream);
}

// inputs: a, b, m_splits | outputs: out (G, N, K) | attrs: a_k_major, b_k_major
TweStatus grouped_gemm_wgrad(OpCall& call) {
  const TweGroupedGemmParams params = grouped_params(call);
  TweTensorView out = call.take_output();
  call.expect_all_outputs_taken();
  return twe_grouped_gemm_wgrad(call.input(0), call.input(1), call.input(2), &out, &params, call.stream);
}

}  // namespace

TWE_REGISTER_OP(gemm, gemm);
TWE_REGISTER_OP(grouped_gemm, grouped_gemm);
TWE_REGISTER_OP(grouped_gemm_wgrad, grouped_gemm_wgrad);

}  // namespace ops
}  // namespace twe
