// C ABI of the quantize family: argument checks, then dispatch to the CPU or CUDA kernels.
#include <string>

#include "internal/quantize.h"

namespace twe {
namespace {

TweDType fp8_dtype(TweFP8Format format) { return format == kTweE5M2 ? kTweFloat8E5M2 : kTweFloat8E4M3; }

/*! The group sizes of a grouped quantize: a non-empty 1-D int32 array. */
TweStatus check_m_splits(const TweTensorView* m_splits) {
  if (!m_splits || !m_splits->data || m_splits->dtype != kTweInt32 || m_splits->ndim != 1 || m_splits->shape[0] < 1) {
    return fail(kTweInvalidArgument, "m_splits must be a non-empty 1-D int32 array");
  }
  return kTweSuccess;
}

TweStatus check_input(const TweTensorView* input) {
  if (!present(input)) return fail(kTweInvalidArgument, "input is missing");
  if (!is_high_precision(input->dtype)) {
    return fail(kTweInvalidArgument, std::string("input must be float32, bfloat16 or float16, got ") +
                                         dtype_name(input->dtype));
  }
  if (input->ndim < 1) return fail(kTweInvalidArgument, "input must have rank >= 1");
  return kTweSuccess;
}

TweStatus check_copies_requested(const TweQuantizedTensor* out) {
  if (!present(&out->rowwise_data) && !present(&out->columnwise_data)) {
    return fail(kTweInvalidArgument, "at least one of rowwise_data and columnwise_data must be requested");
  }
  return kTweSuccess;
}

TweStatus check_per_tensor_outputs(const TweTensorView* input, TweQuantizedTensor* out, TweFP8Format format,
                                   bool needs_amax) {
  const int64_t r = rows(*input), k = cols(*input);
  const TweDevice dev = input->device;
  TweStatus st = check_copies_requested(out);
  if (st) return st;
  if (present(&out->rowwise_data)) {
    if ((st = check_view(&out->rowwise_data, "rowwise_data", fp8_dtype(format), r, k, dev))) return st;
    if ((st = check_view(&out->rowwise_scale_inv, "rowwise_scale_inv", kTweFloat32, -1, 1, dev))) return st;
  }
  if (present(&out->columnwise_data)) {
    if ((st = check_view(&out->columnwise_data, "columnwise_data", fp8_dtype(format), k, r, dev))) return st;
    if ((st = check_view(&out->columnwise_scale_inv, "columnwise_scale_inv", kTweFloat32, -1, 1, dev))) return st;
  }
  if (needs_amax || present(&out->amax)) {
    if ((st = check_view(&out->amax, "amax", kTweFloat32, -1, 1, dev))) return st;
  }
  return kTweSuccess;
}

/*! Shapes (rows, cols) of the fp32 FP8-block scale tensor of one copy (NUMERICS.md §6). */
void fp8_block_scale_shape(int64_t r, int64_t k, bool columnwise, bool two_d, int64_t* rows_out, int64_t* cols_out) {
  constexpr int64_t B = numerics::kFP8BlockSize;
  if (two_d) {
    *rows_out = columnwise ? ceil_div(k, B) : ceil_div(r, B);
    *cols_out = round_up(columnwise ? ceil_div(r, B) : ceil_div(k, B), 4);
  } else {
    *rows_out = columnwise ? ceil_div(r, B) : ceil_div(k, B);
    *cols_out = round_up(columnwise ? k : r, 4);
  }
}

TweStatus check_fp8_block_shape(int64_t r, int64_t k, const std::string& what) {
  if (r % numerics::kFP8BlockSize != 0 || k % numerics::kFP8BlockSize != 0) {
    return fail(kTweInvalidArgument, "FP8 block scaling needs R and K divisible by 128, got " + what);
  }
  return kTweSuccess;
}

TweStatus check_nvfp4_shape(int64_t r, int64_t k, const std::string& what) {
  if (r % numerics::kNVFP4BlockSize != 0 || k % numerics::kNVFP4BlockSize != 0) {
    return fail(kTweInvalidArgument, "NVFP4 needs R and K divisible by 16, got " + what);
  }
  return kTweSuccess;
}

/*! The NVFP4 data and scale views of one copy, of `rows` rows of `cols` elements. */
TweStatus check_nvfp4_copy(const TweTensorView* data, const TweTensorView* scale_inv, const char* data_name,
                           const char* scale_name, int64_t rows, int64_t cols, TweDevice dev) {
  TweStatus st = check_view(data, data_name, kTweUInt8, rows, cols / 2, dev);
  if (st) return st;
  return check_view(scale_inv, scale_name, kTweUInt8, round_up(rows, 128),
                    round_up(ceil_div(cols, numerics::kNVFP4BlockSize), 4), dev);
}

/*! The [seed, offset] state: two integers of dtype uint32, int32 or int64 on `dev`. */
TweStatus check_rng(const TweTensorView* rng, TweDevice dev) {
  if (!present(rng)) return fail(kTweInvalidArgument, "stochastic rounding needs the rng state [seed, offset]");
  if (rng->dtype != kTweUInt32 && rng->dtype != kTweInt32 && rng->dtype != kTweInt64) {
    return fail(kTweInvalidArgument, std::string("rng must have dtype uint32, int32 or int64, got ") +
                                         dtype_name(rng->dtype));
  }
  if (rng->ndim != 1 || rng->shape[0] != 2) {
    return fail(kTweInvalidArgument, "rng must have shape (2,) ([seed, offset]), got " + shape_string(*rng));
  }
  if (rng->device != dev) return fail(kTweInvalidArgument, "rng is on a different device");
  return kTweSuccess;
}

/*! Checks shared by every dequantize entry: data and output present, output high precision and,
 *  for FP8 formats, data of an FP8 dtype. */
TweStatus check_dequantize_views(const TweTensorView* data, const TweTensorView* output, bool fp8_data) {
  if (!present(data) || !present(output)) return fail(kTweInvalidArgument, "data and output must be present");
  if (fp8_data && data->dtype != kTweFloat8E4M3 && data->dtype != kTweFloat8E5M2) {
    return fail(kTweInvalidArgument, std::string("data must be float8_e4m3fn or float8_e5m2, got ") + dtype_name(data->dtype));
  }
  if (!is_high_precision(output->dtype)) return fail(kTweInvalidArgument, "output must be float32, bfloat16 or float16");
  return kTweSuccess;
}

}  // namespace

/*! Every check of twe_quantize_fp8_current (the fused norm + quantize runs them before its kernel). */
TweStatus check_quantize_fp8_current(const TweTensorView* input, TweQuantizedTensor* output,
                                     const TweQuantizeParams* params) {
  TweStatus st = check_input(input);
  if (st) return st;
  if (!output || !params) return fail(kTweInvalidArgument, "output and params must not be NULL");
  if ((st = check_per_tensor_outputs(input, output, params->format, false))) return st;
  if (!(params->amax_epsilon >= 0.0f)) return fail(kTweInvalidArgument, "amax_epsilon must be >= 0");
  return kTweSuccess;
}

/*! Every check of twe_quantize_fp8_delayed. */
TweStatus check_quantize_fp8_delayed(const TweTensorView* input, const TweTensorView* scale,
                                     TweQuantizedTensor* output, const TweQuantizeParams* params) {
  TweStatus st = check_input(input);
  if (st) return st;
  if (!output || !params) return fail(kTweInvalidArgument, "output and params must not be NULL");
  if ((st = check_view(scale, "scale", kTweFloat32, -1, 1, input->device))) return st;
  return check_per_tensor_outputs(input, output, params->format, true);
}

/*! Every check of twe_quantize_mxfp8. */
TweStatus check_quantize_mxfp8(const TweTensorView* input, TweQuantizedTensor* output,
                               const TweQuantizeParams* params) {
  TweStatus st = check_input(input);
  if (st) return st;
  if (!output || !params) return fail(kTweInvalidArgument, "output and params must not be NULL");
  const int64_t r = rows(*input), k = cols(*input);
  if (r % 32 != 0 || k % 32 != 0) {
    return fail(kTweInvalidArgument, "MXFP8 needs R and K to be multiples of 32, got input " + shape_string(*input));
  }
  const TweDevice dev = input->device;
  const TweDType dt = fp8_dtype(params->format);
  if ((st = check_copies_requested(output))) return st;
  if (present(&output->rowwise_data)) {
    if ((st = check_view(&output->rowwise_data, "rowwise_data", dt, r, k, dev))) return st;
    if ((st = check_view(&output->rowwise_scale_inv, "rowwise_scale_inv", kTweUInt8, round_up(r, 128),
                         round_up(k / 32, 4), dev)))
      return st;
  }
  if (present(&output->columnwise_data)) {
    if ((st = check_view(&output->columnwise_data, "columnwise_data", dt, r, k, dev))) return st;
    if ((st = check_view(&output->columnwise_scale_inv, "columnwise_scale_inv", kTweUInt8, round_up(r / 32, 4),
                         round_up(k, 128), dev)))
      return st;
  }
  return kTweSuccess;
}

}  // namespace twe

using namespace twe;

extern "C" {

TweStatus twe_quantize_fp8_current(const TweTensorView* input, TweQuantizedTensor* output,
                                   const TweQuantizeParams* params, void* stream) {
  TweStatus st = check_quantize_fp8_current(input, output, params);
  if (st) return st;
  QuantizeArgs args{input, nullptr, nullptr, output, *params, rows(*input), cols(*input), stream};
  st = run_on_device(input->device, args, TWE_DEVICE_FNS(quantize_fp8_current));
  return st ? st : succeed();
}

TweStatus twe_grouped_quantize_fp8_current(const TweTensorView* input, const TweTensorView* m_splits,
                                           TweQuantizedTensor* output, const TweQuantizeParams* params, void* stream) {
  TweStatus st = check_input(input);
  if (st) return st;
  if (!output || !params) return fail(kTweInvalidArgument, "output and params must not be NULL");
  if (input->device != kTweCPU) {
    return fail(kTweInvalidArgument, "grouped FP8 quantization runs on the CPU only (its block sizes are read on the "
                                     "host)");
  }
  if ((st = check_m_splits(m_splits))) return st;
  if ((st = check_m_split_values(*m_splits, rows(*input)))) return st;
  if (!(params->amax_epsilon >= 0.0f)) return fail(kTweInvalidArgument, "amax_epsilon must be >= 0");
  const int64_t r = rows(*input), k = cols(*input), groups = m_splits->shape[0];
  const TweDType dt = fp8_dtype(params->format);
  if ((st = check_view(&output->rowwise_data, "rowwise_data", dt, r, k, kTweCPU))) return st;
  if ((st = check_view(&output->columnwise_data, "columnwise_data", dt, -1, r * k, kTweCPU))) return st;
  for (const TweTensorView* v : {&output->rowwise_scale_inv, &output->columnwise_scale_inv, &output->amax}) {
    if ((st = check_view(v, "scale_inv / amax", kTweFloat32, -1, groups, kTweCPU))) return st;
  }
  QuantizeArgs args{input, nullptr, nullptr, output, *params, r, k, stream};
  try {
    st = cpu::grouped_quantize_fp8_current(args, *m_splits);
  } catch (const std::exception& e) {
    return fail(kTweInternalError, e.what());
  }
  return st ? st : succeed();
}

TweStatus twe_grouped_quantize_fp8_delayed(const TweTensorView* input, const TweTensorView* m_splits,
                                           const TweTensorView* scale, TweQuantizedTensor* output,
                                           const TweQuantizeParams* params, void* stream) {
  TweStatus st = check_input(input);
  if (st) return st;
  if (!output || !params) return fail(kTweInvalidArgument, "output and params must not be NULL");
  if (input->device != kTweCPU) {
    return fail(kTweInvalidArgument, "grouped FP8 quantization runs on the CPU only (its block sizes are read on the "
                                     "host)");
  }
  if ((st = check_m_splits(m_splits))) return st;
  if ((st = check_m_split_values(*m_splits, rows(*input)))) return st;
  const int64_t r = rows(*input), k = cols(*input), groups = m_splits->shape[0];
  if ((st = check_view(scale, "scale", kTweFloat32, -1, groups, kTweCPU))) return st;
  const TweDType dt = fp8_dtype(params->format);
  if ((st = check_view(&output->rowwise_data, "rowwise_data", dt, r, k, kTweCPU))) return st;
  if ((st = check_view(&output->columnwise_data, "columnwise_data", dt, -1, r * k, kTweCPU))) return st;
  for (const TweTensorView* v : {&output->rowwise_scale_inv, &output->columnwise_scale_inv, &output->amax}) {
    if ((st = check_view(v, "scale_inv / amax", kTweFloat32, -1, groups, kTweCPU))) return st;
  }
  QuantizeArgs args{input, scale, nullptr, output, *params, r, k, stream};
  try {
    st = cpu::grouped_quantize_fp8_delayed(args, *m_splits);
  } catch (const std::exception& e) {
    return fail(kTweInternalError, e.what());
  }
  return st ? st : succeed();
}

TweStatus twe_grouped_quantize_fp8_block(const TweTensorView* input, const TweTensorView* m_splits,
                                         TweQuantizedTensor* output, const TweQuantizeParams* params, void* stream) {
  TweStatus st = check_input(input);
  if (st) return st;
  if (!output || !params) return fail(kTweInvalidArgument, "output and params must not be NULL");
  if (input->device != kTweCPU) {
    return fail(kTweInvalidArgument, "grouped FP8 block quantization runs on the CPU only (its block sizes are read on "
                                     "the host)");
  }
  if ((st = check_m_splits(m_splits))) return st;
  if ((st = check_m_split_values(*m_splits, rows(*input)))) return st;
  if (!(params->amax_epsilon >= 0.0f)) return fail(kTweInvalidArgument, "amax_epsilon must be >= 0");
  const int64_t r = rows(*input), k = cols(*input);
  if (k % numerics::kFP8BlockSize != 0) {
    return fail(kTweInvalidArgument, "FP8 block scaling needs K to be a multiple of 128, got " + shape_string(*input));
  }
  const TweDType dt = fp8_dtype(params->format);
  if ((st = check_view(&output->rowwise_data, "rowwise_data", dt, r, k, kTweCPU))) return st;
  if ((st = check_view(&output->columnwise_data, "columnwise_data", dt, -1, r * k, kTweCPU))) return st;
  for (const TweTensorView* v : {&output->rowwise_scale_inv, &output->columnwise_scale_inv}) {
    if ((st = check_view(v, "scale_inv", kTweFloat32, -1, numel(*v), kTweCPU))) return st;
  }
  QuantizeArgs args{input, nullptr, nullptr, output, *params, r, k, stream};
  try {
    st = cpu::grouped_quantize_fp8_block(args, *m_splits);
  } catch (const std::exception& e) {
    return fail(kTweInternalError, e.what());
  }
  return st ? st : succeed();
}

TweStatus twe_grouped_quantize_mxfp8(const TweTensorView* input, const TweTensorView* m_splits,
                                     TweQuantizedTensor* output, const TweQuantizeParams* params, void* stream) {
  TweStatus st = check_input(input);
  if (st) return st;
  if (!output || !params) return fail(kTweInvalidArgument, "output and params must not be NULL");
  if (input->device != kTweCPU) {
    return fail(kTweInvalidArgument, "grouped MXFP8 quantization runs on the CPU only (its block sizes are read on the "
                                     "host)");
  }
  if ((st = check_m_splits(m_splits))) return st;
  if ((st = check_m_split_values(*m_splits, rows(*input)))) return st;
  const int64_t r = rows(*input), k = cols(*input);
  if (k % 32 != 0) return fail(kTweInvalidArgument, "MXFP8 needs K to be a multiple of 32, got " + shape_string(*input));
  const TweDType dt = fp8_dtype(params->format);
  if ((st = check_view(&output->rowwise_data, "rowwise_data", dt, r, k, kTweCPU))) return st;
  if ((st = check_view(&output->columnwise_data, "columnwise_data", dt, r, k, kTweCPU))) return st;
  if ((st = check_view(&output->rowwise_scale_inv, "rowwise_scale_inv", kTweUInt8, rows(output->rowwise_scale_inv),
                       round_up(k / 32, 4), kTweCPU)))
    return st;
  if ((st = check_view(&output->columnwise_scale_inv, "columnwise_scale_inv", kTweUInt8,
                       rows(output->columnwise_scale_inv), round_up(k, 128), kTweCPU)))
    return st;
  QuantizeArgs args{input, nullptr, nullptr, output, *params, r, k, stream};
  try {
    st = cpu::grouped_quantize_mxfp8(args, *m_splits);
  } catch (const std::exception& e) {
    return fail(kTweInternalError, e.what());
  }
  return st ? st : succeed();
}

TweStatus twe_grouped_quantize_nvfp4(const TweTensorView* input, const TweTensorView* m_splits,
                                     const TweTensorView* rng, TweQuantizedTensor* output,
                                     const TweQuantizeParams* params, void* stream) {
  TweStatus st = check_input(input);
  if (st) return st;
  if (!output || !params) return fail(kTweInvalidArgument, "output and params must not be NULL");
  if (input->device != kTweCPU) {
    return fail(kTweInvalidArgument, "grouped NVFP4 quantization runs on the CPU only (its block sizes are read on the "
                                     "host)");
  }
  if ((st = check_m_splits(m_splits))) return st;
  if ((st = check_m_split_values(*m_splits, rows(*input)))) return st;
  const int64_t r = rows(*input), k = cols(*input);
  if (k % numerics::kNVFP4BlockSize != 0) {
    return fail(kTweInvalidArgument, "NVFP4 needs K to be a multiple of 16, got " + shape_string(*input));
  }
  const int64_t groups = m_splits->shape[0];
  if ((st = check_view(&output->rowwise_data, "rowwise_data", kTweUInt8, r, k / 2, kTweCPU))) return st;
  if ((st = check_view(&output->columnwise_data, "columnwise_data", kTweUInt8, -1, r * k / 2, kTweCPU))) return st;
  for (const TweTensorView* v : {&output->rowwise_scale_inv, &output->columnwise_scale_inv}) {
    if ((st = check_view(v, "scale_inv", kTweUInt8, -1, numel(*v), kTweCPU))) return st;
  }
  if ((st = check_view(&output->amax, "amax", kTweFloat32, -1, groups, kTweCPU))) return st;
  if ((st = check_view(&output->columnwise_amax, "columnwise_amax", kTweFloat32, -1, groups, kTweCPU))) return st;
  if (params->with_rht && input->dtype != kTweBFloat16) {
    return fail(kTweInvalidArgument, std::string("the RHT of the columnwise copy needs bfloat16 input, got ") +
                                         dtype_name(input->dtype));
  }
  if (params->stochastic_rounding) {
    if ((st = check_rng(rng, kTweCPU))) return st;
  } else if (present(rng)) {
    return fail(kTweInvalidArgument, "rng is only used with stochastic_rounding");
  }
  QuantizeArgs args{input, nullptr, rng, output, *params, r, k, stream};
  try {
    st = cpu::grouped_quantize_nvfp4(args, *m_splits);
  } catch (const std::exception& e) {
    return fail(kTweInternalError, e.what());
  }
  return st ? st : succeed();
}

TweStatus twe_quantize_fp8_delayed(const TweTensorView* input, const TweTensorView* scale,
                                   TweQuantizedTensor* output, const TweQuantizeParams* params,
                                   void* stream) {
  TweStatus st = check_quantize_fp8_delayed(input, scale, output, params);
  if (st) return st;
  QuantizeArgs args{input, scale, nullptr, output, *params, rows(*input), cols(*input), stream};
  st = run_on_device(input->device, args, TWE_DEVICE_FNS(quantize_fp8_delayed));
  return st ? st : succeed();
}

TweStatus twe_quantize_mxfp8(const TweTensorView* input, TweQuantizedTensor* output,
                             const TweQuantizeParams* params, void* stream) {
  TweStatus st = check_quantize_mxfp8(input, output, params);
  if (st) return st;
  const int64_t r = rows(*input), k = cols(*input);
  const TweDevice dev = input->device;
  QuantizeArgs args{input, nullptr, nullptr, output, *params, r, k, stream};
  st = run_on_device(dev, args, TWE_DEVICE_FNS(quantize_mxfp8));
  return st ? st : succeed();
}

TweStatus twe_dequantize_fp8(const TweTensorView* data, const TweTensorView* scale_inv, TweTensorView* output,
                             int32_t columnwise, void* stream) {
  if (TweStatus st = check_dequantize_views(data, output, true)) return st;
  const int64_t r = rows(*output), k = cols(*output);
  TweStatus st = columnwise ? check_view(data, "data", data->dtype, k, r, output->device)
                            : check_view(data, "data", data->dtype, r, k, output->device);
  if (st) return st;
  if ((st = check_view(scale_inv, "scale_inv", kTweFloat32, -1, 1, output->device))) return st;
  DequantizeArgs args{data, scale_inv, nullptr, output, columnwise != 0, false, r, k, stream};
  st = run_on_device(output->device, args, TWE_DEVICE_FNS(dequantize_fp8));
  return st ? st : succeed();
}

TweStatus twe_dequantize_mxfp8(const TweTensorView* data, const TweTensorView* scale_inv, TweTensorView* output,
                               int32_t columnwise, void* stream) {
  if (TweStatus st = check_dequantize_views(data, output, true)) return st;
  const int64_t r = rows(*output), k = cols(*output);
  // Rowwise blocks lie along K only: a rowwise copy with any R (e.g. permuted rows) dequantizes.
  if (k % 32 != 0 || (columnwise && r % 32 != 0)) {
    return fail(kTweInvalidArgument, "MXFP8 needs K (and R for the columnwise copy) to be multiples of 32");
  }
  TweStatus st = check_view(data, "data", data->dtype, r, k, output->device);
  if (st) return st;
  st = columnwise ? check_view(scale_inv, "scale_inv", kTweUInt8, round_up(r / 32, 4), round_up(k, 128), output->device)
                  : check_view(scale_inv, "scale_inv", kTweUInt8, round_up(r, 128), round_up(k / 32, 4), output->device);
  if (st) return st;
  DequantizeArgs args{data, scale_inv, nullptr, output, columnwise != 0, false, r, k, stream};
  st = run_on_device(output->device, args, TWE_DEVICE_FNS(dequantize_mxfp8));
  return st ? st : succeed();
}

TweStatus twe_quantize_fp8_block(const TweTensorView* input, TweQuantizedTensor* output,
                                 const TweQuantizeParams* params, void* stream) {
  TweStatus st = check_input(input);
  if (st) return st;
  if (!output || !params) return fail(kTweInvalidArgument, "output and params must not be NULL");
  const int64_t r = rows(*input), k = cols(*input);
  if ((st = check_fp8_block_shape(r, k, "input " + shape_string(*input)))) return st;
  if (!(params->amax_epsilon >= 0.0f)) return fail(kTweInvalidArgument, "amax_epsilon must be >= 0");
  if ((st = check_copies_requested(output))) return st;
  const TweDevice dev = input->device;
  const TweDType dt = fp8_dtype(params->format);
  const bool two_d = params->two_d != 0;
  int64_t sr, sc;
  if (present(&output->rowwise_data)) {
    if ((st = check_view(&output->rowwise_data, "rowwise_data", dt, r, k, dev))) return st;
    fp8_block_scale_shape(r, k, false, two_d, &sr, &sc);
    if ((st = check_view(&output->rowwise_scale_inv, "rowwise_scale_inv", kTweFloat32, sr, sc, dev))) return st;
  }
  if (present(&output->columnwise_data)) {
    if ((st = check_view(&output->columnwise_data, "columnwise_data", dt, k, r, dev))) return st;
    fp8_block_scale_shape(r, k, true, two_d, &sr, &sc);
    if ((st = check_view(&output->columnwise_scale_inv, "columnwise_scale_inv", kTweFloat32, sr, sc, dev))) return st;
  }
  QuantizeArgs args{input, nullptr, nullptr, output, *params, r, k, stream};
  st = run_on_device(dev, args, TWE_DEVICE_FNS(quantize_fp8_block));
  return st ? st : succeed();
}

TweStatus twe_quantize_nvfp4(const TweTensorView* input, const TweTensorView* rng, TweQuantizedTensor* output,
                             const TweQuantizeParams* params, void* stream) {
  return twe_quantize_nvfp4_with_amax(input, rng, nullptr, output, params, stream);
}

TweStatus twe_quantize_nvfp4_with_amax(const TweTensorView* input, const TweTensorView* rng,
                                       const TweTensorView* amax, TweQuantizedTensor* output,
                                       const TweQuantizeParams* params, void* stream) {
  TweStatus st = check_input(input);
  if (st) return st;
  if (!output || !params) return fail(kTweInvalidArgument, "output and params must not be NULL");
  const int64_t r = rows(*input), k = cols(*input);
  if ((st = check_nvfp4_shape(r, k, "input " + shape_string(*input)))) return st;
  if ((st = check_copies_requested(output))) return st;
  const TweDevice dev = input->device;
  if (present(&output->rowwise_data)) {
    if ((st = check_nvfp4_copy(&output->rowwise_data, &output->rowwise_scale_inv, "rowwise_data",
                               "rowwise_scale_inv", r, k, dev)))
      return st;
    if ((st = check_view(&output->amax, "amax", kTweFloat32, -1, 1, dev))) return st;
  }
  if (present(&output->columnwise_data)) {
    if ((st = check_nvfp4_copy(&output->columnwise_data, &output->columnwise_scale_inv, "columnwise_data",
                               "columnwise_scale_inv", k, r, dev)))
      return st;
    if ((st = check_view(&output->columnwise_amax, "columnwise_amax", kTweFloat32, -1, 1, dev))) return st;
    if (params->with_rht && input->dtype != kTweBFloat16) {
      return fail(kTweInvalidArgument, std::string("the RHT of the columnwise copy needs bfloat16 input, got ") +
                                           dtype_name(input->dtype));
    }
  }
  if (params->stochastic_rounding) {
    if ((st = check_rng(rng, dev))) return st;
  } else if (present(rng)) {
    return fail(kTweInvalidArgument, "rng is only used with stochastic_rounding");
  }
  if (present(amax) && (st = check_view(amax, "amax", kTweFloat32, -1, 2, dev))) return st;
  QuantizeArgs args{input, nullptr, rng, output, *params, r, k, stream, present(amax) ? amax : nullptr};
  st = run_on_device(dev, args, TWE_DEVICE_FNS(quantize_nvfp4));
  return st ? st : succeed();
}

TweStatus twe_dequantize_fp8_block(const TweTensorView* data, const TweTensorView* scale_inv, TweTensorView* output,
                                   int32_t columnwise, int32_t two_d, void* stream) {
  if (TweStatus st = check_dequantize_views(data, output, true)) return st;
  const int64_t r = rows(*output), k = cols(*output);
  // A rowwise 1D copy has blocks along K only: any R (e.g. permuted rows) dequantizes.
  TweStatus st = check_fp8_block_shape(columnwise || two_d ? r : 0, k, "output " + shape_string(*output));
  if (st) return st;
  st = columnwise ? check_view(data, "data", data->dtype, k, r, output->device)
                  : check_view(data, "data", data->dtype, r, k, output->device);
  if (st) return st;
  int64_t sr, sc;
  fp8_block_scale_shape(r, k, columnwise != 0, two_d != 0, &sr, &sc);
  if ((st = check_view(scale_inv, "scale_inv", kTweFloat32, sr, sc, output->device))) return st;
  DequantizeArgs args{data, scale_inv, nullptr, output, columnwise != 0, two_d != 0, r, k, stream};
  st = run_on_device(output->device, args, TWE_DEVICE_FNS(dequantize_fp8_block));
  return st ? st : succeed();
}

TweStatus twe_dequantize_nvfp4(const TweTensorView* data, const TweTensorView* scale_inv, const TweTensorView* amax,
                               TweTensorView* output, int32_t columnwise, void* stream) {
  if (TweStatus st = check_dequantize_views(data, output, false)) return st;
  const int64_t r = rows(*output), k = cols(*output);
  // A rowwise copy has blocks along K only: any R (e.g. permuted rows) dequantizes.
  TweStatus st = check_nvfp4_shape(columnwise ? r : 0, k, "output " + shape_string(*output));
  if (st) return st;
  st = columnwise ? check_nvfp4_copy(data, scale_inv, "data", "scale_inv", k, r, output->device)
                  : check_nvfp4_copy(data, scale_inv, "data", "scale_inv", r, k, output->device);
  if (st) return st;
  if ((st = check_view(amax, "amax", kTweFloat32, -1, 1, output->device))) return st;
  DequantizeArgs args{data, scale_inv, amax, output, columnwise != 0, false, r, k, stream};
  st = run_on_device(output->device, args, TWE_DEVICE_FNS(dequantize_nvfp4));
  return st ? st : succeed();
}

TweStatus twe_quantize(const TweTensorView* input, const TweTensorView* scale, const TweTensorView* rng,
                       TweQuantizedTensor* output, const TweQuantizeParams* params, TweScalingMode mode, void* stream) {
  const bool has_scale = present(scale), has_rng = present(rng);
  if (has_scale && mode != kTweScalingFP8Delayed) return fail(kTweInvalidArgument, "scale is only used by delayed scaling");
  if (has_rng && mode != kTweScalingNVFP4) return fail(kTweInvalidArgument, "rng is only used by NVFP4");
  switch (mode) {
    case kTweScalingFP8Current: return twe_quantize_fp8_current(input, output, params, stream);
    case kTweScalingFP8Delayed: return twe_quantize_fp8_delayed(input, scale, output, params, stream);
    case kTweScalingMXFP8: return twe_quantize_mxfp8(input, output, params, stream);
    case kTweScalingFP8Block: return twe_quantize_fp8_block(input, output, params, stream);
    case kTweScalingNVFP4: return twe_quantize_nvfp4(input, rng, output, params, stream);
  }
  return fail(kTweInvalidArgument, "unknown scaling mode");
}

TweStatus twe_quantize_update_delayed_scaling(const TweTensorView* amax_history, const TweTensorView* scale,
                                              TweTensorView* new_amax_history, TweTensorView* new_scale,
                                              const TweDelayedScalingParams* params, void* stream) {
  if (!present(amax_history) || !params) return fail(kTweInvalidArgument, "amax_history and params are required");
  if (amax_history->ndim != 1 && amax_history->ndim != 2) {
    return fail(kTweInvalidArgument, "amax_history must be (history_length,) or (history_length, slots)");
  }
  const int64_t length = amax_history->shape[0];
  const int64_t slots = amax_history->ndim == 2 ? amax_history->shape[1] : 1;
  if (length < 1) return fail(kTweInvalidArgument, "amax_history must hold at least one row");
  const TweDevice dev = amax_history->device;
  // A 1-D history (L,) is one slot: check it by element count.
  const int64_t hist_rows = amax_history->ndim == 2 ? length : -1;
  const int64_t hist_cols = amax_history->ndim == 2 ? slots : length;
  TweStatus st = check_view(amax_history, "amax_history", kTweFloat32, hist_rows, hist_cols, dev);
  if (st) return st;
  if ((st = check_view(scale, "scale", kTweFloat32, -1, slots, dev))) return st;
  if ((st = check_view(new_amax_history, "new_amax_history", kTweFloat32, hist_rows, hist_cols, dev))) return st;
  if ((st = check_view(new_scale, "new_scale", kTweFloat32, -1, slots, dev))) return st;
  if (params->algorithm != kTweAmaxMax && params->algorithm != kTweAmaxMostRecent) {
    return fail(kTweInvalidArgument, "unknown amax algorithm");
  }
  if (params->margin < 0 || params->margin > 64) return fail(kTweInvalidArgument, "margin must be in [0, 64]");
  DelayedUpdateArgs args{amax_history, scale, new_amax_history, new_scale, *params, length, slots, stream};
  st = run_on_device(dev, args, TWE_DEVICE_FNS(update_delayed_scaling));
  return st ? st : succeed();
}

}  // extern "C"
