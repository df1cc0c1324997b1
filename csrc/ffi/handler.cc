#include "ffi/handler.h"

#include <algorithm>
#include <climits>

namespace twe {
namespace ffi_bind {

bool to_twe_dtype(ffi::DataType dt, TweDType* out) {
  switch (dt) {
    case ffi::DataType::F32: *out = kTweFloat32; return true;
    case ffi::DataType::BF16: *out = kTweBFloat16; return true;
    case ffi::DataType::F16: *out = kTweFloat16; return true;
    case ffi::DataType::F8E4M3FN: *out = kTweFloat8E4M3; return true;
    case ffi::DataType::F8E5M2: *out = kTweFloat8E5M2; return true;
    case ffi::DataType::U8: *out = kTweUInt8; return true;
    case ffi::DataType::S32: *out = kTweInt32; return true;
    case ffi::DataType::S64: *out = kTweInt64; return true;
    case ffi::DataType::U32: *out = kTweUInt32; return true;
    default: return false;
  }
}

bool to_view(const ffi::AnyBuffer& buffer, TweDevice device, TweTensorView* view, std::string* error) {
  TweTensorView v{};
  if (!to_twe_dtype(buffer.element_type(), &v.dtype)) {
    *error = "unsupported XLA element type " + std::to_string(static_cast<int>(buffer.element_type()));
    return false;
  }
  const auto dims = buffer.dimensions();
  if (dims.size() > TWE_MAX_DIMS) {
    *error = "rank above " + std::to_string(TWE_MAX_DIMS);
    return false;
  }
  v.ndim = static_cast<int32_t>(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) v.shape[i] = dims[i];
  v.device = device;
  v.data = buffer.untyped_data();
  // A zero-size XLA buffer may carry a null pointer: give it a non-null dummy so it counts as present.
  static char empty_marker;
  if (v.data == nullptr) v.data = &empty_marker;
  *view = v;
  return true;
}

ffi::Error run_op(ops::OpFn fn, TweDevice device, void* stream, ffi::RemainingArgs args, ffi::RemainingRets rets,
                  const ffi::Dictionary& attrs) {
  try {
    DictionaryAttrs attr_view(attrs);
    ops::OpCall call{{}, {}, &attr_view, stream};
    std::string error;
    for (size_t i = 0; i < args.size(); ++i) {
      auto buffer = args.get<ffi::AnyBuffer>(i);
      if (buffer.has_error()) return buffer.error();
      TweTensorView v;
      if (!to_view(*buffer, device, &v, &error)) return ffi::Error::InvalidArgument("operand " + std::to_string(i) + ": " + error);
      call.inputs.push_back(v);
    }
    for (size_t i = 0; i < rets.size(); ++i) {
      auto buffer = rets.get<ffi::AnyBuffer>(i);
      if (buffer.has_error()) return buffer.error();
      TweTensorView v;
      if (!to_view(**buffer, device, &v, &error)) return ffi::Error::InvalidArgument("result " + std::to_string(i) + ": " + error);
      call.outputs.push_back(v);
    }
    const TweStatus status = fn(call);
    if (status == kTweSuccess) return ffi::Error::Success();
    const ffi::ErrorCode code = status == kTweInvalidArgument ? ffi::ErrorCode::kInvalidArgument
                                                              : ffi::ErrorCode::kInternal;
    return ffi::Error(code, std::string("twinengine: ") + twe_last_error());
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("twinengine: ") + e.what());
  }
}

void schedule_on_xla_pool(void* pool, void (*task)(void*), void* arg) {
  static_cast<ffi::ThreadPool*>(pool)->Schedule([task, arg] { task(arg); });
}

ffi::Error run_cpu_op(ops::OpFn fn, ffi::ThreadPool pool, ffi::RemainingArgs args, ffi::RemainingRets rets,
                      const ffi::Dictionary& attrs) {
  const int64_t threads = pool.num_threads();  // 0 when XLA runs without an intra-op pool
  TweCpuExecutor executor{static_cast<int32_t>(std::min<int64_t>(threads, INT32_MAX)), &schedule_on_xla_pool, &pool};
  return run_op(fn, kTweCPU, threads > 0 ? &executor : nullptr, args, rets, attrs);
}

}  // namespace ffi_bind
}  // namespace twe
