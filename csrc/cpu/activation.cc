#ifndef TWE_SIMD_LANES_PASS
// CPU kernels of the activation family: loops only; the value math is numerics.h's
// (gated_forward / activation_backward / ...), shared with the CUDA kernels. Rows run in W-lane
// vectors (internal/simd.h: AVX-512 or AVX2, picked at run time) whose lane functions below repeat
// numerics.h's operations in its order (branches as selects), with the scalar functions for a
// row's last cols mod W elements, or in the scalar loops: every variant writes the same bytes.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "internal/activation.h"
#include "internal/cpu.h"
#include "internal/quantize.h"
#include "internal/quantize_rows.h"
#include "internal/simd.h"

namespace twe {
namespace cpu {
namespace {

using numerics::Activation;

/*! Calls fn(std::integral_constant<Activation, K>{}) for the kind K = `kind`, so each kernel loop
 *  is compiled per kind with the kind's math inlined and no per-element dispatch. */
template <typename Fn>
void dispatch_kind(Activation kind, Fn&& fn) {
  switch (kind) {
#define TWE_KIND_CASE(K) \
  case Activation::K: fn(std::integral_constant<Activation, Activation::K>{}); return;
    TWE_KIND_CASE(kGelu) TWE_KIND_CASE(kGeglu) TWE_KIND_CASE(kQGelu) TWE_KIND_CASE(kQGeglu)
    TWE_KIND_CASE(kRelu) TWE_KIND_CASE(kReglu) TWE_KIND_CASE(kSRelu) TWE_KIND_CASE(kSReglu)
    TWE_KIND_CASE(kSilu) TWE_KIND_CASE(kSwiglu) TWE_KIND_CASE(kClampedSwiglu)
#undef TWE_KIND_CASE
  }
}

/*! Rows begin .. end - 1 of the forward, scalar; with `keys`, also keys[r] = the max amax_key of
 *  output row r as written. */
template <typename T, Activation kKind>
void forward_rows_scalar(const ActivationArgs& a, int64_t begin, int64_t end, uint32_t* keys) {
  constexpr Activation kind = kKind;
  const T* x = static_cast<const T*>(a.x->data);
  T* y = static_cast<T*>(a.out->data);
  const bool gated = numerics::activation_is_gated(kind);
  const int64_t k = a.cols, half = k / 2;
  for (int64_t r = begin; r < end; ++r) {
    const T* xr = x + r * k;
    if (gated) {
      T* yr = y + r * half;
      for (int64_t c = 0; c < half; ++c) {
        yr[c] = FromFloat<T>::apply(
            numerics::gated_forward(kind, to_float(xr[c]), to_float(xr[half + c]), a.limit, a.alpha));
      }
      if (keys) keys[r] = amax_key_bits(yr, half);
    } else {
      T* yr = y + r * k;
      for (int64_t c = 0; c < k; ++c) yr[c] = FromFloat<T>::apply(numerics::activation_forward(kind, to_float(xr[c])));
      if (keys) keys[r] = amax_key_bits(yr, k);
    }
  }
}

/*! dx of row r = act'(x)·dy, rounded to T, for columns [c0, cols) (of a's half for gated kinds). */
template <typename T, Activation kKind>
void backward_row_scalar(const ActivationArgs& a, int64_t r, int64_t c0 = 0) {
  constexpr Activation kind = kKind;
  const bool gated = numerics::activation_is_gated(kind);
  const int64_t k = a.cols, half = k / 2;
  const T* xr = static_cast<const T*>(a.x->data) + r * k;
  T* dxr = static_cast<T*>(a.out->data) + r * k;
  if (gated) {
    const T* dyr = static_cast<const T*>(a.dy->data) + r * half;
    for (int64_t c = c0; c < half; ++c) {
      const numerics::GatedGrad g = numerics::gated_backward(kind, to_float(xr[c]), to_float(xr[half + c]),
                                                             to_float(dyr[c]), a.limit, a.alpha);
      dxr[c] = FromFloat<T>::apply(g.da);
      dxr[half + c] = FromFloat<T>::apply(g.db);
    }
  } else {
    const T* dyr = static_cast<const T*>(a.dy->data) + r * k;
    for (int64_t c = c0; c < k; ++c) {
      dxr[c] = FromFloat<T>::apply(numerics::activation_backward(kind, to_float(xr[c]), to_float(dyr[c])));
    }
  }
}

/*! lane[c] = fl(lane[c] + v[c]) for c < n: one row's terms of the canonical column sums. */
template <typename T>
void accumulate_lane(float* __restrict__ lane, const T* __restrict__ v, int64_t n) {
  for (int64_t c = 0; c < n; ++c) lane[c] = lane[c] + to_float(v[c]);
}

/*! Backward rows of lanes lane_begin .. lane_end - 1 with dbias partials, scalar; with `keys`,
 *  also keys[r] = the max amax_key of dx row r as stored. */
template <typename T, Activation kKind>
void backward_dbias_lanes_scalar(const ActivationArgs& a, int64_t lane_begin, int64_t lane_end, float* partials,
                                 uint32_t* keys) {
  const int64_t k = a.cols;
  for (int64_t lane = lane_begin; lane < lane_end; ++lane) {
    for (int64_t r = lane; r < a.rows; r += numerics::kSumLanes) {
      backward_row_scalar<T, kKind>(a, r);
      const T* dx = static_cast<const T*>(a.out->data) + r * k;
      accumulate_lane(partials + lane * k, dx, k);
      if (keys) keys[r] = amax_key_bits(dx, k);
    }
  }
}

}  // namespace
}  // namespace cpu
}  // namespace twe

// The vector rows (the #else part below), once per x86 vector ISA.
#define TWE_SIMD_LANES_FILE "cpu/activation.cc"
#include "internal/simd_foreach.h"

namespace twe {
namespace cpu {
namespace {

using numerics::Activation;


using ForwardRowsFn = void (*)(const ActivationArgs&, int64_t, int64_t, uint32_t*);
using RowsFn = void (*)(const ActivationArgs&, int64_t, int64_t);
using LanesFn = void (*)(const ActivationArgs&, int64_t, int64_t, float*, uint32_t*);

/*! The forward / backward / dbias row loops of (T, K) on the widest variant (simd::elementwise_isa()). */
template <typename T, Activation K>
ForwardRowsFn forward_rows_fn() {
#if defined(TWE_SIMD_X86)
  switch (simd::elementwise_isa()) {
    case simd::Isa::kAvx512: return &avx512::forward_rows<T, K>;
    case simd::Isa::kAvx2: return &avx2::forward_rows<T, K>;
    default: break;
  }
#endif
  return &forward_rows_scalar<T, K>;
}

template <typename T, Activation K>
void backward_rows_scalar(const ActivationArgs& a, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) backward_row_scalar<T, K>(a, r);
}

template <typename T, Activation K>
RowsFn backward_rows_fn() {
#if defined(TWE_SIMD_X86)
  switch (simd::elementwise_isa()) {
    case simd::Isa::kAvx512: return &avx512::backward_rows<T, K>;
    case simd::Isa::kAvx2: return &avx2::backward_rows<T, K>;
    default: break;
  }
#endif
  return &backward_rows_scalar<T, K>;
}

template <typename T, Activation K>
LanesFn backward_dbias_lanes_fn() {
#if defined(TWE_SIMD_X86)
  switch (simd::elementwise_isa()) {
    case simd::Isa::kAvx512: return &avx512::backward_dbias_lanes<T, K>;
    case simd::Isa::kAvx2: return &avx2::backward_dbias_lanes<T, K>;
    default: break;
  }
#endif
  return &backward_dbias_lanes_scalar<T, K>;
}

template <typename T, Activation kKind>
void forward_typed(const ActivationArgs& a) {
  const ForwardRowsFn rows = forward_rows_fn<T, kKind>();
  advise_view(*a.out);
  parallel_for(a.rows, a.rows * a.cols * 8, [&](int64_t begin, int64_t end) { rows(a, begin, end, nullptr); });
}

/*! forward_typed fused with the quantization of y (see activation_forward_quantized). */
template <typename T, Activation kKind>
TweStatus forward_quantized_typed(const ActivationArgs& a, const TweActivationQuantize& q) {
  const ForwardRowsFn rows = forward_rows_fn<T, kKind>();
  const int64_t k = numerics::activation_is_gated(kKind) ? a.cols / 2 : a.cols, work = a.rows * a.cols * 8;
  if (q.mode == kTweScalingMXFP8) {
    return quantize_mxfp8_by_row_blocks(*a.out, *q.output, q.params, a.rows, k, work, a.stream,
                                        [&](int64_t r0, int64_t r1) { rows(a, r0, r1, nullptr); });
  }
  return quantize_fp8_per_tensor_by_rows(*a.out, q.scale, q.output, q.params, a.rows, k, work, a.stream,
                                         [&](int64_t r0, int64_t r1, uint32_t* keys) { rows(a, r0, r1, keys); });
}

template <typename T, Activation kKind>
void backward_typed(const ActivationArgs& a) {
  const RowsFn rows = backward_rows_fn<T, kKind>();
  advise_view(*a.out);
  parallel_for(a.rows, a.rows * a.cols * 8, [&](int64_t begin, int64_t end) { rows(a, begin, end); });
}

/*! dx = act'(x)·dy and dbias = Σc over rows of dx (as stored): lane l (a worker's unit) computes
 *  rows l, l+32, ... in order, adding each stored dx row to its own partial sums, so each lane's
 *  sum is sequential in the row index and the 32 lanes fold as numerics::canonical_fold — the
 *  bytes of activation_backward followed by the bias family's column sum, in one pass. */
template <typename T, typename U, Activation kKind>
void backward_dbias_typed(const ActivationArgs& a, uint32_t* keys) {
  const int64_t k = a.cols, rows = a.rows;
  constexpr int64_t kLanes = numerics::kSumLanes;
  const int64_t lanes = std::min<int64_t>(kLanes, rows);
  std::vector<float> partials(static_cast<size_t>(kLanes * k), 0.0f);
  const LanesFn run = backward_dbias_lanes_fn<T, kKind>();
  advise_view(*a.out);
  parallel_for(lanes, rows * k * 8, [&](int64_t lane_begin, int64_t lane_end) {
    run(a, lane_begin, lane_end, partials.data(), keys);
  });
  U* db = static_cast<U*>(a.dbias->data);
  float fold[kLanes];
  for (int64_t c = 0; c < k; ++c) {
    for (int64_t l = 0; l < kLanes; ++l) fold[l] = partials[l * k + c];
    db[c] = FromFloat<U>::apply(numerics::canonical_fold(fold));
  }
}

}  // namespace

TweStatus activation_backward_dbias(const ActivationArgs& a) {
  ScopedIeeeSubnormals ieee;
  return dispatch_high_precision(a.x->dtype, [&](auto tag) {
    return dispatch_high_precision(a.dbias->dtype, [&](auto bias_tag) {
      dispatch_kind(a.kind, [&](auto kind) {
        backward_dbias_typed<decltype(tag), decltype(bias_tag), decltype(kind)::value>(a, nullptr);
      });
      return kTweSuccess;
    });
  });
}

TweStatus activation_backward_dbias_quantized(const ActivationArgs& a, const TweActivationQuantize& q) {
  ScopedIeeeSubnormals ieee;
  std::vector<uint32_t> keys(static_cast<size_t>(a.rows), 0u);
  const TweStatus st = dispatch_high_precision(a.x->dtype, [&](auto tag) {
    return dispatch_high_precision(a.dbias->dtype, [&](auto bias_tag) {
      dispatch_kind(a.kind, [&](auto kind) {
        backward_dbias_typed<decltype(tag), decltype(bias_tag), decltype(kind)::value>(a, keys.data());
      });
      return kTweSuccess;
    });
  });
  if (st) return st;
  uint32_t key = 0;
  for (uint32_t v : keys) key = v > key ? v : key;
  const QuantizeArgs qa{a.out, q.scale, nullptr, q.output, q.params, a.rows, a.cols, a.stream};
  return quantize_fp8_per_tensor_with_amax(qa, numerics::bits_to_float(key));
}

TweStatus activation_forward_quantized(const ActivationArgs& a, const TweActivationQuantize& q) {
  ScopedIeeeSubnormals ieee;
  return dispatch_high_precision(a.x->dtype, [&](auto tag) {
    TweStatus st = kTweSuccess;
    dispatch_kind(a.kind, [&](auto kind) { st = forward_quantized_typed<decltype(tag), decltype(kind)::value>(a, q); });
    return st;
  });
}

TweStatus activation_forward(const ActivationArgs& a) {
  return dispatch_high_precision(a.x->dtype, [&](auto tag) {
    dispatch_kind(a.kind, [&](auto kind) { forward_typed<decltype(tag), decltype(kind)::value>(a); });
    return kTweSuccess;
  });
}

TweStatus activation_backward(const ActivationArgs& a) {
  return dispatch_high_precision(a.x->dtype, [&](auto tag) {
    dispatch_kind(a.kind, [&](auto kind) { backward_typed<decltype(tag), decltype(kind)::value>(a); });
    return kTweSuccess;
  });
}

}  // namespace cpu
}  // namespace twe

#else  // TWE_SIMD_LANES_PASS: the vector rows for ISA TWE_SIMD_NS (internal/simd_foreach.h)

namespace twe {
namespace cpu {
namespace TWE_SIMD_NS {
namespace {

using numerics::Activation;

/*! A base activation's value and derivative in W lanes (numerics::ActivationValue). */
struct Value {
  F value;
  F derivative;
};

/*! numerics::sigmoid_linear. */
TWE_SIMD_INLINE Value sigmoid_linear(F x, float alpha) {
  const F z = alpha * x;
  const F s = sigmoid_f32(z);
  const F zs = z * s;
  const F one_minus = 1.0f - s;
  const F slope = zs * one_minus;
  return Value{x * s, slope + s};
}

/*! numerics::gelu_f32 (with gelu_tanh_argument). */
TWE_SIMD_INLINE Value gelu(F x) {
  const F x2 = x * x;
  const F cubic = 0.044715f * x2;
  const F inner = 1.0f + cubic;
  const F kx = 0.7978845608f * x;
  const F t = tanh_f32(kx * inner);
  const F half_x = 0.5f * x;
  const F one_plus = 1.0f + t;
  const F value = half_x * one_plus;
  const F t2 = t * t;
  const F sech2 = 1.0f - t2;
  const F du = 0.1070322243f * x2;
  const F dinner = 0.7978845608f + du;
  const F prod = sech2 * dinner;
  const F left = half_x * prod;
  const F right = 0.5f * one_plus;
  return Value{value, left + right};
}

/*! numerics::relu_f32. */
TWE_SIMD_INLINE F relu(F x) {
  return select((x > 0.0f) | is_nan(x), x, splat(0.0f));
}

/*! numerics::base_activation for kind K. */
template <Activation K>
TWE_SIMD_INLINE Value base_activation(F x, float alpha) {
  if constexpr (K == Activation::kGelu || K == Activation::kGeglu) {
    return gelu(x);
  } else if constexpr (K == Activation::kQGelu || K == Activation::kQGeglu) {
    return sigmoid_linear(x, 1.702f);
  } else if constexpr (K == Activation::kSilu || K == Activation::kSwiglu) {
    return sigmoid_linear(x, 1.0f);
  } else if constexpr (K == Activation::kClampedSwiglu) {
    return sigmoid_linear(x, alpha);
  } else if constexpr (K == Activation::kRelu || K == Activation::kReglu) {
    return Value{relu(x), splat(1.0f)};
  } else {
    const F r = relu(x);
    return Value{r * r, 2.0f * r};
  }
}

constexpr bool is_gated(Activation k) {
  return k == Activation::kGeglu || k == Activation::kQGeglu || k == Activation::kReglu || k == Activation::kSReglu ||
         k == Activation::kSwiglu || k == Activation::kClampedSwiglu;
}

constexpr bool has_relu_kink(Activation k) {
  return k == Activation::kRelu || k == Activation::kReglu || k == Activation::kSRelu || k == Activation::kSReglu;
}

/*! numerics::clamp_max / clamp_both. */
TWE_SIMD_INLINE F clamp_max(F v, float hi) {
  return select(v > hi, splat(hi), v);
}
TWE_SIMD_INLINE F clamp_both(F v, float lo, float hi) {
  return select(v < lo, splat(lo), select(v > hi, splat(hi), v));
}

/*! numerics::gated_forward. */
template <Activation K>
TWE_SIMD_INLINE F gated_forward(F a, F b,
                                                       float limit, float alpha) {
  if constexpr (K == Activation::kClampedSwiglu) {
    const F ac = clamp_max(a, limit);
    const F bc = clamp_both(b, -limit, limit);
    const F act = sigmoid_linear(ac, alpha).value;
    const F gate = bc + 1.0f;
    return act * gate;
  } else {
    const F act = base_activation<K>(a, alpha).value;
    return act * b;
  }
}

/*! numerics::activation_backward. */
template <Activation K>
TWE_SIMD_INLINE F activation_backward(F x, F dy) {
  const Value v = base_activation<K>(x, 1.0f);
  const F dx = v.derivative * dy;
  if constexpr (has_relu_kink(K)) {
    const F kink = select(is_nan(x), x, splat(0.0f));
    return select(x > 0.0f, dx, kink);
  } else {
    return dx;
  }
}

/*! numerics::gated_backward: da into *da, db into *db. */
template <Activation K>
TWE_SIMD_INLINE void gated_backward(F a, F b,
                                    F dy, float limit, float alpha,
                                    F* da, F* db) {
  const F zero = splat(0.0f);
  if constexpr (K == Activation::kClampedSwiglu) {
    const F ac = clamp_max(a, limit);
    const F bc = clamp_both(b, -limit, limit);
    const Value v = sigmoid_linear(ac, alpha);
    const F gate = bc + 1.0f;
    const F scaled = v.derivative * dy;
    *da = select(a > limit, zero, scaled * gate);
    const F dact = dy * v.value;
    *db = select(is_nan(b), b, select((b < -limit) | (b > limit), zero, dact));
  } else {
    const Value v = base_activation<K>(a, alpha);
    const F scaled = v.derivative * dy;
    F d = scaled * b;
    if constexpr (has_relu_kink(K)) {
      d = select(a > 0.0f, d, select(is_nan(a), a, zero));
    }
    *da = d;
    *db = dy * v.value;
  }
}

template <typename T, Activation K>
void forward_rows(const ActivationArgs& a, int64_t begin, int64_t end, uint32_t* keys) {
  const T* x = static_cast<const T*>(a.x->data);
  T* y = static_cast<T*>(a.out->data);
  const int64_t k = a.cols, half = k / 2;
  for (int64_t r = begin; r < end; ++r) {
    const T* xr = x + r * k;
    if constexpr (is_gated(K)) {
      T* yr = y + r * half;
      int64_t c = 0;
      for (; c + W <= half; c += W) {
        const F av = load_float(xr + c), bv = load_float(xr + half + c);
        store_rounded(yr + c, gated_forward<K>(av, bv, a.limit, a.alpha));
      }
      for (; c < half; ++c) {
        yr[c] = FromFloat<T>::apply(numerics::gated_forward(K, to_float(xr[c]), to_float(xr[half + c]), a.limit, a.alpha));
      }
      if (keys) keys[r] = amax_key_bits(yr, half);
    } else {
      T* yr = y + r * k;
      int64_t c = 0;
      for (; c + W <= k; c += W) {
        store_rounded(yr + c, base_activation<K>(load_float(xr + c), 1.0f).value);
      }
      for (; c < k; ++c) yr[c] = FromFloat<T>::apply(numerics::activation_forward(K, to_float(xr[c])));
      if (keys) keys[r] = amax_key_bits(yr, k);
    }
  }
}

template <typename T, Activation K>
TWE_SIMD_INLINE void backward_row(const ActivationArgs& a, int64_t r) {
  const int64_t k = a.cols, half = k / 2;
  const T* xr = static_cast<const T*>(a.x->data) + r * k;
  T* dxr = static_cast<T*>(a.out->data) + r * k;
  int64_t c = 0;
  if constexpr (is_gated(K)) {
    const T* dyr = static_cast<const T*>(a.dy->data) + r * half;
    for (; c + W <= half; c += W) {
      F da, db;
      gated_backward<K>(load_float(xr + c), load_float(xr + half + c),
                           load_float(dyr + c), a.limit, a.alpha, &da, &db);
      store_rounded(dxr + c, da);
      store_rounded(dxr + half + c, db);
    }
  } else {
    const T* dyr = static_cast<const T*>(a.dy->data) + r * k;
    for (; c + W <= k; c += W) {
      store_rounded(dxr + c,
                             activation_backward<K>(load_float(xr + c), load_float(dyr + c)));
    }
  }
  backward_row_scalar<T, K>(a, r, c);
}

template <typename T, Activation K>
void backward_rows(const ActivationArgs& a, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) backward_row<T, K>(a, r);
}

/*! backward_dbias_lanes_scalar in W lanes: each stored dx row is added to the lane partials. */
template <typename T, Activation K>
void backward_dbias_lanes(const ActivationArgs& a, int64_t lane_begin, int64_t lane_end, float* partials,
                          uint32_t* keys) {
  const int64_t k = a.cols;
  for (int64_t lane = lane_begin; lane < lane_end; ++lane) {
    float* p = partials + lane * k;
    for (int64_t r = lane; r < a.rows; r += numerics::kSumLanes) {
      backward_row<T, K>(a, r);
      const T* dx = static_cast<const T*>(a.out->data) + r * k;
      int64_t c = 0;
      for (; c + W <= k; c += W) store(p + c, load<F>(p + c) + load_float(dx + c));
      accumulate_lane(p + c, dx + c, k - c);
      if (keys) keys[r] = amax_key_bits(dx, k);
    }
  }
}

}  // namespace
}  // namespace TWE_SIMD_NS
}  // namespace cpu
}  // namespace twe

#endif  // TWE_SIMD_LANES_PASS
