// CPU kernels of the quantize family: loops and tiling only; value math is in numerics.h.
#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "internal/cpu.h"
#include "internal/gemm.h"
#include "internal/quantize.h"

namespace twe {
namespace cpu {
namespace {

using numerics::FP8Format;

constexpr int64_t kTile = 128;  // row strip of the per-tensor cast: its columnwise runs are 128 bytes

// ---- Vectorized loops (TWE_CPU_CLONES: one clone per x86 level, picked at load time) ---------

#if defined(__GNUC__) && !defined(__clang__)
// The vector helpers below are always inlined into their callers: no vector crosses a call, so
// the warning about the AVX-512 calling convention does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

// Generic vectors (GCC/clang vector extensions): 16 lanes of 32 bits, 32 lanes of 16 bits. In
// a TWE_CPU_CLONES function they compile to one zmm register (x86-64-v4), two ymm (v3), four
// xmm (baseline) or NEON registers; every lane runs the scalar rule's integer operations.
typedef uint32_t U32x16 __attribute__((vector_size(64)));
typedef uint16_t U16x16 __attribute__((vector_size(32)));
typedef uint16_t U16x32 __attribute__((vector_size(64)));

typedef float F32x16 __attribute__((vector_size(64)));
typedef int32_t I32x16 __attribute__((vector_size(64)));
typedef uint8_t U8x16 __attribute__((vector_size(16)));

/*! 16 elements widened to fp32 (exactly, as to_float). */
template <typename T>
__attribute__((always_inline)) inline F32x16 load_f32x16(const T* p) {
  F32x16 v;
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(&v, p, sizeof(v));
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    U16x16 h;
    std::memcpy(&h, p, sizeof(h));
    v = reinterpret_cast<F32x16>(__builtin_convertvector(h, U32x16) << 16);
  } else {
    for (int j = 0; j < 16; ++j) v[j] = to_float(p[j]);
  }
  return v;
}

/*! numerics::amax_key of 16 lanes. */
__attribute__((always_inline)) inline U32x16 amax_keys(F32x16 v) {
  const U32x16 a = reinterpret_cast<U32x16>(v) & 0x7FFFFFFFu;
  return a > 0x7F800000u ? U32x16{} : a;
}

/*! Largest of 16 lanes. */
__attribute__((always_inline)) inline uint32_t max_lane(U32x16 v) {
  typedef uint32_t U32x8 __attribute__((vector_size(32)));
  typedef uint32_t U32x4 __attribute__((vector_size(16)));
  const U32x8 lo8 = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
  const U32x8 hi8 = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const U32x8 m8 = lo8 > hi8 ? lo8 : hi8;
  const U32x4 lo4 = __builtin_shufflevector(m8, m8, 0, 1, 2, 3);
  const U32x4 hi4 = __builtin_shufflevector(m8, m8, 4, 5, 6, 7);
  const U32x4 m4 = lo4 > hi4 ? lo4 : hi4;
  uint32_t m = m4[0];
  for (int j = 1; j < 4; ++j) m = m4[j] > m ? m4[j] : m;
  return m;
}

/*! numerics::float_to_fp8<F> of 16 lanes: the same integer and fp32 operations on every lane
 *  (both the normal and the subnormal code are computed, the scalar code's selects pick one). */
template <FP8Format F>
__attribute__((always_inline)) inline U32x16 fp8_codes(F32x16 v) {
  using Tr = numerics::FP8Traits<F>;
  const U32x16 u = reinterpret_cast<U32x16>(v);
  const U32x16 sign = (u >> 24) & 0x80u;
  const U32x16 a = u & 0x7FFFFFFFu;
  constexpr int kShift = 23 - Tr::kMantissaBits;
  const U32x16 rounded = (a + ((1u << (kShift - 1)) - 1u) + ((a >> kShift) & 1u)) >> kShift;
  const U32x16 normal = rounded - (static_cast<uint32_t>(127 - Tr::kBias) << Tr::kMantissaBits);
  const U32x16 clamped = a < Tr::kMinNormalBits ? a : U32x16{} + Tr::kMinNormalBits;
  const F32x16 scaled = reinterpret_cast<F32x16>(clamped) * Tr::kSubnormalInvStep;
  const F32x16 shifted = scaled + 12582912.0f;  // numerics::round_half_even
  const F32x16 nearest = shifted - 12582912.0f;
  const U32x16 subnormal = reinterpret_cast<U32x16>(__builtin_convertvector(nearest, I32x16));
  U32x16 code = a < Tr::kMinNormalBits ? subnormal : normal;
  // Saturation (finite overflow and ±inf) as two selects: an OR of two lane masks is lowered lane
  // by lane by GCC 12.
  const U32x16 max_code = U32x16{} + Tr::kMaxCode;
  code = code > static_cast<uint32_t>(Tr::kMaxCode) ? max_code : code;
  code = a >= Tr::kMaxBits ? max_code : code;
  code |= sign;
  return a > 0x7F800000u ? U32x16{} + 0x7Fu : code;
}

/*! 16 FP8 codes (one per lane) stored as 16 bytes. */
__attribute__((always_inline)) inline void store_bytes16(uint8_t* out, U32x16 code) {
  const U8x16 bytes = __builtin_convertvector(code, U8x16);
  std::memcpy(out, &bytes, sizeof(bytes));
}

/*! Max of amax_key over n elements: the NaN-skipping amax as bits (max of integers is exact in
 *  any order, so vector lanes may reduce in any grouping). float: 16 keys per vector; bf16: the
 *  key's upper half taken on the 16-bit pattern itself (|h| > 0x7F80 is NaN), 32 per vector;
 *  other types through to_float. */
template <typename T>
TWE_CPU_CLONES uint32_t amax_key_run(const T* x, int64_t n) {
  int64_t i = 0;
  uint32_t key = 0;
  if constexpr (std::is_same_v<T, float>) {
    U32x16 m = {};
    for (; i + 16 <= n; i += 16) {
      U32x16 a;
      std::memcpy(&a, x + i, sizeof(a));
      a &= 0x7FFFFFFFu;
      a = a > 0x7F800000u ? 0u : a;
      m = a > m ? a : m;
    }
    for (int j = 0; j < 16; ++j) key = m[j] > key ? m[j] : key;
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    U16x32 m = {};
    for (; i + 32 <= n; i += 32) {
      U16x32 a;
      std::memcpy(&a, x + i, sizeof(a));
      a &= uint16_t{0x7FFF};
      a = a > uint16_t{0x7F80} ? uint16_t{0} : a;
      m = a > m ? a : m;
    }
    for (int j = 0; j < 32; ++j) key = uint32_t{m[j]} << 16 > key ? uint32_t{m[j]} << 16 : key;
  } else {
    constexpr int64_t kLanes = 16;
    uint32_t lanes[kLanes] = {};
    for (; i + kLanes <= n; i += kLanes)
      for (int64_t j = 0; j < kLanes; ++j) {
        const uint32_t k = numerics::amax_key(to_float(x[i + j]));
        lanes[j] = k > lanes[j] ? k : lanes[j];
      }
    for (int64_t j = 0; j < kLanes; ++j) key = lanes[j] > key ? lanes[j] : key;
  }
  for (; i < n; ++i) {
    const uint32_t k = numerics::amax_key(to_float(x[i]));
    key = k > key ? k : key;
  }
  return key;
}

/*! out[i] = FP8(x[i] * scale) for n elements (one scale). */
template <FP8Format F, typename T>
TWE_CPU_CLONES void cast_run(const T* x, int64_t n, float scale, uint8_t* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) store_bytes16(out + i, fp8_codes<F>(load_f32x16(x + i) * scale));
  for (; i < n; ++i) out[i] = numerics::float_to_fp8<F>(to_float(x[i]) * scale);
}

#if defined(__SSE2__)
/*! Transposes one 16×16 byte tile: out[c * out_stride + r] = in[r * in_stride + c]. Four rounds
 *  of SSE2 unpacks (8-, 16-, 32-, 64-bit interleaves); pure data movement, so the bytes are
 *  those of the scalar loop. */
inline void transpose_tile16(const uint8_t* in, int64_t in_stride, uint8_t* out, int64_t out_stride) {
  __m128i a[16], b[16];
  for (int i = 0; i < 16; ++i) a[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i * in_stride));
  for (int i = 0; i < 8; ++i) {  // rows 2i, 2i+1 interleaved: columns 0-7, then 8-15
    b[2 * i] = _mm_unpacklo_epi8(a[2 * i], a[2 * i + 1]);
    b[2 * i + 1] = _mm_unpackhi_epi8(a[2 * i], a[2 * i + 1]);
  }
  for (int g = 0; g < 4; ++g) {  // rows 4g..4g+3: columns 0-3, 4-7, 8-11, 12-15
    const __m128i* p = b + 4 * g;
    a[4 * g + 0] = _mm_unpacklo_epi16(p[0], p[2]);
    a[4 * g + 1] = _mm_unpackhi_epi16(p[0], p[2]);
    a[4 * g + 2] = _mm_unpacklo_epi16(p[1], p[3]);
    a[4 * g + 3] = _mm_unpackhi_epi16(p[1], p[3]);
  }
  for (int h = 0; h < 2; ++h) {  // rows 8h..8h+7: column pairs (0,1), (2,3), ..., (14,15)
    const __m128i* lo = a + 8 * h;
    const __m128i* hi = a + 8 * h + 4;
    for (int j = 0; j < 4; ++j) {
      b[8 * h + 2 * j] = _mm_unpacklo_epi32(lo[j], hi[j]);
      b[8 * h + 2 * j + 1] = _mm_unpackhi_epi32(lo[j], hi[j]);
    }
  }
  for (int j = 0; j < 8; ++j) {  // columns 2j and 2j+1, all 16 rows
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + (2 * j) * out_stride), _mm_unpacklo_epi64(b[j], b[8 + j]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + (2 * j + 1) * out_stride), _mm_unpackhi_epi64(b[j], b[8 + j]));
  }
}
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#define TWE_TRANSPOSE_AVX512 1
// GCC 12's 512-bit unpack intrinsics pass an undefined merge source (_mm512_undefined_epi32),
// which -Wuninitialized reports once inlined here; the unmasked unpacks never read it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
/*! Four 16×16 byte tiles side by side (16 rows of 64 bytes) transposed at once: the SSE2 network
 *  of transpose_tile16 on 512-bit registers, whose unpacks work within each 128-bit lane, so lane
 *  t carries tile t. buf[(16t + c) * buf_stride + r] = in[r * in_stride + 16t + c]. */
__attribute__((target("avx512f,avx512bw"))) void transpose_tiles64_avx512(const uint8_t* in, int64_t in_stride,
                                                                          uint8_t* buf, int64_t buf_stride) {
  __m512i a[16], b[16];
  for (int i = 0; i < 16; ++i) a[i] = _mm512_loadu_si512(in + i * in_stride);
  for (int i = 0; i < 8; ++i) {
    b[2 * i] = _mm512_unpacklo_epi8(a[2 * i], a[2 * i + 1]);
    b[2 * i + 1] = _mm512_unpackhi_epi8(a[2 * i], a[2 * i + 1]);
  }
  for (int g = 0; g < 4; ++g) {
    const __m512i* p = b + 4 * g;
    a[4 * g + 0] = _mm512_unpacklo_epi16(p[0], p[2]);
    a[4 * g + 1] = _mm512_unpackhi_epi16(p[0], p[2]);
    a[4 * g + 2] = _mm512_unpacklo_epi16(p[1], p[3]);
    a[4 * g + 3] = _mm512_unpackhi_epi16(p[1], p[3]);
  }
  for (int h = 0; h < 2; ++h) {
    const __m512i* lo = a + 8 * h;
    const __m512i* hi = a + 8 * h + 4;
    for (int j = 0; j < 4; ++j) {
      b[8 * h + 2 * j] = _mm512_unpacklo_epi32(lo[j], hi[j]);
      b[8 * h + 2 * j + 1] = _mm512_unpackhi_epi32(lo[j], hi[j]);
    }
  }
  for (int j = 0; j < 8; ++j) {
    const __m512i even = _mm512_unpacklo_epi64(b[j], b[8 + j]);  // column 2j of each tile
    const __m512i odd = _mm512_unpackhi_epi64(b[j], b[8 + j]);   // column 2j + 1
    alignas(64) uint8_t lanes[2][64];
    _mm512_store_si512(lanes[0], even);
    _mm512_store_si512(lanes[1], odd);
    for (int t = 0; t < 4; ++t) {
      std::memcpy(buf + (16 * t + 2 * j) * buf_stride, lanes[0] + 16 * t, 16);
      std::memcpy(buf + (16 * t + 2 * j + 1) * buf_stride, lanes[1] + 16 * t, 16);
    }
  }
}

#pragma GCC diagnostic pop

bool cpu_has_avx512bw() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return has;
}
#endif

/*! out[k * out_stride + r] = in[r * in_stride + k] for r < rows, k < K: a row block of FP8
 *  bytes stored transposed. Each strip of 64 columns (16 without AVX-512) is transposed in
 *  16-row groups of byte tiles (AVX-512: four 16×16 tiles at once; SSE2: one) into a small
 *  contiguous buffer, then copied out as runs of `rows` bytes, so the strided output is written
 *  in whole runs (no 4K-aliased 16-byte stores). Pure data movement: the bytes are those of the
 *  scalar loop whatever the path. */
__attribute__((noinline, noclone)) void transpose_bytes(const uint8_t* in, int64_t in_stride, int64_t rows, int64_t K,
                                               uint8_t* out, int64_t out_stride) {
#if defined(TWE_TRANSPOSE_AVX512)
  const bool wide = cpu_has_avx512bw();
#else
  const bool wide = false;
#endif
  const int64_t strip = wide ? 64 : 16;
  std::vector<uint8_t> buffer(static_cast<size_t>(strip * rows));
  uint8_t* buf = buffer.data();
  for (int64_t k0 = 0; k0 < K; k0 += strip) {
    const int64_t width = std::min(strip, K - k0);
    // Columns c0.. of the strip in tiles (a group of 64, or of 16, for every 16 rows), the
    // rest element by element.
    int64_t c0 = 0;
#if defined(TWE_TRANSPOSE_AVX512)
    if (width == 64) {
      int64_t r0 = 0;
      for (; r0 + 16 <= rows; r0 += 16) transpose_tiles64_avx512(in + r0 * in_stride + k0, in_stride, buf + r0, rows);
      for (int64_t j = 0; j < 64; ++j)
        for (int64_t r = r0; r < rows; ++r) buf[j * rows + r] = in[r * in_stride + k0 + j];
      c0 = 64;
    }
#endif
#if defined(__SSE2__)
    for (; c0 + 16 <= width; c0 += 16) {
      int64_t r0 = 0;
      for (; r0 + 16 <= rows; r0 += 16)
        transpose_tile16(in + r0 * in_stride + k0 + c0, in_stride, buf + c0 * rows + r0, rows);
      for (int64_t j = c0; j < c0 + 16; ++j)
        for (int64_t r = r0; r < rows; ++r) buf[j * rows + r] = in[r * in_stride + k0 + j];
    }
#endif
    for (int64_t j = c0; j < width; ++j)
      for (int64_t r = 0; r < rows; ++r) buf[j * rows + r] = in[r * in_stride + k0 + j];
    for (int64_t j = 0; j < width; ++j) std::memcpy(out + (k0 + j) * out_stride, buf + j * rows, static_cast<size_t>(rows));
  }
}

/*! One row of rowwise MXFP8 (K % 32 == 0), a 32-element block at a time in registers: the
 *  block's amax key, the E8M0 exponent of that amax and its multiplier, then the cast. */
template <FP8Format F, typename T>
TWE_CPU_CLONES void mxfp8_row(const T* x, int64_t K, uint8_t* data, uint8_t* scales) {
  for (int64_t kb = 0; kb < K / 32; ++kb) {
    const F32x16 v0 = load_f32x16(x + kb * 32), v1 = load_f32x16(x + kb * 32 + 16);
    const U32x16 k0 = amax_keys(v0), k1 = amax_keys(v1);
    const uint32_t key = max_lane(k0 > k1 ? k0 : k1);
    const uint8_t e = numerics::mxfp8_block_exponent<F>(numerics::bits_to_float(key));
    const float m = numerics::e8m0_encode_multiplier(e);
    store_bytes16(data + kb * 32, fp8_codes<F>(v0 * m));
    store_bytes16(data + kb * 32 + 16, fp8_codes<F>(v1 * m));
    scales[kb] = e;
  }
}

/*! keys[k] = max(keys[k], amax keys of x[r * ld + k] for r < rows), k < K: per-column amax as bits. */
template <typename T>
TWE_CPU_CLONES void column_keys(const T* x, int64_t rows, int64_t K, int64_t ld, uint32_t* keys) {
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    U32x16 m;
    std::memcpy(&m, keys + k, sizeof(m));
    for (int64_t r = 0; r < rows; ++r) {
      U32x16 a = reinterpret_cast<U32x16>(load_f32x16(x + r * ld + k)) & 0x7FFFFFFFu;
      a = a > 0x7F800000u ? 0u : a;
      m = a > m ? a : m;
    }
    std::memcpy(keys + k, &m, sizeof(m));
  }
  for (; k < K; ++k)
    for (int64_t r = 0; r < rows; ++r) keys[k] = std::max(keys[k], numerics::amax_key(to_float(x[r * ld + k])));
}

/*! keys[k] = max over `rows` rows of amax_key(x[r * ld + k]) for k < K: per-column amax as bits. */
template <typename T>
void column_amax_keys(const T* x, int64_t rows, int64_t K, int64_t ld, uint32_t* keys) {
  std::fill(keys, keys + K, 0u);
  column_keys(x, rows, K, ld, keys);
}

/*! out[i] = FP8(x[i] * scale[i]) for i < n: one scale per element. */
template <FP8Format F, typename T>
__attribute__((always_inline)) inline void cast_scaled(const T* x, int64_t n, const float* scale, uint8_t* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    F32x16 s;
    std::memcpy(&s, scale + i, sizeof(s));
    store_bytes16(out + i, fp8_codes<F>(load_f32x16(x + i) * s));
  }
  for (; i < n; ++i) out[i] = numerics::float_to_fp8<F>(to_float(x[i]) * scale[i]);
}

/*! Per block b < n: the E8M0 exponent of its amax (key) and its encode multiplier, 16 lanes at a
 *  time: numerics::mxfp8_block_exponent (e8m0_round_up of fl(amax · fl(1/M))) and
 *  numerics::e8m0_encode_multiplier, their branches as selects. */
template <FP8Format F>
TWE_CPU_CLONES void mxfp8_exponents(const uint32_t* keys, int64_t n, uint8_t* exps, float* mult) {
  constexpr float kInvMax = 1.0f / numerics::FP8Traits<F>::kMax;
  int64_t b = 0;
  for (; b + 16 <= n; b += 16) {
    F32x16 amax;
    std::memcpy(&amax, keys + b, sizeof(amax));
    const U32x16 u = reinterpret_cast<U32x16>(amax * kInvMax) & 0x7FFFFFFFu;
    const U32x16 exponent = u >> 23;
    const U32x16 zero = U32x16{}, one = zero + 1u, top = zero + 254u;
    U32x16 e = exponent + ((u & 0x7FFFFFu) != 0u ? one : zero);  // rounded up
    e = e > 254u ? top : e;
    const U32x16 sub = u <= 0x00400000u ? zero : one;  // subnormal: <= 2^-127 -> 0 (and 0 -> 0)
    e = exponent == 0u ? sub : e;
    e = u == 0x7F800000u ? top : e;             // inf
    e = u > 0x7F800000u ? zero + 255u : e;      // NaN
    const U32x16 m = e >= 254u ? zero + 0x00400000u : (254u - e) << 23;
    const U8x16 bytes = __builtin_convertvector(e, U8x16);
    std::memcpy(exps + b, &bytes, sizeof(bytes));
    std::memcpy(mult + b, &m, sizeof(m));
  }
  for (; b < n; ++b) {
    const uint8_t e = numerics::mxfp8_block_exponent<F>(numerics::bits_to_float(keys[b]));
    exps[b] = e;
    mult[b] = numerics::e8m0_encode_multiplier(e);
  }
}

/*! One 32-row block of columnwise MXFP8 (blocks run down the columns), in chunks of 256
 *  columns (32 KB of fp32 input, in L1 from the amax to the cast): per column the amax over the
 *  32 rows, its exponent and multiplier, then the cast. `keys` and `mult` hold K entries of
 *  scratch. */
template <FP8Format F, typename T>
TWE_CPU_CLONES void mxfp8_col_block(const T* x, int64_t K, uint8_t* data, uint8_t* scales, uint32_t* keys,
                                    float* mult) {
  constexpr int64_t kChunk = 256;
  for (int64_t k0 = 0; k0 < K; k0 += kChunk) {
    const int64_t kc = std::min(kChunk, K - k0);
    column_amax_keys(x + k0, 32, kc, K, keys + k0);
    mxfp8_exponents<F>(keys + k0, kc, scales + k0, mult + k0);
    for (int64_t r = 0; r < 32; ++r) cast_scaled<F>(x + r * K + k0, kc, mult + k0, data + r * K + k0);
  }
}

/*! out[r * K + k] = FP8(x[r * ld + k] * scale[k]) for `rows` rows, k < K: per-column scales. */
template <FP8Format F, typename T>
TWE_CPU_CLONES void cast_columns(const T* x, int64_t rows, int64_t K, int64_t ld, const float* scale, uint8_t* out) {
  for (int64_t r = 0; r < rows; ++r) cast_scaled<F>(x + r * ld, K, scale, out + r * K);
}

template <typename T>
float block_amax(const T* x, int64_t n) {
  return numerics::bits_to_float(amax_key_run(x, n));
}

/*! NaN-skipping amax of n elements, in parallel chunks (max is exact in any order). The
 *  chunks are read from the end of x backwards (chunk index chunks-1-i for piece index i), so
 *  the cast pass that follows, which starts at the front, finds its first megabytes still in
 *  cache. */
template <typename T>
float tensor_amax(const T* x, int64_t n) {
  constexpr int64_t kChunk = int64_t(1) << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<float> partial(static_cast<size_t>(chunks), 0.0f);
  parallel_for(chunks, n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t c = chunks - 1 - i;
      partial[c] = block_amax(x + c * kChunk, std::min(kChunk, n - c * kChunk));
    }
  });
  float amax = 0.0f;
  for (float p : partial) amax = numerics::amax_update(amax, p);
  return amax;
}

/*! Casts x * scale to FP8 into rowwise (R, K) and/or columnwise (K, R) outputs: 32-row blocks
 *  cast in one vector run (into the rowwise output, or scratch), then stored transposed. */
template <FP8Format F, typename T>
void cast_per_tensor(const T* x, float scale, int64_t R, int64_t K, uint8_t* rowwise, uint8_t* columnwise) {
  const int64_t row_tiles = (R + kTile - 1) / kTile;
  parallel_for(row_tiles, R * K, [&](int64_t tile_begin, int64_t tile_end) {
    std::vector<uint8_t> scratch(rowwise ? 0 : static_cast<size_t>(kTile * K));
    for (int64_t r0 = tile_begin * kTile; r0 < std::min(R, tile_end * kTile); r0 += kTile) {
      const int64_t rows = std::min(R, r0 + kTile) - r0;
      uint8_t* q = rowwise ? rowwise + r0 * K : scratch.data();
      cast_run<F>(x + r0 * K, rows * K, scale, q);
      if (columnwise) transpose_bytes(q, K, rows, K, columnwise + r0, R);
    }
  });
}

template <typename T>
void per_tensor_cast(const QuantizeArgs& a, const T* x, float scale) {
  uint8_t* row = static_cast<uint8_t*>(a.output->rowwise_data.data);
  uint8_t* col = static_cast<uint8_t*>(a.output->columnwise_data.data);
  if (a.params.format == kTweE5M2) cast_per_tensor<FP8Format::kE5M2>(x, scale, a.rows, a.cols, row, col);
  else cast_per_tensor<FP8Format::kE4M3>(x, scale, a.rows, a.cols, row, col);
}

void write_per_tensor_scalars(const QuantizeArgs& a, float scale, float amax) {
  const float scale_inv = 1.0f / scale;
  if (present(&a.output->rowwise_scale_inv)) *static_cast<float*>(a.output->rowwise_scale_inv.data) = scale_inv;
  if (present(&a.output->columnwise_scale_inv)) *static_cast<float*>(a.output->columnwise_scale_inv.data) = scale_inv;
  if (present(&a.output->amax)) *static_cast<float*>(a.output->amax.data) = amax;
}

float format_max(TweFP8Format f) { return f == kTweE5M2 ? numerics::kE5M2Max : numerics::kE4M3Max; }

// ---- MXFP8 -------------------------------------------------------------------------------

template <FP8Format F, typename T>
void mxfp8_rowwise(const T* x, int64_t R, int64_t K, uint8_t* data, uint8_t* scales, int64_t scale_stride) {
  parallel_for(R, R * K, [&](int64_t row_begin, int64_t row_end) {
    for (int64_t r = row_begin; r < row_end; ++r) mxfp8_row<F>(x + r * K, K, data + r * K, scales + r * scale_stride);
  });
}

template <FP8Format F, typename T>
void mxfp8_columnwise(const T* x, int64_t R, int64_t K, uint8_t* data, uint8_t* scales, int64_t scale_stride) {
  parallel_for(R / 32, R * K, [&](int64_t rb_begin, int64_t rb_end) {
    std::vector<uint32_t> keys(static_cast<size_t>(K));
    std::vector<float> mult(static_cast<size_t>(K));
    for (int64_t rb = rb_begin; rb < rb_end; ++rb)
      mxfp8_col_block<F>(x + rb * 32 * K, K, data + rb * 32 * K, scales + rb * scale_stride, keys.data(), mult.data());
  });
}

/*! Both 1D copies in one pass over x: per 32-row block (in cache after its rows are done) the
 *  rowwise blocks of its 32 rows, then its columnwise blocks. The per-copy steps are those of
 *  mxfp8_rowwise and mxfp8_columnwise, so the bytes are theirs. */
template <FP8Format F, typename T>
void mxfp8_both(const T* x, int64_t R, int64_t K, uint8_t* row_data, uint8_t* row_scales, int64_t row_stride,
                uint8_t* col_data, uint8_t* col_scales, int64_t col_stride) {
  parallel_for(R / 32, R * K, [&](int64_t rb_begin, int64_t rb_end) {
    std::vector<uint32_t> keys(static_cast<size_t>(K));
    std::vector<float> mult(static_cast<size_t>(K));
    for (int64_t rb = rb_begin; rb < rb_end; ++rb) {
      for (int64_t r = rb * 32; r < rb * 32 + 32; ++r)
        mxfp8_row<F>(x + r * K, K, row_data + r * K, row_scales + r * row_stride);
      mxfp8_col_block<F>(x + rb * 32 * K, K, col_data + rb * 32 * K, col_scales + rb * col_stride, keys.data(),
                         mult.data());
    }
  });
}

/*! 2D MXFP8: one exponent per 32x32 tile; data written once per requested copy. */
template <FP8Format F, typename T>
void mxfp8_2d(const T* x, int64_t R, int64_t K, uint8_t* row_data, uint8_t* row_scales, int64_t row_stride,
              uint8_t* col_data, uint8_t* col_scales, int64_t col_stride) {
  parallel_for(R / 32, R * K, [&](int64_t rb_begin, int64_t rb_end) {
  for (int64_t rb = rb_begin; rb < rb_end; ++rb) {
    for (int64_t kb = 0; kb < K / 32; ++kb) {
      float amax = 0.0f;
      for (int64_t r = rb * 32; r < rb * 32 + 32; ++r)
        for (int64_t k = kb * 32; k < kb * 32 + 32; ++k) amax = numerics::amax_update(amax, to_float(x[r * K + k]));
      const uint8_t e = numerics::mxfp8_block_exponent<F>(amax);
      const float m = numerics::e8m0_encode_multiplier(e);
      for (int64_t r = rb * 32; r < rb * 32 + 32; ++r) {
        for (int64_t k = kb * 32; k < kb * 32 + 32; ++k) {
          const uint8_t q = numerics::float_to_fp8<F>(to_float(x[r * K + k]) * m);
          if (row_data) row_data[r * K + k] = q;
          if (col_data) col_data[r * K + k] = q;
        }
        if (row_scales) row_scales[r * row_stride + kb] = e;
      }
      if (col_scales)
        for (int64_t k = kb * 32; k < kb * 32 + 32; ++k) col_scales[rb * col_stride + k] = e;
    }
  }
  });
}

template <FP8Format F, typename T>
void mxfp8(const QuantizeArgs& a, const T* x) {
  const TweQuantizedTensor& o = *a.output;
  uint8_t* row_data = static_cast<uint8_t*>(o.rowwise_data.data);
  uint8_t* col_data = static_cast<uint8_t*>(o.columnwise_data.data);
  uint8_t* row_scales = row_data ? static_cast<uint8_t*>(o.rowwise_scale_inv.data) : nullptr;
  uint8_t* col_scales = col_data ? static_cast<uint8_t*>(o.columnwise_scale_inv.data) : nullptr;
  const int64_t row_stride = row_data ? o.rowwise_scale_inv.shape[o.rowwise_scale_inv.ndim - 1] : 0;
  const int64_t col_stride = col_data ? o.columnwise_scale_inv.shape[o.columnwise_scale_inv.ndim - 1] : 0;
  if (row_scales) std::memset(row_scales, 0, static_cast<size_t>(numel(o.rowwise_scale_inv)));
  if (col_scales) std::memset(col_scales, 0, static_cast<size_t>(numel(o.columnwise_scale_inv)));
  if (a.params.two_d) {
    mxfp8_2d<F>(x, a.rows, a.cols, row_data, row_scales, row_stride, col_data, col_scales, col_stride);
    return;
  }
  if (row_data && col_data) {
    mxfp8_both<F>(x, a.rows, a.cols, row_data, row_scales, row_stride, col_data, col_scales, col_stride);
    return;
  }
  if (row_data) mxfp8_rowwise<F>(x, a.rows, a.cols, row_data, row_scales, row_stride);
  if (col_data) mxfp8_columnwise<F>(x, a.rows, a.cols, col_data, col_scales, col_stride);
}

// ---- FP8 block scaling (NUMERICS.md §6) -----------------------------------------------------

constexpr int64_t kFP8Block = numerics::kFP8BlockSize;

/*! Where one FP8-block quantize call writes (null pointers for copies not requested). */
struct Fp8BlockOutputs {
  uint8_t* row_data;
  float* row_scales;
  int64_t row_stride;
  uint8_t* col_data;
  float* col_scales;
  int64_t col_stride;
};

/*! Encode scale of one block from its amax (§2 with the block options). */
struct Fp8BlockScaler {
  float format_max;
  float epsilon;
  bool pow2;
  float inf_value;
  float operator()(float amax) const { return numerics::scale_from_amax(amax, format_max, epsilon, pow2, inf_value); }
};

/*! One row of rowwise 1×128 FP8 blocks (K % 128 == 0), a block at a time in registers: its
 *  amax key, its scale (the inverse goes to scale_inv[kb * stride]), then its cast. With
 *  `col_keys`, col_keys[k] also takes the max with the amax key of element k (the columnwise
 *  blocks' amaxes gathered on the way: a max of keys is exact in any order). */
template <FP8Format F, typename T>
TWE_CPU_CLONES void fp8_block_row(const T* x, int64_t K, const Fp8BlockScaler& scaler, uint8_t* data,
                                  float* scale_inv, int64_t stride, uint32_t* col_keys = nullptr) {
  constexpr int kVecs = kFP8Block / 16;
  for (int64_t kb = 0; kb < K / kFP8Block; ++kb) {
    const T* xb = x + kb * kFP8Block;
    U32x16 keys = {};
    for (int j = 0; j < kVecs; ++j) {
      const U32x16 k = amax_keys(load_f32x16(xb + 16 * j));
      keys = k > keys ? k : keys;
      if (col_keys) {
        U32x16 c;
        std::memcpy(&c, col_keys + kb * kFP8Block + 16 * j, sizeof(c));
        c = k > c ? k : c;
        std::memcpy(col_keys + kb * kFP8Block + 16 * j, &c, sizeof(c));
      }
    }
    const float s = scaler(numerics::bits_to_float(max_lane(keys)));
    scale_inv[kb * stride] = 1.0f / s;
    for (int j = 0; j < kVecs; ++j)
      store_bytes16(data + kb * kFP8Block + 16 * j, fp8_codes<F>(load_f32x16(xb + 16 * j) * s));
  }
}

/*! Both 1×128 copies in one pass over x: per 128-row block and chunk of columns (whole rowwise
 *  blocks; 1 MB of input, in cache from the first step to the last) the
 *  rowwise blocks of the chunk's 128 row pieces (taking the column amax keys on the way), then
 *  the chunk's columnwise blocks: scales, the cast with per-column scales, the transposed store. The per-block steps are
 *  those of the single-copy loops below, so the bytes are theirs. */
template <FP8Format F, typename T>
void fp8_block_1d_both(const T* x, int64_t R, int64_t K, const Fp8BlockScaler& scaler, const Fp8BlockOutputs& o) {
  // Columns per chunk: 1 MB of input per 128-row block (long row runs keep the hardware
  // prefetchers streaming: 1024-column chunks measured 1.2-1.5x slower at 2048 x 2048).
  constexpr int64_t kChunk = (int64_t(1) << 20) / (kFP8Block * static_cast<int64_t>(sizeof(T))) / kFP8Block * kFP8Block;
  parallel_for(R / kFP8Block, R * K, [&](int64_t rb_begin, int64_t rb_end) {
    std::vector<uint32_t> keys(static_cast<size_t>(kChunk));
    std::vector<float> scale(static_cast<size_t>(kChunk));
    std::vector<uint8_t> block(static_cast<size_t>(kFP8Block * kChunk));
    for (int64_t rb = rb_begin; rb < rb_end; ++rb) {
      const T* xb = x + rb * kFP8Block * K;
      for (int64_t k0 = 0; k0 < K; k0 += kChunk) {
        const int64_t kc = std::min(kChunk, K - k0);  // a multiple of 128
        std::fill(keys.begin(), keys.begin() + kc, 0u);
        for (int64_t r = rb * kFP8Block; r < (rb + 1) * kFP8Block; ++r)  // also the column amax keys
          fp8_block_row<F>(x + r * K + k0, kc, scaler, o.row_data + r * K + k0,
                           o.row_scales + (k0 / kFP8Block) * o.row_stride + r, o.row_stride, keys.data());
        for (int64_t k = 0; k < kc; ++k) {
          scale[k] = scaler(numerics::bits_to_float(keys[k]));
          o.col_scales[rb * o.col_stride + k0 + k] = 1.0f / scale[k];
        }
        cast_columns<F>(xb + k0, kFP8Block, kc, K, scale.data(), block.data());
        transpose_bytes(block.data(), kc, kFP8Block, kc, o.col_data + k0 * R + rb * kFP8Block, R);
      }
    }
  });
}

/*! 1×128 blocks: rowwise along K, columnwise along R (blocks of the transpose). */
template <FP8Format F, typename T>
void fp8_block_1d(const T* x, int64_t R, int64_t K, const Fp8BlockScaler& scaler, const Fp8BlockOutputs& o) {
  if (o.row_data && o.col_data) {
    fp8_block_1d_both<F>(x, R, K, scaler, o);
    return;
  }
  if (o.row_data) {
    parallel_for(R, R * K, [&](int64_t row_begin, int64_t row_end) {
      for (int64_t r = row_begin; r < row_end; ++r)
        fp8_block_row<F>(x + r * K, K, scaler, o.row_data + r * K, o.row_scales + r, o.row_stride);
    });
  }
  if (o.col_data) {
    parallel_for(R / kFP8Block, R * K, [&](int64_t rb_begin, int64_t rb_end) {
      std::vector<uint32_t> keys(static_cast<size_t>(K));
      std::vector<float> scale(static_cast<size_t>(K));
      std::vector<uint8_t> block(static_cast<size_t>(kFP8Block * K));
      for (int64_t rb = rb_begin; rb < rb_end; ++rb) {
        const T* xb = x + rb * kFP8Block * K;
        column_amax_keys(xb, kFP8Block, K, K, keys.data());
        for (int64_t k = 0; k < K; ++k) {
          scale[k] = scaler(numerics::bits_to_float(keys[k]));
          o.col_scales[rb * o.col_stride + k] = 1.0f / scale[k];
        }
        // Cast row-major with per-column scales, then store transposed: column k of this row
        // block is one contiguous run of the (K, R) output.
        cast_columns<F>(xb, kFP8Block, K, K, scale.data(), block.data());
        transpose_bytes(block.data(), K, kFP8Block, K, o.col_data + rb * kFP8Block, R);
      }
    });
  }
}

/*! 128×128 tiles: one scale per tile; the columnwise copy is the exact transpose. A strip of
 *  128 rows is read row after row twice (tile amaxes, then the cast with each tile's scale), so
 *  both passes stream through memory; the columnwise copy is the strip's bytes transposed. */
template <FP8Format F, typename T>
void fp8_block_2d(const T* x, int64_t R, int64_t K, const Fp8BlockScaler& scaler, const Fp8BlockOutputs& o) {
  const int64_t tiles = K / kFP8Block;
  parallel_for(R / kFP8Block, R * K, [&](int64_t rb_begin, int64_t rb_end) {
    std::vector<uint8_t> strip(o.row_data ? 0 : static_cast<size_t>(kFP8Block * K));
    std::vector<uint32_t> keys(static_cast<size_t>(tiles));
    std::vector<float> scale(static_cast<size_t>(tiles));
    for (int64_t rb = rb_begin; rb < rb_end; ++rb) {
      const T* xs = x + rb * kFP8Block * K;
      std::fill(keys.begin(), keys.end(), 0u);
      for (int64_t r = 0; r < kFP8Block; ++r)
        for (int64_t kb = 0; kb < tiles; ++kb)
          keys[kb] = std::max(keys[kb], amax_key_run(xs + r * K + kb * kFP8Block, kFP8Block));
      for (int64_t kb = 0; kb < tiles; ++kb) {
        scale[kb] = scaler(numerics::bits_to_float(keys[kb]));
        if (o.row_scales) o.row_scales[rb * o.row_stride + kb] = 1.0f / scale[kb];
        if (o.col_scales) o.col_scales[kb * o.col_stride + rb] = 1.0f / scale[kb];
      }
      uint8_t* q = o.row_data ? o.row_data + rb * kFP8Block * K : strip.data();
      for (int64_t r = 0; r < kFP8Block; ++r)
        for (int64_t kb = 0; kb < tiles; ++kb)
          cast_run<F>(xs + r * K + kb * kFP8Block, kFP8Block, scale[kb], q + r * K + kb * kFP8Block);
      if (o.col_data) transpose_bytes(q, K, kFP8Block, K, o.col_data + rb * kFP8Block, R);
    }
  });
}

template <FP8Format F, typename T>
void fp8_block(const QuantizeArgs& a, const T* x, float inf_value) {
  const TweQuantizedTensor& t = *a.output;
  Fp8BlockOutputs o{};
  o.row_data = static_cast<uint8_t*>(t.rowwise_data.data);
  o.col_data = static_cast<uint8_t*>(t.columnwise_data.data);
  if (o.row_data) {
    o.row_scales = static_cast<float*>(t.rowwise_scale_inv.data);
    o.row_stride = t.rowwise_scale_inv.shape[t.rowwise_scale_inv.ndim - 1];
    std::fill(o.row_scales, o.row_scales + numel(t.rowwise_scale_inv), 0.0f);
  }
  if (o.col_data) {
    o.col_scales = static_cast<float*>(t.columnwise_scale_inv.data);
    o.col_stride = t.columnwise_scale_inv.shape[t.columnwise_scale_inv.ndim - 1];
    std::fill(o.col_scales, o.col_scales + numel(t.columnwise_scale_inv), 0.0f);
  }
  const Fp8BlockScaler scaler{numerics::FP8Traits<F>::kMax, a.params.amax_epsilon, a.params.force_pow2_scales != 0,
                              inf_value};
  if (a.params.two_d) fp8_block_2d<F>(x, a.rows, a.cols, scaler, o);
  else fp8_block_1d<F>(x, a.rows, a.cols, scaler, o);
}

// ---- NVFP4 (NUMERICS.md §7) -------------------------------------------------------------------

constexpr int64_t kFP4Block = numerics::kNVFP4BlockSize;

/*! Stochastic-rounding state of one call: seed and offset (low 32 bits of the rng elements). */
struct SrState {
  uint32_t seed;
  uint32_t offset;
};

uint32_t rng_word(const TweTensorView& rng, int index) {
  if (rng.dtype == kTweInt64) return static_cast<uint32_t>(static_cast<const int64_t*>(rng.data)[index]);
  return static_cast<const uint32_t*>(rng.data)[index];  // uint32, or int32 read as its bits
}

/*! Where one NVFP4 copy goes: packed data (rows, cols/2), E4M3 scale codes, global amax. */
struct Nvfp4Copy {
  uint8_t* data;
  uint8_t* scales;
  int64_t scale_stride;
  float* amax;
  uint32_t index;  // 0 rowwise, 1 columnwise (the Philox counter's copy bit)
};

/*! numerics::float_to_e2m1 of 16 lanes: the same comparisons against the midpoints (a true
 *  comparison is -1 in a lane, so the count is negated), the sign bit, NaN -> 0x7. */
__attribute__((always_inline)) inline U32x16 e2m1_codes(F32x16 v) {
  const U32x16 u = reinterpret_cast<U32x16>(v);
  const U32x16 abs_bits = u & 0x7FFFFFFFu;
  const F32x16 a = reinterpret_cast<F32x16>(abs_bits);
  const I32x16 count = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
  const U32x16 code = reinterpret_cast<U32x16>(-count) | ((u >> 31) << 3);
  return abs_bits > 0x7F800000u ? U32x16{} + numerics::kE2M1MaxCode : code;
}

/*! 16 E2M1 codes (one per lane) packed two per byte: the even lane in the low nibble. */
__attribute__((always_inline)) inline void store_packed8(U32x16 code, uint8_t* out) {
  typedef uint32_t U32x8 __attribute__((vector_size(32)));
  typedef uint8_t U8x8 __attribute__((vector_size(8)));
  const U32x8 even = __builtin_shufflevector(code, code, 0, 2, 4, 6, 8, 10, 12, 14);
  const U32x8 odd = __builtin_shufflevector(code, code, 1, 3, 5, 7, 9, 11, 13, 15);
  const U8x8 packed = __builtin_convertvector(even | (odd << 4), U8x8);
  std::memcpy(out, &packed, sizeof(packed));
}

/*! Exact values of the E4M3 codes (block scale codes d_b). */
struct E4M3Values {
  float value[256];
  E4M3Values() {
    for (int c = 0; c < 256; ++c) value[c] = numerics::fp8_to_float<FP8Format::kE4M3>(static_cast<uint8_t>(c));
  }
};
const E4M3Values& e4m3_values() {
  static const E4M3Values table;
  return table;
}

/*! Per block b < n: its scale code from the amax key (numerics::nvfp4_block_scale_code) and its
 *  encode multiplier (numerics::nvfp4_encode_multiplier: min(1 / fl(d_b · S_dec), FLT_MAX), d_b
 *  from the exact-value table). */
TWE_CPU_CLONES void nvfp4_block_scales(const uint32_t* keys, int64_t n, float factor, float s_dec, const float* e4m3,
                                       uint8_t* codes, float* mult) {
  for (int64_t b = 0; b < n; ++b)
    codes[b] = numerics::nvfp4_block_scale_code(numerics::bits_to_float(keys[b]), factor);
  for (int64_t b = 0; b < n; ++b) {
    const float m = 1.0f / (e4m3[codes[b]] * s_dec);
    mult[b] = m > numerics::kFloatMax ? numerics::kFloatMax : m;
  }
}

/*! block_keys[b] = max(block_keys[b], amax keys of the 16 elements of block b) for one row of
 *  `blocks` 16-element blocks. */
template <typename T>
TWE_CPU_CLONES void accumulate_block_keys(const T* c, int64_t blocks, uint32_t* block_keys) {
  for (int64_t b = 0; b < blocks; ++b) {
    U32x16 a = reinterpret_cast<U32x16>(load_f32x16(c + b * kFP4Block)) & 0x7FFFFFFFu;
    a = a > 0x7F800000u ? 0u : a;
    uint32_t key = block_keys[b];
    for (int j = 0; j < 16; ++j) key = a[j] > key ? a[j] : key;
    block_keys[b] = key;
  }
}

/*! One row of NVFP4 data with round-to-nearest-even (steps 4–5 of §7): block b's 16 elements
 *  times its multiplier mult[b], cast to E2M1 and packed into 8 bytes. */
template <typename T>
TWE_CPU_CLONES void nvfp4_row_rne(const T* c, int64_t blocks, const float* mult, uint8_t* data) {
  for (int64_t b = 0; b < blocks; ++b)
    store_packed8(e2m1_codes(load_f32x16(c + b * kFP4Block) * mult[b]), data + b * (kFP4Block / 2));
}

/*! One row of NVFP4 data with stochastic rounding (step 9): element i = row·cols + b·16 + j of
 *  copy `index` takes byte j of the Philox block of group row·blocks + b. */
template <typename T>
void nvfp4_row_sr(const T* c, int64_t row, int64_t blocks, const float* mult, const SrState& sr, uint32_t index,
                  uint8_t* data) {
  for (int64_t b = 0; b < blocks; ++b) {
    const numerics::Philox4x32 random =
        numerics::sr_random_block(static_cast<uint64_t>(row * blocks + b), index, sr.seed, sr.offset);
    uint8_t codes[kFP4Block];
    for (int j = 0; j < kFP4Block; ++j)
      codes[j] = numerics::float_to_e2m1_stochastic(to_float(c[b * kFP4Block + j]) * mult[b],
                                                    numerics::sr_random_byte(random, j));
    for (int j = 0; j < kFP4Block; j += 2) data[b * kFP4Block / 2 + j / 2] = numerics::pack_e2m1(codes[j], codes[j + 1]);
  }
}

/*! The per-copy constants of §7 steps 2–3 from the copy's global amax. */
struct Nvfp4Globals {
  float s_dec;
  float factor;
  explicit Nvfp4Globals(float global_amax) {
    const float s_enc = numerics::nvfp4_global_encode_scale(global_amax);
    s_dec = 1.0f / s_enc;
    factor = numerics::nvfp4_block_scale_factor(s_enc);
  }
};

/*! Quantizes one row-major copy c (rows, cols) given its global amax: steps 2–5, 7 and 9 of §7
 *  in one pass over strips of 16 rows (a strip's block amaxes, scale codes and multipliers,
 *  then its rows cast while they are in cache). Block amaxes are maxima of amax keys (exact in
 *  any grouping); a 2D tile's scale is written to each of its 16 rows. */
template <typename T>
void nvfp4_rows(const T* c, int64_t rows, int64_t cols, bool two_d, float global_amax, const SrState* sr,
                const Nvfp4Copy& out) {
  const Nvfp4Globals g(global_amax);
  const float* e4m3 = e4m3_values().value;
  const int64_t blocks = cols / kFP4Block;
  std::fill(out.scales, out.scales + round_up(rows, 128) * out.scale_stride, uint8_t{0});
  const int64_t strips = (rows + kFP4Block - 1) / kFP4Block;
  parallel_for(strips, rows * cols, [&](int64_t begin, int64_t end) {
    std::vector<uint32_t> keys(static_cast<size_t>(blocks));
    std::vector<uint8_t> codes(static_cast<size_t>(blocks));
    std::vector<float> mult(static_cast<size_t>(blocks));
    for (int64_t s = begin; s < end; ++s) {
      const int64_t r0 = s * kFP4Block, r1 = std::min(rows, r0 + kFP4Block);
      const int64_t scale_rows = two_d ? r1 - r0 : 1;  // rows sharing one set of block scales
      for (int64_t r = r0; r < r1; r += scale_rows) {
        std::fill(keys.begin(), keys.end(), 0u);
        for (int64_t i = r; i < r + scale_rows; ++i) accumulate_block_keys(c + i * cols, blocks, keys.data());
        nvfp4_block_scales(keys.data(), blocks, g.factor, g.s_dec, e4m3, codes.data(), mult.data());
        for (int64_t i = r; i < r + scale_rows; ++i) {
          std::memcpy(out.scales + i * out.scale_stride, codes.data(), static_cast<size_t>(blocks));
          uint8_t* data = out.data + i * cols / 2;
          if (sr) nvfp4_row_sr(c + i * cols, i, blocks, mult.data(), *sr, out.index, data);
          else nvfp4_row_rne(c + i * cols, blocks, mult.data(), data);
        }
      }
    }
  });
  *out.amax = global_amax;
}

/*! packed[i * K + k] = E2M1(x[2i][k] · mult[k]) | E2M1(x[2i+1][k] · mult[k]) << 4 for i < 8:
 *  one 16-row block of the columnwise copy, cast with per-column multipliers (K % 16 == 0). */
template <typename T>
TWE_CPU_CLONES void nvfp4_column_block_rne(const T* x, int64_t K, const float* mult, uint8_t* packed) {
  for (int64_t k = 0; k < K; k += 16) {
    F32x16 m;
    std::memcpy(&m, mult + k, sizeof(m));
    for (int64_t i = 0; i < kFP4Block / 2; ++i) {
      const U32x16 even = e2m1_codes(load_f32x16(x + 2 * i * K + k) * m);
      const U32x16 odd = e2m1_codes(load_f32x16(x + (2 * i + 1) * K + k) * m);
      const U8x16 bytes = __builtin_convertvector(even | (odd << 4), U8x16);
      std::memcpy(packed + i * K + k, &bytes, sizeof(bytes));
    }
  }
}

/*! The columnwise copy of x (R, K) without RHT, i.e. the rows of xᵀ (K, R), given its global
 *  amax (that of x: the same values), quantized straight from x: per 16-row block of x (one
 *  16-element block of every row of xᵀ) the column amaxes, scale codes and multipliers, the
 *  cast of the block's 16 × K elements into 8 × K packed bytes, then those bytes stored
 *  transposed (16×16 byte tiles for two blocks at a time). Same steps, order and bytes as
 *  nvfp4_rows on xᵀ. */
template <typename T>
void nvfp4_columns(const T* x, int64_t R, int64_t K, bool two_d, float global_amax, const SrState* sr,
                   const Nvfp4Copy& out) {
  const Nvfp4Globals g(global_amax);
  const float* e4m3 = e4m3_values().value;
  const int64_t blocks = R / kFP4Block;  // blocks per row of xᵀ
  std::fill(out.scales, out.scales + round_up(K, 128) * out.scale_stride, uint8_t{0});
  constexpr int64_t kStrip = 2 * kFP4Block;  // two blocks: 16 packed bytes per column of x
  const int64_t strips = (R + kStrip - 1) / kStrip;
  parallel_for(strips, R * K, [&](int64_t begin, int64_t end) {
    std::vector<uint32_t> keys(static_cast<size_t>(K));
    std::vector<uint8_t> codes(static_cast<size_t>(K));
    std::vector<float> mult(static_cast<size_t>(K));
    std::vector<uint8_t> packed(static_cast<size_t>(kFP4Block * K));
    for (int64_t s = begin; s < end; ++s) {
      const int64_t r0 = s * kStrip, r1 = std::min(R, r0 + kStrip);
      for (int64_t rb = r0; rb < r1; rb += kFP4Block) {
        const int64_t b = rb / kFP4Block;  // block index along the rows of xᵀ
        const T* xb = x + rb * K;
        std::fill(keys.begin(), keys.end(), 0u);
        column_keys(xb, kFP4Block, K, K, keys.data());
        if (two_d)  // 16×16 tiles of xᵀ: 16 of its rows (columns k of x) share a block amax
          for (int64_t k0 = 0; k0 < K; k0 += kFP4Block) {
            const uint32_t key = *std::max_element(keys.begin() + k0, keys.begin() + k0 + kFP4Block);
            std::fill(keys.begin() + k0, keys.begin() + k0 + kFP4Block, key);
          }
        nvfp4_block_scales(keys.data(), K, g.factor, g.s_dec, e4m3, codes.data(), mult.data());
        for (int64_t k = 0; k < K; ++k) out.scales[k * out.scale_stride + b] = codes[k];
        uint8_t* half = packed.data() + (rb - r0) / 2 * K;  // rows (rb - r0)/2 .. +8 of the strip's bytes
        if (!sr) {
          nvfp4_column_block_rne(xb, K, mult.data(), half);
          continue;
        }
        for (int64_t k = 0; k < K; ++k) {
          const numerics::Philox4x32 random =
              numerics::sr_random_block(static_cast<uint64_t>(k * blocks + b), out.index, sr->seed, sr->offset);
          uint8_t c[kFP4Block];
          for (int j = 0; j < kFP4Block; ++j)
            c[j] = numerics::float_to_e2m1_stochastic(to_float(xb[j * K + k]) * mult[k],
                                                       numerics::sr_random_byte(random, j));
          for (int j = 0; j < kFP4Block; j += 2) half[(j / 2) * K + k] = numerics::pack_e2m1(c[j], c[j + 1]);
        }
      }
      // The strip's packed bytes are (r1 - r0)/2 rows of K; column k goes to row k of the copy.
      transpose_bytes(packed.data(), K, (r1 - r0) / 2, K, out.data + r0 / 2, R / 2);
    }
  });
  *out.amax = global_amax;
}

/*! The columnwise operand xᵀ (K, R) in fp32, transformed along R in chunks of 16 by the RHT
 *  (each output rounded to bf16). */
template <typename T>
std::vector<float> nvfp4_rht_operand(const T* x, int64_t R, int64_t K) {
  std::vector<float> xt(static_cast<size_t>(R * K));
  parallel_for(R / numerics::kRHTSize, R * K, [&](int64_t begin, int64_t end) {
    for (int64_t r0 = begin * numerics::kRHTSize; r0 < end * numerics::kRHTSize; r0 += numerics::kRHTSize) {
      for (int64_t k = 0; k < K; ++k) {  // the chunk's 16 input rows stay in cache
        float chunk[numerics::kRHTSize];
        for (int j = 0; j < numerics::kRHTSize; ++j) chunk[j] = to_float(x[(r0 + j) * K + k]);
        numerics::rht_chunk(chunk, xt.data() + k * R + r0);
      }
    }
  });
  return xt;
}

template <typename T>
void nvfp4(const QuantizeArgs& a, const T* x) {
  const TweQuantizedTensor& t = *a.output;
  SrState state{};
  const SrState* sr = nullptr;
  if (a.params.stochastic_rounding) {
    state = SrState{rng_word(*a.rng, 0), rng_word(*a.rng, 1)};
    sr = &state;
  }
  const bool two_d = a.params.two_d != 0;
  auto copy = [](const TweTensorView& data, const TweTensorView& scales, const TweTensorView& amax, uint32_t index) {
    return Nvfp4Copy{static_cast<uint8_t*>(data.data), static_cast<uint8_t*>(scales.data),
                     scales.shape[scales.ndim - 1], static_cast<float*>(amax.data), index};
  };
  const bool rht = a.params.with_rht != 0;
  const bool columnwise = present(&t.columnwise_data);
  // x and xᵀ hold the same values: one global amax serves both copies unless the RHT changes them.
  // Given amaxes (a shard's group-wide [rowwise, columnwise] values) replace the computed ones.
  const float* given = a.amax ? static_cast<const float*>(a.amax->data) : nullptr;
  float amax = 0.0f;
  if (given) amax = given[0];
  else if (present(&t.rowwise_data) || (columnwise && !rht)) amax = tensor_amax(x, a.rows * a.cols);
  if (present(&t.rowwise_data)) {
    nvfp4_rows(x, a.rows, a.cols, two_d, amax, sr, copy(t.rowwise_data, t.rowwise_scale_inv, t.amax, 0));
  }
  if (columnwise) {
    const Nvfp4Copy out = copy(t.columnwise_data, t.columnwise_scale_inv, t.columnwise_amax, 1);
    if (rht) {
      const std::vector<float> xt = nvfp4_rht_operand(x, a.rows, a.cols);
      nvfp4_rows(xt.data(), a.cols, a.rows, two_d, given ? given[1] : tensor_amax(xt.data(), a.rows * a.cols), sr,
                 out);
    } else {
      nvfp4_columns(x, a.rows, a.cols, two_d, given ? given[1] : amax, sr, out);
    }
  }
}

// ---- Dequantize ---------------------------------------------------------------------------

/*! out[k] = Out(value[codes[k]] * mult[k]) for k < K: one output row from its FP8 codes, the
 *  exact values of the 256 codes and a per-element multiplier (its block's scale). */
template <typename Out>
TWE_CPU_CLONES void decode_run(const uint8_t* codes, int64_t K, const float* value, const float* mult, Out* out) {
  for (int64_t k = 0; k < K; ++k) out[k] = FromFloat<Out>::apply(value[codes[k]] * mult[k]);
}

/*! Dequantizes an FP8-coded (R, K) tensor stored (R, K) or, when `transposed`, (K, R): tiles of
 *  16 rows (a transposed copy is first turned back into 16 contiguous rows of codes), each row
 *  decoded through the 256-entry value table of format F with the multipliers
 *  `row_scales(r, mult)` writes for row r. The table holds fp8_to_float of every code, so the
 *  bytes are those of decoding element by element. */
template <FP8Format F, typename Out, typename RowScales>
void dequantize_fp8_rows(const DequantizeArgs& a, bool transposed, RowScales row_scales) {
  std::array<float, 256> value{};
  for (int code = 0; code < 256; ++code) value[code] = numerics::fp8_to_float<F>(static_cast<uint8_t>(code));
  const uint8_t* q = static_cast<const uint8_t*>(a.data->data);
  Out* out = static_cast<Out*>(a.output->data);
  const int64_t R = a.rows, K = a.cols;
  constexpr int64_t kRowTile = 16;
  parallel_for((R + kRowTile - 1) / kRowTile, R * K, [&](int64_t tile_begin, int64_t tile_end) {
    std::vector<uint8_t> codes(transposed ? static_cast<size_t>(kRowTile * K) : 0);
    std::vector<float> mult(static_cast<size_t>(K));
    for (int64_t t = tile_begin; t < tile_end; ++t) {
      const int64_t r0 = t * kRowTile, h = std::min(kRowTile, R - r0);
      // Stored (K, R): the h columns r0.. of the stored copy, transposed into h rows of K codes.
      if (transposed) transpose_bytes(q + r0, R, K, h, codes.data(), K);
      for (int64_t j = 0; j < h; ++j) {
        row_scales(r0 + j, mult.data());
        const uint8_t* row = transposed ? codes.data() + j * K : q + (r0 + j) * K;
        decode_run(row, K, value.data(), mult.data(), out + (r0 + j) * K);
      }
    }
  });
}

template <FP8Format F, typename Out>
void dequantize_fp8_typed(const DequantizeArgs& a) {
  const float scale_inv = *static_cast<const float*>(a.scale_inv->data);
  dequantize_fp8_rows<F, Out>(a, a.columnwise, [&](int64_t, float* mult) {
    std::fill(mult, mult + a.cols, scale_inv);
  });
}

template <FP8Format F, typename Out>
void dequantize_mxfp8_typed(const DequantizeArgs& a) {
  const uint8_t* scales = static_cast<const uint8_t*>(a.scale_inv->data);
  const int64_t stride = a.scale_inv->shape[a.scale_inv->ndim - 1];
  // MXFP8 keeps its columnwise copy in the (R, K) layout.
  dequantize_fp8_rows<F, Out>(a, false, [&](int64_t r, float* mult) {
    for (int64_t k = 0; k < a.cols; ++k)
      mult[k] = numerics::e8m0_to_float(a.columnwise ? scales[(r / 32) * stride + k] : scales[r * stride + k / 32]);
  });
}

template <FP8Format F, typename Out>
void dequantize_fp8_block_typed(const DequantizeArgs& a) {
  const float* scales = static_cast<const float*>(a.scale_inv->data);
  const int64_t stride = a.scale_inv->shape[a.scale_inv->ndim - 1];
  dequantize_fp8_rows<F, Out>(a, a.columnwise, [&](int64_t r, float* mult) {
    const int64_t rb = r / kFP8Block;
    for (int64_t k = 0; k < a.cols; ++k) {
      const int64_t kb = k / kFP8Block;
      if (a.two_d) mult[k] = a.columnwise ? scales[kb * stride + rb] : scales[rb * stride + kb];
      else mult[k] = a.columnwise ? scales[rb * stride + k] : scales[kb * stride + r];
    }
  });
}

template <typename Out>
void dequantize_nvfp4_typed(const DequantizeArgs& a) {
  const uint8_t* q = static_cast<const uint8_t*>(a.data->data);
  const uint8_t* scales = static_cast<const uint8_t*>(a.scale_inv->data);
  const int64_t stride = a.scale_inv->shape[a.scale_inv->ndim - 1];
  const float global_amax = *static_cast<const float*>(a.amax->data);
  Out* out = static_cast<Out*>(a.output->data);
  const int64_t R = a.rows, K = a.cols;
  // The stored copy has `rows` rows of `cols` elements: (R, K), or (K, R) when columnwise.
  const int64_t rows = a.columnwise ? K : R, cols = a.columnwise ? R : K;
  parallel_for(rows, R * K, [&](int64_t row_begin, int64_t row_end) {
    for (int64_t i = row_begin; i < row_end; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        const uint8_t byte = q[(i * cols + j) / 2];
        const uint8_t code = (j & 1) ? static_cast<uint8_t>(byte >> 4) : static_cast<uint8_t>(byte & 0xFu);
        const float m = numerics::nvfp4_decode_multiplier(scales[i * stride + j / kFP4Block], global_amax);
        const float v = numerics::e2m1_to_float(code) * m;
        out[a.columnwise ? j * K + i : i * K + j] = FromFloat<Out>::apply(v);
      }
  });
}

template <template <FP8Format, typename> class Kernel>
TweStatus dispatch_dequantize(const DequantizeArgs& a) {
  ScopedIeeeSubnormals ieee;
  const bool e5m2 = a.data->dtype == kTweFloat8E5M2;
  return dispatch_high_precision(a.output->dtype, [&](auto out_tag) {
    using Out = decltype(out_tag);
    if (e5m2) Kernel<FP8Format::kE5M2, Out>::run(a);
    else Kernel<FP8Format::kE4M3, Out>::run(a);
    return kTweSuccess;
  });
}

template <FP8Format F, typename Out>
struct DequantizeFp8 { static void run(const DequantizeArgs& a) { dequantize_fp8_typed<F, Out>(a); } };
template <FP8Format F, typename Out>
struct DequantizeMxfp8 { static void run(const DequantizeArgs& a) { dequantize_mxfp8_typed<F, Out>(a); } };
template <FP8Format F, typename Out>
struct DequantizeFp8Block { static void run(const DequantizeArgs& a) { dequantize_fp8_block_typed<F, Out>(a); } };

/*! Huge-page advice for the data copies of a quantize output (see advise_huge_pages). */
void advise_outputs(const TweQuantizedTensor& o) {
  for (const TweTensorView* v : {&o.rowwise_data, &o.columnwise_data})
    if (present(v)) advise_huge_pages(v->data, numel(*v) * element_size(v->dtype));
}

}  // namespace

template <typename T>
uint32_t amax_key_bits(const T* x, int64_t n) {
  return amax_key_run(x, n);
}
template uint32_t amax_key_bits<float>(const float*, int64_t);
template uint32_t amax_key_bits<BFloat16>(const BFloat16*, int64_t);
template uint32_t amax_key_bits<Float16>(const Float16*, int64_t);

TweStatus quantize_fp8_current(const QuantizeArgs& a) {
  ScopedIeeeSubnormals ieee;
  return dispatch_high_precision(a.input->dtype, [&](auto tag) {
    using T = decltype(tag);
    return quantize_fp8_per_tensor_with_amax(a, tensor_amax(static_cast<const T*>(a.input->data), a.rows * a.cols));
  });
}

TweStatus quantize_fp8_per_tensor_with_amax(const QuantizeArgs& a, float amax) {
  ScopedIeeeSubnormals ieee;
  advise_outputs(*a.output);
  return dispatch_high_precision(a.input->dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(a.input->data);
    const float scale = a.scale ? *static_cast<const float*>(a.scale->data)
                                : numerics::scale_from_amax(amax, format_max(a.params.format), a.params.amax_epsilon,
                                                            a.params.force_pow2_scales != 0, numerics::kFloatMax);
    per_tensor_cast(a, x, scale);
    write_per_tensor_scalars(a, scale, amax);
    return kTweSuccess;
  });
}

TweStatus grouped_quantize_fp8_current(const QuantizeArgs& a, const TweTensorView& m_splits) {
  const int32_t* splits = static_cast<const int32_t*>(m_splits.data);
  const TweQuantizedTensor& o = *a.output;
  const int64_t k = a.cols;
  auto block = [](const TweTensorView& v, int64_t offset, int64_t rows, int64_t cols) {
    return view_2d(v, offset, rows, cols);
  };
  int64_t start = 0;
  for (int64_t g = 0; g < m_splits.shape[0]; ++g) {
    const int64_t begin = std::min(start, a.rows);
    const int64_t end = std::min(start + std::max<int32_t>(splits[g], 0), a.rows);
    start += std::max<int32_t>(splits[g], 0);
    const int64_t rows = end - begin;
    TweTensorView input = block(*a.input, begin * k, rows, k);
    TweQuantizedTensor out{};
    out.rowwise_data = block(o.rowwise_data, begin * k, rows, k);
    out.rowwise_scale_inv = block(o.rowwise_scale_inv, g, 1, 1);
    out.columnwise_data = block(o.columnwise_data, begin * k, k, rows);
    out.columnwise_scale_inv = block(o.columnwise_scale_inv, g, 1, 1);
    out.amax = block(o.amax, g, 1, 1);
    QuantizeArgs group{&input, nullptr, nullptr, &out, a.params, rows, k, a.stream};
    const TweStatus st = quantize_fp8_current(group);
    if (st) return st;
  }
  return kTweSuccess;
}

TweStatus grouped_quantize_fp8_delayed(const QuantizeArgs& a, const TweTensorView& m_splits) {
  const int32_t* splits = static_cast<const int32_t*>(m_splits.data);
  const TweQuantizedTensor& o = *a.output;
  const int64_t k = a.cols;
  int64_t start = 0;
  for (int64_t g = 0; g < m_splits.shape[0]; ++g) {
    const int64_t begin = std::min(start, a.rows);
    const int64_t end = std::min(start + std::max<int32_t>(splits[g], 0), a.rows);
    start += std::max<int32_t>(splits[g], 0);
    const int64_t rows = end - begin;
    TweTensorView input = view_2d(*a.input, begin * k, rows, k);
    TweTensorView scale = view_2d(*a.scale, g, 1, 1);
    TweQuantizedTensor out{};
    out.rowwise_data = view_2d(o.rowwise_data, begin * k, rows, k);
    out.rowwise_scale_inv = view_2d(o.rowwise_scale_inv, g, 1, 1);
    out.columnwise_data = view_2d(o.columnwise_data, begin * k, k, rows);
    out.columnwise_scale_inv = view_2d(o.columnwise_scale_inv, g, 1, 1);
    out.amax = view_2d(o.amax, g, 1, 1);
    QuantizeArgs group{&input, &scale, nullptr, &out, a.params, rows, k, a.stream};
    const TweStatus st = quantize_fp8_delayed(group);
    if (st) return st;
  }
  return kTweSuccess;
}

TweStatus grouped_quantize_fp8_block(const QuantizeArgs& a, const TweTensorView& m_splits) {
  const int32_t* splits = static_cast<const int32_t*>(m_splits.data);
  const TweQuantizedTensor& o = *a.output;
  const int64_t k = a.cols;
  const bool two_d = a.params.two_d != 0;
  int64_t start = 0, row_scales = 0, col_scales = 0;
  for (int64_t g = 0; g < m_splits.shape[0]; ++g) {
    const int64_t m = splits[g];
    if (m < 0 || m % 128 != 0) {
      return fail(kTweInvalidArgument, "FP8 block scaling quantizes each expert block on its own and needs every "
                                       "m_split to be a multiple of 128 (pad the blocks: align_size=128), got " +
                                           std::to_string(m));
    }
    int64_t rr, rc, cr, cc;
    fp8_block_scale_dims(m, k, two_d, &rr, &rc);  // rowwise copy: data (m, K)
    fp8_block_scale_dims(k, m, two_d, &cr, &cc);  // columnwise copy: data (K, m)
    if (start + m > a.rows || row_scales + rr * rc > numel(o.rowwise_scale_inv) ||
        col_scales + cr * cc > numel(o.columnwise_scale_inv)) {
      return fail(kTweInvalidArgument, "m_splits exceed the rows of the input or of the scale buffers");
    }
    if (m > 0) {
      TweTensorView input = view_2d(*a.input, start * k, m, k);
      TweQuantizedTensor out{};
      out.rowwise_data = view_2d(o.rowwise_data, start * k, m, k);
      out.rowwise_scale_inv = view_2d(o.rowwise_scale_inv, row_scales, rr, rc);
      out.columnwise_data = view_2d(o.columnwise_data, start * k, k, m);
      out.columnwise_scale_inv = view_2d(o.columnwise_scale_inv, col_scales, cr, cc);
      QuantizeArgs group{&input, nullptr, nullptr, &out, a.params, m, k, a.stream};
      const TweStatus st = quantize_fp8_block(group);
      if (st) return st;
    }
    start += m;
    row_scales += rr * rc;
    col_scales += cr * cc;
  }
  return kTweSuccess;
}

TweStatus grouped_quantize_mxfp8(const QuantizeArgs& a, const TweTensorView& m_splits) {
  const int32_t* splits = static_cast<const int32_t*>(m_splits.data);
  const TweQuantizedTensor& o = *a.output;
  const int64_t k = a.cols;
  auto block = [](const TweTensorView& v, int64_t row, int64_t rows) {
    const int64_t cols = v.shape[v.ndim - 1];
    return view_2d(v, row * cols, rows, cols);
  };
  int64_t start = 0, row_scales = 0, col_scales = 0;
  for (int64_t g = 0; g < m_splits.shape[0]; ++g) {
    const int64_t m = splits[g];
    if (m < 0 || m % 32 != 0) {
      return fail(kTweInvalidArgument, "MXFP8 quantizes each expert block on its own and needs every m_split to be a "
                                       "multiple of 32 (pad the blocks: align_size=32), got " + std::to_string(m));
    }
    const int64_t r_rows = round_up(m, 128), c_rows = round_up(m / 32, 4);
    if (start + m > a.rows || row_scales + r_rows > rows(o.rowwise_scale_inv) ||
        col_scales + c_rows > rows(o.columnwise_scale_inv)) {
      return fail(kTweInvalidArgument, "m_splits exceed the rows of the input or of the scale buffers");
    }
    TweTensorView input = block(*a.input, start, m);
    TweQuantizedTensor out{};
    out.rowwise_data = block(o.rowwise_data, start, m);
    out.rowwise_scale_inv = block(o.rowwise_scale_inv, row_scales, r_rows);
    out.columnwise_data = block(o.columnwise_data, start, m);
    out.columnwise_scale_inv = block(o.columnwise_scale_inv, col_scales, c_rows);
    QuantizeArgs group{&input, nullptr, nullptr, &out, a.params, m, k, a.stream};
    if (m > 0) {
      const TweStatus st = quantize_mxfp8(group);
      if (st) return st;
    }
    start += m;
    row_scales += r_rows;
    col_scales += c_rows;
  }
  return kTweSuccess;
}

TweStatus grouped_quantize_nvfp4(const QuantizeArgs& a, const TweTensorView& m_splits) {
  const int32_t* splits = static_cast<const int32_t*>(m_splits.data);
  const TweQuantizedTensor& o = *a.output;
  const int64_t k = a.cols;
  const int64_t row_stride = round_up(k / kFP4Block, 4);  // rowwise scale codes per row
  const int64_t col_rows = round_up(k, 128);              // columnwise scale rows per block
  uint32_t seed = 0, offset = 0;
  if (a.params.stochastic_rounding) {
    seed = rng_word(*a.rng, 0);
    offset = rng_word(*a.rng, 1);
  }
  // Scale padding is zero (defined bytes in both frontends).
  for (const TweTensorView* v : {&o.rowwise_scale_inv, &o.columnwise_scale_inv})
    std::memset(v->data, 0, static_cast<size_t>(numel(*v)));
  int64_t start = 0, row_scales = 0, col_scales = 0;
  for (int64_t g = 0; g < m_splits.shape[0]; ++g) {
    const int64_t m = splits[g];
    if (m < 0 || m % kFP4Block != 0) {
      return fail(kTweInvalidArgument, "NVFP4 quantizes each expert block on its own and needs every m_split to be a "
                                       "multiple of 16 (pad the blocks: align_size=32), got " + std::to_string(m));
    }
    const int64_t row_count = round_up(m, 128) * row_stride;
    const int64_t col_stride = round_up(m / kFP4Block, 4);
    const int64_t col_count = col_rows * col_stride;
    if (start + m > a.rows || row_scales + row_count > numel(o.rowwise_scale_inv) ||
        col_scales + col_count > numel(o.columnwise_scale_inv)) {
      return fail(kTweInvalidArgument, "m_splits exceed the rows of the input or of the scale buffers");
    }
    static_cast<float*>(o.amax.data)[g] = 0.0f;
    static_cast<float*>(o.columnwise_amax.data)[g] = 0.0f;
    if (m > 0) {
      // Expert g rounds stochastically with [seed, offset + g] (mod 2^32): the rng of its own Linear.
      uint32_t words[2] = {seed, offset + static_cast<uint32_t>(g)};
      TweTensorView rng{};
      rng.data = words;
      rng.dtype = kTweUInt32;
      rng.ndim = 1;
      rng.shape[0] = 2;
      rng.device = kTweCPU;
      TweTensorView input = view_2d(*a.input, start * k, m, k);
      TweQuantizedTensor out{};
      out.rowwise_data = view_2d(o.rowwise_data, start * k / 2, m, k / 2);
      out.rowwise_scale_inv = view_2d(o.rowwise_scale_inv, row_scales, round_up(m, 128), row_stride);
      out.amax = view_2d(o.amax, g, 1, 1);
      out.columnwise_data = view_2d(o.columnwise_data, start * k / 2, k, m / 2);
      out.columnwise_scale_inv = view_2d(o.columnwise_scale_inv, col_scales, col_rows, col_stride);
      out.columnwise_amax = view_2d(o.columnwise_amax, g, 1, 1);
      QuantizeArgs group{&input, nullptr, a.params.stochastic_rounding ? &rng : nullptr, &out, a.params, m, k,
                         a.stream};
      const TweStatus st = quantize_nvfp4(group);
      if (st) return st;
    }
    start += m;
    row_scales += row_count;
    col_scales += col_count;
  }
  return kTweSuccess;
}

TweStatus quantize_fp8_delayed(const QuantizeArgs& a) {
  ScopedIeeeSubnormals ieee;
  advise_outputs(*a.output);
  return dispatch_high_precision(a.input->dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(a.input->data);
    const float scale = *static_cast<const float*>(a.scale->data);
    per_tensor_cast(a, x, scale);
    write_per_tensor_scalars(a, scale, tensor_amax(x, a.rows * a.cols));
    return kTweSuccess;
  });
}

TweStatus quantize_mxfp8(const QuantizeArgs& a) {
  ScopedIeeeSubnormals ieee;
  advise_outputs(*a.output);
  return dispatch_high_precision(a.input->dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(a.input->data);
    if (a.params.format == kTweE5M2) mxfp8<FP8Format::kE5M2>(a, x);
    else mxfp8<FP8Format::kE4M3>(a, x);
    return kTweSuccess;
  });
}

TweStatus quantize_fp8_block(const QuantizeArgs& a) {
  ScopedIeeeSubnormals ieee;
  advise_outputs(*a.output);
  const float inf_value = dtype_max(a.input->dtype);
  return dispatch_high_precision(a.input->dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(a.input->data);
    if (a.params.format == kTweE5M2) fp8_block<FP8Format::kE5M2>(a, x, inf_value);
    else fp8_block<FP8Format::kE4M3>(a, x, inf_value);
    return kTweSuccess;
  });
}

TweStatus quantize_nvfp4(const QuantizeArgs& a) {
  ScopedIeeeSubnormals ieee;
  advise_outputs(*a.output);
  return dispatch_high_precision(a.input->dtype, [&](auto tag) {
    using T = decltype(tag);
    nvfp4(a, static_cast<const T*>(a.input->data));
    return kTweSuccess;
  });
}

TweStatus dequantize_fp8(const DequantizeArgs& a) { return dispatch_dequantize<DequantizeFp8>(a); }

TweStatus dequantize_mxfp8(const DequantizeArgs& a) { return dispatch_dequantize<DequantizeMxfp8>(a); }

TweStatus dequantize_fp8_block(const DequantizeArgs& a) { return dispatch_dequantize<DequantizeFp8Block>(a); }

TweStatus dequantize_nvfp4(const DequantizeArgs& a) {
  ScopedIeeeSubnormals ieee;
  return dispatch_high_precision(a.output->dtype, [&](auto out_tag) {
    dequantize_nvfp4_typed<decltype(out_tag)>(a);
    return kTweSuccess;
  });
}

TweStatus update_delayed_scaling(const DelayedUpdateArgs& a) {
  ScopedIeeeSubnormals ieee;
  const float* hist = static_cast<const float*>(a.amax_history->data);
  const float* scale = static_cast<const float*>(a.scale->data);
  float* new_hist = static_cast<float*>(a.new_amax_history->data);
  float* new_scale = static_cast<float*>(a.new_scale->data);
  const int64_t L = a.history_length, N = a.slots;
  const float fmt_max = format_max(a.params.format);
  for (int64_t n = 0; n < N; ++n) {
    const float a_new = hist[n];
    if (a_new == 0.0f) {  // unused slot: no roll, same scale
      for (int64_t l = 0; l < L; ++l) new_hist[l * N + n] = hist[l * N + n];
      new_scale[n] = scale[n];
      continue;
    }
    float amax_star = a_new;
    if (a.params.algorithm == kTweAmaxMax)
      for (int64_t l = 1; l < L; ++l) amax_star = numerics::amax_update(amax_star, hist[l * N + n]);
    // Roll: H'[k] = H[k+1 mod L], then H'[0] = 0.
    for (int64_t l = 0; l < L; ++l) new_hist[l * N + n] = hist[((l + 1) % L) * N + n];
    new_hist[n] = 0.0f;
    new_scale[n] = numerics::delayed_scale_update(scale[n], amax_star, fmt_max, a.params.margin);
  }
  return kTweSuccess;
}

}  // namespace cpu
}  // namespace twe
