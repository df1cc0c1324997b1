// Lane helpers of the elementwise SIMD kernels: W = TWE_SIMD_W fp32 lanes as GCC / Clang vector
// extensions, in namespace twe::cpu::TWE_SIMD_NS. No include guard: internal/simd_foreach.h
// includes this once per ISA inside that ISA's `#pragma GCC target` region.
//
// Every lane function performs the operations of its numerics.h counterpart in the same order on
// the same operands; a branch becomes a select that computes both sides and keeps the one the
// scalar code takes (no FMA: -ffp-contract=off). So each lane gives the scalar bytes.
#if !defined(TWE_SIMD_LANES_PASS)
#error "internal/simd_lanes.h is included by internal/simd_foreach.h only"
#endif

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "internal/common.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

namespace twe {
namespace cpu {
namespace TWE_SIMD_NS {

constexpr int W = TWE_SIMD_W;
typedef float F __attribute__((vector_size(4 * W)));      // W fp32 lanes
typedef int32_t I __attribute__((vector_size(4 * W)));    // W int32 lanes; masks: all-ones / zero
typedef uint32_t U __attribute__((vector_size(4 * W)));   // W uint32 lanes
typedef uint16_t H __attribute__((vector_size(2 * W)));   // W bf16 / fp16 bit patterns

template <typename V>
TWE_SIMD_INLINE V load(const void* p) {
  V v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

template <typename V>
TWE_SIMD_INLINE void store(void* p, V v) {
  std::memcpy(p, &v, sizeof(v));
}

/*! Every lane = s. */
TWE_SIMD_INLINE F splat(float s) {
  F v = {};
  return v + s;
}

TWE_SIMD_INLINE U bits(F f) { return reinterpret_cast<U>(f); }
TWE_SIMD_INLINE F from_bits(U u) { return reinterpret_cast<F>(u); }

/*! Lane-wise m ? a : b (m: a comparison's all-ones / zero lanes). */
TWE_SIMD_INLINE F select(I m, F a, F b) {
  const I ai = reinterpret_cast<I>(a), bi = reinterpret_cast<I>(b);
  return reinterpret_cast<F>((ai & m) | (bi & ~m));
}
TWE_SIMD_INLINE U select(I m, U a, U b) {
  const U mu = reinterpret_cast<U>(m);
  return (a & mu) | (b & ~mu);
}

/*! numerics::is_nan lane-wise. */
TWE_SIMD_INLINE I is_nan(F f) { return reinterpret_cast<I>((bits(f) & 0x7FFFFFFFu) > 0x7F800000u); }

/*! Lanes i < n all-ones, the rest zero. */
TWE_SIMD_INLINE I lanes_below(int64_t n) {
  I iota;
  for (int i = 0; i < W; ++i) iota[i] = i;
  return iota < static_cast<int32_t>(n < W ? n : W);
}

// ---- Element types (numerics.h bf16 / fp16 conversions) --------------------------------------

TWE_SIMD_INLINE F bf16_to_float(H h) { return from_bits(__builtin_convertvector(h, U) << 16); }

TWE_SIMD_INLINE F fp16_to_float(H h16) {
  const U h = __builtin_convertvector(h16, U);
  const U sign = (h & 0x8000u) << 16;
  const U exponent = (h >> 10) & 0x1Fu;
  const U mantissa = h & 0x3FFu;
  const F special = from_bits(sign | 0x7F800000u | (mantissa << 13));
  const F magnitude = __builtin_convertvector(mantissa, F) * 5.9604644775390625e-08f;
  const F subnormal = select(reinterpret_cast<I>(sign != 0u), -magnitude, magnitude);
  const F normal = from_bits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  return select(reinterpret_cast<I>(exponent == 0x1Fu), special,
                select(reinterpret_cast<I>(exponent == 0u), subnormal, normal));
}

TWE_SIMD_INLINE H float_to_bf16(F f) {
  const U u = bits(f);
  const U rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const U nan = (u >> 16) | 0x0040u;
  return __builtin_convertvector(select(is_nan(f), nan, rounded), H);
}

TWE_SIMD_INLINE H float_to_fp16(F f) {
  const U u = bits(f);
  const U sign = (u >> 16) & 0x8000u;
  const U a = u & 0x7FFFFFFFu;
  const I small_range = reinterpret_cast<I>(a < 0x38800000u);
  // Below 2^-14: multiples of 2^-24 (other lanes run on 0, their value discarded).
  const F scaled = from_bits(select(small_range, a, U{} + 0u)) * 16777216.0f;
  const F shifted = scaled + 12582912.0f;  // numerics::round_half_even
  const F rounded_small = shifted - 12582912.0f;
  const U small = sign | reinterpret_cast<U>(__builtin_convertvector(rounded_small, I));
  const U rounded = (a + 0xFFFu + ((a >> 13) & 1u)) >> 13;
  const U normal = sign | (rounded - (112u << 10));
  U r = select(small_range, small, normal);
  r = select(reinterpret_cast<I>(a >= 0x477FF000u), sign | 0x7C00u, r);
  r = select(reinterpret_cast<I>(a > 0x7F800000u), sign | 0x7E00u, r);
  return __builtin_convertvector(r, H);
}

/*! W elements of T at p widened exactly to fp32 (T: float, BFloat16, Float16). */
template <typename T>
TWE_SIMD_INLINE F load_float(const T* p) {
  if constexpr (std::is_same<T, float>::value) return load<F>(p);
  else if constexpr (std::is_same<T, BFloat16>::value) return bf16_to_float(load<H>(p));
  else return fp16_to_float(load<H>(p));
}

/*! W fp32 lanes rounded to T (RNE, as FromFloat<T>) and stored at p. */
template <typename T>
TWE_SIMD_INLINE void store_rounded(T* p, F v) {
  if constexpr (std::is_same<T, float>::value) store(p, v);
  else if constexpr (std::is_same<T, BFloat16>::value) store(p, float_to_bf16(v));
  else store(p, float_to_fp16(v));
}

// ---- Transcendentals (numerics::exp_f32 / tanh_f32 / sigmoid_f32) -----------------------------

TWE_SIMD_INLINE F exp_f32(F x) {
  const float ln2_hi = numerics::bits_to_float(0x3F317200u);
  const float ln2_lo = numerics::bits_to_float(0x35BFBE8Eu);
  const float inv_ln2 = numerics::bits_to_float(0x3FB8AA3Bu);
  const float p1 = numerics::bits_to_float(0x3E2AAA8Fu);
  const float p2 = numerics::bits_to_float(0xBB355215u);
  const float upper = numerics::bits_to_float(0x42B17217u);
  const float lower = numerics::bits_to_float(0xC2CFF1B5u);
  // Lanes the scalar code returns early from run the main path on 0 (result replaced below).
  const I nan = is_nan(x), over = x > upper, under = x < lower;
  const F xs = select(nan | over | under, splat(0.0f), x);
  const F shifted = inv_ln2 * xs;
  const F biased = select(xs < 0.0f, shifted - 0.5f, shifted + 0.5f);
  const I k = __builtin_convertvector(biased, I);  // truncation, as static_cast<int>
  const F kf = __builtin_convertvector(k, F);
  const F kh = kf * ln2_hi;
  const F hi = xs - kh;
  const F lo = kf * ln2_lo;
  const F r = hi - lo;
  const F t = r * r;
  const F pt = p2 * t;
  const F poly = p1 + pt;
  const F tp = t * poly;
  const F c = r - tp;
  const F rc = r * c;
  const F q = rc / (2.0f - c);
  const F inner = lo - q;
  const F y = 1.0f - (inner - hi);
  const F top = y * 2.0f * numerics::bits_to_float(0x7F000000u);
  const F normal = y * from_bits(reinterpret_cast<U>(127 + k) << 23);
  const F scaled = y * from_bits(reinterpret_cast<U>(227 + k) << 23);
  const F subnormal = scaled * numerics::bits_to_float(0x0D800000u);
  F result = select(k >= -125, select(k == 128, top, normal), subnormal);
  result = select(under, splat(0.0f), result);
  result = select(over, splat(numerics::bits_to_float(0x7F800000u)), result);
  return select(nan, x + x, result);
}

TWE_SIMD_INLINE F tanh_f32(F x) {
  const F a = from_bits(bits(x) & 0x7FFFFFFFu);
  const F s = x * x;
  F p = splat(numerics::bits_to_float(0x3B0CBDBDu));
  p = p * s; p = p + numerics::bits_to_float(0xBC0610A3u);
  p = p * s; p = p + numerics::bits_to_float(0x3CB1CA6Du);
  p = p * s; p = p + numerics::bits_to_float(0xBD5CF7BEu);
  p = p * s; p = p + numerics::bits_to_float(0x3E088836u);
  p = p * s; p = p + numerics::bits_to_float(0xBEAAAAAAu);
  const F x3 = s * x;
  const F tail = x3 * p;
  const F small = x + tail;
  const F e = exp_f32(a + a);
  const F d = e + 1.0f;
  const F q = 2.0f / d;
  const F t = 1.0f - q;
  const F large = select(reinterpret_cast<I>((bits(x) >> 31) != 0u), -t, t);
  return select(a < 0.625f, small, large);
}

TWE_SIMD_INLINE F sigmoid_f32(F z) {
  const F e = exp_f32(-z);
  const F d = 1.0f + e;
  return 1.0f / d;
}

// ---- Canonical 32-lane sum (NUMERICS.md §11) --------------------------------------------------

/*! Σc of n terms: term(i) gives the W fp32 terms i .. i+W-1 (i a multiple of W; lanes at or past n
 *  may hold anything — they are replaced by +0, which leaves a lane partial unchanged: a partial
 *  that starts at +0 is never −0). Lane l of the 32 accumulates terms l, l+32, ... in order, as
 *  numerics::canonical_sum (the 32/W vectors are those lanes), then canonical_fold. Calls term for
 *  i < round_up(n, W). */
template <typename Term>
TWE_SIMD_INLINE float canonical_sum(int64_t n, Term term) {
  constexpr int kVecs = numerics::kSumLanes / W;
  F acc[kVecs];
  for (int j = 0; j < kVecs; ++j) acc[j] = splat(0.0f);
  int64_t base = 0;
  for (; base + numerics::kSumLanes <= n; base += numerics::kSumLanes)
    for (int j = 0; j < kVecs; ++j) acc[j] = acc[j] + term(base + j * W);
  for (int j = 0; j < kVecs && base + j * W < n; ++j) {
    const F v = term(base + j * W);
    acc[j] = acc[j] + select(lanes_below(n - base - j * W), v, splat(0.0f));
  }
  float partials[numerics::kSumLanes];
  for (int j = 0; j < kVecs; ++j) store(partials + j * W, acc[j]);
  return numerics::canonical_fold(partials);
}

}  // namespace TWE_SIMD_NS
}  // namespace cpu
}  // namespace twe

#pragma GCC diagnostic pop
