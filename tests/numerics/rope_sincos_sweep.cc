// Error sweep of numerics::rope_sincos (csrc/include/twinengine/numerics_rope.h) against libm's
// double sin / cos rounded to fp32 (the correctly rounded result up to double-rounding cases far
// rarer than this sweep can meet), over every fp32 angle with |θ| < 2^24 (the range of the stated
// bound, docs/attention.md §10), every `stride`-th bit pattern.
//
//   g++ -O2 -ffp-contract=off -I csrc/include tests/numerics/rope_sincos_sweep.cc -o sweep
//   ./sweep [stride]      # stride 1 = every fp32 angle in (-2^24, 2^24)
//
// Prints, per function: angles checked, the largest distance in fp32 values from the correctly
// rounded result, how many results are not correctly rounded, and the worst angle; then a check
// of the special angles (±0 keep their sign in sin, cos(±0) = 1, NaN / ±inf give NaN, results for
// |θ| >= 2^24 finite and in [-1, 1]). Exit status 1 if a distance exceeds 1 or a special is wrong.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>

#include "twinengine/numerics_rope.h"

namespace {

using twe::numerics::bits_to_float;
using twe::numerics::float_to_bits;

int64_t ordinal(float f) {
  const uint32_t u = float_to_bits(f);
  return (u >> 31) ? -static_cast<int64_t>(u & 0x7FFFFFFFu) : static_cast<int64_t>(u);
}

struct Stats {
  uint64_t checked = 0, not_rounded = 0;
  int64_t max_distance = 0;
  float worst = 0.0f;
  void add(float angle, float got, float want) {
    ++checked;
    const int64_t dist = std::llabs(ordinal(got) - ordinal(want));
    if (dist != 0) ++not_rounded;
    if (dist > max_distance) {
      max_distance = dist;
      worst = angle;
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  const uint64_t stride = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1;
  Stats sin_stats, cos_stats;
  const uint32_t limit = 0x4B800000u;  // 2^24
  for (uint64_t u = 0; u < limit; u += stride) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      const float a = bits_to_float(static_cast<uint32_t>(u) | sign);
      const twe::numerics::RopeSinCos sc = twe::numerics::rope_sincos(a);
      sin_stats.add(a, sc.sin, static_cast<float>(std::sin(static_cast<double>(a))));
      cos_stats.add(a, sc.cos, static_cast<float>(std::cos(static_cast<double>(a))));
    }
  }
  int bad = 0;
  auto special = [&](float a, bool ok, const char* what) {
    if (!ok) {
      std::printf("special %s wrong at %a\n", what, static_cast<double>(a));
      ++bad;
    }
  };
  const twe::numerics::RopeSinCos pz = twe::numerics::rope_sincos(0.0f), nz = twe::numerics::rope_sincos(-0.0f);
  special(0.0f, float_to_bits(pz.sin) == 0u && pz.cos == 1.0f, "+0");
  special(-0.0f, float_to_bits(nz.sin) == 0x80000000u && nz.cos == 1.0f, "-0");
  for (float a : {NAN, INFINITY, -INFINITY}) {
    const twe::numerics::RopeSinCos sc = twe::numerics::rope_sincos(a);
    special(a, std::isnan(sc.sin) && std::isnan(sc.cos), "non-finite");
  }
  for (uint32_t u = limit; u < 0x7F800000u; u += 0x10001u) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      const float a = bits_to_float(u | sign);
      const twe::numerics::RopeSinCos sc = twe::numerics::rope_sincos(a);
      special(a, std::fabs(sc.sin) <= 1.0f && std::fabs(sc.cos) <= 1.0f, "large angle range");
    }
  }
  for (auto* s : {&sin_stats, &cos_stats}) {
    std::printf("%s checked %llu max distance from correctly rounded %lld ulp, not correctly rounded %llu, "
                "worst angle %.9g\n", s == &sin_stats ? "sin" : "cos", static_cast<unsigned long long>(s->checked),
                static_cast<long long>(s->max_distance), static_cast<unsigned long long>(s->not_rounded),
                static_cast<double>(s->worst));
  }
  std::printf("bad specials %d\n", bad);
  return (sin_stats.max_distance > 1 || cos_stats.max_distance > 1 || bad) ? 1 : 0;
}
