// CPU kernels of the activation family: loops only; the value math is numerics.h's
// (gated_forward / activation_backward / ...), shared with the CUDA kernels.
#include <type_traits>

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

template <typename T, Activation kKind>
void backward_typed(const ActivationArgs& a) {
  constexpr Activation kind = kKind;
  const T* x = static_cast<const T*>(a.x->data);
  const T* dy = static_cast<const T*>(a.dy->data);
  T* dx = static_cast<T*>(a.out->data);
  const bool gated = numerics::activation_is_gated(kind);
  const int64_t k = a.cols, half = k / 2;
  parallel_for(a.rows, a.rows * k * 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * k;
      T* dxr = dx + r * k;
      if (gated) {
        const T* dyr = dy + r * half;
        for (int64_t c = 0; c < half; ++c) {
          const numerics::GatedGrad g = numerics::gated_backward(kind, to_float(xr[c]), to_float(xr[half + c]),
                                                                 to_float(dyr[c]), a.limit, a.alpha);
          dxr[c] = FromFloat<T>::apply(g.da);
          dxr[half + c] = FromFloat<T>::apply(g.db);
        }
      } else {
        const T* dyr = dy + r * k;
        for (int64_t c = 0; c < k; ++c) {
          dxr[c] = FromFloat<T>::apply(numerics::activation_backward(kind, to_float(xr[c]), to_float(dyr[c])));
        }
      }
    }
  });
}

}  // namespace

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
