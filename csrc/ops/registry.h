// The op table both bindings serve: an op name maps to one adapter that turns a generic call
// (input views, output views, named attributes, stream) into one C ABI call. The nanobind
// binding looks ops up by name; the XLA FFI layer defines one handler symbol per op.
#ifndef TWINENGINE_OPS_REGISTRY_H_
#define TWINENGINE_OPS_REGISTRY_H_

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "twinengine/common.h"

namespace twe {
namespace ops {

/*! A malformed generic call (missing attribute, wrong number of tensors). */
class OpError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/*! Named attributes of a call: ints are int64, floats are float32 (core/ops passes them so). */
class Attrs {
 public:
  virtual ~Attrs() = default;
  virtual bool find_int(const char* name, int64_t* value) const = 0;
  virtual bool find_float(const char* name, float* value) const = 0;

  int64_t get_int(const char* name) const {
    int64_t v;
    if (!find_int(name, &v)) throw OpError(std::string("missing int64 attribute '") + name + "'");
    return v;
  }
  float get_float(const char* name) const {
    float v;
    if (!find_float(name, &v)) throw OpError(std::string("missing float32 attribute '") + name + "'");
    return v;
  }
};

/*! One generic call. Outputs are listed in the order core/ops describes for the op. */
struct OpCall {
  std::vector<TweTensorView> inputs;
  std::vector<TweTensorView> outputs;
  const Attrs* attrs;
  void* stream;

  TweTensorView* input(size_t i) {
    if (i >= inputs.size()) throw OpError("too few inputs");
    return &inputs[i];
  }
  /*! Takes the next output in order (cursor-based, for optional outputs). */
  TweTensorView take_output() {
    if (next_output >= outputs.size()) throw OpError("too few outputs");
    return outputs[next_output++];
  }
  void expect_all_outputs_taken() const {
    if (next_output != outputs.size()) throw OpError("too many outputs");
  }
  size_t next_output = 0;
};

using OpFn = TweStatus (*)(OpCall& call);

/*! An XLA FFI handler (XLA_FFI_Handler*), kept opaque here so this header needs no XLA. */
using FfiHandler = void*;

struct OpEntry {
  const char* name;
  OpFn fn;
  FfiHandler ffi_cpu;
  FfiHandler ffi_cuda;  // nullptr when CUDA is not built
};

/*! Every registered op, in registration order. */
std::vector<OpEntry>& op_table();

/*! The op named `name`, or nullptr. */
const OpEntry* find_op(std::string_view name);

struct OpRegistrar {
  OpRegistrar(const char* name, OpFn fn, FfiHandler ffi_cpu, FfiHandler ffi_cuda) {
    op_table().push_back({name, fn, ffi_cpu, ffi_cuda});
  }
};

}  // namespace ops
}  // namespace twe

#include "ffi/handler.h"

/*! Registers `fn` as op `name`: torch calls it by name, JAX as FFI target twinengine_<name>. */
#define TWE_REGISTER_OP(name, fn)                                                             \
  static ::twe::ops::OpRegistrar twe_op_registrar_##name(#name, fn, TWE_FFI_CPU_HANDLER(fn), \
                                                         TWE_FFI_CUDA_HANDLER(fn))

#endif  // TWINENGINE_OPS_REGISTRY_H_
