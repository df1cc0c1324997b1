// C ABI of the rope family: argument checks (shapes, dtypes, cu_seqlens values on the CPU), then
// dispatch to the CPU or CUDA kernel.
#include <string>

#include "internal/rope.h"

namespace twe {
namespace {

TweStatus rope_run(const TweTensorView* x, const char* x_name, const TweTensorView* freqs,
                   const TweTensorView* cu_seqlens, TweTensorView* out, const char* out_name,
                   const TweRopeParams* params, bool backward, void* stream) {
  if (!params) return fail(kTweInvalidArgument, "params must not be NULL");
  if (params->format < kTweRopeSbhd || params->format > kTweRopeThd) {
    return fail(kTweInvalidArgument, "unknown rope tensor format");
  }
  if (params->interleaved != 0 && params->interleaved != 1) {
    return fail(kTweInvalidArgument, "interleaved must be 0 or 1");
  }
  if (x == nullptr || (x->data == nullptr && numel(*x) != 0)) return fail(kTweInvalidArgument, std::string(x_name) + " is missing");
  if (!is_high_precision(x->dtype)) {
    return fail(kTweInvalidArgument, std::string(x_name) + " must be float32, bfloat16 or float16, got " +
                                         dtype_name(x->dtype));
  }
  const bool thd = params->format == kTweRopeThd;
  const int rank = thd ? 3 : 4;
  if (x->ndim != rank) {
    return fail(kTweInvalidArgument, std::string(x_name) + " must have rank " + std::to_string(rank) + ", got shape " +
                                         shape_string(*x));
  }
  const TweDevice dev = x->device;
  if (freqs == nullptr || freqs->dtype != kTweFloat32 || freqs->ndim != 4 || freqs->shape[1] != 1 ||
      freqs->shape[2] != 1) {
    return fail(kTweInvalidArgument, "freqs must be a float32 (S, 1, 1, D2) tensor");
  }
  TweStatus st = check_view_allow_empty(freqs, "freqs", kTweFloat32, -1, numel(*freqs), dev);
  if (st) return st;
  RopeArgs a{};
  a.x = x;
  a.out = out;
  a.format = params->format;
  a.interleaved = params->interleaved == 1;
  a.backward = backward;
  a.heads = x->shape[rank - 2];
  a.d = x->shape[rank - 1];
  a.d2 = freqs->shape[3];
  a.freq_rows = freqs->shape[0];
  a.freqs = static_cast<const float*>(freqs->data);
  a.stream = stream;
  if (a.d2 > a.d) return fail(kTweInvalidArgument, "freqs has more channels than the head dimension");
  if (a.d2 % 2 != 0) return fail(kTweInvalidArgument, "the rotary dimension (freqs.shape[-1]) must be even");
  if ((st = check_view_allow_empty(out, out_name, x->dtype, -1, numel(*x), dev))) return st;
  if (thd) {
    if (!present(cu_seqlens)) return fail(kTweInvalidArgument, "format thd needs cu_seqlens");
    if (cu_seqlens->dtype != kTweInt32 || cu_seqlens->ndim != 1 || cu_seqlens->shape[0] < 2) {
      return fail(kTweInvalidArgument, "cu_seqlens must be a 1-D int32 tensor of at least 2 elements");
    }
    if ((st = check_view(cu_seqlens, "cu_seqlens", kTweInt32, -1, cu_seqlens->shape[0], dev))) return st;
    a.tokens = x->shape[0];
    a.batch = cu_seqlens->shape[0] - 1;
    a.cu_seqlens = static_cast<const int32_t*>(cu_seqlens->data);
    if (dev == kTweCPU) {
      const int32_t* cu = a.cu_seqlens;
      bool ok = cu[0] >= 0 && cu[a.batch] <= a.tokens;
      int64_t longest = 0;
      for (int64_t b = 0; ok && b < a.batch; ++b) {
        ok = cu[b + 1] >= cu[b];
        if (ok && cu[b + 1] - cu[b] > longest) longest = cu[b + 1] - cu[b];
      }
      if (!ok) {
        return fail(kTweInvalidArgument, "cu_seqlens must be non-decreasing offsets in [0, " + std::to_string(a.tokens) + "]");
      }
      if (longest > a.freq_rows) {
        return fail(kTweInvalidArgument, "a sequence of " + std::to_string(longest) + " tokens is longer than freqs (" +
                                             std::to_string(a.freq_rows) + " positions)");
      }
    }
  } else {
    if (present(cu_seqlens)) return fail(kTweInvalidArgument, "cu_seqlens is only used with format thd");
    const bool sbhd = params->format == kTweRopeSbhd;
    a.seq = x->shape[sbhd ? 0 : 1];
    a.batch = x->shape[sbhd ? 1 : 0];
    a.tokens = a.seq * a.batch;
    if (a.seq > a.freq_rows) {
      return fail(kTweInvalidArgument, "the sequence length " + std::to_string(a.seq) + " is longer than freqs (" +
                                           std::to_string(a.freq_rows) + " positions)");
    }
  }
  if (numel(*x) == 0) return succeed();
  st = run_on_device(dev, a, TWE_DEVICE_FNS(rope_apply));
  return st ? st : succeed();
}

}  // namespace
}  // namespace twe

using namespace twe;

extern "C" {

TweStatus twe_rope_forward(const TweTensorView* x, const TweTensorView* freqs, const TweTensorView* cu_seqlens,
                           TweTensorView* y, const TweRopeParams* params, void* stream) {
  return rope_run(x, "x", freqs, cu_seqlens, y, "y", params, false, stream);
}

TweStatus twe_rope_backward(const TweTensorView* dy, const TweTensorView* freqs, const TweTensorView* cu_seqlens,
                            TweTensorView* dx, const TweRopeParams* params, void* stream) {
  return rope_run(dy, "dy", freqs, cu_seqlens, dx, "dx", params, true, stream);
}

}  // extern "C"
