// Thread-local error text and view checks shared by every ABI entry point.
#include "internal/common.h"

#include <sstream>

namespace twe {
namespace {
thread_local std::string g_last_error;
}  // namespace

TweStatus fail(TweStatus status, const std::string& message) {
  g_last_error = message;
  return status;
}

TweStatus succeed() {
  g_last_error.clear();
  return kTweSuccess;
}

const char* dtype_name(TweDType dtype) {
  switch (dtype) {
    case kTweFloat32: return "float32";
    case kTweBFloat16: return "bfloat16";
    case kTweFloat16: return "float16";
    case kTweFloat8E4M3: return "float8_e4m3fn";
    case kTweFloat8E5M2: return "float8_e5m2";
    case kTweUInt8: return "uint8";
    case kTweInt32: return "int32";
    case kTweInt64: return "int64";
    case kTweUInt32: return "uint32";
  }
  return "unknown";
}

std::string shape_string(const TweTensorView& v) {
  std::ostringstream out;
  out << "(";
  for (int32_t i = 0; i < v.ndim; ++i) out << (i ? ", " : "") << v.shape[i];
  out << (v.ndim == 1 ? ",)" : ")");
  return out.str();
}

namespace {

TweStatus check_view_impl(const TweTensorView* v, const char* name, TweDType dtype, int64_t expect_rows,
                          int64_t expect_cols, TweDevice device, bool allow_empty) {
  const bool empty_ok = allow_empty && v != nullptr && v->data == nullptr && v->ndim >= 0 &&
                        v->ndim <= TWE_MAX_DIMS && numel(*v) == 0;
  if (!present(v) && !empty_ok) return fail(kTweInvalidArgument, std::string(name) + " is missing");
  if (v->ndim < 0 || v->ndim > TWE_MAX_DIMS) return fail(kTweInvalidArgument, std::string(name) + " has a bad rank");
  if (v->dtype != dtype) {
    return fail(kTweInvalidArgument, std::string(name) + " must have dtype " + dtype_name(dtype) + ", got " +
                                         dtype_name(v->dtype));
  }
  if (v->device != device) return fail(kTweInvalidArgument, std::string(name) + " is on a different device");
  const bool shape_ok = expect_rows < 0 ? numel(*v) == expect_cols
                                        : (rows(*v) == expect_rows && cols(*v) == expect_cols);
  if (!shape_ok) {
    std::ostringstream out;
    out << name << " has shape " << shape_string(*v) << ", expected ";
    if (expect_rows < 0) out << expect_cols << " elements";
    else out << "(" << expect_rows << ", " << expect_cols << ") after flattening";
    return fail(kTweInvalidArgument, out.str());
  }
  return kTweSuccess;
}

}  // namespace

TweStatus check_view(const TweTensorView* v, const char* name, TweDType dtype, int64_t expect_rows,
                     int64_t expect_cols, TweDevice device) {
  return check_view_impl(v, name, dtype, expect_rows, expect_cols, device, false);
}

TweStatus check_view_allow_empty(const TweTensorView* v, const char* name, TweDType dtype, int64_t expect_rows,
                                 int64_t expect_cols, TweDevice device) {
  return check_view_impl(v, name, dtype, expect_rows, expect_cols, device, true);
}

}  // namespace twe

extern "C" {

const char* twe_last_error(void) { return twe::g_last_error.c_str(); }

int twe_has_cuda(void) {
#ifdef TWE_WITH_CUDA
  return 1;
#else
  return 0;
#endif
}

}  // extern "C"
