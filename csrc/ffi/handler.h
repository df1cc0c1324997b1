// XLA FFI handlers generated for every registered op: one handler symbol per op and platform,
// binding all operands (RemainingArgs), all results (RemainingRets) and all attributes
// (Dictionary). The operand, result and attribute lists of each op are documented beside its
// adapter in csrc/ops/<family>.cc and described once in core/ops/<family>.py.
#ifndef TWINENGINE_FFI_HANDLER_H_
#define TWINENGINE_FFI_HANDLER_H_

#include <exception>
#include <string>

#include "ops/registry.h"
#include "xla/ffi/api/ffi.h"

namespace twe {
namespace ffi_bind {

namespace ffi = ::xla::ffi;

bool to_twe_dtype(ffi::DataType dt, TweDType* out);

/*! Views an XLA buffer; false (with `error` set) for an unsupported dtype or rank. */
bool to_view(const ffi::AnyBuffer& buffer, TweDevice device, TweTensorView* view, std::string* error);

/*! Adapter from a Dictionary of attributes to ops::Attrs. */
class DictionaryAttrs final : public ops::Attrs {
 public:
  explicit DictionaryAttrs(const ffi::Dictionary& dict) : dict_(dict) {}
  bool find_int(const char* name, int64_t* value) const override {
    auto v = dict_.get<int64_t>(name);
    if (v.has_error()) return false;
    *value = *v;
    return true;
  }
  bool find_float(const char* name, float* value) const override {
    auto v = dict_.get<float>(name);
    if (v.has_error()) return false;
    *value = *v;
    return true;
  }

 private:
  const ffi::Dictionary& dict_;
};

/*! Runs op `fn` on XLA buffers; every failure becomes an ffi::Error carrying the message. */
ffi::Error run_op(ops::OpFn fn, TweDevice device, void* stream, ffi::RemainingArgs args, ffi::RemainingRets rets,
                  const ffi::Dictionary& attrs);

/*! TweCpuExecutor::schedule on XLA's intra-op thread pool (`pool` is an ffi::ThreadPool*). */
void schedule_on_xla_pool(void* pool, void (*task)(void*), void* arg);

/*! Runs op `fn` on CPU buffers with XLA's intra-op thread pool as the kernels' executor (the
 *  twinengine default pool when XLA provides none). */
ffi::Error run_cpu_op(ops::OpFn fn, ffi::ThreadPool pool, ffi::RemainingArgs args, ffi::RemainingRets rets,
                      const ffi::Dictionary& attrs);

template <ops::OpFn Fn>
ffi::Error cpu_impl(ffi::ThreadPool pool, ffi::RemainingArgs args, ffi::RemainingRets rets, ffi::Dictionary attrs) {
  return run_cpu_op(Fn, pool, args, rets, attrs);
}

template <ops::OpFn Fn>
XLA_FFI_Error* cpu_handler(XLA_FFI_CallFrame* frame) {
  static auto* handler = ffi::Ffi::Bind()
                             .Ctx<ffi::ThreadPool>()  // XLA's intra-op pool: the kernels' threads
                             .RemainingArgs()
                             .RemainingRets()
                             .Attrs()
                             .To(cpu_impl<Fn>)
                             .release();
  return handler->Call(frame);
}

#ifdef TWE_WITH_CUDA
template <ops::OpFn Fn>
ffi::Error cuda_impl(void* stream, ffi::RemainingArgs args, ffi::RemainingRets rets, ffi::Dictionary attrs) {
  return run_op(Fn, kTweCUDA, stream, args, rets, attrs);
}

// Ops run asynchronously on the XLA stream without host syncs: safe inside command buffers.
template <ops::OpFn Fn>
XLA_FFI_Error* cuda_handler(XLA_FFI_CallFrame* frame) {
  static auto* handler = ffi::Ffi::Bind()
                             .Ctx<ffi::PlatformStream<void*>>()
                             .RemainingArgs()
                             .RemainingRets()
                             .Attrs()
                             .To(cuda_impl<Fn>, {ffi::Traits::kCmdBufferCompatible})
                             .release();
  return handler->Call(frame);
}
#endif

}  // namespace ffi_bind
}  // namespace twe

#define TWE_FFI_CPU_HANDLER(fn) reinterpret_cast<void*>(&::twe::ffi_bind::cpu_handler<fn>)
#ifdef TWE_WITH_CUDA
#define TWE_FFI_CUDA_HANDLER(fn) reinterpret_cast<void*>(&::twe::ffi_bind::cuda_handler<fn>)
#else
#define TWE_FFI_CUDA_HANDLER(fn) nullptr
#endif

#endif  // TWINENGINE_FFI_HANDLER_H_
