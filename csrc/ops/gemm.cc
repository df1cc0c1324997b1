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

}  // namespace

TWE_REGISTER_OP(gemm, gemm);
TWE_REGISTER_OP(gemm_swizzle_scales, gemm_swizzle_scales);

}  // namespace ops
}  // namespace twe
