// C ABI of the gemm family: argument checks, then dispatch to the CPU or CUDA kernel.
#include <climits>
#include <string>

#include "internal/gemm.h"
#include "internal/gemm_swizzle.h"

namespace twe {
namespace {

bool is_fp8(TweDType d) { return d == kTweFloat8E4M3 || d == kTweFloat8E5M2; }

/*! (rows, K) of an operand from its stored 2-D shape (NVFP4 packs two K elements a byte). */
void operand_dims(const TweGemmOperand& op, TweGemmScaling scaling, int64_t* rows_out, int64_t* k_out) {
  const int64_t r = rows(op.data), c = cols(op.data) * (scaling == kTweGemmNVFP4 ? 2 : 1);
  *rows_out = op.k_major ? r : c;
  *k_out = op.k_major ? c : r;
}

TweStatus check_operand(const TweGemmOperand* op, const char* name, TweGemmScaling scaling, TweDevice device) {
  const std::string n(name);
  if (!op || !present(&op->data)) return fail(kTweInvalidArgument, n + " data is missing");
  if (op->data.device != device) return fail(kTweInvalidArgument, n + " is on a different device than out");
  if (op->data.ndim < 1) return fail(kTweInvalidArgument, n + " data must have rank >= 1");
  if (scaling == kTweGemmHighPrecision) {
    if (!is_high_precision(op->data.dtype)) {
      return fail(kTweInvalidArgument, n + " data must be float32, bfloat16 or float16, got " +
                                           dtype_name(op->data.dtype));
    }
    if (present(&op->scale_inv)) return fail(kTweInvalidArgument, n + ": high-precision operands take no scale_inv");
    return kTweSuccess;
  }
  const bool nvfp4 = scaling == kTweGemmNVFP4;
  if (nvfp4 ? op->data.dtype != kTweUInt8 : !is_fp8(op->data.dtype)) {
    return fail(kTweInvalidArgument, n + (nvfp4 ? " data must be uint8 (packed E2M1)" : " data must be float8_e4m3fn "
                                          "or float8_e5m2") + ", got " + dtype_name(op->data.dtype));
  }
  int64_t r, k;
  operand_dims(*op, scaling, &r, &k);
  const std::string scale_name = n + " scale_inv";
  if (scaling != kTweGemmMXFP8 && !op->k_major) {
    return fail(kTweInvalidArgument, n + ": per-tensor FP8, FP8 block and NVFP4 operands must be K-major");
  }
  switch (scaling) {
    case kTweGemmFP8PerTensor:
      return check_view(&op->scale_inv, scale_name.c_str(), kTweFloat32, -1, 1, device);
    case kTweGemmMXFP8:
      if (r % 32 != 0 || k % 32 != 0) {
        return fail(kTweInvalidArgument, n + ": MXFP8 operands need rows and K divisible by 32, got data " +
                                             shape_string(op->data));
      }
      return op->k_major
                 ? check_view(&op->scale_inv, scale_name.c_str(), kTweUInt8, round_up(r, 128), round_up(k / 32, 4), device)
                 : check_view(&op->scale_inv, scale_name.c_str(), kTweUInt8, round_up(k / 32, 4), round_up(r, 128), device);
    case kTweGemmFP8Block:
      return op->block_2d ? check_view(&op->scale_inv, scale_name.c_str(), kTweFloat32, ceil_div(r, 128),
                                       round_up(ceil_div(k, 128), 4), device)
                          : check_view(&op->scale_inv, scale_name.c_str(), kTweFloat32, ceil_div(k, 128),
                                       round_up(r, 4), device);
    default: {
      const std::string amax_name = n + " amax";
      TweStatus st = check_view(&op->scale_inv, scale_name.c_str(), kTweUInt8, round_up(r, 128),
                                round_up(ceil_div(k, 16), 4), device);
      return st ? st : check_view(&op->amax, amax_name.c_str(), kTweFloat32, -1, 1, device);
    }
  }
}

/*! What a grouped GEMM operand view holds. */
enum class GroupedData { kHighPrecision, kFP8, kPackedFP4 };

/*! An operand view of rank `ndim` (data may be NULL when it has no elements) holding `kind`
 *  (packed FP4: uint8, two E2M1 values per byte). */
TweStatus check_hp_view(const TweTensorView* v, const char* name, int32_t ndim, TweDevice device,
                        GroupedData kind = GroupedData::kHighPrecision) {
  if (!v) return fail(kTweInvalidArgument, std::string(name) + " is missing");
  if (kind == GroupedData::kFP8 && !is_fp8(v->dtype)) {
    return fail(kTweInvalidArgument, std::string(name) + " must be float8_e4m3fn or float8_e5m2, got " +
                                         dtype_name(v->dtype));
  }
  if (kind == GroupedData::kPackedFP4 && v->dtype != kTweUInt8) {
    return fail(kTweInvalidArgument, std::string(name) + " must be uint8 (packed E2M1), got " + dtype_name(v->dtype));
  }
  if (kind == GroupedData::kHighPrecision && !is_high_precision(v->dtype)) {
    return fail(kTweInvalidArgument, std::string(name) + " must be float32, bfloat16 or float16 (grouped GEMMs take "
                                     "high-precision operands), got " + dtype_name(v->dtype));
  }
  if (v->ndim != ndim) {
    return fail(kTweInvalidArgument, std::string(name) + " must have rank " + std::to_string(ndim) + ", got " +
                                         shape_string(*v));
  }
  if (v->device != device) return fail(kTweInvalidArgument, std::string(name) + " is on a different device than out");
  if (!v->data && numel(*v) > 0) return fail(kTweInvalidArgument, std::string(name) + " data is missing");
  return kTweSuccess;
}

TweStatus grouped_gemm_checked(const TweTensorView* a, const TweTensorView* a_scale_inv, const TweTensorView* a_amax,
                               const TweTensorView* b, const TweTensorView* b_scale_inv, const TweTensorView* b_amax,
                               const TweTensorView* m_splits, const TweTensorView* bias, TweTensorView* out,
                               const TweGroupedGemmParams* params, bool ragged_k, void* stream) {
  if (!params) return fail(kTweInvalidArgument, "params must not be NULL");
  if (!out) return fail(kTweInvalidArgument, "out is missing");
  const TweDevice dev = out->device;
  const bool nvfp4 = params->scaling == kTweGemmNVFP4;
  const bool fp8 = params->scaling == kTweGemmFP8PerTensor || params->scaling == kTweGemmMXFP8 ||
                   params->scaling == kTweGemmFP8Block || nvfp4;
  if (!fp8 && params->scaling != kTweGemmHighPrecision) {
    return fail(kTweInvalidArgument, "grouped GEMMs take high-precision, per-tensor FP8, FP8 block, MXFP8 or NVFP4 "
                                     "operands");
  }
  if (fp8 && dev != kTweCPU) return fail(kTweInvalidArgument, "quantized grouped GEMMs run on the CPU only");
  if (!is_high_precision(out->dtype)) {
    return fail(kTweInvalidArgument, std::string("out must be float32, bfloat16 or float16, got ") +
                                         dtype_name(out->dtype));
  }
  if (!m_splits || !m_splits->data || m_splits->dtype != kTweInt32 || m_splits->ndim != 1 || m_splits->shape[0] < 1) {
    return fail(kTweInvalidArgument, "m_splits must be a non-empty 1-D int32 array");
  }
  if (m_splits->device != dev) return fail(kTweInvalidArgument, "m_splits is on a different device than out");
  const int64_t groups = m_splits->shape[0];
  const GroupedData kind = nvfp4 ? GroupedData::kPackedFP4 : fp8 ? GroupedData::kFP8 : GroupedData::kHighPrecision;
  TweStatus st = check_hp_view(a, "a", 2, dev, kind);
  if (st) return st;
  if ((st = check_hp_view(b, "b", ragged_k ? 2 : 3, dev, kind))) return st;
  if ((st = check_hp_view(out, "out", ragged_k ? 3 : 2, dev))) return st;
  if (params->scaling == kTweGemmFP8PerTensor) {
    if ((st = check_view(a_scale_inv, "a scale_inv", kTweFloat32, -1, groups, dev))) return st;
    if ((st = check_view(b_scale_inv, "b scale_inv", kTweFloat32, -1, groups, dev))) return st;
  } else if (params->scaling == kTweGemmMXFP8) {
    for (const TweTensorView* s : {a_scale_inv, b_scale_inv}) {
      if (!s || !s->data || s->dtype != kTweUInt8 || s->ndim != 2 || s->device != dev) {
        return fail(kTweInvalidArgument, "MXFP8 grouped GEMM scales must be 2-D uint8 arrays on out's device");
      }
    }
  } else if (params->scaling == kTweGemmFP8Block) {
    for (const TweTensorView* s : {a_scale_inv, b_scale_inv}) {
      if (!s || !s->data || s->dtype != kTweFloat32 || s->ndim != 1 || s->device != dev) {
        return fail(kTweInvalidArgument, "FP8 block grouped GEMM scales must be flat float32 arrays on out's device");
      }
    }
    if (params->a_block_2d && params->b_block_2d) {
      return fail(kTweInvalidArgument, "FP8 block GEMMs need at least one 1D (1x128) operand");
    }
  } else if (nvfp4) {
    for (const TweTensorView* s : {a_scale_inv, b_scale_inv}) {
      if (!s || !s->data || s->dtype != kTweUInt8 || s->ndim != 1 || s->device != dev) {
        return fail(kTweInvalidArgument, "NVFP4 grouped GEMM scales must be flat uint8 arrays on out's device");
      }
    }
    if ((st = check_view(a_amax, "a amax", kTweFloat32, -1, groups, dev))) return st;
    if ((st = check_view(b_amax, "b amax", kTweFloat32, -1, groups, dev))) return st;
    if (!params->a_k_major || !params->b_k_major) {
      return fail(kTweInvalidArgument, "NVFP4 grouped GEMM operands must be K-major");
    }
  }
  // NVFP4 data holds two elements per byte along K (the last dimension of K-major operands).
  const int64_t pack = nvfp4 ? 2 : 1;
  int64_t m, n, k;
  if (!ragged_k) {
    m = a->shape[0];
    k = a->shape[1] * pack;
    n = params->b_k_major ? b->shape[1] : b->shape[2];
    const int64_t kb = params->b_k_major ? b->shape[2] * pack : b->shape[1];
    if (!params->a_k_major) return fail(kTweInvalidArgument, "grouped_gemm: a must be K-major (M, K)");
    if (b->shape[0] != groups || kb != k) {
      return fail(kTweInvalidArgument, "b " + shape_string(*b) + " does not hold " + std::to_string(groups) +
                                           " operands of K = " + std::to_string(k));
    }
    if (out->shape[0] != m || out->shape[1] != n) {
      return fail(kTweInvalidArgument, "out must have shape (M, N), got " + shape_string(*out));
    }
    if (bias && bias->data) {
      if ((st = check_hp_view(bias, "bias", 2, dev))) return st;
      if (bias->shape[0] != groups || bias->shape[1] != n) {
        return fail(kTweInvalidArgument, "bias must have shape (G, N), got " + shape_string(*bias));
      }
    }
  } else {
    m = params->b_k_major ? b->shape[1] * pack : b->shape[0];
    k = params->b_k_major ? b->shape[0] : b->shape[1];
    n = params->a_k_major ? a->shape[0] : a->shape[1];
    const int64_t ma = params->a_k_major ? a->shape[1] * pack : a->shape[0];
    if (ma != m) {
      return fail(kTweInvalidArgument, "a " + shape_string(*a) + " and b " + shape_string(*b) +
                                           " disagree on the rows M");
    }
    if (out->shape[0] != groups || out->shape[1] != n || out->shape[2] != k) {
      return fail(kTweInvalidArgument, "out must have shape (G, N, K), got " + shape_string(*out));
    }
  }
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX) return fail(kTweInvalidArgument, "GEMM dimensions must be < 2^31");
  // Host-readable splits are checked here (a device split would need a sync: CUDA clamps them).
  if (dev == kTweCPU && (st = check_m_split_values(*m_splits, m))) return st;
  GroupedGemmArgs args{a, b, m_splits, (bias && bias->data) ? bias : nullptr, out, fp8 ? a_scale_inv : nullptr,
                       fp8 ? b_scale_inv : nullptr, params->scaling, ragged_k, params->a_k_major != 0,
                       params->b_k_major != 0, groups, m, n, k, stream, params->a_block_2d != 0,
                       params->b_block_2d != 0, nvfp4 ? a_amax : nullptr, nvfp4 ? b_amax : nullptr};
  if (numel(*out) == 0) return succeed();
  st = run_on_device(dev, args, TWE_DEVICE_FNS(grouped_gemm));
  return st ? st : succeed();
}

}  // namespace
}  // namespace twe

using namespace twe;

extern "C" {

TweStatus twe_gemm(const TweGemmOperand* a, const TweGemmOperand* b, const TweTensorView* bias, TweTensorView* out,
                   TweTensorView* workspace, const TweGemmParams* params, void* stream) {
  if (!params) return fail(kTweInvalidArgument, "params must not be NULL");
  if (!present(out)) return fail(kTweInvalidArgument, "out is missing");
  if (!is_high_precision(out->dtype)) {
    return fail(kTweInvalidArgument, std::string("out must be float32, bfloat16 or float16, got ") +
                                         dtype_name(out->dtype));
  }
  const TweGemmScaling scaling = params->scaling;
  if (scaling < kTweGemmHighPrecision || scaling > kTweGemmNVFP4) {
    return fail(kTweInvalidArgument, "unknown GEMM scaling mode " + std::to_string(static_cast<int>(scaling)));
  }
  const TweDevice dev = out->device;
  TweStatus st = check_operand(a, "a", scaling, dev);
  if (st) return st;
  if ((st = check_operand(b, "b", scaling, dev))) return st;
  if (scaling == kTweGemmFP8Block && a->block_2d && b->block_2d) {
    return fail(kTweInvalidArgument, "FP8 block GEMMs need at least one 1D (1x128) operand; both are 2D (128x128)");
  }
  int64_t m, ka, n, kb;
  operand_dims(*a, scaling, &m, &ka);
  operand_dims(*b, scaling, &n, &kb);
  if (ka != kb) {
    return fail(kTweInvalidArgument, "a and b disagree on K: a data " + shape_string(a->data) + " (k_major=" +
                                         std::to_string(a->k_major) + "), b data " + shape_string(b->data) +
                                         " (k_major=" + std::to_string(b->k_major) + ")");
  }
  if (m > INT_MAX || n > INT_MAX || ka > INT_MAX) return fail(kTweInvalidArgument, "GEMM dimensions must be < 2^31");
  if ((st = check_view(out, "out", out->dtype, m, n, dev))) return st;
  const bool has_bias = present(bias);
  if (has_bias) {
    if (!is_high_precision(bias->dtype)) return fail(kTweInvalidArgument, "bias must be float32, bfloat16 or float16");
    if ((st = check_view(bias, "bias", bias->dtype, -1, n, dev))) return st;
  }
  const bool has_workspace = present(workspace);
  if (has_workspace) {
    if (workspace->device != dev) return fail(kTweInvalidArgument, "workspace is on a different device than out");
    if (workspace->dtype != kTweUInt8) return fail(kTweInvalidArgument, "workspace must be uint8");
  }
  GemmArgs args{a, b, has_bias ? bias : nullptr, out, scaling, m, n, ka, stream, has_workspace ? workspace : nullptr};
  st = run_on_device(dev, args, TWE_DEVICE_FNS(gemm));
  return st ? st : succeed();
}

TweStatus twe_grouped_gemm(const TweTensorView* a, const TweTensorView* a_scale_inv, const TweTensorView* a_amax,
                           const TweTensorView* b, const TweTensorView* b_scale_inv, const TweTensorView* b_amax,
                           const TweTensorView* m_splits, const TweTensorView* bias, TweTensorView* out,
                           const TweGroupedGemmParams* params, void* stream) {
  return grouped_gemm_checked(a, a_scale_inv, a_amax, b, b_scale_inv, b_amax, m_splits, bias, out, params, false,
                              stream);
}

TweStatus twe_grouped_gemm_wgrad(const TweTensorView* a, const TweTensorView* a_scale_inv, const TweTensorView* a_amax,
                                 const TweTensorView* b, const TweTensorView* b_scale_inv, const TweTensorView* b_amax,
                                 const TweTensorView* m_splits, TweTensorView* out, const TweGroupedGemmParams* params,
                                 void* stream) {
  return grouped_gemm_checked(a, a_scale_inv, a_amax, b, b_scale_inv, b_amax, m_splits, nullptr, out, params, true,
                              stream);
}

TweStatus twe_gemm_swizzle_scales(const TweTensorView* in, TweTensorView* out, const TweGemmSwizzleParams* params,
                                  void* stream) {
  if (!params) return fail(kTweInvalidArgument, "params must not be NULL");
  if (!present(in) || !present(out)) return fail(kTweInvalidArgument, "in and out must be present");
  if (in->dtype != kTweUInt8 || out->dtype != kTweUInt8) return fail(kTweInvalidArgument, "scales must be uint8");
  if (in->device != out->device) return fail(kTweInvalidArgument, "in and out are on different devices");
  if (numel(*in) != numel(*out)) {
    return fail(kTweInvalidArgument, "in " + shape_string(*in) + " and out " + shape_string(*out) +
                                         " must have the same number of scales");
  }
  const TweTensorView& compact = params->inverse ? *out : *in;
  if (compact.ndim != 2) {
    return fail(kTweInvalidArgument, "the compact scales must be 2-D, got " + shape_string(compact));
  }
  const bool transposed = params->transposed != 0;
  const int64_t rows = transposed ? compact.shape[1] : compact.shape[0];
  const int64_t blocks = transposed ? compact.shape[0] : compact.shape[1];
  if (rows % kSwizzleTileRows != 0 || blocks % kSwizzleTileCols != 0) {
    return fail(kTweInvalidArgument, "the compact scales " + shape_string(compact) + " must be padded to " +
                                         (transposed ? std::string("(4k, 128k)") : std::string("(128k, 4k)")) +
                                         " for the 128x4 tiled layout");
  }
  SwizzleArgs args{in, out, rows, blocks, transposed, params->inverse != 0, stream};
  const TweStatus st = run_on_device(in->device, args, TWE_DEVICE_FNS(gemm_swizzle_scales));
  return st ? st : succeed();
}

int64_t twe_gemm_cublaslt_version(void) {
#ifdef TWE_WITH_CUDA
  return cuda::cublaslt_version();
#else
  return 0;
#endif
}

}  // extern "C"
