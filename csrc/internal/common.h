// Internal helpers shared by the ABI layer and the kernels (not part of the public ABI).
#ifndef TWINENGINE_INTERNAL_COMMON_H_
#define TWINENGINE_INTERNAL_COMMON_H_

#include <cstdint>
#include <exception>
#include <string>

#include "twinengine/common.h"
#include "twinengine/numerics.h"

namespace twe {

/*! Records `message` as this thread's last error and returns `status`. */
TweStatus fail(TweStatus status, const std::string& message);

/*! Clears this thread's last error and returns kTweSuccess. */
TweStatus succeed();

inline bool present(const TweTensorView* v) { return v != nullptr && v->data != nullptr; }

inline int64_t numel(const TweTensorView& v) {
  int64_t n = 1;
  for (int32_t i = 0; i < v.ndim; ++i) n *= v.shape[i];
  return n;
}

/*! Columns K of the view flattened to 2-D (R, K). */
inline int64_t cols(const TweTensorView& v) { return v.ndim == 0 ? 1 : v.shape[v.ndim - 1]; }

/*! Rows R of the view flattened to 2-D (R, K): the product of all but the last dimension
 *  (so an (R, 0) view still has R rows). */
inline int64_t rows(const TweTensorView& v) {
  int64_t r = 1;
  for (int32_t i = 0; i + 1 < v.ndim; ++i) r *= v.shape[i];
  return r;
}

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
inline int64_t ceil_div(int64_t x, int64_t m) { return (x + m - 1) / m; }

const char* dtype_name(TweDType dtype);
std::string shape_string(const TweTensorView& v);

/*! Checks one view: present, expected dtype, expected 2-D shape (rows, cols) after flattening
 *  (or exact numel when rows < 0), same device. Returns kTweSuccess or records an error. */
TweStatus check_view(const TweTensorView* v, const char* name, TweDType dtype, int64_t expect_rows,
                     int64_t expect_cols, TweDevice device);

/*! check_view, except that a view of zero elements may have data == NULL (frameworks give empty
 *  tensors no storage). */
TweStatus check_view_allow_empty(const TweTensorView* v, const char* name, TweDType dtype, int64_t expect_rows,
                                 int64_t expect_cols, TweDevice device);

/*! Bytes of one element of dtype d. */
inline int64_t element_size(TweDType d) {
  switch (d) {
    case kTweFloat32: case kTweInt32: case kTweUInt32: return 4;
    case kTweBFloat16: case kTweFloat16: return 2;
    case kTweInt64: return 8;
    default: return 1;
  }
}

/*! A 2-D (rows, cols) view of the elements starting `offset` elements into v (a block of a
 *  grouped tensor). */
inline TweTensorView view_2d(const TweTensorView& v, int64_t offset, int64_t rows, int64_t cols) {
  TweTensorView s = v;
  s.data = static_cast<char*>(v.data) + offset * element_size(v.dtype);
  s.ndim = 2;
  s.shape[0] = rows;
  s.shape[1] = cols;
  return s;
}

/*! The values of a GroupedLinear's m_splits read on the host (int32 (G,), a CPU view): every
 *  size >= 0 and Σ = rows — x is the concatenation of the G blocks. The sentences of
 *  core/ops/gemm.py check_m_split_values, for splits Python could not inspect (traced). */
inline TweStatus check_m_split_values(const TweTensorView& m_splits, int64_t rows) {
  const int32_t* splits = static_cast<const int32_t*>(m_splits.data);
  std::string list = "[";
  int64_t sum = 0;
  bool negative = false;
  for (int64_t g = 0; g < m_splits.shape[0]; ++g) {
    list += (g ? ", " : "") + std::to_string(splits[g]);
    negative = negative || splits[g] < 0;
    sum += splits[g];
  }
  if (negative) return fail(kTweInvalidArgument, "m_splits must be >= 0, got " + list + "]");
  if (sum != rows) {
    return fail(kTweInvalidArgument, "m_splits must sum to the " + std::to_string(rows) + " rows of the input, got sum " +
                                         std::to_string(sum));
  }
  return kTweSuccess;
}

/*! Makes `stream` (a `const TweCpuExecutor*`, or NULL for the default) the executor of the CPU
 *  kernels this thread runs until the scope ends (csrc/internal/cpu.h parallel_for reads it). */
class CpuStreamScope {
 public:
  explicit CpuStreamScope(void* stream);
  ~CpuStreamScope();
  CpuStreamScope(const CpuStreamScope&) = delete;
  CpuStreamScope& operator=(const CpuStreamScope&) = delete;

 private:
  const TweCpuExecutor* saved_;
};

/*! Runs cpu_fn(args) for CPU views, else cuda_fn(args) (kTweUnsupported without CUDA kernels). */
template <typename Args, typename CpuFn, typename CudaFn>
TweStatus run_on_device(TweDevice device, const Args& args, CpuFn cpu_fn, CudaFn cuda_fn) {
  // Nothing may throw across the C ABI: allocation or thread-start failures inside a kernel
  // become a status with a message.
  try {
    if (device == kTweCPU) {
      CpuStreamScope scope(args.stream);
      return cpu_fn(args);
    }
#ifdef TWE_WITH_CUDA
    return cuda_fn(args);
#else
    (void)cuda_fn;
    return fail(kTweUnsupported, "twinengine was built without CUDA kernels; CUDA tensors are not supported");
#endif
  } catch (const std::exception& e) {
    return fail(kTweInternalError, std::string("kernel failed: ") + e.what());
  }
}

/*! The (cpu, cuda) kernel pair of run_on_device for kernel `name`. */
#ifdef TWE_WITH_CUDA
#define TWE_DEVICE_FNS(name) cpu::name, cuda::name
#else
#define TWE_DEVICE_FNS(name) cpu::name, nullptr
#endif

/*! Whether a dtype is a supported high-precision element type (fp32, bf16, fp16). */
inline bool is_high_precision(TweDType d) { return d == kTweFloat32 || d == kTweBFloat16 || d == kTweFloat16; }

// Element access for high-precision tensors.
struct BFloat16 { uint16_t bits; };
struct Float16 { uint16_t bits; };

TWE_HOST_DEVICE float to_float(float v) { return v; }
TWE_HOST_DEVICE float to_float(BFloat16 v) { return numerics::bf16_to_float(v.bits); }
TWE_HOST_DEVICE float to_float(Float16 v) { return numerics::fp16_to_float(v.bits); }

template <typename T> struct FromFloat;
template <> struct FromFloat<float> { static TWE_HOST_DEVICE float apply(float v) { return v; } };
template <> struct FromFloat<BFloat16> {
  static TWE_HOST_DEVICE BFloat16 apply(float v) { return BFloat16{numerics::float_to_bf16(v)}; }
};
template <> struct FromFloat<Float16> {
  static TWE_HOST_DEVICE Float16 apply(float v) { return Float16{numerics::float_to_fp16(v)}; }
};

/*! Calls fn(T{}) with T the C++ element type of a high-precision dtype. */
template <typename Fn>
TweStatus dispatch_high_precision(TweDType dtype, Fn&& fn) {
  switch (dtype) {
    case kTweFloat32: return fn(float{});
    case kTweBFloat16: return fn(BFloat16{});
    case kTweFloat16: return fn(Float16{});
    default: return fail(kTweInvalidArgument, std::string("unsupported high-precision dtype ") + dtype_name(dtype));
  }
}

/*! Largest finite value of a high-precision dtype (NUMERICS.md §6 inf_value). */
inline float dtype_max(TweDType dtype) {
  switch (dtype) {
    case kTweBFloat16: return numerics::kBFloat16Max;
    case kTweFloat16: return numerics::kFloat16Max;
    default: return numerics::kFloatMax;
  }
}

}  // namespace twe

#endif  // TWINENGINE_INTERNAL_COMMON_H_
