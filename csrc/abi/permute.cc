// C ABI of the permute family: argument checks, then dispatch to the CPU or CUDA kernels.
#include <string>

#include "internal/permute.h"

namespace twe {
namespace {

constexpr int64_t kMaxRows = (int64_t{1} << 31) - 1;  // row ids are int32

TweStatus check_params(const TwePermuteParams* p, TweMapType expect) {
  if (!p) return fail(kTweInvalidArgument, "params must not be NULL");
  if (p->map_type != expect && expect != static_cast<TweMapType>(-1)) {
    return fail(kTweInvalidArgument, "params.map_type does not match the call");
  }
  if (p->map_type != kTweMapIndex && p->map_type != kTweMapMask) return fail(kTweInvalidArgument, "unknown map_type");
  if (p->num_tokens < 0 || p->num_slots < 1 || p->num_out_tokens < 0) {
    return fail(kTweInvalidArgument, "num_tokens and num_out_tokens must be >= 0 and num_slots >= 1");
  }
  const int64_t pairs = p->num_tokens * p->num_slots;
  if (p->num_slots > kMaxRows || p->num_tokens > kMaxRows || pairs > kMaxRows || p->num_out_tokens > kMaxRows) {
    return fail(kTweInvalidArgument, "row ids are int32: num_tokens * num_slots and num_out_tokens must be < 2^31");
  }
  return kTweSuccess;
}

TweStatus check_row_id_map(const TweTensorView* map, const TwePermuteParams& p, TweDevice dev) {
  if (p.map_type == kTweMapIndex) return check_view(map, "row_id_map", kTweInt32, -1, p.num_slots * p.num_tokens, dev);
  return check_view(map, "row_id_map", kTweInt32, p.num_tokens, 2 * p.num_slots + 1, dev);
}

TweStatus check_high_precision(const TweTensorView* v, const char* name) {
  if (!present(v)) return fail(kTweInvalidArgument, std::string(name) + " is missing");
  if (!is_high_precision(v->dtype)) {
    return fail(kTweInvalidArgument, std::string(name) + " must be float32, bfloat16 or float16, got " +
                                         dtype_name(v->dtype));
  }
  return kTweSuccess;
}

/*! Optional probs-like input (T, slots) and its optional partner output of `out_numel`
 *  elements (or (T, slots) when out_numel < 0): both present or both absent, same dtype. */
TweStatus check_probs_pair(const TweTensorView* in, const char* in_name, int64_t in_rows, int64_t in_cols,
                           const TweTensorView* out, const char* out_name, int64_t out_rows, int64_t out_cols,
                           TweDevice dev) {
  if (present(in) != present(out)) {
    return fail(kTweInvalidArgument,
                std::string(in_name) + " and " + out_name + " must be both present or both absent");
  }
  if (!present(in)) return kTweSuccess;
  TweStatus st = check_high_precision(in, in_name);
  if (st) return st;
  if ((st = check_view(in, in_name, in->dtype, in_rows, in_cols, dev))) return st;
  return check_view(out, out_name, in->dtype, out_rows, out_cols, dev);
}

}  // namespace
}  // namespace twe

using namespace twe;

extern "C" {

TweStatus twe_permute_row_id_map_index(const TweTensorView* routing_map, TweTensorView* row_id_map,
                                       TweTensorView* workspace, const TwePermuteParams* params, void* stream) {
  TweStatus st = check_params(params, kTweMapIndex);
  if (st) return st;
  const TwePermuteParams& p = *params;
  if (!present(routing_map)) return fail(kTweInvalidArgument, "routing_map is missing");
  const TweDevice dev = routing_map->device;
  if ((st = check_view(routing_map, "routing_map", kTweInt32, p.num_tokens, p.num_slots, dev))) return st;
  if ((st = check_row_id_map(row_id_map, p, dev))) return st;
  if ((st = check_view(workspace, "workspace", kTweInt64, -1, 2 * p.num_tokens * p.num_slots, dev))) return st;
  PermuteArgs args{routing_map, nullptr, nullptr, nullptr, row_id_map, nullptr, workspace, p,
                   p.num_tokens, 0, 0, stream};
  st = run_on_device(dev, args, TWE_DEVICE_FNS(permute_row_id_map_index));
  return st ? st : succeed();
}

TweStatus twe_permute_row_id_map_mask(const TweTensorView* routing_map, TweTensorView* row_id_map,
                                      TweTensorView* workspace, const TwePermuteParams* params, void* stream) {
  TweStatus st = check_params(params, kTweMapMask);
  if (st) return st;
  const TwePermuteParams& p = *params;
  if (!present(routing_map)) return fail(kTweInvalidArgument, "routing_map is missing");
  const TweDevice dev = routing_map->device;
  if (routing_map->dtype != kTweUInt8 && routing_map->dtype != kTweInt32) {
    return fail(kTweInvalidArgument, std::string("routing_map must be uint8 or int32, got ") +
                                         dtype_name(routing_map->dtype));
  }
  if ((st = check_view(routing_map, "routing_map", routing_map->dtype, p.num_tokens, p.num_slots, dev))) return st;
  if ((st = check_row_id_map(row_id_map, p, dev))) return st;
  if ((st = check_view(workspace, "workspace", kTweInt64, -1, p.num_slots, dev))) return st;
  PermuteArgs args{routing_map, nullptr, nullptr, nullptr, row_id_map, nullptr, workspace, p,
                   p.num_tokens, 0, 0, stream};
  st = run_on_device(dev, args, TWE_DEVICE_FNS(permute_row_id_map_mask));
  return st ? st : succeed();
}

TweStatus twe_permute_chunk_map(const TweTensorView* split_sizes, const TweTensorView* sorted_index,
                                TweTensorView* row_id_map, const TwePermuteParams* params, void* stream) {
  TweStatus st = check_params(params, kTweMapIndex);
  if (st) return st;
  const TwePermuteParams& p = *params;
  if (p.num_slots != 1) return fail(kTweInvalidArgument, "a chunk map has one slot per row");
  if (!present(split_sizes)) return fail(kTweInvalidArgument, "split_sizes is missing");
  const TweDevice dev = split_sizes->device;
  const int64_t chunks = numel(*split_sizes);
  if ((st = check_view(split_sizes, "split_sizes", kTweInt32, -1, chunks, dev))) return st;
  if ((st = check_view(sorted_index, "sorted_index", kTweInt32, -1, chunks, dev))) return st;
  if ((st = check_row_id_map(row_id_map, p, dev))) return st;
  PermuteArgs args{split_sizes, sorted_index, nullptr, nullptr, row_id_map, nullptr, nullptr, p, chunks, 0, 0, stream};
  st = run_on_device(dev, args, TWE_DEVICE_FNS(permute_chunk_map));
  return st ? st : succeed();
}

TweStatus twe_permute_rows(const TweTensorView* inp, const TweTensorView* row_id_map, const TweTensorView* probs,
                           TweTensorView* out, TweTensorView* permuted_probs, const TwePermuteParams* params,
                           void* stream) {
  TweStatus st = check_params(params, static_cast<TweMapType>(-1));
  if (st) return st;
  const TwePermuteParams& p = *params;
  if (!present(inp) || !present(out)) return fail(kTweInvalidArgument, "inp and out must be present");
  const TweDevice dev = inp->device;
  const int64_t in_rows = rows(*inp), width = cols(*inp), out_rows = rows(*out);
  if (inp->ndim < 1 || in_rows < p.num_tokens) {
    return fail(kTweInvalidArgument, "inp must have at least num_tokens rows, got " + shape_string(*inp));
  }
  if (out_rows < p.num_out_tokens) {
    return fail(kTweInvalidArgument, "out must have at least num_out_tokens rows, got " + shape_string(*out));
  }
  if ((st = check_view(out, "out", inp->dtype, out_rows, width, dev))) return st;
  if ((st = check_row_id_map(row_id_map, p, dev))) return st;
  if ((st = check_probs_pair(probs, "probs", p.num_tokens, p.num_slots, permuted_probs, "permuted_probs", -1,
                             p.num_out_tokens, dev)))
    return st;
  PermuteArgs args{inp, nullptr, row_id_map, probs, out, permuted_probs, nullptr, p,
                   in_rows, out_rows, width * element_size(inp->dtype), stream};
  st = run_on_device(dev, args, TWE_DEVICE_FNS(permute_rows));
  return st ? st : succeed();
}

TweStatus twe_permute_rows_backward(const TweTensorView* grad_out, const TweTensorView* grad_permuted_probs,
                                    const TweTensorView* row_id_map, TweTensorView* grad_inp,
                                    TweTensorView* grad_probs, const TwePermuteParams* params, void* stream) {
  TweStatus st = check_params(params, static_cast<TweMapType>(-1));
  if (st) return st;
  const TwePermuteParams& p = *params;
  if ((st = check_high_precision(grad_out, "grad_out"))) return st;
  const TweDevice dev = grad_out->device;
  const int64_t width = cols(*grad_out);
  if ((st = check_view(grad_out, "grad_out", grad_out->dtype, p.num_out_tokens, width, dev))) return st;
  if ((st = check_view(grad_inp, "grad_inp", grad_out->dtype, p.num_tokens, width, dev))) return st;
  if ((st = check_row_id_map(row_id_map, p, dev))) return st;
  if ((st = check_probs_pair(grad_permuted_probs, "grad_permuted_probs", -1, p.num_out_tokens, grad_probs,
                             "grad_probs", p.num_tokens, p.num_slots, dev)))
    return st;
  PermuteArgs args{grad_out, nullptr, row_id_map, grad_permuted_probs, grad_inp, grad_probs, nullptr, p,
                   p.num_out_tokens, p.num_tokens, width, stream};
  st = run_on_device(dev, args, TWE_DEVICE_FNS(permute_rows_backward));
  return st ? st : succeed();
}

TweStatus twe_permute_unpermute(const TweTensorView* y, const TweTensorView* row_id_map,
                                const TweTensorView* merging_probs, TweTensorView* out,
                                const TwePermuteParams* params, void* stream) {
  TweStatus st = check_params(params, static_cast<TweMapType>(-1));
  if (st) return st;
  const TwePermuteParams& p = *params;
  if ((st = check_high_precision(y, "y"))) return st;
  const TweDevice dev = y->device;
  const int64_t width = cols(*y);
  if ((st = check_view(y, "y", y->dtype, p.num_out_tokens, width, dev))) return st;
  if ((st = check_view(out, "out", y->dtype, p.num_tokens, width, dev))) return st;
  if ((st = check_row_id_map(row_id_map, p, dev))) return st;
  if (present(merging_probs)) {
    if ((st = check_high_precision(merging_probs, "merging_probs"))) return st;
    st = check_view(merging_probs, "merging_probs", merging_probs->dtype, p.num_tokens, p.num_slots, dev);
    if (st) return st;
  }
  PermuteArgs args{y, nullptr, row_id_map, present(merging_probs) ? merging_probs : nullptr, out, nullptr, nullptr, p,
                   p.num_out_tokens, p.num_tokens, width, stream};
  st = run_on_device(dev, args, TWE_DEVICE_FNS(permute_unpermute));
  return st ? st : succeed();
}

TweStatus twe_permute_unpermute_backward(const TweTensorView* grad_out, const TweTensorView* y,
                                         const TweTensorView* row_id_map, const TweTensorView* merging_probs,
                                         TweTensorView* grad_y, TweTensorView* grad_merging_probs,
                                         const TwePermuteParams* params, void* stream) {
  TweStatus st = check_params(params, static_cast<TweMapType>(-1));
  if (st) return st;
  const TwePermuteParams& p = *params;
  if ((st = check_high_precision(y, "y"))) return st;
  const TweDevice dev = y->device;
  const int64_t width = cols(*y);
  if ((st = check_view(y, "y", y->dtype, p.num_out_tokens, width, dev))) return st;
  if ((st = check_view(grad_out, "grad_out", y->dtype, p.num_tokens, width, dev))) return st;
  if ((st = check_view(grad_y, "grad_y", y->dtype, p.num_out_tokens, width, dev))) return st;
  if ((st = check_row_id_map(row_id_map, p, dev))) return st;
  if ((st = check_probs_pair(merging_probs, "merging_probs", p.num_tokens, p.num_slots, grad_merging_probs,
                             "grad_merging_probs", p.num_tokens, p.num_slots, dev)))
    return st;
  PermuteArgs args{grad_out, y, row_id_map, present(merging_probs) ? merging_probs : nullptr, grad_y,
                   grad_merging_probs, nullptr, p, p.num_tokens, p.num_out_tokens, width, stream};
  st = run_on_device(dev, args, TWE_DEVICE_FNS(permute_unpermute_backward));
  return st ? st : succeed();
}

TweStatus twe_permute_pad_offsets(const TweTensorView* counts, TweTensorView* pad_offsets, TweTensorView* padded_counts,
                                  int64_t align_size, void* stream) {
  if (!present(counts)) return fail(kTweInvalidArgument, "counts is missing");
  const TweDevice dev = counts->device;
  const int64_t experts = numel(*counts);
  if (experts < 1) return fail(kTweInvalidArgument, "counts must hold at least one expert");
  if (align_size < 1) return fail(kTweInvalidArgument, "align_size must be >= 1");
  TweStatus st = check_view(counts, "counts", kTweInt32, -1, experts, dev);
  if (st) return st;
  if ((st = check_view(pad_offsets, "pad_offsets", kTweInt32, -1, experts, dev))) return st;
  if ((st = check_view(padded_counts, "padded_counts", kTweInt32, -1, experts, dev))) return st;
  PermuteArgs args{counts, nullptr, nullptr, nullptr, pad_offsets, padded_counts, nullptr, TwePermuteParams{},
                   experts, 0, 0, stream, align_size};
  st = run_on_device(dev, args, TWE_DEVICE_FNS(permute_pad_offsets));
  return st ? st : succeed();
}

TweStatus twe_permute_pad_map(const TweTensorView* row_id_map, const TweTensorView* pad_offsets, TweTensorView* out,
                              const TwePermuteParams* params, void* stream) {
  TweStatus st = check_params(params, kTweMapMask);
  if (st) return st;
  const TwePermuteParams& p = *params;
  if (!present(pad_offsets)) return fail(kTweInvalidArgument, "pad_offsets is missing");
  const TweDevice dev = pad_offsets->device;
  if ((st = check_row_id_map(row_id_map, p, dev))) return st;
  if ((st = check_view(pad_offsets, "pad_offsets", kTweInt32, -1, p.num_slots, dev))) return st;
  if ((st = check_row_id_map(out, p, dev))) return st;
  PermuteArgs args{nullptr, pad_offsets, row_id_map, nullptr, out, nullptr, nullptr, p, p.num_tokens, p.num_tokens, 0,
                   stream};
  st = run_on_device(dev, args, TWE_DEVICE_FNS(permute_pad_map));
  return st ? st : succeed();
}

TweStatus twe_permute_split_pad_map(const TweTensorView* split_sizes, const TweTensorView* pad_offsets,
                                    TweTensorView* row_id_map, const TwePermuteParams* params, void* stream) {
  TweStatus st = check_params(params, kTweMapIndex);
  if (st) return st;
  const TwePermuteParams& p = *params;
  if (p.num_slots != 1) return fail(kTweInvalidArgument, "a split padding map has one slot per row");
  if (!present(split_sizes)) return fail(kTweInvalidArgument, "split_sizes is missing");
  const TweDevice dev = split_sizes->device;
  const int64_t groups = numel(*split_sizes);
  if ((st = check_view(split_sizes, "split_sizes", kTweInt32, -1, groups, dev))) return st;
  if ((st = check_view(pad_offsets, "pad_offsets", kTweInt32, -1, groups, dev))) return st;
  if ((st = check_row_id_map(row_id_map, p, dev))) return st;
  PermuteArgs args{split_sizes, pad_offsets, nullptr, nullptr, row_id_map, nullptr, nullptr, p, groups, 0, 0, stream};
  st = run_on_device(dev, args, TWE_DEVICE_FNS(permute_split_pad_map));
  return st ? st : succeed();
}

}  // extern "C"
