// The GEMM dispatcher: format × device capability × layout → kernel choice, in one table
// (NUMERICS.md §8). Host code, built with or without CUDA, so the table is unit-tested on any
// machine (tests/core/test_gemm_plan.py) and the frontends size the workspace from its answer.
#include <cstdio>
#include <string>

#include "internal/gemm.h"

namespace twe {
namespace {

bool is_fp8(TweDType d) { return d == kTweFloat8E4M3 || d == kTweFloat8E5M2; }

/*! One row of the native-format table: what a format needs to run natively in cuBLASLt. */
struct NativeRule {
  TweGemmScaling scaling;
  int32_t min_sm;              // lowest compute capability (major·10 + minor)
  int32_t max_sm;              // highest (inclusive), 0 for no limit
  int32_t min_cublaslt;        // lowest cublasLtGetVersion()
  bool k_minor_from_sm100;     // K-minor (non-TN) operands accepted on sm_100 / sm_110
  int64_t k_multiple;          // K must be a multiple of this
  int64_t mn_multiple;         // M and N must be multiples of this
  TweGemmStaging scale_staging;
  bool fp16_out;               // fp16 output offered directly
  TweGemmStaging fallback;     // staging of the dequantize fallback
  const char* requirement;     // for the reason text
};

// The table. FP8 GEMMs need 16-byte aligned leading dimensions (K % 16 for K-major FP8 data,
// K % 32 for packed FP4); cuBLASLt's FP8 kernels before Blackwell are TN only (both operands
// K-major), and block-scaled ones (VEC16/VEC32) take K-minor FP8 data on sm_100 only.
// FP8 block scaling (VEC128 / BLK128x128) exists on Hopper alone, from cuBLASLt 12.9.
constexpr NativeRule kNative[] = {
    {kTweGemmHighPrecision, 0, 0, 1, true, 1, 1, kTweGemmStageNone, true, kTweGemmStageFP32,
     "same dtype for both operands"},
    {kTweGemmFP8PerTensor, 89, 0, 1, false, 16, 16, kTweGemmStageNone, true, kTweGemmStageFP32,
     "sm_89+, not E5M2 x E5M2, M, N, K multiples of 16"},
    {kTweGemmMXFP8, 100, 0, 120800, true, 32, 32, kTweGemmStageSwizzle, true, kTweGemmStageBF16,
     "sm_100+ and cuBLASLt >= 12.8, not E5M2 x E5M2"},
    {kTweGemmFP8Block, 90, 90, 120900, false, 128, 16, kTweGemmStageNone, false, kTweGemmStageFP32,
     "sm_90 and cuBLASLt >= 12.9, K a multiple of 128, M, N multiples of 16"},
    {kTweGemmNVFP4, 100, 0, 120800, false, 32, 32, kTweGemmStageSwizzle, true, kTweGemmStageBF16,
     "sm_100+ and cuBLASLt >= 12.8, M, N, K multiples of 32"},
};

const NativeRule& rule_for(TweGemmScaling scaling) {
  for (const NativeRule& r : kNative)
    if (r.scaling == scaling) return r;
  return kNative[0];
}

int32_t scale_mode(TweGemmScaling scaling, bool block_2d) {
  switch (scaling) {
    case kTweGemmFP8PerTensor: return kScaleScalar32F;
    case kTweGemmMXFP8: return kScaleVec32UE8M0;
    case kTweGemmFP8Block: return block_2d ? kScaleBlk128x128_32F : kScaleVec128_32F;
    case kTweGemmNVFP4: return kScaleVec16UE4M3;
    default: return kScaleNone;
  }
}

TweDType staged_dtype(TweGemmStaging staging, TweDType stored) {
  switch (staging) {
    case kTweGemmStageBF16: return kTweBFloat16;
    case kTweGemmStageFP32: return kTweFloat32;
    default: return stored;
  }
}

/*! Whether cuBLASLt writes `out` directly for operands read as `compute` (A's and B's dtype). */
bool direct_output(TweDType compute, TweDType out, const NativeRule* native_rule) {
  if (compute == kTweFloat32) return out == kTweFloat32;
  if (compute == kTweBFloat16) return out == kTweBFloat16 || out == kTweFloat32;
  if (compute == kTweFloat16) return out == kTweFloat16 || out == kTweFloat32;
  // FP8 / FP4 inputs: fp32, bf16 and (per the table) fp16 outputs.
  return out != kTweFloat16 || (native_rule && native_rule->fp16_out);
}

void set_reason(TweGemmPlan* plan, const std::string& text) {
  std::snprintf(plan->reason, sizeof(plan->reason), "%s", text.c_str());
}

TweStatus check_query(const TweGemmPlanQuery& q) {
  if (q.scaling < kTweGemmHighPrecision || q.scaling > kTweGemmNVFP4) {
    return fail(kTweInvalidArgument, "unknown GEMM scaling mode " + std::to_string(static_cast<int>(q.scaling)));
  }
  if (q.device != kTweCPU && q.device != kTweCUDA) return fail(kTweInvalidArgument, "unknown device");
  if (q.m < 0 || q.n < 0 || q.k < 0) return fail(kTweInvalidArgument, "GEMM dimensions must be >= 0");
  if (!is_high_precision(q.out_dtype)) {
    return fail(kTweInvalidArgument, std::string("out must be float32, bfloat16 or float16, got ") +
                                         dtype_name(q.out_dtype));
  }
  if (q.has_bias && !is_high_precision(q.bias_dtype)) {
    return fail(kTweInvalidArgument, "bias must be float32, bfloat16 or float16");
  }
  for (TweDType d : {q.a_dtype, q.b_dtype}) {
    const bool ok = q.scaling == kTweGemmHighPrecision ? is_high_precision(d)
                    : q.scaling == kTweGemmNVFP4      ? d == kTweUInt8
                                                      : is_fp8(d);
    if (!ok) {
      return fail(kTweInvalidArgument, std::string("operand dtype ") + dtype_name(d) +
                                           " does not fit the GEMM format " + std::to_string(static_cast<int>(q.scaling)));
    }
  }
  if (q.scaling != kTweGemmHighPrecision && q.scaling != kTweGemmMXFP8 && (!q.a_k_major || !q.b_k_major)) {
    return fail(kTweInvalidArgument, "per-tensor FP8, FP8 block and NVFP4 operands must be K-major");
  }
  if (q.scaling == kTweGemmFP8Block && q.a_block_2d && q.b_block_2d) {
    return fail(kTweInvalidArgument, "FP8 block GEMMs need at least one 1D (1x128) operand; both are 2D (128x128)");
  }
  if ((q.a_block_2d || q.b_block_2d) && q.scaling != kTweGemmFP8Block) {
    return fail(kTweInvalidArgument, "block_2d applies to FP8 block operands only");
  }
  if (q.device == kTweCUDA && q.sm <= 0) return fail(kTweInvalidArgument, "a CUDA plan needs the compute capability");
  return kTweSuccess;
}

/*! Why the format cannot run natively here ("" when it can). */
std::string native_blocker(const TweGemmPlanQuery& q, const NativeRule& r) {
  const bool k_minor = !q.a_k_major || !q.b_k_major;
  if (q.scaling == kTweGemmHighPrecision) return q.a_dtype == q.b_dtype ? "" : "mixed high-precision dtypes";
  if (q.sm < r.min_sm || (r.max_sm && q.sm > r.max_sm)) {
    return "device sm_" + std::to_string(q.sm) + " (needs " + r.requirement + ")";
  }
  if (q.cublaslt_version < r.min_cublaslt) {
    return "cuBLASLt " + std::to_string(q.cublaslt_version) + " (needs " + r.requirement + ")";
  }
  if (q.a_dtype == kTweFloat8E5M2 && q.b_dtype == kTweFloat8E5M2) return "E5M2 x E5M2 has no cuBLASLt kernel";
  if (k_minor && !(r.k_minor_from_sm100 && q.sm >= 100 && q.sm < 120)) {
    return "K-minor operand on sm_" + std::to_string(q.sm);
  }
  if (q.k % r.k_multiple != 0) return "K=" + std::to_string(q.k) + " not a multiple of " + std::to_string(r.k_multiple);
  if (q.m % r.mn_multiple != 0 || q.n % r.mn_multiple != 0) {
    return "M, N (" + std::to_string(q.m) + ", " + std::to_string(q.n) + ") not multiples of " +
           std::to_string(r.mn_multiple);
  }
  return "";
}

constexpr int64_t kWorkspaceAlign = 256;
constexpr int64_t kScalarBytes = 256;

}  // namespace

int64_t gemm_staging_bytes(TweGemmStaging staging, int64_t rows, int64_t k, int64_t scale_bytes) {
  switch (staging) {
    case kTweGemmStageSwizzle: return round_up(scale_bytes, kWorkspaceAlign);
    case kTweGemmStageBF16: return round_up(rows * k * 2, kWorkspaceAlign);
    case kTweGemmStageFP32: return round_up(rows * k * 4, kWorkspaceAlign);
    default: return 0;
  }
}

GemmWorkspaceLayout gemm_workspace_layout(const TweGemmPlan& plan, const TweGemmPlanQuery& q) {
  GemmWorkspaceLayout w;
  if (plan.path != kTweGemmPathCublasLt && plan.path != kTweGemmPathDequantCublasLt) return w;
  w.cublas_bytes = kTweGemmCublasWorkspaceBytes;
  w.cublas = 0;
  w.a_stage = w.cublas + w.cublas_bytes;
  w.b_stage = w.a_stage + gemm_staging_bytes(plan.a_staging, q.m, q.k, q.a_scale_bytes);
  w.out_stage = w.b_stage + gemm_staging_bytes(plan.b_staging, q.n, q.k, q.b_scale_bytes);
  w.scalars = w.out_stage + (plan.epilogue == kTweGemmEpilogueStaged ? round_up(q.m * q.n * 4, kWorkspaceAlign) : 0);
  w.total = w.scalars + kScalarBytes + kWorkspaceAlign;  // + slack to align the base pointer to 256
  return w;
}

TweStatus gemm_plan(const TweGemmPlanQuery& q, TweGemmPlan* plan) {
  *plan = TweGemmPlan{};
  plan->a_scale_mode = plan->b_scale_mode = kScaleNone;
  plan->a_compute_dtype = q.a_dtype;
  plan->b_compute_dtype = q.b_dtype;
  TweStatus st = check_query(q);
  if (st) return st;
  if (q.m == 0 || q.n == 0) {
    plan->path = kTweGemmPathNone;
    set_reason(plan, "empty output");
    return kTweSuccess;
  }
  if (q.device == kTweCPU) {
    plan->path = kTweGemmPathCpu;
    set_reason(plan, "CPU views");
    return kTweSuccess;
  }
  if (q.k == 0 || q.cublaslt_version <= 0) {
    plan->path = kTweGemmPathTiled;
    set_reason(plan, q.k == 0 ? "K == 0 (out = bias)" : "cuBLASLt could not be loaded");
    return kTweSuccess;
  }
  const NativeRule& rule = rule_for(q.scaling);
  const std::string blocker = native_blocker(q, rule);
  const bool native = blocker.empty();
  // cuBLASLt computes column-major outᵀ = B · Aᵀ: its A is our B (op T when K-major), its B is
  // our A (op N when K-major).
  plan->cublas_transa = q.b_k_major ? 1 : 0;
  plan->cublas_transb = q.a_k_major ? 0 : 1;
  if (native) {
    plan->path = kTweGemmPathCublasLt;
    plan->a_scale_mode = scale_mode(q.scaling, q.a_block_2d);
    plan->b_scale_mode = scale_mode(q.scaling, q.b_block_2d);
    plan->a_staging = plan->b_staging = rule.scale_staging;
    set_reason(plan, q.scaling == kTweGemmHighPrecision ? "high precision" : "native format");
  } else {
    plan->path = kTweGemmPathDequantCublasLt;
    plan->a_staging = plan->b_staging = rule.fallback;
    set_reason(plan, "dequantize: " + blocker);
  }
  plan->a_compute_dtype = staged_dtype(plan->a_staging, q.a_dtype);
  plan->b_compute_dtype = staged_dtype(plan->b_staging, q.b_dtype);
  const bool direct = direct_output(plan->a_compute_dtype, q.out_dtype, native ? &rule : nullptr);
  // cuBLASLt's bias epilogue adds in fp32 and rounds once, as the spec does; it is used where
  // its bias dtype rule is simple (bias dtype == bf16/fp16 out dtype, plain or per-tensor scaled).
  const bool cublas_bias = q.out_dtype != kTweFloat32 && q.bias_dtype == q.out_dtype &&
                           (q.scaling == kTweGemmHighPrecision || q.scaling == kTweGemmFP8PerTensor ||
                            plan->path == kTweGemmPathDequantCublasLt);
  if (!direct) plan->epilogue = kTweGemmEpilogueStaged;
  else if (!q.has_bias) plan->epilogue = kTweGemmEpilogueDirect;
  else if (cublas_bias) plan->epilogue = kTweGemmEpilogueBias;
  else if (q.out_dtype == kTweFloat32) plan->epilogue = kTweGemmEpilogueBiasAdd;
  else plan->epilogue = kTweGemmEpilogueStaged;
  plan->workspace_bytes = gemm_workspace_layout(*plan, q).total;
  return kTweSuccess;
}

}  // namespace twe

extern "C" TweStatus twe_gemm_plan(const TweGemmPlanQuery* query, TweGemmPlan* plan) {
  if (!query || !plan) return twe::fail(kTweInvalidArgument, "query and plan must not be NULL");
  try {
    const TweStatus st = twe::gemm_plan(*query, plan);
    return st ? st : twe::succeed();
  } catch (const std::exception& e) {
    return twe::fail(kTweInternalError, std::string("gemm plan failed: ") + e.what());
  }
}
