// Host-side GEMM helpers for Python: the dispatcher (twe_gemm_plan), which the frontends use to
// size the CUDA workspace and the tests use to check the table, and the loaded cuBLASLt version.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>

#include "twinengine/gemm.h"

namespace nb = nanobind;

namespace twe {
namespace nb_bind {
namespace {

int64_t get(const nb::dict& d, const char* key, int64_t fallback) {
  return d.contains(key) ? nb::cast<int64_t>(d[key]) : fallback;
}

int64_t require(const nb::dict& d, const char* key) {
  if (!d.contains(key)) throw nb::value_error((std::string("gemm_plan: missing '") + key + "'").c_str());
  return nb::cast<int64_t>(d[key]);
}

nb::dict gemm_plan(const nb::dict& q) {
  TweGemmPlanQuery query{};
  query.scaling = static_cast<TweGemmScaling>(require(q, "scaling"));
  query.a_dtype = static_cast<TweDType>(require(q, "a_dtype"));
  query.b_dtype = static_cast<TweDType>(require(q, "b_dtype"));
  query.out_dtype = static_cast<TweDType>(require(q, "out_dtype"));
  query.has_bias = static_cast<int32_t>(get(q, "has_bias", 0));
  query.bias_dtype = static_cast<TweDType>(get(q, "bias_dtype", 0));
  query.a_k_major = static_cast<int32_t>(get(q, "a_k_major", 1));
  query.b_k_major = static_cast<int32_t>(get(q, "b_k_major", 1));
  query.a_block_2d = static_cast<int32_t>(get(q, "a_block_2d", 0));
  query.b_block_2d = static_cast<int32_t>(get(q, "b_block_2d", 0));
  query.m = require(q, "m");
  query.n = require(q, "n");
  query.k = require(q, "k");
  query.a_scale_bytes = get(q, "a_scale_bytes", 0);
  query.b_scale_bytes = get(q, "b_scale_bytes", 0);
  query.device = static_cast<TweDevice>(require(q, "device"));
  query.sm = static_cast<int32_t>(get(q, "sm", 0));
  query.cublaslt_version = static_cast<int32_t>(get(q, "cublaslt_version", 0));
  TweGemmPlan plan{};
  const TweStatus status = twe_gemm_plan(&query, &plan);
  const std::string message = std::string("twinengine.gemm: ") + twe_last_error();
  if (status == kTweInvalidArgument) throw nb::value_error(message.c_str());
  if (status != kTweSuccess) throw std::runtime_error(message);
  nb::dict out;
  out["path"] = static_cast<int>(plan.path);
  out["cublas_transa"] = plan.cublas_transa;
  out["cublas_transb"] = plan.cublas_transb;
  out["a_scale_mode"] = plan.a_scale_mode;
  out["b_scale_mode"] = plan.b_scale_mode;
  out["a_staging"] = static_cast<int>(plan.a_staging);
  out["b_staging"] = static_cast<int>(plan.b_staging);
  out["a_compute_dtype"] = static_cast<int>(plan.a_compute_dtype);
  out["b_compute_dtype"] = static_cast<int>(plan.b_compute_dtype);
  out["epilogue"] = static_cast<int>(plan.epilogue);
  out["workspace_bytes"] = plan.workspace_bytes;
  out["reason"] = std::string(plan.reason);
  return out;
}

}  // namespace

void bind_gemm(nb::module_& m) {
  m.def("gemm_plan", &gemm_plan, nb::arg("query"),
        "The GEMM dispatcher (twe_gemm_plan) on a dict of TweGemmPlanQuery fields; returns the plan as a dict.");
  m.def("gemm_cublaslt_version", []() { return twe_gemm_cublaslt_version(); },
        "cublasLtGetVersion() of the cuBLASLt the CUDA path loads; 0 when none loads or CUDA is not built.");
}

}  // namespace nb_bind
}  // namespace twe
