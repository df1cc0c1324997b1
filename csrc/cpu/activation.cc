// CPU kernels of the activation family: loops only; the value math is numerics.h's
// (gated_forward / activation_backward / ...), shared with the CUDA kernels.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "internal/activation.h"
#include "internal/cpu.h"

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

template <typename T, Activation kKind>
void forward_typed(const ActivationArgs& a) {
  constexpr Activation kind = kKind;
  const T* x = static_cast<const T*>(a.x->data);
  T* y = static_cast<T*>(a.out->data);
  const bool gated = numerics::activation_is_gated(kind);
  const int64_t k = a.cols, half = k / 2;
  parallel_for(a.rows, a.rows * k * 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * k;
      if (gated) {
        T* yr = y + r * half;
        for (int64_t c = 0; c < half; ++c) {
          yr[c] = FromFloat<T>::apply(
              numerics::gated_forward(kind, to_float(xr[c]), to_float(xr[half + c]), a.limit, a.alpha));
        }
      } else {
        T* yr = y + r * k;
        for (int64_t c = 0; c < k; ++c) yr[c] = FromFloat<T>::apply(numerics::activation_forward(kind, to_float(xr[c])));
      }
    }
  });
}

/*! dx of row r = act'(x)·dy, rounded to T. */
template <typename T, Activation kKind>
void backward_row(const ActivationArgs& a, int64_t r) {
  constexpr Activation kind = kKind;
  const bool gated = numerics::activation_is_gated(kind);
  const int64_t k = a.cols, half = k / 2;
  const T* xr = static_cast<const T*>(a.x->data) + r * k;
  T* dxr = static_cast<T*>(a.out->data) + r * k;
  if (gated) {
    const T* dyr = static_cast<const T*>(a.dy->data) + r * half;
    for (int64_t c = 0; c < half; ++c) {
      const numerics::GatedGrad g = numerics::gated_backward(kind, to_float(xr[c]), to_float(xr[half + c]),
                                                             to_float(dyr[c]), a.limit, a.alpha);
      dxr[c] = FromFloat<T>::apply(g.da);
      dxr[half + c] = FromFloat<T>::apply(g.db);
    }
  } else {
    const T* dyr = static_cast<const T*>(a.dy->data) + r * k;
    for (int64_t c = 0; c < k; ++c) {
      dxr[c] = FromFloat<T>::apply(numerics::activation_backward(kind, to_float(xr[c]), to_float(dyr[c])));
    }
  }
}

template <typename T, Activation kKind>
void backward_typed(const ActivationArgs& a) {
  parallel_for(a.rows, a.rows * a.cols * 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) backward_row<T, kKind>(a, r);
  });
}

/*! lane[c] = fl(lane[c] + v[c]) for c < n: one row's terms of the canonical column sums. */
template <typename T>
void accumulate_lane(float* __restrict__ lane, const T* __restrict__ v, int64_t n) {
  for (int64_t c = 0; c < n; ++c) lane[c] = lane[c] + to_float(v[c]);
}

/*! dx = act'(x)·dy and dbias = Σc over rows of dx (as stored): lane l (a worker's unit) computes
 *  rows l, l+32, ... in order, adding each stored dx row to its own partial sums, so each lane's
 *  sum is sequential in the row index and the 32 lanes fold as numerics::canonical_fold — the
 *  bytes of activation_backward followed by the bias family's column sum, in one pass. */
template <typename T, typename U, Activation kKind>
void backward_dbias_typed(const ActivationArgs& a) {
  const int64_t k = a.cols, rows = a.rows;
  constexpr int64_t kLanes = numerics::kSumLanes;
  const int64_t lanes = std::min<int64_t>(kLanes, rows);
  std::vector<float> partials(static_cast<size_t>(kLanes * k), 0.0f);
  parallel_for(lanes, rows * k * 8, [&](int64_t lane_begin, int64_t lane_end) {
    for (int64_t lane = lane_begin; lane < lane_end; ++lane) {
      for (int64_t r = lane; r < rows; r += kLanes) {
        backward_row<T, kKind>(a, r);
        accumulate_lane(partials.data() + lane * k, static_cast<const T*>(a.out->data) + r * k, k);
      }
    }
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
        backward_dbias_typed<decltype(tag), decltype(bias_tag), decltype(kind)::value>(a);
      });
      return kTweSuccess;
    });
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
