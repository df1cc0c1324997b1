// CPU kernels of the dropout family: loops only; the Philox draw, the keep test and the
// scaling are numerics.h's (dropout_mask_byte / dropout_apply), shared with the CUDA kernels.
#include "internal/cpu.h"
#include "internal/dropout.h"

namespace twe {
namespace cpu {
namespace {

uint32_t rng_word(const TweTensorView& rng, int index) {
  if (rng.dtype == kTweInt64) return static_cast<uint32_t>(static_cast<const int64_t*>(rng.data)[index]);
  return static_cast<const uint32_t*>(rng.data)[index];  // uint32, or int32 read as its bits
}

template <typename T>
void apply_typed(const DropoutArgs& a, bool draw) {
  const T* in = static_cast<const T*>(a.in->data);
  T* out = static_cast<T*>(a.out->data);
  uint8_t* mask = static_cast<uint8_t*>(a.mask->data);
  const float scale = numerics::dropout_scale(a.p);
  const uint64_t threshold = numerics::dropout_threshold(a.p);
  const uint32_t seed = draw ? rng_word(*a.rng, 0) : 0u, offset = draw ? rng_word(*a.rng, 1) : 0u;
  const int64_t bytes = ceil_div(a.n, 8);
  parallel_for(bytes, a.n * 16, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      const uint8_t bits = draw ? numerics::dropout_mask_byte(m, a.n, threshold, seed, offset) : mask[m];
      if (draw) mask[m] = bits;
      for (int64_t e = 0; e < 8 && m * 8 + e < a.n; ++e) {
        const int64_t i = m * 8 + e;
        out[i] = FromFloat<T>::apply(numerics::dropout_apply(to_float(in[i]), (bits >> e) & 1u, scale));
      }
    }
  });
}

}  // namespace

TweStatus dropout_forward(const DropoutArgs& a) {
  return dispatch_high_precision(a.in->dtype, [&](auto tag) {
    apply_typed<decltype(tag)>(a, true);
    return kTweSuccess;
  });
}

TweStatus dropout_backward(const DropoutArgs& a) {
  return dispatch_high_precision(a.in->dtype, [&](auto tag) {
    apply_typed<decltype(tag)>(a, false);
    return kTweSuccess;
  });
}

}  // namespace cpu
}  // namespace twe
