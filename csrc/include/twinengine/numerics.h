/*! \file numerics.h
 *  \brief The one place where twinengine's value math lives (NUMERICS.md).
 *
 *  Every function is `TWE_HOST_DEVICE inline`: the CPU kernels (C++17) and the CUDA kernels
 *  include this header, so both produce identical bytes. Element casts, scale-from-amax,
 *  E8M0 / E4M3 scale encoding, bf16 / fp16 conversions live here; later families add the
 *  RHT and stochastic rounding. Kernels hold only loops and memory movement.
 *
 *  All arithmetic is IEEE fp32 round-to-nearest. Callers compile with
 *  `-ffp-contract=off` (host) / `--fmad=false` (device); the functions are also written so
 *  that no multiply feeds an add that could be contracted.
 */
#ifndef TWINENGINE_NUMERICS_H_
#define TWINENGINE_NUMERICS_H_

#include <stdint.h>

#if defined(__CUDACC__)
#define TWE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#include <cmath>
#include <cstring>
#define TWE_HOST_DEVICE inline
#endif

namespace twe {
namespace numerics {

constexpr float kFloatMax = 3.40282346638528859812e+38f;
constexpr float kBFloat16Max = 3.38953138925153547590e+38f;
constexpr float kFloat16Max = 65504.0f;
constexpr float kE4M3Max = 448.0f;
constexpr float kE5M2Max = 57344.0f;
constexpr float kE2M1Max = 6.0f;

// ---------------------------------------------------------------------------------------
// Bit access
// ---------------------------------------------------------------------------------------

TWE_HOST_DEVICE uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

TWE_HOST_DEVICE float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

TWE_HOST_DEVICE bool is_nan(float f) { return (float_to_bits(f) & 0x7FFFFFFFu) > 0x7F800000u; }
TWE_HOST_DEVICE bool is_inf(float f) { return (float_to_bits(f) & 0x7FFFFFFFu) == 0x7F800000u; }
TWE_HOST_DEVICE float abs_value(float f) { return bits_to_float(float_to_bits(f) & 0x7FFFFFFFu); }

/*! Round a value in [0, 2^22) to the nearest integer, ties to even. On the host, adding and
 *  subtracting 1.5·2^23 rounds in the FPU's round-to-nearest-even mode without a libm call
 *  (keeps the casts vectorizable); both steps are exact apart from that one rounding. */
TWE_HOST_DEVICE float round_half_even(float f) {
#if defined(__CUDA_ARCH__)
  return rintf(f);
#else
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  const float shifted = f + kMagic;  // IEEE semantics (no -ffast-math): not folded to f
  return shifted - kMagic;
#endif
}

// ---------------------------------------------------------------------------------------
// Amax: NaN-skipping running maximum of |x| (NUMERICS.md, "Amax")
// ---------------------------------------------------------------------------------------

/*! New running amax after seeing v: NaN is skipped, ±inf counts as +inf. */
TWE_HOST_DEVICE float amax_update(float running, float v) {
  const float a = abs_value(v);
  return a > running ? a : running;  // NaN compares false: skipped
}

/*! Integer key of |v| for amax reductions: ordering keys orders |v| (non-negative floats order
 *  as their bits), and NaN maps to 0 so it is skipped. amax = bits_to_float(max of keys). */
TWE_HOST_DEVICE uint32_t amax_key(float v) {
  const uint32_t a = float_to_bits(v) & 0x7FFFFFFFu;
  return a > 0x7F800000u ? 0u : a;
}

// ---------------------------------------------------------------------------------------
// High-precision element types (NUMERICS.md §1: widened exactly to fp32)
// ---------------------------------------------------------------------------------------

TWE_HOST_DEVICE float bf16_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

TWE_HOST_DEVICE float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1Fu) return bits_to_float(sign | 0x7F800000u | (mantissa << 13));
  if (exponent == 0) {
    // Subnormal: mantissa * 2^-24, exact in fp32.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-08f;
    return sign ? -magnitude : magnitude;
  }
  return bits_to_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

/*! fp32 -> bf16 bits, round to nearest even; NaN stays a (quiet) NaN. */
TWE_HOST_DEVICE uint16_t float_to_bf16(float f) {
  const uint32_t u = float_to_bits(f);
  if (is_nan(f)) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

/*! fp32 -> fp16 bits, round to nearest even, overflow to ±inf, subnormals kept. */
TWE_HOST_DEVICE uint16_t float_to_fp16(float f) {
  const uint32_t u = float_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to inf
  if (a < 0x38800000u) {
    // Below 2^-14: multiples of 2^-24; scaling by 2^24 is exact.
    const float scaled = bits_to_float(a) * 16777216.0f;
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(round_half_even(scaled)));
  }
  const uint32_t rounded = (a + 0xFFFu + ((a >> 13) & 1u)) >> 13;
  return static_cast<uint16_t>(sign | (rounded - (112u << 10)));
}

// ---------------------------------------------------------------------------------------
// FP8 element casts (NUMERICS.md §1)
// ---------------------------------------------------------------------------------------

enum class FP8Format { kE4M3 = 0, kE5M2 = 1 };

template <FP8Format F>
struct FP8Traits;

template <>
struct FP8Traits<FP8Format::kE4M3> {
  static constexpr int kMantissaBits = 3;
  static constexpr int kBias = 7;
  static constexpr uint8_t kMaxCode = 0x7E;           // 448
  static constexpr uint32_t kMaxBits = 0x43E00000u;   // 448.0f
  static constexpr uint32_t kMinNormalBits = 0x3C800000u;  // 2^-6
  static constexpr float kSubnormalInvStep = 512.0f;  // 1 / 2^-9
  static constexpr float kSubnormalStep = 0.001953125f;
  static constexpr float kMax = kE4M3Max;
};

template <>
struct FP8Traits<FP8Format::kE5M2> {
  static constexpr int kMantissaBits = 2;
  static constexpr int kBias = 15;
  static constexpr uint8_t kMaxCode = 0x7B;           // 57344
  static constexpr uint32_t kMaxBits = 0x47600000u;   // 57344.0f
  static constexpr uint32_t kMinNormalBits = 0x38800000u;  // 2^-14
  static constexpr float kSubnormalInvStep = 65536.0f;  // 1 / 2^-16
  static constexpr float kSubnormalStep = 1.52587890625e-05f;
  static constexpr float kMax = kE5M2Max;
};

/*! Saturating round-to-nearest-even cast of an fp32 value to an FP8 code.
 *  Finite overflow and ±inf become ±max; any NaN becomes 0x7F (both formats).
 *  Written with selects instead of early returns so CPU loops vectorize. */
template <FP8Format F>
TWE_HOST_DEVICE uint8_t float_to_fp8(float v) {
  using T = FP8Traits<F>;
  const uint32_t u = float_to_bits(v);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFFFFFFu;
  // Normal range: round the mantissa to kMantissaBits (ties to even), then rebias the exponent.
  constexpr int kShift = 23 - T::kMantissaBits;
  const uint32_t rounded = (a + ((1u << (kShift - 1)) - 1u) + ((a >> kShift) & 1u)) >> kShift;
  const uint32_t normal = rounded - (static_cast<uint32_t>(127 - T::kBias) << T::kMantissaBits);
  // Subnormal range: multiples of the subnormal step; the scaling is exact. Computed for every
  // input (clamped into range) and selected below, so no floating-point op sits in a branch.
  const uint32_t clamped = a < T::kMinNormalBits ? a : T::kMinNormalBits;
  const uint32_t subnormal =
      static_cast<uint32_t>(static_cast<int32_t>(round_half_even(bits_to_float(clamped) * T::kSubnormalInvStep)));
  uint32_t code = a < T::kMinNormalBits ? subnormal : normal;
  const bool saturate = (a >= T::kMaxBits) | (code > T::kMaxCode);  // incl. ±inf
  code = saturate ? static_cast<uint32_t>(T::kMaxCode) : code;
  code |= sign;
  return static_cast<uint8_t>(a > 0x7F800000u ? 0x7Fu : code);
}

/*! Exact value of an FP8 code (E4M3: 0x7F/0xFF NaN; E5M2: inf and NaN codes). */
template <FP8Format F>
TWE_HOST_DEVICE float fp8_to_float(uint8_t code) {
  using T = FP8Traits<F>;
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  const uint32_t exponent = (code & 0x7Fu) >> T::kMantissaBits;
  const uint32_t mantissa = code & ((1u << T::kMantissaBits) - 1u);
  if (F == FP8Format::kE4M3 && (code & 0x7Fu) == 0x7Fu) return bits_to_float(0x7FC00000u);
  if (F == FP8Format::kE5M2 && exponent == 0x1Fu) {
    return bits_to_float(sign | (mantissa ? 0x7FC00000u : 0x7F800000u));
  }
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * T::kSubnormalStep;
    return sign ? -magnitude : magnitude;
  }
  return bits_to_float(sign | ((exponent + 127u - T::kBias) << 23) | (mantissa << (23 - T::kMantissaBits)));
}

// ---------------------------------------------------------------------------------------
// Scale from amax (NUMERICS.md §2)
// ---------------------------------------------------------------------------------------

/*! Encode scale s for amax `amax`: max(amax, eps); 0 / inf / NaN -> 1; M / amax;
 *  +inf -> inf_value; optional power-of-two truncation. */
TWE_HOST_DEVICE float scale_from_amax(float amax, float format_max, float epsilon, bool pow2, float inf_value) {
  if (amax < epsilon) amax = epsilon;  // a NaN amax stays NaN
  if (amax == 0.0f || is_inf(amax) || is_nan(amax)) return 1.0f;
  float scale = format_max / amax;
  if (is_inf(scale)) scale = inf_value;
  if (pow2) scale = bits_to_float(float_to_bits(scale) & 0xFF800000u);
  return scale;
}

// ---------------------------------------------------------------------------------------
// Delayed scaling update (NUMERICS.md §3)
// ---------------------------------------------------------------------------------------

/*! s' = fl(M * 2^-margin) / a* when a* is finite and > 0, else s; +inf -> FLT_MAX. */
TWE_HOST_DEVICE float delayed_scale_update(float scale, float amax_star, float format_max, int margin) {
  if (!(amax_star > 0.0f) || is_inf(amax_star)) return scale;
  // 2^-margin built from bits (exact for margins in the normal range).
  int exponent = 127 - margin;
  if (exponent < 1) exponent = 1;
  if (exponent > 254) exponent = 254;
  const float numerator = format_max * bits_to_float(static_cast<uint32_t>(exponent) << 23);
  float next = numerator / amax_star;
  if (is_inf(next)) next = kFloatMax;
  return next;
}

// ---------------------------------------------------------------------------------------
// MXFP8 E8M0 block scales (NUMERICS.md §5)
// ---------------------------------------------------------------------------------------

/*! E8M0 code of v rounded up to a power of two ("RCEIL"). */
TWE_HOST_DEVICE uint8_t e8m0_round_up(float v) {
  if (is_nan(v)) return 255;
  if (v == 0.0f) return 0;
  if (is_inf(v)) return 254;
  const uint32_t u = float_to_bits(v) & 0x7FFFFFFFu;
  const uint32_t exponent = u >> 23;
  if (exponent == 0) return u <= 0x00400000u ? 0 : 1;  // subnormal: <= 2^-127 -> 0
  const uint32_t e = exponent + ((u & 0x7FFFFFu) != 0u ? 1u : 0u);
  return static_cast<uint8_t>(e > 254u ? 254u : e);
}

/*! E8M0 code of a block with amax `block_amax`: v = fl(amax * fl(1/M)), rounded up. */
template <FP8Format F>
TWE_HOST_DEVICE uint8_t mxfp8_block_exponent(float block_amax) {
  constexpr float kInvMax = 1.0f / FP8Traits<F>::kMax;
  return e8m0_round_up(block_amax * kInvMax);
}

/*! Encode multiplier 2^(127 - e), built exactly from bits (2^-127 is subnormal). */
TWE_HOST_DEVICE float e8m0_encode_multiplier(uint8_t e) {
  if (e >= 254) return bits_to_float(0x00400000u);
  return bits_to_float(static_cast<uint32_t>(254u - e) << 23);
}

/*! Decode value 2^(e - 127) of an E8M0 code; 255 is NaN, 0 is 2^-127. */
TWE_HOST_DEVICE float e8m0_to_float(uint8_t e) {
  if (e == 255) return bits_to_float(0x7FC00000u);
  if (e == 0) return bits_to_float(0x00400000u);
  return bits_to_float(static_cast<uint32_t>(e) << 23);
}

// ---------------------------------------------------------------------------------------
// MoE permutation sums (NUMERICS.md §10)
// ---------------------------------------------------------------------------------------

/*! One term of an unpermute / probs-gradient sum: fl(acc + fl(v · w)), never fused. */
TWE_HOST_DEVICE float weighted_accumulate(float acc, float v, float w) {
  const float product = v * w;
  return acc + product;
}

}  // namespace numerics
}  // namespace twe

#endif  // TWINENGINE_NUMERICS_H_
