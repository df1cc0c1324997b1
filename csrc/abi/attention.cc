// C ABI of the attention family: argument checks (shapes, dtypes, mask/window consistency,
// sequence-length values on CPU), then dispatch to the CPU or CUDA kernels (csrc/cuda/attention.cu:
// high precision only; FP8 attention on CUDA views gets kTweUnsupported).
#include <sstream>
#include <string>

#include "internal/attention.h"

namespace twe {
namespace {

bool is_padding(TweAttentionMask m) {
  return m == kTweAttnMaskPadding || m == kTweAttnMaskPaddingCausal || m == kTweAttnMaskPaddingCausalBottomRight;
}

bool is_causal(TweAttentionMask m) {
  return m == kTweAttnMaskCausal || m == kTweAttnMaskPaddingCausal || m == kTweAttnMaskCausalBottomRight ||
         m == kTweAttnMaskPaddingCausalBottomRight;
}

/*! A view of `dtype` with exactly the 4-D (or 3-D / 1-D) shape `shape` (empty allowed). */
TweStatus check_shape(const TweTensorView* v, const char* name, TweDType dtype, const int64_t* shape, int ndim,
                      TweDevice device) {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  TweStatus st = check_view_allow_empty(v, name, dtype, -1, n, device);
  if (st) return st;
  bool ok = v->ndim == ndim;
  for (int i = 0; ok && i < ndim; ++i) ok = v->shape[i] == shape[i];
  if (!ok) {
    std::ostringstream out;
    out << name << " has shape " << shape_string(*v) << ", expected (";
    for (int i = 0; i < ndim; ++i) out << (i ? ", " : "") << shape[i];
    out << (ndim == 1 ? ",)" : ")");
    return fail(kTweInvalidArgument, out.str());
  }
  return kTweSuccess;
}

/*! q, k, v, the sizes, params and the optional inputs; fills the size fields of `a`. */
TweStatus check_common(AttentionArgs& a) {
  if (a.q == nullptr || a.k == nullptr || a.v == nullptr) return fail(kTweInvalidArgument, "q, k and v are required");
  if (!is_high_precision(a.q->dtype)) {
    return fail(kTweInvalidArgument, std::string("q must be float32, bfloat16 or float16, got ") +
                                         dtype_name(a.q->dtype));
  }
  if (a.params.layout != kTweAttnLayoutBSHD && a.params.layout != kTweAttnLayoutSBHD &&
      a.params.layout != kTweAttnLayoutTHD) {
    return fail(kTweInvalidArgument, "unknown layout");
  }
  const bool sbhd = a.params.layout == kTweAttnLayoutSBHD, thd = a.params.layout == kTweAttnLayoutTHD;
  const int nd = thd ? 3 : 4;
  if (a.q->ndim != nd || a.k->ndim != nd || a.v->ndim != nd) {
    return fail(kTweInvalidArgument,
                thd ? "q, k and v must be 3-D (layout thd)" : "q, k and v must be 4-D (layout bshd or sbhd)");
  }
  // thd is bshd with one "batch" of T tokens (the same memory order); the sequences are the
  // cu_seqlens segments, which the mask keeps apart.
  a.batch = thd ? 1 : a.q->shape[sbhd ? 1 : 0];
  a.seq_q = a.q->shape[thd || sbhd ? 0 : 1];
  a.heads = a.q->shape[nd - 2];
  a.head_dim = a.q->shape[nd - 1];
  a.seq_kv = a.k->shape[thd || sbhd ? 0 : 1];
  a.kv_heads = a.k->shape[nd - 2];
  a.v_dim = a.v->shape[nd - 1];
  const TweDevice dev = a.q->device;
  if (a.kv_heads < 1 || a.heads % a.kv_heads != 0) {
    return fail(kTweInvalidArgument, "the number of query heads must be a multiple of the number of kv heads");
  }
  if (a.head_dim < 1 || a.v_dim < 1) return fail(kTweInvalidArgument, "head dimensions must be >= 1");
  TweStatus st;
  int64_t q_shape[4] = {sbhd ? a.seq_q : a.batch, sbhd ? a.batch : a.seq_q, a.heads, a.head_dim};
  int64_t k_shape[4] = {sbhd ? a.seq_kv : a.batch, sbhd ? a.batch : a.seq_kv, a.kv_heads, a.head_dim};
  int64_t v_shape[4] = {sbhd ? a.seq_kv : a.batch, sbhd ? a.batch : a.seq_kv, a.kv_heads, a.v_dim};
  const int skip = thd ? 1 : 0;  // thd shapes are the last three of (1, T, H, D)
  if ((st = check_shape(a.q, "q", a.q->dtype, q_shape + skip, nd, dev)) ||
      (st = check_shape(a.k, "k", a.q->dtype, k_shape + skip, nd, dev)) ||
      (st = check_shape(a.v, "v", a.q->dtype, v_shape + skip, nd, dev)))
    return st;
  const TweAttentionParams& p = a.params;
  if (p.mask_type < kTweAttnMaskNone || p.mask_type > kTweAttnMaskPaddingCausalBottomRight) {
    return fail(kTweInvalidArgument, "unknown mask type");
  }
  if (p.window_left < -1 || p.window_right < -1) return fail(kTweInvalidArgument, "window sizes must be >= -1");
  if (is_causal(p.mask_type) && p.window_right != 0) {
    return fail(kTweInvalidArgument, "a causal mask needs window_right == 0");
  }
  if (p.fp8 != 0 && p.fp8 != 1) return fail(kTweInvalidArgument, "fp8 must be 0 or 1");
  if (!(p.dropout_p >= 0.0f && p.dropout_p < 1.0f)) return fail(kTweInvalidArgument, "dropout_p must be in [0, 1)");
  if (thd) {
    if (!is_padding(p.mask_type)) return fail(kTweInvalidArgument, "layout thd needs a padding mask type");
    if (!present(a.seqlens_q) || !present(a.seqlens_kv)) {
      return fail(kTweInvalidArgument, "layout thd needs cu_seqlens_q and cu_seqlens_kv");
    }
    const int64_t n = numel(*a.seqlens_q);
    if (n < 2) return fail(kTweInvalidArgument, "cu_seqlens_q must have at least 2 elements");
    const int64_t cu_shape[1] = {n};
    if ((st = check_shape(a.seqlens_q, "cu_seqlens_q", kTweInt32, cu_shape, 1, dev)) ||
        (st = check_shape(a.seqlens_kv, "cu_seqlens_kv", kTweInt32, cu_shape, 1, dev)))
      return st;
    if (dev == kTweCPU) {
      for (const TweTensorView* cu : {a.seqlens_q, a.seqlens_kv}) {
        const bool is_q = cu == a.seqlens_q;
        const int32_t* data = static_cast<const int32_t*>(cu->data);
        const int64_t limit = is_q ? a.seq_q : a.seq_kv;
        bool ok = data[0] >= 0 && data[n - 1] <= limit;
        for (int64_t i = 1; ok && i < n; ++i) ok = data[i] >= data[i - 1];
        if (!ok) {
          return fail(kTweInvalidArgument, std::string(is_q ? "cu_seqlens_q" : "cu_seqlens_kv") +
                                               " must be non-decreasing offsets in [0, " + std::to_string(limit) +
                                               "]");
        }
      }
    }
  }
  const int64_t b_shape[1] = {a.batch};
  for (const TweTensorView* lens : {a.seqlens_q, a.seqlens_kv}) {
    if (lens == nullptr || thd) continue;
    const bool is_q = lens == a.seqlens_q;
    const char* name = is_q ? "seqlens_q" : "seqlens_kv";
    if (!is_padding(p.mask_type)) {
      return fail(kTweInvalidArgument, std::string(name) + " is only used with a padding mask type");
    }
    if ((st = check_shape(lens, name, kTweInt32, b_shape, 1, dev))) return st;
    if (dev == kTweCPU) {
      const int32_t* data = static_cast<const int32_t*>(lens->data);
      const int64_t limit = is_q ? a.seq_q : a.seq_kv;
      for (int64_t b = 0; b < a.batch; ++b) {
        if (data[b] < 0 || data[b] > limit) {
          std::ostringstream out;
          out << name << "[" << b << "] = " << data[b] << " is outside [0, " << limit << "]";
          return fail(kTweInvalidArgument, out.str());
        }
      }
    }
  }
  if (p.dropout_p > 0.0f) {
    if (!present(a.rng)) return fail(kTweInvalidArgument, "attention dropout needs the rng state [seed, offset]");
    if (a.rng->dtype != kTweUInt32 && a.rng->dtype != kTweInt32 && a.rng->dtype != kTweInt64) {
      return fail(kTweInvalidArgument, std::string("rng must have dtype uint32, int32 or int64, got ") +
                                           dtype_name(a.rng->dtype));
    }
    if ((st = check_view(a.rng, "rng", a.rng->dtype, -1, 2, dev))) return st;
  }
  return kTweSuccess;
}

}  // namespace
}  // namespace twe

using namespace twe;

extern "C" {

TweStatus twe_attention_fwd(const TweTensorView* q, const TweTensorView* k, const TweTensorView* v,
                            const TweTensorView* seqlens_q, const TweTensorView* seqlens_kv, const TweTensorView* rng,
                            TweTensorView* out, TweTensorView* lse, const TweAttentionParams* params, void* stream) {
  if (!params) return fail(kTweInvalidArgument, "params must not be NULL");
  AttentionArgs a{};
  a.q = q; a.k = k; a.v = v;
  a.seqlens_q = seqlens_q; a.seqlens_kv = seqlens_kv; a.rng = rng;
  a.out = out; a.lse = lse;
  a.params = *params;
  a.stream = stream;
  TweStatus st = check_common(a);
  if (st) return st;
  const bool thd = params->layout == kTweAttnLayoutTHD;
  const int64_t o_shape[4] = {q->shape[0], q->shape[1], a.heads, a.v_dim};
  const int64_t l_shape[3] = {a.batch, a.heads, a.seq_q};
  int64_t o_thd[3] = {a.seq_q, a.heads, a.v_dim};
  if ((st = check_shape(out, "out", q->dtype, thd ? o_thd : o_shape, q->ndim, q->device)) ||
      (st = check_shape(lse, "lse", kTweFloat32, l_shape + (thd ? 1 : 0), thd ? 2 : 3, q->device)))
    return st;
  st = run_on_device(q->device, a, TWE_DEVICE_FNS(attention_fwd));
  return st ? st : succeed();
}

TweStatus twe_attention_bwd(const TweTensorView* dout, const TweTensorView* q, const TweTensorView* k,
                            const TweTensorView* v, const TweTensorView* out, const TweTensorView* lse,
                            const TweTensorView* seqlens_q, const TweTensorView* seqlens_kv, const TweTensorView* rng,
                            TweTensorView* dq, TweTensorView* dk, TweTensorView* dv, const TweAttentionParams* params,
                            void* stream) {
  if (!params) return fail(kTweInvalidArgument, "params must not be NULL");
  AttentionArgs a{};
  a.q = q; a.k = k; a.v = v;
  a.seqlens_q = seqlens_q; a.seqlens_kv = seqlens_kv; a.rng = rng;
  a.dout = dout; a.out_in = out; a.lse = const_cast<TweTensorView*>(lse);
  a.dq = dq; a.dk = dk; a.dv = dv;
  a.params = *params;
  a.stream = stream;
  TweStatus st = check_common(a);
  if (st) return st;
  const bool thd = params->layout == kTweAttnLayoutTHD;
  const int64_t o_shape[4] = {q->shape[0], q->shape[1], a.heads, a.v_dim};
  const int64_t l_shape[3] = {a.batch, a.heads, a.seq_q};
  int64_t o_thd[3] = {a.seq_q, a.heads, a.v_dim};
  const int64_t* o_expect = thd ? o_thd : o_shape;
  if ((st = check_shape(dout, "dout", q->dtype, o_expect, q->ndim, q->device)) ||
      (st = check_shape(out, "out", q->dtype, o_expect, q->ndim, q->device)) ||
      (st = check_shape(lse, "lse", kTweFloat32, l_shape + (thd ? 1 : 0), thd ? 2 : 3, q->device)) ||
      (st = check_shape(dq, "dq", q->dtype, q->shape, q->ndim, q->device)) ||
      (st = check_shape(dk, "dk", q->dtype, k->shape, q->ndim, q->device)) ||
      (st = check_shape(dv, "dv", q->dtype, v->shape, q->ndim, q->device)))
    return st;
  st = run_on_device(q->device, a, TWE_DEVICE_FNS(attention_bwd));
  return st ? st : succeed();
}

}  // extern "C"
