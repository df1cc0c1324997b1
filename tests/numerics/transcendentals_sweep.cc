// Error sweep of the portable fp32 exp / tanh of csrc/include/twinengine/numerics.h against
// libm's double-precision exp / tanh (the reference; rounded to fp32 it is the correctly
// rounded result except in double-rounding cases far rarer than this sweep can meet).
//
//   g++ -O2 -ffp-contract=off -I csrc/include tests/numerics/transcendentals_sweep.cc -o sweep
//   ./sweep [stride]      # stride 1 = every one of the 2^32 fp32 bit patterns
//
// Prints, per function: inputs checked, the largest distance in ulps from the correctly rounded
// fp32 result (an integer: how many fp32 values lie between), the largest error in ulps of the
// exact value (ulp taken at the exact result, subnormal ulp 2^-149), how many results are not
// correctly rounded, and the worst input. Exit status 1 if a distance exceeds 2 ulps or a
// special value (NaN, ±inf, overflow, underflow, ±0) is wrong.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "twinengine/numerics.h"

namespace {

using twe::numerics::bits_to_float;
using twe::numerics::float_to_bits;

/*! Position of an fp32 value on the integer line of ordered floats (-0 and +0 coincide). */
int64_t ordinal(float f) {
  const uint32_t u = float_to_bits(f);
  return (u >> 31) ? -static_cast<int64_t>(u & 0x7FFFFFFFu) : static_cast<int64_t>(u);
}

struct Stats {
  const char* name;
  uint64_t checked = 0, not_cr = 0, special_bad = 0;
  int64_t max_dist = 0;
  double max_ulp = 0.0;
  uint32_t worst_dist_input = 0, worst_ulp_input = 0;
};

void check(Stats& s, uint32_t bits, float got, double exact) {
  const float cr = static_cast<float>(exact);
  ++s.checked;
  if (std::isnan(exact) || std::isnan(cr)) {
    if (!std::isnan(got)) ++s.special_bad;
    return;
  }
  if (std::isinf(cr) || std::isinf(got) || cr == 0.0f || got == 0.0f) {
    if (got != cr || (cr == 0.0f && std::signbit(got) != std::signbit(cr))) {
      // Zeros and infinities must match exactly, except a result one ulp from the boundary.
      const int64_t d = std::llabs(ordinal(got) - ordinal(cr));
      if (d > 2) ++s.special_bad;
      if (d > s.max_dist) { s.max_dist = d; s.worst_dist_input = bits; }
      if (d) ++s.not_cr;
    }
    return;
  }
  const int64_t d = std::llabs(ordinal(got) - ordinal(cr));
  if (d) ++s.not_cr;
  if (d > s.max_dist) { s.max_dist = d; s.worst_dist_input = bits; }
  int e;
  std::frexp(std::fabs(exact), &e);  // |exact| in [2^(e-1), 2^e)
  const double ulp = std::ldexp(1.0, (e - 1 < -126 ? -126 : e - 1) - 23);
  const double err = std::fabs(static_cast<double>(got) - exact) / ulp;
  if (err > s.max_ulp) { s.max_ulp = err; s.worst_ulp_input = bits; }
}

void report(const Stats& s) {
  std::printf("%-5s checked %llu  max distance from correctly rounded %lld ulp (x = %a)  "
              "max error %.4f ulp (x = %a)  not correctly rounded %llu (%.4f%%)  bad specials %llu\n",
              s.name, static_cast<unsigned long long>(s.checked), static_cast<long long>(s.max_dist),
              bits_to_float(s.worst_dist_input), s.max_ulp, bits_to_float(s.worst_ulp_input),
              static_cast<unsigned long long>(s.not_cr), 100.0 * s.not_cr / (s.checked ? s.checked : 1),
              static_cast<unsigned long long>(s.special_bad));
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t stride = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1;
  Stats exp_stats{"exp"}, tanh_stats{"tanh"};
  for (uint64_t b = 0; b <= 0xFFFFFFFFull; b += stride) {
    const uint32_t bits = static_cast<uint32_t>(b);
    const float x = bits_to_float(bits);
    check(exp_stats, bits, twe::numerics::exp_f32(x), std::exp(static_cast<double>(x)));
    check(tanh_stats, bits, twe::numerics::tanh_f32(x), std::tanh(static_cast<double>(x)));
  }
  // Edge inputs always checked, whatever the stride.
  const uint32_t edges[] = {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00000u,
                            0x00000001u, 0x80000001u, 0x42B17217u, 0x42B17218u, 0xC2CFF1B5u, 0xC2CFF1B6u,
                            0xC2AEAC50u, 0xC2AEAC4Fu, 0x3F200000u, 0x3F1FFFFFu, 0x41100000u, 0x7F7FFFFFu};
  for (uint32_t bits : edges) {
    const float x = bits_to_float(bits);
    check(exp_stats, bits, twe::numerics::exp_f32(x), std::exp(static_cast<double>(x)));
    check(tanh_stats, bits, twe::numerics::tanh_f32(x), std::tanh(static_cast<double>(x)));
  }
  report(exp_stats);
  report(tanh_stats);
  const bool ok = exp_stats.max_dist <= 2 && tanh_stats.max_dist <= 2 && exp_stats.special_bad == 0 &&
                  tanh_stats.special_bad == 0;
  return ok ? 0 : 1;
}
