/*! \file numerics_rope.h
 *  \brief The value math of the rotary position embedding (docs/numerics.md, "Rotary position
 *  embedding"): part of numerics.h's rules (same conventions: TWE_HOST_DEVICE inline, no FMA
 *  contraction), kept in its own header so that only the rope kernels include it.
 */
#ifndef TWINENGINE_NUMERICS_ROPE_H_
#define TWINENGINE_NUMERICS_ROPE_H_

#include "twinengine/numerics.h"

namespace twe {
namespace numerics {

// ---------------------------------------------------------------------------------------
// Rotary position embedding (docs/numerics.md, "Rotary position embedding"): cos / sin of an
// fp32 angle evaluated in IEEE binary64 with +, −, × only (plus exact fmod above 2^24), then
// rounded once to fp32 — the same double operations on CPU and CUDA (no FMA: -ffp-contract=off
// / --fmad=false), so every device and both frontends give the same bytes.
// ---------------------------------------------------------------------------------------

/*! cos and sin of one angle, each rounded (RNE) to fp32. */
struct RopeSinCos {
  float sin;
  float cos;
};

/*! v rounded to the nearest integer, ties to even, for |v| < 2^51 (add and subtract 1.5·2^52). */
TWE_HOST_DEVICE double rope_round_integer(double v) {
  const double magic = 6755399441055744.0;  // 1.5 * 2^52
  const double shifted = v + magic;
  return shifted - magic;
}

/*! sin / cos of the fp32 `angle`:
 *   1. a = double(angle) (exact). NaN or ±inf -> both NaN.
 *   2. |a| < 2^-27: sin = angle, cos = 1 (fdlibm's small-argument path; sin(±0) = ±0).
 *      |a| >= 2^24: a = fmod(a, 2π_d) (exact; 2π_d = 0x401921FB54442D18), else unchanged.
 *   3. k = round_integer(fl(a · 2/π_d)); r = fl(fl(fl(a − k·P1) − k·P2) − k·P3) with π/2 split
 *      into P1, P2 of 28 significant bits (k·P1, k·P2 exact, a − k·P1 exact) and P3 the next
 *      53 bits.
 *   4. fdlibm's __kernel_sin / __kernel_cos polynomials of r (tail y = 0), Horner in double,
 *      selected and negated by quadrant k mod 4, then each rounded once to fp32.
 *  Error (|angle| < 2^24): the double value is within 2^-48 relative of the exact one, so the
 *  fp32 result is within 0.5 + 2^-24 ulp (the correctly rounded value unless the exact value
 *  lies within 2^-24 ulp of a rounding midpoint). */
TWE_HOST_DEVICE RopeSinCos rope_sincos(float angle) {
  const double nan = static_cast<double>(bits_to_float(0x7FC00000u));
  double a = static_cast<double>(angle);
  if (!(a - a == 0.0)) return RopeSinCos{static_cast<float>(nan), static_cast<float>(nan)};
  if (a >= 16777216.0 || a <= -16777216.0) {
#if defined(__CUDA_ARCH__)
    a = fmod(a, 6.28318530717958623200e+00);
#else
    a = std::fmod(a, 6.28318530717958623200e+00);
#endif
  }
  // |a| < 2^-27 (fdlibm's small-argument path; also keeps sin(±0) = ±0): sin = a, cos = 1.
  if (a < 7.450580596923828125e-09 && a > -7.450580596923828125e-09) return RopeSinCos{angle, 1.0f};
  const double two_over_pi = 6.36619772367581382433e-01;
  const double p1 = 1.57079632580280303955e+00;  // 0x3FF921FB54000000
  const double p2 = 9.92093573959351656958e-10;  // 0x3E110B4610000000
  const double p3 = 5.72118872610983179676e-18;  // 0x3C5A62633145C06E
  const double scaled = a * two_over_pi;
  const double k = rope_round_integer(scaled);
  const double kp1 = k * p1;
  const double t1 = a - kp1;
  const double kp2 = k * p2;
  const double t2 = t1 - kp2;
  const double kp3 = k * p3;
  const double r = t2 - kp3;
  const double z = r * r;
  // __kernel_sin(r, 0, 0) = r + r³·(S1 + z·(S2 + z·(S3 + z·(S4 + z·(S5 + z·S6)))))
  double ps = 1.58969099521155010221e-10;
  ps = ps * z; ps = ps + -2.50507602534068634195e-08;
  ps = ps * z; ps = ps + 2.75573137070700676789e-06;
  ps = ps * z; ps = ps + -1.98412698298579493134e-04;
  ps = ps * z; ps = ps + 8.33333333332248946124e-03;
  const double zps = z * ps;
  const double s1 = -1.66666666666666324348e-01 + zps;
  const double v = z * r;
  const double vs = v * s1;
  const double sin_r = r + vs;
  // __kernel_cos(r, 0) = w + (((1 − w) − z/2) + z·q), w = 1 − z/2, q = z·(C1 + z·(... C6))
  double pc = -1.13596475577881948265e-11;
  pc = pc * z; pc = pc + 2.08757232129817482790e-09;
  pc = pc * z; pc = pc + -2.75573143513906633035e-07;
  pc = pc * z; pc = pc + 2.48015872894767294178e-05;
  pc = pc * z; pc = pc + -1.38888888888741095749e-03;
  pc = pc * z; pc = pc + 4.16666666666666019037e-02;
  const double q = z * pc;
  const double hz = 0.5 * z;
  const double w = 1.0 - hz;
  const double one_minus_w = 1.0 - w;
  const double corr = one_minus_w - hz;
  const double zq = z * q;
  const double tail = corr + zq;
  const double cos_r = w + tail;
  const int quadrant = static_cast<int>(static_cast<int64_t>(k) & 3);
  double s, c;
  if (quadrant == 0) { s = sin_r; c = cos_r; }
  else if (quadrant == 1) { s = cos_r; c = -sin_r; }
  else if (quadrant == 2) { s = -sin_r; c = -cos_r; }
  else { s = -cos_r; c = sin_r; }
  return RopeSinCos{static_cast<float>(s), static_cast<float>(c)};
}

/*! One rotated channel: fl(fl(x · c) + fl(other · s)) (forward: other = −x of the partner
 *  channel and s its own sine; backward: other = ±dy of the partner and s the partner's sine). */
TWE_HOST_DEVICE float rope_rotate(float x, float c, float other, float s) {
  const float a = x * c;
  const float b = other * s;
  return a + b;
}

}  // namespace numerics
}  // namespace twe

#endif  // TWINENGINE_NUMERICS_ROPE_H_
