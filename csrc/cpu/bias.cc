// CPU kernels of the bias family: loops only; the adds and the canonical column sum follow
// numerics.h (add_f32, scale_f32, the Σc lane / fold order), as the CUDA kernels do.
#include <algorithm>
#include <vector>

#include "internal/bias.h"
#include "internal/cpu.h"

namespace twe {
namespace cpu {
namespace {

template <typename T, typename U>
void elementwise_typed(const BiasArgs& a) {
  const T* x = static_cast<const T*>(a.a->data);
  const U* b = a.b ? static_cast<const U*>(a.b->data) : nullptr;
  T* out = static_cast<T*>(a.out->data);
  const int64_t k = a.cols;
  parallel_for(a.rows, a.rows * k * 2, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * k;
      T* yr = out + r * k;
      if (a.op == BiasOp::kAddBias) {
        for (int64_t c = 0; c < k; ++c) yr[c] = FromFloat<T>::apply(numerics::add_f32(to_float(xr[c]), to_float(b[c])));
      } else if (a.op == BiasOp::kAddResidual) {
        const U* br = b + r * k;
        for (int64_t c = 0; c < k; ++c) yr[c] = FromFloat<T>::apply(numerics::add_f32(to_float(xr[c]), to_float(br[c])));
      } else {
        for (int64_t c = 0; c < k; ++c) yr[c] = FromFloat<T>::apply(numerics::scale_f32(to_float(xr[c]), a.c));
      }
    }
  });
}

/*! Σc over rows of each column in [begin, end): lane l = row mod 32 accumulates rows in order,
 *  then numerics::canonical_fold. */
template <typename T, typename U>
void grad_typed(const BiasArgs& a) {
  const T* dy = static_cast<const T*>(a.a->data);
  U* db = static_cast<U*>(a.out->data);
  const int64_t k = a.cols, rows = a.rows;
  parallel_for(k, rows * k * 2, [&](int64_t begin, int64_t end) {
    constexpr int64_t kTile = 256;
    const int64_t lanes = numerics::kSumLanes;
    std::vector<float> partials(static_cast<size_t>(lanes * kTile));
    float fold[numerics::kSumLanes];
    for (int64_t c0 = begin; c0 < end; c0 += kTile) {
      const int64_t w = std::min(kTile, end - c0);
      std::fill(partials.begin(), partials.end(), 0.0f);
      for (int64_t r = 0; r < rows; ++r) {
        float* lane = partials.data() + (r % lanes) * kTile;
        const T* row = dy + r * k + c0;
        for (int64_t c = 0; c < w; ++c) lane[c] = lane[c] + to_float(row[c]);
      }
      for (int64_t c = 0; c < w; ++c) {
        for (int64_t l = 0; l < lanes; ++l) fold[l] = partials[l * kTile + c];
        db[c0 + c] = FromFloat<U>::apply(numerics::canonical_fold(fold));
      }
    }
  });
}

}  // namespace

TweStatus bias_elementwise(const BiasArgs& a) {
  const TweDType other = a.b ? a.b->dtype : a.a->dtype;
  return dispatch_high_precision(a.a->dtype, [&](auto t) {
    return dispatch_high_precision(other, [&](auto u) {
      elementwise_typed<decltype(t), decltype(u)>(a);
      return kTweSuccess;
    });
  });
}

TweStatus bias_grad(const BiasArgs& a) {
  return dispatch_high_precision(a.a->dtype, [&](auto t) {
    return dispatch_high_precision(a.out->dtype, [&](auto u) {
      grad_typed<decltype(t), decltype(u)>(a);
      return kTweSuccess;
    });
  });
}

}  // namespace cpu
}  // namespace twe
