/*! \file numerics.h
 *  \brief The one place where twinengine's value math lives (NUMERICS.md).
 *
 *  Every function is `TWE_HOST_DEVICE inline`: the CPU kernels (C++17) and the CUDA kernels
 *  include this header, so both produce identical bytes. Element casts, scale-from-amax,
 *  E8M0 / E4M3 scale encoding, bf16 / fp16 conversions, the E2M1 (FP4) cast, NVFP4 scale
 *  math, the 16-point random Hadamard transform, Philox4x32-10 and stochastic rounding live
 *  here. Kernels hold only loops and memory movement.
 *
 *  All arithmetic is IEEE fp32 round-to-nearest. Callers compile with
 *  `-ffp-contract=off` (host) / `--fmad=false` (device); the functions are also written so
 *  that no multiply feeds an add that could be contracted.
 */
#ifndef TWINENGINE_NUMERICS_H_
#define TWINENGINE_NUMERICS_H_

#include <stdint.h>

#include <cmath>
#include <cstring>  // host side of float_to_bits / bits_to_float, also under nvcc

#if defined(__CUDACC__)
#define TWE_HOST_DEVICE __host__ __device__ __forceinline__
#else
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
 *  Written with selects instead of early returns so CPU loops vectorize. On sm_89 and newer
 *  the device uses the hardware conversion `cvt.rn.satfinite.{e4m3,e5m2}x2.f32`, which is the
 *  same rule (RNE, subnormal results kept, overflow and ±inf saturated to ±max) except that it
 *  may give a NaN either sign: the NaN code is forced to 0x7F. (The integer rule below costs
 *  ~20 half-rate integer ops per value: it would make the CUDA casts compute-bound.) */
template <FP8Format F>
TWE_HOST_DEVICE uint8_t float_to_fp8(float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t pair;  // both halves convert v: the packing order does not matter
  if (F == FP8Format::kE4M3) asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %1;" : "=h"(pair) : "f"(v));
  else asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %1;" : "=h"(pair) : "f"(v));
  return is_nan(v) ? static_cast<uint8_t>(0x7F) : static_cast<uint8_t>(pair & 0xFFu);
#else
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
#endif
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
// E2M1 (FP4) element cast (NUMERICS.md §1, §7 steps 5 and 9)
// ---------------------------------------------------------------------------------------

/*! Sign bit of an E2M1 code (set for negative values and -0.0). */
constexpr uint8_t kE2M1SignBit = 0x8;
/*! E2M1 code of +6, also the code of NaN (FP4 has no NaN). */
constexpr uint8_t kE2M1MaxCode = 0x7;

/*! E2M1 code (0..7) of the largest grid value {0, .5, 1, 1.5, 2, 3, 4, 6} that is <= m
 *  (m >= 0; +inf gives 7, the code of 6). */
TWE_HOST_DEVICE uint8_t e2m1_floor_code(float m) {
  return static_cast<uint8_t>((m >= 0.5f) + (m >= 1.0f) + (m >= 1.5f) + (m >= 2.0f) + (m >= 3.0f) + (m >= 4.0f) +
                              (m >= 6.0f));
}

/*! Round-to-nearest-even cast of v to an E2M1 code: |v| > 6 (and ±inf) -> ±6, NaN -> +6
 *  (0x7); the sign of zero is kept (-0.0 and negatives that round to 0 give 0x8). */
TWE_HOST_DEVICE uint8_t float_to_e2m1(float v) {
  if (is_nan(v)) return kE2M1MaxCode;
  const uint8_t sign = (float_to_bits(v) >> 31) ? kE2M1SignBit : 0;
  const float a = abs_value(v);
  // Count the midpoints between grid values that a lies above; at a midpoint (a tie) the
  // comparison is strict below an odd code and inclusive below an even one: ties to even.
  const int code = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
  return static_cast<uint8_t>(sign | code);
}

/*! Grid spacing of E2M1 at magnitude m (§7 step 9): 0.5 below 2, 1 in [2, 4), 2 from 4 on. */
TWE_HOST_DEVICE float e2m1_step(float magnitude) {
  const uint32_t exponent = 126u + (magnitude >= 2.0f) + (magnitude >= 4.0f);  // 2^-1, 2^0, 2^1
  return bits_to_float(exponent << 23);
}

/*! Stochastic rounding of v to an E2M1 code with one random byte k (§7 step 9):
 *  t = fl(|v| + (k/256)·step(|v|)) (the product is exact), q = min(floor(t/step(t))·step(t), 6)
 *  with the sign restored, NaN -> +6. floor(t/step(t))·step(t) is the largest grid value <= t
 *  for t < 8, and is >= 6 from t = 6 on, so q is the grid floor of t capped at 6. */
TWE_HOST_DEVICE uint8_t float_to_e2m1_stochastic(float v, uint8_t random_byte) {
  if (is_nan(v)) return kE2M1MaxCode;
  const uint8_t sign = (float_to_bits(v) >> 31) ? kE2M1SignBit : 0;
  const float a = abs_value(v);
  const float u = static_cast<float>(random_byte) * 0.00390625f;  // k / 256, exact
  const float increment = u * e2m1_step(a);                        // exact
  const float t = a + increment;
  return static_cast<uint8_t>(sign | e2m1_floor_code(t));
}

/*! Exact value of an E2M1 code (low 4 bits). */
TWE_HOST_DEVICE float e2m1_to_float(uint8_t code) {
  const uint8_t m = code & 0x7u;
  const float magnitude = m < 4 ? static_cast<float>(m) * 0.5f : (m < 6 ? static_cast<float>(m) - 2.0f
                                                                          : (m == 6 ? 4.0f : 6.0f));
  return (code & kE2M1SignBit) ? -magnitude : magnitude;
}

/*! One byte holding two E2M1 codes: the even-index element in the low nibble. */
TWE_HOST_DEVICE uint8_t pack_e2m1(uint8_t even, uint8_t odd) {
  return static_cast<uint8_t>((even & 0xFu) | ((odd & 0xFu) << 4));
}

// ---------------------------------------------------------------------------------------
// FP8 block scaling (NUMERICS.md §6)
// ---------------------------------------------------------------------------------------

/*! Block size of FP8 block scaling: 1×128 blocks, 128×128 tiles. */
constexpr int kFP8BlockSize = 128;

// ---------------------------------------------------------------------------------------
// NVFP4 scales (NUMERICS.md §7 steps 2–4 and 6)
// ---------------------------------------------------------------------------------------

/*! Elements per NVFP4 block (1×16; 16×16 tiles in 2D mode). */
constexpr int kNVFP4BlockSize = 16;
/*! 6 · 448: E2M1 max times E4M3 max. */
constexpr float kNVFP4GlobalMax = 2688.0f;

/*! Global encode scale S_enc = min(2688 / A, FLT_MAX); 1 when A == 0 or S_enc == 0 (A = +inf). */
TWE_HOST_DEVICE float nvfp4_global_encode_scale(float global_amax) {
  if (global_amax == 0.0f) return 1.0f;
  float s = kNVFP4GlobalMax / global_amax;
  if (s > kFloatMax) s = kFloatMax;
  return s == 0.0f ? 1.0f : s;
}

/*! Global decode scale S_dec = 1 / S_enc (NUMERICS.md §7 step 2; the GEMM's final factor, §8). */
TWE_HOST_DEVICE float nvfp4_global_decode_scale(float global_amax) {
  return 1.0f / nvfp4_global_encode_scale(global_amax);
}

/*! fl(S_enc · fl(1/6)): the factor turning a block amax into its decode scale (formed first). */
TWE_HOST_DEVICE float nvfp4_block_scale_factor(float s_enc) {
  constexpr float kInvE2M1Max = 1.0f / kE2M1Max;
  return s_enc * kInvE2M1Max;
}

/*! E4M3 code of the block decode scale d_b = RNE_sat_E4M3(fl(a_b · factor)). */
TWE_HOST_DEVICE uint8_t nvfp4_block_scale_code(float block_amax, float factor) {
  return float_to_fp8<FP8Format::kE4M3>(block_amax * factor);
}

/*! Encode multiplier m_b = min(1 / fl(float(d_b) · S_dec), FLT_MAX); d_b = 0 gives FLT_MAX. */
TWE_HOST_DEVICE float nvfp4_encode_multiplier(uint8_t scale_code, float s_dec) {
  const float denominator = fp8_to_float<FP8Format::kE4M3>(scale_code) * s_dec;
  const float m = 1.0f / denominator;
  return m > kFloatMax ? kFloatMax : m;
}

/*! Decode multiplier fl(fl(float(d_b) · A) · fl(1/2688)) of a block (§7 step 6). */
TWE_HOST_DEVICE float nvfp4_decode_multiplier(uint8_t scale_code, float global_amax) {
  constexpr float kInvGlobalMax = 1.0f / kNVFP4GlobalMax;
  const float scaled = fp8_to_float<FP8Format::kE4M3>(scale_code) * global_amax;
  return scaled * kInvGlobalMax;
}

// ---------------------------------------------------------------------------------------
// Random Hadamard transform (NUMERICS.md §7 step 8)
// ---------------------------------------------------------------------------------------

/*! Points of the RHT. */
constexpr int kRHTSize = 16;
/*! Bit i set <=> sign_i = -1. */
constexpr uint32_t kRHTSignMask = 0xD7E8u;

/*! Entry H[j][i] of H = (1/4)·diag(sign)·H16: ±0.25, with H16[j][i] = (-1)^popcount(i & j). */
TWE_HOST_DEVICE float rht_entry(int j, int i) {
  uint32_t parity = static_cast<uint32_t>(i & j);
  parity ^= parity >> 2;
  parity ^= parity >> 1;
  parity = (parity & 1u) ^ ((kRHTSignMask >> j) & 1u);
  return parity ? -0.25f : 0.25f;
}

/*! Output i of the RHT of one 16-element chunk x (x' = x·H): the exact products x_j·H[j][i]
 *  summed in index order j = 0..15 (acc = p_0; acc = fl(acc + p_j)), then rounded to bf16
 *  (RNE, subnormals kept) and returned widened to fp32. */
TWE_HOST_DEVICE float rht_output(const float* x, int i) {
  float acc = x[0] * rht_entry(0, i);
  for (int j = 1; j < kRHTSize; ++j) {
    const float product = x[j] * rht_entry(j, i);  // exact: times ±2^-2
    acc = acc + product;
  }
  return bf16_to_float(float_to_bf16(acc));
}

/*! All 16 outputs y[i] = rht_output(x, i) of one chunk. */
TWE_HOST_DEVICE void rht_chunk(const float* x, float* y) {
  for (int i = 0; i < kRHTSize; ++i) y[i] = rht_output(x, i);
}

// ---------------------------------------------------------------------------------------
// Philox4x32-10 and the stochastic-rounding random bytes (NUMERICS.md §7 step 9)
// ---------------------------------------------------------------------------------------

/*! Four 32-bit words: a Philox counter or output block. */
struct Philox4x32 {
  uint32_t x[4];
};

/*! Random123 Philox4x32-10 of `counter` under key (k0, k1). */
TWE_HOST_DEVICE Philox4x32 philox4x32_10(Philox4x32 c, uint32_t k0, uint32_t k1) {
  constexpr uint64_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    const uint64_t p0 = kM0 * c.x[0];
    const uint64_t p1 = kM1 * c.x[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = Philox4x32{{hi1 ^ c.x[1] ^ k0, lo1, hi0 ^ c.x[3] ^ k1, lo0}};
  }
  return c;
}

/*! The 16 random bytes of element group g = floor(i/16) of quantized copy `copy`
 *  (0 rowwise, 1 columnwise): Philox4x32-10 of counter (g mod 2^32, (floor(g/2^32) << 1) | copy,
 *  offset, 0) under key (seed, 0). Element i uses byte i mod 16 (sr_random_byte). */
TWE_HOST_DEVICE Philox4x32 sr_random_block(uint64_t group, uint32_t copy, uint32_t seed, uint32_t offset) {
  const Philox4x32 counter{{static_cast<uint32_t>(group), static_cast<uint32_t>((group >> 32) << 1) | copy, offset, 0u}};
  return philox4x32_10(counter, seed, 0u);
}

/*! Byte b (0..15) of a Philox output read as 16 little-endian bytes. */
TWE_HOST_DEVICE uint8_t sr_random_byte(const Philox4x32& words, int b) {
  return static_cast<uint8_t>((words.x[b >> 2] >> (8 * (b & 3))) & 0xFFu);
}

// ---------------------------------------------------------------------------------------
// MoE permutation sums (NUMERICS.md §10)
// ---------------------------------------------------------------------------------------

/*! One term of an unpermute / probs-gradient sum: fl(acc + fl(v · w)), never fused. */
TWE_HOST_DEVICE float weighted_accumulate(float acc, float v, float w) {
  const float product = v * w;
  return acc + product;
}

// ---------------------------------------------------------------------------------------
// Canonical 32-lane sum (NUMERICS.md §11)
// ---------------------------------------------------------------------------------------

/*! Lanes of the canonical sum: lane l adds v_l, v_{l+32}, v_{l+64}, ... sequentially. */
constexpr int kSumLanes = 32;

/*! Folds 32 lane partials by halves (p_l = fl(p_l + p_{l+16}) for l < 16, then +8, +4, +2, +1:
 *  a CUDA __shfl_down_sync tree) and returns p_0. `partials` is overwritten. */
TWE_HOST_DEVICE float canonical_fold(float* partials) {
  for (int half = kSumLanes / 2; half > 0; half >>= 1)
    for (int l = 0; l < half; ++l) partials[l] = partials[l] + partials[l + half];
  return partials[0];
}

/*! Σc of load(0) ... load(n-1) (NUMERICS.md §11): 32 fp32 lanes from +0, element i added to
 *  lane i mod 32 in index order, then canonical_fold. `load(i)` returns the fp32 term i. */
template <typename Load>
TWE_HOST_DEVICE float canonical_sum(int64_t n, Load load) {
  float partials[kSumLanes];
  for (int l = 0; l < kSumLanes; ++l) partials[l] = 0.0f;
  int64_t base = 0;
  for (; base + kSumLanes <= n; base += kSumLanes)
    for (int l = 0; l < kSumLanes; ++l) partials[l] = partials[l] + load(base + l);
  for (int l = 0; base + l < n; ++l) partials[l] = partials[l] + load(base + l);
  return canonical_fold(partials);
}

// ---------------------------------------------------------------------------------------
// Normalization (NUMERICS.md §11): one fp32 rounding per operation, no contraction
// ---------------------------------------------------------------------------------------

/*! Correctly rounded fp32 square root (IEEE; never an approximation). */
TWE_HOST_DEVICE float sqrt_rn(float v) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(v);
#else
  return std::sqrt(v);
#endif
}

/*! Correctly rounded fp32 reciprocal fl(1 / v). */
TWE_HOST_DEVICE float reciprocal_rn(float v) {
#if defined(__CUDA_ARCH__)
  return __frcp_rn(v);
#else
  return 1.0f / v;
#endif
}

/*! fl(v · v). */
TWE_HOST_DEVICE float square(float v) { return v * v; }

/*! A per-row mean of the norms: fl(sum / K), K converted to fp32 (exact for K < 2^24). */
TWE_HOST_DEVICE float norm_mean(float sum, int64_t k) { return sum / static_cast<float>(k); }

/*! rstd = fl(1 / fl(sqrt(fl(var + ε)))) with ε already an fp32 value (LayerNorm, RMSNorm, and
 *  L2Normalization with var the plain sum of squares). */
TWE_HOST_DEVICE float norm_rstd(float var, float eps) {
  const float shifted = var + eps;
  return reciprocal_rn(sqrt_rn(shifted));
}

/*! The gain applied to x̂: g' = γ, or fl(1 + γ) with zero-centered gamma. */
TWE_HOST_DEVICE float norm_gain(float gamma, bool zero_centered_gamma) {
  return zero_centered_gamma ? 1.0f + gamma : gamma;
}

/*! LayerNorm x̂ = fl(fl(x − μ) · rstd). */
TWE_HOST_DEVICE float layernorm_xhat(float x, float mu, float rstd) {
  const float d = x - mu;
  return d * rstd;
}

/*! LayerNorm y = fl(fl(x̂ · g') + β) (before rounding to the output dtype). */
TWE_HOST_DEVICE float layernorm_output(float xhat, float gain, float beta) {
  const float scaled = xhat * gain;
  return scaled + beta;
}

/*! RMSNorm y = fl(fl(x · rstd) · g') (before rounding to the output dtype). */
TWE_HOST_DEVICE float rmsnorm_output(float x, float rstd, float gain) {
  const float xhat = x * rstd;
  return xhat * gain;
}

/*! LayerNorm dx = fl(rstd · fl(fl(ĝ − a) − fl(x̂ · b))). */
TWE_HOST_DEVICE float layernorm_dx(float rstd, float ghat, float a, float xhat, float b) {
  const float centered = ghat - a;
  const float projection = xhat * b;
  const float diff = centered - projection;
  return rstd * diff;
}

/*! RMSNorm dx = fl(rstd · fl(ĝ − fl(x̂ · b))). */
TWE_HOST_DEVICE float rmsnorm_dx(float rstd, float ghat, float xhat, float b) {
  const float projection = xhat * b;
  const float diff = ghat - projection;
  return rstd * diff;
}

/*! L2Normalization dx = fl(rstd · fl(dy − fl(y · s))) with s = Σc fl(dy · y). */
TWE_HOST_DEVICE float l2norm_dx(float rstd, float dy, float y, float s) {
  const float projection = y * s;
  const float diff = dy - projection;
  return rstd * diff;
}

// ---------------------------------------------------------------------------------------
// Portable transcendentals (NUMERICS.md §11): the same fp32 code on CPU and CUDA, never
// libm, __expf or fast-math. Error bounds, measured exhaustively over every fp32 input
// against the correctly rounded result, are in docs/numerics_transcendentals.md.
// ---------------------------------------------------------------------------------------

/*! e^x in fp32 (fdlibm's e_expf algorithm, without FMA): x = k·ln2 + r with |r| <= ~0.35
 *  (ln2 split into an exact 15-bit head and a tail, so k·ln2_hi is exact), a rational
 *  approximation of e^r, then an exact scaling by 2^k (two steps below 2^-125, so a subnormal
 *  result is rounded once). NaN -> NaN, x > 88.7228394 -> +inf, x < -103.972084 -> +0. */
TWE_HOST_DEVICE float exp_f32(float x) {
  const float ln2_hi = bits_to_float(0x3F317200u);   // 6.9314575195e-01
  const float ln2_lo = bits_to_float(0x35BFBE8Eu);   // 1.4286067653e-06
  const float inv_ln2 = bits_to_float(0x3FB8AA3Bu);  // 1.4426950216e+00
  const float p1 = bits_to_float(0x3E2AAA8Fu);       // 1.6666625440e-01
  const float p2 = bits_to_float(0xBB355215u);       // -2.7667332906e-03
  if (is_nan(x)) return x + x;
  if (x > bits_to_float(0x42B17217u)) return bits_to_float(0x7F800000u);  // e^x > FLT_MAX
  if (x < bits_to_float(0xC2CFF1B5u)) return 0.0f;                        // e^x < 2^-150
  // k = round(x / ln2), ties away from zero (the float -> int conversion truncates).
  const float shifted = inv_ln2 * x;
  const int k = static_cast<int>(x < 0.0f ? shifted - 0.5f : shifted + 0.5f);
  const float kf = static_cast<float>(k);
  const float kh = kf * ln2_hi;  // exact: k has <= 8 bits, ln2_hi 15
  const float hi = x - kh;
  const float lo = kf * ln2_lo;
  const float r = hi - lo;
  const float t = r * r;
  const float pt = p2 * t;
  const float poly = p1 + pt;
  const float tp = t * poly;
  const float c = r - tp;
  const float rc = r * c;
  const float q = rc / (2.0f - c);
  const float inner = lo - q;
  const float y = 1.0f - (inner - hi);  // e^r in [0.7, 1.42]
  if (k >= -125) {
    if (k == 128) return y * 2.0f * bits_to_float(0x7F000000u);  // 2 · 2^127
    return y * bits_to_float(static_cast<uint32_t>(127 + k) << 23);
  }
  // 2^(k+100) (normal, exact product) then 2^-100: one rounding into the subnormals.
  const float scaled = y * bits_to_float(static_cast<uint32_t>(227 + k) << 23);
  return scaled * bits_to_float(0x0D800000u);  // 2^-100
}

/*! tanh(x) in fp32. |x| < 0.625: x + x³·P(x²) with a degree-5 polynomial P (fp32 Horner);
 *  otherwise sign(x)·(1 − 2/(e^{2|x|} + 1)) with exp_f32 (e^{2|x|} = +inf gives exactly 1).
 *  Odd: tanh(−x) = −tanh(x), tanh(±0) = ±0; NaN -> NaN; ±inf -> ±1. */
TWE_HOST_DEVICE float tanh_f32(float x) {
  const float a = abs_value(x);
  if (a < 0.625f) {
    const float s = x * x;
    float p = bits_to_float(0x3B0CBDBDu);            //  2.1475397e-03
    p = p * s; p = p + bits_to_float(0xBC0610A3u);   // -8.1826774e-03
    p = p * s; p = p + bits_to_float(0x3CB1CA6Du);   //  2.1702969e-02
    p = p * s; p = p + bits_to_float(0xBD5CF7BEu);   // -5.3947203e-02
    p = p * s; p = p + bits_to_float(0x3E088836u);   //  1.3333210e-01
    p = p * s; p = p + bits_to_float(0xBEAAAAAAu);   // -3.3333331e-01
    const float x3 = s * x;
    const float tail = x3 * p;
    return x + tail;
  }
  const float e = exp_f32(a + a);  // NaN stays NaN
  const float d = e + 1.0f;
  const float q = 2.0f / d;
  const float t = 1.0f - q;
  return (float_to_bits(x) >> 31) ? -t : t;
}

/*! σ(z) = 1 / (1 + exp(−z)), each step one fp32 rounding. */
TWE_HOST_DEVICE float sigmoid_f32(float z) {
  const float e = exp_f32(-z);
  const float d = 1.0f + e;
  return 1.0f / d;
}

// ---------------------------------------------------------------------------------------
// Activations and their derivatives (NUMERICS.md §11), fp32, one rounding per written step.
// ---------------------------------------------------------------------------------------

/*! Activation kinds; the numbering matches core/ops/activation.py ACTIVATION_KINDS. The gated
 *  kinds apply the base activation to the first half of the last dimension. */
enum class Activation {
  kGelu = 0, kGeglu = 1, kQGelu = 2, kQGeglu = 3, kRelu = 4, kReglu = 5,
  kSRelu = 6, kSReglu = 7, kSilu = 8, kSwiglu = 9, kClampedSwiglu = 10,
};

TWE_HOST_DEVICE bool activation_is_gated(Activation kind) {
  return kind == Activation::kGeglu || kind == Activation::kQGeglu || kind == Activation::kReglu ||
         kind == Activation::kSReglu || kind == Activation::kSwiglu || kind == Activation::kClampedSwiglu;
}

/*! GELU's tanh argument u = fl(fl(0.7978845608·x) · fl(1 + fl(0.044715 · fl(x·x)))). */
TWE_HOST_DEVICE float gelu_tanh_argument(float x) {
  const float x2 = x * x;
  const float cubic = 0.044715f * x2;
  const float inner = 1.0f + cubic;
  const float kx = 0.7978845608f * x;
  return kx * inner;
}

/*! ReLU: x for x > 0, +0 otherwise (−0 included); NaN propagates. */
TWE_HOST_DEVICE float relu_f32(float x) { return (x > 0.0f || is_nan(x)) ? x : 0.0f; }

/*! Value and derivative of a base (non-gated) activation at x, fp32. `alpha` is the sigmoid
 *  slope of the x·σ(alpha·x) family (1 for SiLU, 1.702 for QGELU, ClampedSwiGLU's alpha). */
struct ActivationValue {
  float value;
  float derivative;
};

/*! x·σ(alpha·x) and its derivative s + fl(fl(z·s)·fl(1 − s)) (z = fl(alpha·x), s = σ(z)). */
TWE_HOST_DEVICE ActivationValue sigmoid_linear(float x, float alpha) {
  const float z = alpha * x;
  const float s = sigmoid_f32(z);
  const float zs = z * s;
  const float one_minus = 1.0f - s;
  const float slope = zs * one_minus;
  return ActivationValue{x * s, slope + s};
}

/*! GELU (tanh form) value fl(fl(0.5·x)·fl(1 + t)) and derivative
 *  fl(fl(fl(0.5·x)·fl(fl(1 − fl(t·t))·fl(0.7978845608 + fl(0.1070322243·fl(x·x))))) + fl(0.5·fl(1 + t))). */
TWE_HOST_DEVICE ActivationValue gelu_f32(float x) {
  const float t = tanh_f32(gelu_tanh_argument(x));
  const float half_x = 0.5f * x;
  const float one_plus = 1.0f + t;
  const float value = half_x * one_plus;
  const float t2 = t * t;
  const float sech2 = 1.0f - t2;
  const float x2 = x * x;
  const float du = 0.1070322243f * x2;
  const float dinner = 0.7978845608f + du;
  const float prod = sech2 * dinner;
  const float left = half_x * prod;
  const float right = 0.5f * one_plus;
  return ActivationValue{value, left + right};
}

/*! Value of base activation `kind` (gated kinds: of their activated half) at x. For ReLU-type
 *  kinds the derivative is only meaningful for x > 0 (the kinks are handled by the callers). */
TWE_HOST_DEVICE ActivationValue base_activation(Activation kind, float x, float alpha) {
  switch (kind) {
    case Activation::kGelu: case Activation::kGeglu: return gelu_f32(x);
    case Activation::kQGelu: case Activation::kQGeglu: return sigmoid_linear(x, 1.702f);
    case Activation::kSilu: case Activation::kSwiglu: return sigmoid_linear(x, 1.0f);
    case Activation::kClampedSwiglu: return sigmoid_linear(x, alpha);
    case Activation::kRelu: case Activation::kReglu: return ActivationValue{relu_f32(x), 1.0f};
    default: {  // SReLU / SReGLU: fl(r·r), derivative fl(2·r)
      const float r = relu_f32(x);
      return ActivationValue{r * r, 2.0f * r};
    }
  }
}

/*! Whether kind's derivative is a select at x <= 0 (ReLU, SReLU and their gated forms). */
TWE_HOST_DEVICE bool activation_has_relu_kink(Activation kind) {
  return kind == Activation::kRelu || kind == Activation::kReglu || kind == Activation::kSRelu ||
         kind == Activation::kSReglu;
}

/*! Non-gated forward: act(x). */
TWE_HOST_DEVICE float activation_forward(Activation kind, float x) { return base_activation(kind, x, 1.0f).value; }

/*! Non-gated backward: dx = fl(act'(x)·dy); ReLU / SReLU give +0 for x <= 0 (a select, as
 *  PyTorch's threshold_backward: even for dy = ±inf or NaN) and NaN for NaN x. */
TWE_HOST_DEVICE float activation_backward(Activation kind, float x, float dy) {
  const ActivationValue v = base_activation(kind, x, 1.0f);
  if (activation_has_relu_kink(kind) && !(x > 0.0f)) return is_nan(x) ? x : 0.0f;
  return v.derivative * dy;
}

/*! ClampedSwiGLU's clamps: a' = min(a, limit), b' = clamp(b, −limit, limit), NaN propagating. */
TWE_HOST_DEVICE float clamp_max(float v, float hi) { return v > hi ? hi : v; }
TWE_HOST_DEVICE float clamp_both(float v, float lo, float hi) { return v < lo ? lo : (v > hi ? hi : v); }

/*! Gated forward: fl(act(a)·b); ClampedSwiGLU fl(fl(a'·σ(fl(alpha·a')))·fl(b' + 1)). */
TWE_HOST_DEVICE float gated_forward(Activation kind, float a, float b, float limit, float alpha) {
  if (kind == Activation::kClampedSwiglu) {
    const float ac = clamp_max(a, limit);
    const float bc = clamp_both(b, -limit, limit);
    const float act = sigmoid_linear(ac, alpha).value;
    const float gate = bc + 1.0f;
    return act * gate;
  }
  const float act = base_activation(kind, a, alpha).value;
  return act * b;
}

/*! Gradients of a gated activation: da = fl(fl(act'(a)·dy)·g), db = fl(dy·act(a)), with g = b
 *  (ClampedSwiGLU: g = fl(b' + 1)). Kinks as PyTorch: ReLU types give da = +0 for a <= 0; the
 *  clamps pass the gradient at their bounds (inclusive) and give +0 outside. A NaN a (b) gives
 *  a NaN da (db). */
struct GatedGrad {
  float da;
  float db;
};

TWE_HOST_DEVICE GatedGrad gated_backward(Activation kind, float a, float b, float dy, float limit, float alpha) {
  if (kind == Activation::kClampedSwiglu) {
    const float ac = clamp_max(a, limit);
    const float bc = clamp_both(b, -limit, limit);
    const ActivationValue v = sigmoid_linear(ac, alpha);
    const float gate = bc + 1.0f;
    const float scaled = v.derivative * dy;
    const float da = a > limit ? 0.0f : scaled * gate;
    const float dact = dy * v.value;
    const float db = is_nan(b) ? b : ((b < -limit || b > limit) ? 0.0f : dact);
    return GatedGrad{da, db};
  }
  const ActivationValue v = base_activation(kind, a, alpha);
  const float scaled = v.derivative * dy;
  float da = scaled * b;
  if (activation_has_relu_kink(kind) && !(a > 0.0f)) da = is_nan(a) ? a : 0.0f;
  const float db = dy * v.value;
  return GatedGrad{da, db};
}

// ---------------------------------------------------------------------------------------
// Dropout (NUMERICS.md §11)
// ---------------------------------------------------------------------------------------

/*! Fourth counter word of dropout's Philox draws ("DROP"). */
constexpr uint32_t kDropoutCounterTag = 0x44524F50u;

/*! Keep threshold floor(p·2^32) of an fp32 p in [0, 1): p·2^32 is exact in fp32. */
TWE_HOST_DEVICE uint64_t dropout_threshold(float p) { return static_cast<uint64_t>(p * 4294967296.0f); }

/*! Kept-value multiplier fl(1 / fl(1 − p)). */
TWE_HOST_DEVICE float dropout_scale(float p) {
  const float keep = 1.0f - p;
  return 1.0f / keep;
}

/*! The four random words of dropout elements 4j .. 4j+3: Philox4x32-10 of counter
 *  (j mod 2^32, floor(j/2^32), offset, 0x44524F50) under key (seed, 0). */
TWE_HOST_DEVICE Philox4x32 dropout_random_block(uint64_t j, uint32_t seed, uint32_t offset) {
  const Philox4x32 counter{{static_cast<uint32_t>(j), static_cast<uint32_t>(j >> 32), offset, kDropoutCounterTag}};
  return philox4x32_10(counter, seed, 0u);
}

/*! The mask byte of elements 8m .. 8m+7 (bit e set iff element 8m+e is kept; bits of elements
 *  at or past n are 0). */
TWE_HOST_DEVICE uint8_t dropout_mask_byte(int64_t m, int64_t n, uint64_t threshold, uint32_t seed, uint32_t offset) {
  uint8_t byte = 0;
  for (int half = 0; half < 2; ++half) {
    const uint64_t j = static_cast<uint64_t>(m) * 2u + static_cast<uint64_t>(half);
    const Philox4x32 w = dropout_random_block(j, seed, offset);
    for (int e = 0; e < 4; ++e) {
      const int64_t i = m * 8 + half * 4 + e;
      if (i < n && static_cast<uint64_t>(w.x[e]) >= threshold) byte = static_cast<uint8_t>(byte | (1u << (half * 4 + e)));
    }
  }
  return byte;
}

/*! Dropout of one value: fl(x·scale) when kept, +0 otherwise (also the backward with dy). */
TWE_HOST_DEVICE float dropout_apply(float x, bool kept, float scale) { return kept ? x * scale : 0.0f; }

// ---------------------------------------------------------------------------------------
// Attention (docs/attention.md): log, scores, online-softmax steps, dropout stream "ATTN"
// ---------------------------------------------------------------------------------------

/*! ln(x) in fp32 (FreeBSD's e_logf algorithm, without FMA): x = 2^k · (1 + f) with
 *  1 + f in [sqrt(2)/2, sqrt(2)), then log(1+f) from s = f/(2+f) and a degree-4 polynomial in s².
 *  +0/-0 -> -inf, x < 0 -> NaN, NaN -> NaN, +inf -> +inf; subnormals are scaled by 2^25 first. */
TWE_HOST_DEVICE float log_f32(float x) {
  const float ln2_hi = bits_to_float(0x3F317180u);  // 6.9313812256e-01
  const float ln2_lo = bits_to_float(0x3717F7D1u);  // 9.0580006145e-06
  const float lg1 = bits_to_float(0x3F2AAAAAu);     // 0.66666662693
  const float lg2 = bits_to_float(0x3ECCCE13u);     // 0.40000972152
  const float lg3 = bits_to_float(0x3E91E9EEu);     // 0.28498786688
  const float lg4 = bits_to_float(0x3E789E26u);     // 0.24279078841
  int32_t ix = static_cast<int32_t>(float_to_bits(x));
  int32_t k = 0;
  if (ix < 0x00800000) {                                           // x < 2^-126, or negative
    if ((ix & 0x7FFFFFFF) == 0) return bits_to_float(0xFF800000u);  // log(±0) = -inf
    if (ix < 0) return bits_to_float(0x7FC00000u);                  // log(<0) = NaN
    k -= 25;
    x = x * bits_to_float(0x4C000000u);  // 2^25, exact
    ix = static_cast<int32_t>(float_to_bits(x));
  }
  if (ix >= 0x7F800000) return x + x;  // +inf, NaN
  k += (ix >> 23) - 127;
  ix &= 0x007FFFFF;
  const int32_t i0 = (ix + (0x95F64 << 3)) & 0x800000;
  x = bits_to_float(static_cast<uint32_t>(ix | (i0 ^ 0x3F800000)));  // x or x/2, in [sqrt(2)/2, sqrt(2))
  k += i0 >> 23;
  const float f = x - 1.0f;
  const float dk = static_cast<float>(k);
  if ((0x007FFFFF & (0x8000 + ix)) < 0xC000) {  // -2^-9 <= f < 2^-9
    if (f == 0.0f) {
      if (k == 0) return 0.0f;
      const float a = dk * ln2_hi;
      const float b = dk * ln2_lo;
      return a + b;
    }
    const float third = 0.333333333333f * f;
    const float half_minus = 0.5f - third;
    const float ff = f * f;
    const float r = ff * half_minus;
    if (k == 0) return f - r;
    const float a = dk * ln2_lo;
    const float b = r - a;
    const float c = b - f;
    const float d = dk * ln2_hi;
    return d - c;
  }
  const float s = f / (2.0f + f);
  const float z = s * s;
  int32_t i = ix - (0x6147A << 3);
  const float w = z * z;
  const int32_t j = (0x6B851 << 3) - ix;
  const float w4 = w * lg4;
  const float t1 = w * (lg2 + w4);
  const float w3 = w * lg3;
  const float t2 = z * (lg1 + w3);
  i |= j;
  const float r = t2 + t1;
  if (i > 0) {
    const float hf = 0.5f * f;
    const float hfsq = hf * f;
    const float sr = s * (hfsq + r);
    if (k == 0) return f - (hfsq - sr);
    const float a = sr + dk * ln2_lo;
    const float b = hfsq - a;
    const float c = b - f;
    return dk * ln2_hi - c;
  }
  const float sr = s * (f - r);
  if (k == 0) return f - sr;
  const float a = sr - dk * ln2_lo;
  const float c = a - f;
  return dk * ln2_hi - c;
}

/*! One attention score x = fl(dot · s), dot = Σc_d fl(q_d · k_d) (docs/attention.md §3.1). */
TWE_HOST_DEVICE float attention_score(const float* q, const float* k, int64_t d, float scale) {
  const float dot = canonical_sum(d, [q, k](int64_t i) { return q[i] * k[i]; });
  return dot * scale;
}

/*! Scores of m keys at once, for SIMD over keys on the CPU: out[c] = fl(Σc_d fl(q_d · k[d·ldk + c])
 *  · s) for c < m, with k stored d-major (ldk floats between d rows). Every out[c] performs
 *  exactly attention_score's operations in its order (lane d mod 32, d ascending, then
 *  canonical_fold), so the bytes are the same. `scratch` holds 32·m floats. Host only. */
inline void attention_scores_columns(const float* q, const float* k, int64_t d_n, int64_t ldk, int64_t m, float scale,
                                     float* scratch, float* out) {
  for (int64_t i = 0; i < kSumLanes * m; ++i) scratch[i] = 0.0f;
  for (int64_t d = 0; d < d_n; ++d) {
    float* p = scratch + (d % kSumLanes) * m;
    const float* row = k + d * ldk;
    const float qd = q[d];
    for (int64_t c = 0; c < m; ++c) p[c] = p[c] + qd * row[c];
  }
  for (int half = kSumLanes / 2; half > 0; half >>= 1)
    for (int l = 0; l < half; ++l) {
      float* lo = scratch + l * m;
      const float* hi = scratch + (l + half) * m;
      for (int64_t c = 0; c < m; ++c) lo[c] = lo[c] + hi[c];
    }
  for (int64_t c = 0; c < m; ++c) out[c] = scratch[c] * scale;
}

/*! Online-softmax rescale factor α = exp_f32(fl(m_old − m_new)) (+0 while m_old = −inf). */
TWE_HOST_DEVICE float attention_rescale(float m_old, float m_new) { return exp_f32(m_old - m_new); }

/*! Unnormalized probability p = exp_f32(fl(x − m)) (m the running max, or lse in backward). */
TWE_HOST_DEVICE float attention_prob(float x, float m) { return exp_f32(x - m); }

/*! lse = fl(m + log_f32(l)). */
TWE_HOST_DEVICE float attention_lse(float m, float l) {
  const float log_l = log_f32(l);
  return m + log_l;
}

/*! ds = fl(p · fl(dp − Δ)). */
TWE_HOST_DEVICE float attention_dscore(float p, float dp, float delta) {
  const float diff = dp - delta;
  return p * diff;
}

/*! Fourth counter word of attention dropout's Philox draws ("ATTN"). */
constexpr uint32_t kAttentionDropoutCounterTag = 0x4154544Eu;

/*! Whether attention probability n (= ((b·H + h)·S_q + i)·S_kv + j) is kept: word n mod 4 of
 *  Philox4x32-10 of counter (floor(n/4) mod 2^32, floor(n/2^34), offset, 0x4154544E) under key
 *  (seed, 0) is >= threshold. */
TWE_HOST_DEVICE bool attention_dropout_keep(uint64_t n, uint64_t threshold, uint32_t seed, uint32_t offset) {
  const uint64_t j = n >> 2;
  const Philox4x32 counter{{static_cast<uint32_t>(j), static_cast<uint32_t>(j >> 32), offset,
                            kAttentionDropoutCounterTag}};
  const Philox4x32 w = philox4x32_10(counter, seed, 0u);
  return static_cast<uint64_t>(w.x[n & 3u]) >= threshold;
}

// ---------------------------------------------------------------------------------------
// Bias / residual add and constant scale (NUMERICS.md §11)
// ---------------------------------------------------------------------------------------

/*! fl(x + b). */
TWE_HOST_DEVICE float add_f32(float x, float b) { return x + b; }

/*! fl(x · c). */
TWE_HOST_DEVICE float scale_f32(float x, float c) { return x * c; }

// ---------------------------------------------------------------------------------------
// GEMM block scaling (NUMERICS.md §8)
// ---------------------------------------------------------------------------------------

/*! A (K-block) partial sum scaled by the decode scales of its two operands, in this order:
 *  fl(fl(partial · scale_inv_a) · scale_inv_b). */
TWE_HOST_DEVICE float gemm_scale_partial(float partial, float scale_inv_a, float scale_inv_b) {
  const float scaled_a = partial * scale_inv_a;
  return scaled_a * scale_inv_b;
}

}  // namespace numerics
}  // namespace twe

#endif  // TWINENGINE_NUMERICS_H_
