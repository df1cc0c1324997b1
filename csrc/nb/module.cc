// The Python extension twinengine._C: the nanobind binding the torch frontend calls with data
// pointers and a stream (it never builds against PyTorch), and the table of XLA FFI handlers
// the JAX frontend registers.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>
#include <unordered_map>
#include <variant>

#include "ops/registry.h"

namespace nb = nanobind;

namespace twe {
namespace nb_bind {
namespace {

class DictAttrs final : public ops::Attrs {
 public:
  bool find_int(const char* name, int64_t* value) const override {
    auto it = values_.find(name);
    if (it == values_.end() || !std::holds_alternative<int64_t>(it->second)) return false;
    *value = std::get<int64_t>(it->second);
    return true;
  }
  bool find_float(const char* name, float* value) const override {
    auto it = values_.find(name);
    if (it == values_.end() || !std::holds_alternative<float>(it->second)) return false;
    *value = std::get<float>(it->second);
    return true;
  }
  std::unordered_map<std::string, std::variant<int64_t, float>> values_;
};

/*! A view from the Python tuple (data_ptr, dtype_code, device_code, shape). */
TweTensorView to_view(nb::handle obj) {
  nb::tuple t = nb::cast<nb::tuple>(obj);
  if (t.size() != 4) throw nb::value_error("a tensor view is (data_ptr, dtype, device, shape)");
  TweTensorView v{};
  v.data = reinterpret_cast<void*>(nb::cast<uintptr_t>(t[0]));
  v.dtype = static_cast<TweDType>(nb::cast<int>(t[1]));
  v.device = static_cast<TweDevice>(nb::cast<int>(t[2]));
  nb::tuple shape = nb::cast<nb::tuple>(t[3]);
  if (shape.size() > TWE_MAX_DIMS) throw nb::value_error("tensor rank above 8");
  v.ndim = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) v.shape[i] = nb::cast<int64_t>(shape[i]);
  // An empty tensor may carry a null pointer: give it a non-null dummy so it counts as present
  // (as the XLA FFI binding does).
  static char empty_marker;
  int64_t numel = 1;
  for (int32_t i = 0; i < v.ndim; ++i) numel *= v.shape[i];
  if (v.data == nullptr && numel == 0) v.data = &empty_marker;
  return v;
}

void fill_attrs(nb::dict attrs, DictAttrs* out) {
  for (auto item : attrs) {
    const std::string key = nb::cast<std::string>(item.first);
    if (nb::isinstance<nb::float_>(item.second)) out->values_[key] = static_cast<float>(nb::cast<double>(item.second));
    else out->values_[key] = nb::cast<int64_t>(item.second);
  }
}

/*! Runs `op` on the views. On CUDA `stream` is the cudaStream_t; on CPU (stream 0)
 *  `cpu_threads` > 0 is the thread count the kernels may use (torch.get_num_threads()), passed
 *  to the C ABI as its TweCpuExecutor stream; 0 keeps the library default. */
void run(const ops::OpEntry* op, const ops::Attrs& attrs, nb::list inputs, nb::list outputs, uintptr_t stream,
         int cpu_threads) {
  const std::string name = op->name;
  TweCpuExecutor executor{cpu_threads, nullptr, nullptr};
  void* call_stream = reinterpret_cast<void*>(stream);
  if (stream == 0 && cpu_threads > 0) call_stream = &executor;
  ops::OpCall op_call{{}, {}, &attrs, call_stream};
  op_call.inputs.reserve(inputs.size());
  op_call.outputs.reserve(outputs.size());
  for (auto t : inputs) op_call.inputs.push_back(to_view(t));
  for (auto t : outputs) op_call.outputs.push_back(to_view(t));
  TweStatus status;
  std::string op_error;
  {
    nb::gil_scoped_release release;
    try {
      status = op->fn(op_call);
    } catch (const ops::OpError& e) {
      status = kTweInternalError;
      op_error = e.what();
    }
  }
  if (!op_error.empty()) throw std::runtime_error("twinengine." + name + ": " + op_error);
  if (status == kTweInvalidArgument) throw nb::value_error(("twinengine." + name + ": " + twe_last_error()).c_str());
  if (status != kTweSuccess) throw std::runtime_error("twinengine." + name + ": " + twe_last_error());
}

const ops::OpEntry* lookup(const std::string& name) {
  const ops::OpEntry* op = ops::find_op(name);
  if (!op) throw nb::value_error(("unknown twinengine op '" + name + "'").c_str());
  return op;
}

void call(const std::string& name, nb::list inputs, nb::list outputs, nb::dict attrs, uintptr_t stream,
          int cpu_threads) {
  const ops::OpEntry* op = lookup(name);
  DictAttrs attr_view;
  fill_attrs(attrs, &attr_view);
  run(op, attr_view, inputs, outputs, stream, cpu_threads);
}

/*! An op with its attributes parsed once: frontends keep one per planned call, so an eager
 *  call only passes its tensor views. */
struct PreparedOp {
  const ops::OpEntry* op;
  DictAttrs attrs;
};

PreparedOp* prepare(const std::string& name, nb::dict attrs) {
  auto* p = new PreparedOp{lookup(name), {}};
  fill_attrs(attrs, &p->attrs);
  return p;
}

nb::dict ffi_targets() {
  nb::dict targets;
  for (const ops::OpEntry& e : ops::op_table()) {
    nb::dict platforms;
    platforms["cpu"] = nb::capsule(e.ffi_cpu);
    if (e.ffi_cuda) platforms["CUDA"] = nb::capsule(e.ffi_cuda);
    targets[("twinengine_" + std::string(e.name)).c_str()] = platforms;
  }
  return targets;
}

}  // namespace

void bind_gemm(nb::module_& m);  // csrc/nb/gemm.cc

}  // namespace nb_bind
}  // namespace twe

NB_MODULE(_C, m) {
  m.doc() = "twinengine kernels: generic op calls for torch, XLA FFI handlers for JAX";
  // PreparedOps live in core's plan cache until the interpreter exits: not leaks.
  nb::set_leak_warnings(false);
  m.def("call", &twe::nb_bind::call, nb::arg("name"), nb::arg("inputs"), nb::arg("outputs"), nb::arg("attrs"),
        nb::arg("stream") = 0, nb::arg("cpu_threads") = 0,
        "Runs op `name` on tensor views (data_ptr, dtype, device, shape) on the CUDA `stream`, or on CPU\n"
        "with up to `cpu_threads` threads (0: the default); raises ValueError on bad input.");
  m.def("cpu_default_threads", []() { return twe_cpu_default_threads(); },
        "Threads CPU kernels use when the caller names none: the CPUs this process may run on.");
  nb::class_<twe::nb_bind::PreparedOp>(m, "PreparedOp")
      .def("__call__",
           [](const twe::nb_bind::PreparedOp& p, nb::list inputs, nb::list outputs, uintptr_t stream, int cpu_threads) {
             twe::nb_bind::run(p.op, p.attrs, inputs, outputs, stream, cpu_threads);
           },
           nb::arg("inputs"), nb::arg("outputs"), nb::arg("stream") = 0, nb::arg("cpu_threads") = 0,
           "As call(name, inputs, outputs, attrs, stream, cpu_threads) with the prepared name and attrs.");
  m.def("prepare", &twe::nb_bind::prepare, nb::arg("name"), nb::arg("attrs"), nb::rv_policy::take_ownership,
        "Op `name` with `attrs` parsed once: a PreparedOp callable as (inputs, outputs, stream, cpu_threads).");
  m.def("ffi_targets", &twe::nb_bind::ffi_targets, "{'twinengine_<op>': {'cpu': capsule, 'CUDA': capsule}}");
  m.def("has_cuda", []() { return twe_has_cuda() != 0; });
  twe::nb_bind::bind_gemm(m);
  m.def("ops", []() {
    nb::list names;
    for (const auto& e : twe::ops::op_table()) names.append(e.name);
    return names;
  });
}
