// The cuBLASLt GEMM path (NUMERICS.md §8): runs the plan of csrc/abi/gemm_plan.cc — native
// FP8 / FP8 block / MXFP8 / NVFP4 / high-precision cuBLASLt GEMMs, or dequantize into the
// workspace and a bf16 / fp32 cuBLASLt GEMM — with every buffer carved from the caller's
// workspace (framework allocator; stream-ordered, no host sync, CUDA-graph safe). The
// staging and epilogue kernels are in csrc/cuda/gemm_staging.cu.
//
// libcublasLt is loaded at run time (dlopen), not linked: the extension imports on machines
// without a GPU, driver or cuBLAS, the CPU path never needs it, and the CUDA path falls back
// to the tiled kernel when it cannot be loaded (twe_gemm_cublaslt_version() == 0). Types and
// enums come from the cublasLt.h the build found (toolkit, else the nvidia-cublas wheel).
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <array>
#include <mutex>
#include <string>
#include <vector>

#include "internal/gemm.h"
#include "internal/gemm_swizzle.h"

#ifndef TWE_CUBLASLT_WHEEL_LIBDIR
#define TWE_CUBLASLT_WHEEL_LIBDIR ""
#endif

namespace twe {
namespace cuda {

namespace {

constexpr bool same_mode(int cublas, int ours) { return cublas == ours; }
static_assert(same_mode(CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, kScaleScalar32F), "scale mode");
static_assert(same_mode(CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3, kScaleVec16UE4M3), "scale mode");
static_assert(same_mode(CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0, kScaleVec32UE8M0), "scale mode");
static_assert(same_mode(CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, kScaleVec128_32F), "scale mode");
static_assert(same_mode(CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, kScaleBlk128x128_32F), "scale mode");

// ---- run-time loading ------------------------------------------------------------------------

struct CublasLtApi {
  decltype(&::cublasLtGetVersion) GetVersion = nullptr;
  decltype(&::cublasLtGetStatusString) GetStatusString = nullptr;
  decltype(&::cublasLtCreate) Create = nullptr;
  decltype(&::cublasLtMatmulDescCreate) MatmulDescCreate = nullptr;
  decltype(&::cublasLtMatmulDescDestroy) MatmulDescDestroy = nullptr;
  decltype(&::cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute = nullptr;
  decltype(&::cublasLtMatrixLayoutCreate) MatrixLayoutCreate = nullptr;
  decltype(&::cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy = nullptr;
  decltype(&::cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate = nullptr;
  decltype(&::cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy = nullptr;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute = nullptr;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic = nullptr;
  decltype(&::cublasLtMatmul) Matmul = nullptr;
  int64_t version = 0;
};

template <typename Fn>
bool bind(void* lib, const char* name, Fn* fn) {
  *fn = reinterpret_cast<Fn>(dlsym(lib, name));
  return *fn != nullptr;
}

/*! Directory of this extension (to find the nvidia-cublas wheel beside it in site-packages). */
std::string own_directory() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&own_directory), &info) || !info.dli_fname) return "";
  const std::string path(info.dli_fname);
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

CublasLtApi load_api() {
  CublasLtApi api;
  const std::string soname = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
  const std::string here = own_directory();
  // 1. already loaded or on the loader path (torch's CUDA wheels load it); 2. the wheel beside
  // this extension in site-packages; 3. the wheel the build used.
  std::vector<std::string> candidates = {soname};
  if (!here.empty()) {
    candidates.push_back(here + "/../nvidia/cu" + std::to_string(CUBLAS_VER_MAJOR) + "/lib/" + soname);
    candidates.push_back(here + "/../nvidia/cublas/lib/" + soname);
  }
  const std::string build_wheel = TWE_CUBLASLT_WHEEL_LIBDIR;
  if (!build_wheel.empty()) candidates.push_back(build_wheel + "/" + soname);
  void* lib = nullptr;
  for (const std::string& c : candidates) {
    lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib) break;
  }
  if (!lib) return api;
  const bool ok = bind(lib, "cublasLtGetVersion", &api.GetVersion) &&
                  bind(lib, "cublasLtGetStatusString", &api.GetStatusString) &&
                  bind(lib, "cublasLtCreate", &api.Create) &&
                  bind(lib, "cublasLtMatmulDescCreate", &api.MatmulDescCreate) &&
                  bind(lib, "cublasLtMatmulDescDestroy", &api.MatmulDescDestroy) &&
                  bind(lib, "cublasLtMatmulDescSetAttribute", &api.MatmulDescSetAttribute) &&
                  bind(lib, "cublasLtMatrixLayoutCreate", &api.MatrixLayoutCreate) &&
                  bind(lib, "cublasLtMatrixLayoutDestroy", &api.MatrixLayoutDestroy) &&
                  bind(lib, "cublasLtMatmulPreferenceCreate", &api.MatmulPreferenceCreate) &&
                  bind(lib, "cublasLtMatmulPreferenceDestroy", &api.MatmulPreferenceDestroy) &&
                  bind(lib, "cublasLtMatmulPreferenceSetAttribute", &api.MatmulPreferenceSetAttribute) &&
                  bind(lib, "cublasLtMatmulAlgoGetHeuristic", &api.MatmulAlgoGetHeuristic) &&
                  bind(lib, "cublasLtMatmul", &api.Matmul);
  if (!ok) return CublasLtApi{};
  const int64_t version = static_cast<int64_t>(api.GetVersion());
  // Same major version as the header the build compiled against (the ABI of the enums/structs).
  if (version / 10000 != CUBLAS_VER_MAJOR) return CublasLtApi{};
  api.version = version;
  return api;
}

const CublasLtApi& api() {
  static const CublasLtApi loaded = load_api();
  return loaded;
}

constexpr int kMaxDevices = 64;

/*! One cuBLASLt handle per device, created on first use (host-only; no stream work). */
TweStatus handle_for(int device, cublasLtHandle_t* out) {
  static std::mutex mutex;
  static std::array<cublasLtHandle_t, kMaxDevices> handles{};
  if (device < 0 || device >= kMaxDevices) return fail(kTweUnsupported, "device index above 63");
  std::lock_guard<std::mutex> lock(mutex);
  if (!handles[device]) {
    const cublasStatus_t st = api().Create(&handles[device]);
    if (st != CUBLAS_STATUS_SUCCESS) {
      handles[device] = nullptr;
      return fail(kTweCudaError, std::string("cublasLtCreate failed: ") + api().GetStatusString(st));
    }
  }
  *out = handles[device];
  return kTweSuccess;
}

// ---- cuBLASLt descriptors ---------------------------------------------------------------------

cudaDataType_t cuda_type(TweDType d) {
  switch (d) {
    case kTweFloat32: return CUDA_R_32F;
    case kTweBFloat16: return CUDA_R_16BF;
    case kTweFloat16: return CUDA_R_16F;
    case kTweFloat8E4M3: return CUDA_R_8F_E4M3;
    case kTweFloat8E5M2: return CUDA_R_8F_E5M2;
    default: return CUDA_R_4F_E2M1;  // uint8 operands are packed NVFP4
  }
}

struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descriptors() {
    if (pref) api().MatmulPreferenceDestroy(pref);
    if (c) api().MatrixLayoutDestroy(c);
    if (b) api().MatrixLayoutDestroy(b);
    if (a) api().MatrixLayoutDestroy(a);
    if (op) api().MatmulDescDestroy(op);
  }
};

TweStatus cublas_check(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return kTweSuccess;
  return fail(kTweCudaError, std::string(what) + " failed: " + api().GetStatusString(st));
}

template <typename T>
TweStatus set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& value, const char* what) {
  return cublas_check(api().MatmulDescSetAttribute(d, attr, &value, sizeof(value)), what);
}

}  // namespace

int64_t cublaslt_version() { return api().version; }

/*! Runs a cuBLASLt plan (path kTweGemmPathCublasLt or kTweGemmPathDequantCublasLt). */
TweStatus gemm_cublaslt(const GemmArgs& args, const TweGemmPlan& plan, const TweGemmPlanQuery& query, int device) {
  const GemmWorkspaceLayout layout = gemm_workspace_layout(plan, query);
  const int64_t given = args.workspace ? numel(*args.workspace) : 0;
  if (given < layout.total) {
    return fail(kTweInvalidArgument, "the CUDA GEMM plan (" + std::string(plan.reason) + ") needs a workspace of " +
                                         std::to_string(layout.total) + " bytes (core/ops/gemm.py "
                                         "gemm_workspace_bytes), got " + std::to_string(given));
  }
  uint8_t* base = static_cast<uint8_t*>(args.workspace->data);
  base += (256 - reinterpret_cast<uintptr_t>(base) % 256) % 256;
  const TweGemmOperand& a = *args.a;
  const TweGemmOperand& b = *args.b;
  const TweGemmScaling scaling = args.scaling;
  void* stream = args.stream;

  // Staging: swizzled scales or dequantized operands.
  uint8_t* a_stage = base + layout.a_stage;
  uint8_t* b_stage = base + layout.b_stage;
  TweStatus st = stage_operand(a, scaling, plan.a_staging, args.m, args.k, a_stage, stream);
  if (st) return st;
  if ((st = stage_operand(b, scaling, plan.b_staging, args.n, args.k, b_stage, stream))) return st;
  const bool dequantized = plan.path == kTweGemmPathDequantCublasLt;
  const void* a_ptr = dequantized ? a_stage : a.data.data;
  const void* b_ptr = dequantized ? b_stage : b.data.data;

  // alpha / beta: device scalars for NVFP4 (S_dec_a · S_dec_b), host 1 / 0 otherwise.
  float* scalars = reinterpret_cast<float*>(base + layout.scalars);
  const bool device_alpha = scaling == kTweGemmNVFP4;
  if (device_alpha) {
    st = launch_nvfp4_alpha(static_cast<const float*>(a.amax.data), static_cast<const float*>(b.amax.data), scalars,
                            stream);
    if (st) return st;
  }
  static const float kOne = 1.0f, kZero = 0.0f;

  // Output: out directly, or the fp32 staging buffer.
  const bool staged = plan.epilogue == kTweGemmEpilogueStaged;
  void* d_ptr = staged ? static_cast<void*>(base + layout.out_stage) : args.out->data;
  const TweDType d_dtype = staged ? kTweFloat32 : args.out->dtype;

  cublasLtHandle_t handle;
  if ((st = handle_for(device, &handle))) return st;
  Descriptors desc;
  st = cublas_check(api().MatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  if (st) return st;
  // cuBLASLt's A is our B, its B our A (column-major outᵀ (N, M) = B · Aᵀ).
  const cublasOperation_t transa = plan.cublas_transa ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t transb = plan.cublas_transb ? CUBLAS_OP_T : CUBLAS_OP_N;
  if ((st = set_desc(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, transa, "TRANSA"))) return st;
  if ((st = set_desc(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, transb, "TRANSB"))) return st;
  if (device_alpha) {
    const cublasLtPointerMode_t mode = CUBLASLT_POINTER_MODE_DEVICE;
    if ((st = set_desc(desc.op, CUBLASLT_MATMUL_DESC_POINTER_MODE, mode, "POINTER_MODE"))) return st;
  }
  if (!dequantized && scaling != kTweGemmHighPrecision) {
    const void* a_scale = plan.a_staging == kTweGemmStageSwizzle ? a_stage : a.scale_inv.data;
    const void* b_scale = plan.b_staging == kTweGemmStageSwizzle ? b_stage : b.scale_inv.data;
    if ((st = set_desc(desc.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, b_scale, "A_SCALE_POINTER"))) return st;
    if ((st = set_desc(desc.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, a_scale, "B_SCALE_POINTER"))) return st;
    if (plan.b_scale_mode != kScaleScalar32F) {
      const int32_t mode = plan.b_scale_mode;
      if ((st = set_desc(desc.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, mode, "A_SCALE_MODE"))) return st;
    }
    if (plan.a_scale_mode != kScaleScalar32F) {
      const int32_t mode = plan.a_scale_mode;
      if ((st = set_desc(desc.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mode, "B_SCALE_MODE"))) return st;
    }
  }
  if (plan.epilogue == kTweGemmEpilogueBias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    const void* bias = args.bias->data;
    const int32_t bias_type = cuda_type(args.bias->dtype);
    if ((st = set_desc(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, epi, "EPILOGUE"))) return st;
    if ((st = set_desc(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, "BIAS_POINTER"))) return st;
    if ((st = set_desc(desc.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type, "BIAS_DATA_TYPE"))) return st;
  }

  // Layouts (column-major): its A = our B as stored, its B = our A as stored, D = outᵀ (N, M).
  const uint64_t m = static_cast<uint64_t>(args.m), n = static_cast<uint64_t>(args.n);
  const uint64_t k = static_cast<uint64_t>(args.k);
  const cudaDataType_t a_type = cuda_type(plan.b_compute_dtype), b_type = cuda_type(plan.a_compute_dtype);
  st = transa == CUBLAS_OP_T ? cublas_check(api().MatrixLayoutCreate(&desc.a, a_type, k, n, args.k), "layout A")
                             : cublas_check(api().MatrixLayoutCreate(&desc.a, a_type, n, k, args.n), "layout A");
  if (st) return st;
  st = transb == CUBLAS_OP_N ? cublas_check(api().MatrixLayoutCreate(&desc.b, b_type, k, m, args.k), "layout B")
                             : cublas_check(api().MatrixLayoutCreate(&desc.b, b_type, m, k, args.m), "layout B");
  if (st) return st;
  if ((st = cublas_check(api().MatrixLayoutCreate(&desc.c, cuda_type(d_dtype), n, m, args.n), "layout D"))) return st;

  if ((st = cublas_check(api().MatmulPreferenceCreate(&desc.pref), "cublasLtMatmulPreferenceCreate"))) return st;
  const uint64_t workspace_bytes = static_cast<uint64_t>(layout.cublas_bytes);
  if ((st = cublas_check(api().MatmulPreferenceSetAttribute(desc.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                            &workspace_bytes, sizeof(workspace_bytes)),
                         "MAX_WORKSPACE_BYTES"))) {
    return st;
  }
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  const cublasStatus_t hs = api().MatmulAlgoGetHeuristic(handle, desc.op, desc.a, desc.b, desc.c, desc.c, desc.pref, 1,
                                                         &heuristic, &found);
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0) {
    // No cuBLASLt kernel for this combination on this device/library: the tiled kernel
    // computes the same GEMM (every recipe runs on every device). The staging above only
    // wrote workspace.
    return gemm_tiled(args);
  }
  const void* alpha = device_alpha ? static_cast<const void*>(scalars) : &kOne;
  const void* beta = device_alpha ? static_cast<const void*>(scalars + 1) : &kZero;
  if ((st = cublas_check(api().Matmul(handle, desc.op, alpha, b_ptr, desc.a, a_ptr, desc.b,
                                      beta, d_ptr, desc.c, d_ptr, desc.c, &heuristic.algo, base + layout.cublas,
                                      static_cast<size_t>(layout.cublas_bytes), static_cast<cudaStream_t>(stream)),
                         "cublasLtMatmul"))) {
    return st;
  }
  const bool epilogue_kernel = plan.epilogue == kTweGemmEpilogueBiasAdd || staged;
  return epilogue_kernel ? launch_gemm_epilogue(args, static_cast<const float*>(d_ptr)) : kTweSuccess;
}

}  // namespace cuda
}  // namespace twe
