// CPU kernel of the rope family: a per-call table of numerics::rope_sincos for every (position,
// rotary channel) used, then one loop over rows applying numerics::rope_rotate (the CUDA kernel
// computes the same values per element).
#include <vector>

#include "internal/cpu.h"
#include "internal/rope.h"

namespace twe {
namespace cpu {
namespace {

template <typename T>
void apply_typed(const RopeArgs& a, const std::vector<int64_t>& position, const std::vector<float>& table) {
  const T* x = static_cast<const T*>(a.x->data);
  T* out = static_cast<T*>(a.out->data);
  const int64_t rows = a.tokens * a.heads, d = a.d, d2 = a.d2;
  parallel_for(rows, rows * d * 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * d;
      T* yr = out + r * d;
      const int64_t p = position[static_cast<size_t>(r / a.heads)];
      int64_t first_copied = d2;
      if (p < 0) first_copied = 0;
      else {
        const float* sc = table.data() + p * d2 * 2;  // (sin, cos) per channel
        for (int64_t i = 0; i < d2; ++i) {
          int64_t j;
          bool negate;
          rope_partner(i, d2, a.interleaved, a.backward, &j, &negate);
          const float xi = to_float(xr[i]);
          const float xj = to_float(xr[j]);
          const float other = negate ? -xj : xj;
          const float s = sc[2 * (a.backward ? j : i)];
          yr[i] = FromFloat<T>::apply(numerics::rope_rotate(xi, sc[2 * i + 1], other, s));
        }
      }
      for (int64_t i = first_copied; i < d; ++i) yr[i] = xr[i];
    }
  });
}

}  // namespace

TweStatus rope_apply(const RopeArgs& a) {
  // Position of every token (-1: outside every sequence, copied).
  std::vector<int64_t> position(static_cast<size_t>(a.tokens), -1);
  int64_t positions = 0;
  if (a.format == kTweRopeThd) {
    for (int64_t b = 0; b < a.batch; ++b) {
      for (int64_t t = a.cu_seqlens[b]; t < a.cu_seqlens[b + 1]; ++t) position[static_cast<size_t>(t)] = t - a.cu_seqlens[b];
      const int64_t len = a.cu_seqlens[b + 1] - a.cu_seqlens[b];
      if (len > positions) positions = len;
    }
  } else {
    for (int64_t t = 0; t < a.tokens; ++t) {
      position[static_cast<size_t>(t)] = a.format == kTweRopeSbhd ? t / a.batch : t % a.seq;
    }
    positions = a.seq;
  }
  std::vector<float> table(static_cast<size_t>(positions * a.d2 * 2));
  parallel_for(positions, positions * a.d2 * 64, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      for (int64_t i = 0; i < a.d2; ++i) {
        const numerics::RopeSinCos sc = numerics::rope_sincos(a.freqs[p * a.d2 + i]);
        table[static_cast<size_t>((p * a.d2 + i) * 2)] = sc.sin;
        table[static_cast<size_t>((p * a.d2 + i) * 2 + 1)] = sc.cos;
      }
    }
  });
  return dispatch_high_precision(a.x->dtype, [&](auto t) {
    apply_typed<decltype(t)>(a, position, table);
    return kTweSuccess;
  });
}

}  // namespace cpu
}  // namespace twe
