// Adapter of the gemm family: generic call -> C ABI. Input order and attribute names follow
// core/ops/gemm.py (the one description both frontends use).
#include "ops/registry.h"
#include "twinengine/gemm.h"

namespace twe {
namespace ops {
namespace {

// inputs: a_data, [a_scale_inv, [a_amax]], b_data, [b_scale_inv, [b_amax]], [bias] (scales unless
// scaling == 0, amaxes for NVFP4, bias if has_bias) | outputs: out, [workspace] (CUDA)
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
  // The CUDA plan's workspace (core/ops/gemm.py with_workspace), allocated by the framework.
  TweTensorView workspace{};
  if (call.outputs.size() > 1) workspace = call.take_output();
  call.expect_all_outputs_taken();
  return twe_gemm(&a, &b, bias, &out, &workspace, &params, call.stream);
}

// inputs: scales | outputs: out (same number of uint8 scales) | attrs: transposed, inverse
TweStatus gemm_swizzle_scales(OpCall& call) {
  TweGemmSwizzleParams params{};
  params.transposed = static_cast<int32_t>(call.attrs->get_int("transposed"));
  params.inverse = static_cast<int32_t>(call.attrs->get_int("inverse"));
  if (call.inputs.size() != 1) throw OpError("gemm_swizzle_scales takes one input");
  TweTensorView out = call.take_output();
  call.expect_all_outputs_taken();
  return twe_gemm_swizzle_scales(call.input(0), &out, &params, call.stream);
}

TweGroupedGemmParams grouped_params(OpCall& call) {
  TweGroupedGemmParams params{};
  params.scaling = static_cast<TweGemmScaling>(call.attrs->get_int("scaling"));
  params.a_k_major = static_cast<int32_t>(call.attrs->get_int("a_k_major"));
  params.b_k_major = static_cast<int32_t>(call.attrs->get_int("b_k_major"));
  int64_t two_d = 0;
  params.a_block_2d = call.attrs->find_int("a_block_2d", &two_d) ? static_cast<int32_t>(two_d) : 0;
  two_d = 0;
  params.b_block_2d = call.attrs->find_int("b_block_2d", &two_d) ? static_cast<int32_t>(two_d) : 0;
  return params;
}

/*! Inputs a, [a_scale_inv, [a_amax]], b, [b_scale_inv, [b_amax]], m_splits (scales for
 *  quantized operands, amaxes for NVFP4), from `next`. */
struct GroupedInputs {
  const TweTensorView* a = nullptr;
  const TweTensorView* a_scale = nullptr;
  const TweTensorView* a_amax = nullptr;
  const TweTensorView* b = nullptr;
  const TweTensorView* b_scale = nullptr;
  const TweTensorView* b_amax = nullptr;
  const TweTensorView* m_splits = nullptr;
};

GroupedInputs grouped_inputs(OpCall& call, const TweGroupedGemmParams& params, size_t* next) {
  const bool scaled = params.scaling != kTweGemmHighPrecision;
  const bool nvfp4 = params.scaling == kTweGemmNVFP4;
  GroupedInputs in;
  in.a = call.input((*next)++);
  if (scaled) in.a_scale = call.input((*next)++);
  if (nvfp4) in.a_amax = call.input((*next)++);
  in.b = call.input((*next)++);
  if (scaled) in.b_scale = call.input((*next)++);
  if (nvfp4) in.b_amax = call.input((*next)++);
  in.m_splits = call.input((*next)++);
  return in;
}

// inputs: a, [a_scale_inv, [a_amax]], b, [b_scale_inv, [b_amax]], m_splits[, bias] | outputs: out
// attrs: scaling, a_k_major, b_k_major
TweStatus grouped_gemm(OpCall& call) {
  const TweGroupedGemmParams params = grouped_params(call);
  size_t next = 0;
  const GroupedInputs in = grouped_inputs(call, params, &next);
  const TweTensorView* bias = next < call.inputs.size() ? call.input(next) : nullptr;
  TweTensorView out = call.take_output();
  call.expect_all_outputs_taken();
  return twe_grouped_gemm(in.a, in.a_scale, in.a_amax, in.b, in.b_scale, in.b_amax, in.m_splits, bias, &out, &params,
                          call.stream);
}

// inputs: a, [a_scale_inv, [a_amax]], b, [b_scale_inv, [b_amax]], m_splits | outputs: out (G, N, K)
// attrs: scaling, a_k_major, b_k_major
TweStatus grouped_gemm_wgrad(OpCall& call) {
  const TweGroupedGemmParams params = grouped_params(call);
  size_t next = 0;
  const GroupedInputs in = grouped_inputs(call, params, &next);
  TweTensorView out = call.take_output();
  call.expect_all_outputs_taken();
  return twe_grouped_gemm_wgrad(in.a, in.a_scale, in.a_amax, in.b, in.b_scale, in.b_amax, in.m_splits, &out, &params,
                                call.stream);
}

}  // namespace

TWE_REGISTER_OP(gemm, gemm);
TWE_REGISTER_OP(grouped_gemm, grouped_gemm);
TWE_REGISTER_OP(grouped_gemm_wgrad, grouped_gemm_wgrad);
TWE_REGISTER_OP(gemm_swizzle_scales, gemm_swizzle_scales);

}  // namespace ops
}  // namespace twe
