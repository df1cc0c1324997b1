// CPU kernel of the gemm family: operands widened to fp32 panels, partial sums from our blocked
// FMA micro-kernels (AVX-512 / AVX2+FMA / scalar fmaf, chosen at run time, identical bytes: one
// sequential FMA chain over K per output element, §8 batch invariance), block scaling and the
// epilogue in loops; value math is in numerics.h.
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "internal/cpu.h"
#include "internal/gemm.h"

namespace twe {
namespace cpu {
namespace {

using numerics::FP8Format;

template <FP8Format F>
std::array<float, 256> fp8_table() {
  std::array<float, 256> table{};
  for (int code = 0; code < 256; ++code) table[code] = numerics::fp8_to_float<F>(static_cast<uint8_t>(code));
  return table;
}

template <typename T>
void widen_into(const T* src, int64_t count, float* dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = to_float(src[i]);
}

void widen_table_into(const uint8_t* src, int64_t count, const std::array<float, 256>& table, float* dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = table[src[i]];
}

/*! Packed E2M1 pairs -> two fp32 values each, the even index from the low nibble (§1). */
void widen_e2m1_into(const uint8_t* src, int64_t bytes, float* dst) {
  for (int64_t i = 0; i < bytes; ++i) {
    dst[2 * i] = numerics::e2m1_to_float(static_cast<uint8_t>(src[i] & 0xF));
    dst[2 * i + 1] = numerics::e2m1_to_float(static_cast<uint8_t>(src[i] >> 4));
  }
}

/*! The operand's data as exact fp32 values in its stored layout (no copy for fp32 data). */
const float* widen(const TweGemmOperand& op, TweGemmScaling scaling, std::vector<float>& buffer) {
  const int64_t count = numel(op.data);
  const TweDType dt = op.data.dtype;
  if (dt == kTweFloat32) return static_cast<const float*>(op.data.data);
  const bool nvfp4 = scaling == kTweGemmNVFP4;
  buffer.resize(static_cast<size_t>(nvfp4 ? 2 * count : count));
  const uint8_t* bytes = static_cast<const uint8_t*>(op.data.data);
  if (nvfp4) {
    widen_e2m1_into(bytes, count, buffer.data());
  } else if (dt == kTweBFloat16) {
    widen_into(static_cast<const BFloat16*>(op.data.data), count, buffer.data());
  } else if (dt == kTweFloat16) {
    widen_into(static_cast<const Float16*>(op.data.data), count, buffer.data());
  } else if (dt == kTweFloat8E4M3) {
    static const std::array<float, 256> table = fp8_table<FP8Format::kE4M3>();
    widen_table_into(bytes, count, table, buffer.data());
  } else {
    static const std::array<float, 256> table = fp8_table<FP8Format::kE5M2>();
    widen_table_into(bytes, count, table, buffer.data());
  }
  return buffer.data();
}

/*! A widened operand: element (r, k) at data[r * k + k] (K-major) or data[k * rows + r]. */
struct Panel {
  const float* data;
  bool k_major;
  int64_t rows;
  int64_t k;
  int64_t row_step() const { return k_major ? k : 1; }
  int64_t k_step() const { return k_major ? 1 : rows; }
};

// ---------------------------------------------------------------------------------------------
// Micro-kernels. Every output element is one fp32 FMA chain over K in increasing order:
//   c = +0; for k: c = fma(a[i][k], b[j][k], c)
// (single rounding per step, explicit FMA instructions or fmaf in every variant), so its bytes
// do not depend on the tile, the ISA, M, N or the thread count (§8 batch invariance). The
// K-blocking below continues the same chain: a tile's accumulators are stored in fp32 and
// reloaded unchanged for the next K-block.

/*! C tile (mr × nr, leading dimension ldc) [+]= Σ_k Ap[k][0:mr] ⊗ Bp[k][0:nr], chain per element. */
using MicroKernel = void (*)(int64_t kc, const float* ap, const float* bp, float* c, int64_t ldc, bool zero);

/*! Block formats: for each K-block b of `block` (the last may be shorter) of the kc K values,
 *  p = chain from +0 over the block, then c = fl(c + fl(fl(p · sa[b][i]) · sb[b][j])) (§8). */
using BlockKernel = void (*)(int64_t kc, int64_t block, const float* ap, const float* bp, const float* sa,
                             const float* sb, float* c, int64_t ldc);

struct KernelShape {
  MicroKernel fn;
  BlockKernel block_fn;
  int64_t mr;
  int64_t nr;
};

constexpr int64_t kScalarMr = 4, kScalarNr = 4;
void kernel_scalar(int64_t kc, const float* ap, const float* bp, float* c, int64_t ldc, bool zero) {
  float acc[kScalarMr][kScalarNr];
  for (int64_t i = 0; i < kScalarMr; ++i)
    for (int64_t j = 0; j < kScalarNr; ++j) acc[i][j] = zero ? 0.0f : c[i * ldc + j];
  for (int64_t k = 0; k < kc; ++k) {
    for (int64_t i = 0; i < kScalarMr; ++i) {
      const float a = ap[k * kScalarMr + i];
      for (int64_t j = 0; j < kScalarNr; ++j) acc[i][j] = std::fma(a, bp[k * kScalarNr + j], acc[i][j]);
    }
  }
  for (int64_t i = 0; i < kScalarMr; ++i)
    for (int64_t j = 0; j < kScalarNr; ++j) c[i * ldc + j] = acc[i][j];
}

void block_kernel_scalar(int64_t kc, int64_t block, const float* ap, const float* bp, const float* sa,
                         const float* sb, float* c, int64_t ldc) {
  for (int64_t k0 = 0, b = 0; k0 < kc; k0 += block, ++b) {
    float p[kScalarMr][kScalarNr] = {};
    for (int64_t k = k0; k < std::min(kc, k0 + block); ++k) {
      for (int64_t i = 0; i < kScalarMr; ++i) {
        const float a = ap[k * kScalarMr + i];
        for (int64_t j = 0; j < kScalarNr; ++j) p[i][j] = std::fma(a, bp[k * kScalarNr + j], p[i][j]);
      }
    }
    for (int64_t i = 0; i < kScalarMr; ++i)
      for (int64_t j = 0; j < kScalarNr; ++j)
        c[i * ldc + j] = c[i * ldc + j] + numerics::gemm_scale_partial(p[i][j], sa[b * kScalarMr + i],
                                                                         sb[b * kScalarNr + j]);
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define TWE_GEMM_X86 1
constexpr int64_t kAvx2Mr = 6, kAvx2Nr = 16;
__attribute__((target("avx2,fma"))) void kernel_avx2(int64_t kc, const float* ap, const float* bp, float* c,
                                                      int64_t ldc, bool zero) {
  __m256 acc[kAvx2Mr][2];
  for (int i = 0; i < kAvx2Mr; ++i) {
    acc[i][0] = zero ? _mm256_setzero_ps() : _mm256_loadu_ps(c + i * ldc);
    acc[i][1] = zero ? _mm256_setzero_ps() : _mm256_loadu_ps(c + i * ldc + 8);
  }
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_loadu_ps(bp + k * kAvx2Nr), b1 = _mm256_loadu_ps(bp + k * kAvx2Nr + 8);
    for (int i = 0; i < kAvx2Mr; ++i) {
      const __m256 a = _mm256_broadcast_ss(ap + k * kAvx2Mr + i);
      acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
    }
  }
  for (int i = 0; i < kAvx2Mr; ++i) {
    _mm256_storeu_ps(c + i * ldc, acc[i][0]);
    _mm256_storeu_ps(c + i * ldc + 8, acc[i][1]);
  }
}

__attribute__((target("avx2,fma"))) void block_kernel_avx2(int64_t kc, int64_t block, const float* ap,
                                                            const float* bp, const float* sa, const float* sb,
                                                            float* c, int64_t ldc) {
  for (int64_t k0 = 0, b = 0; k0 < kc; k0 += block, ++b) {
    __m256 p[kAvx2Mr][2];
    for (int i = 0; i < kAvx2Mr; ++i) p[i][0] = p[i][1] = _mm256_setzero_ps();
    for (int64_t k = k0; k < std::min(kc, k0 + block); ++k) {
      const __m256 b0 = _mm256_loadu_ps(bp + k * kAvx2Nr), b1 = _mm256_loadu_ps(bp + k * kAvx2Nr + 8);
      for (int i = 0; i < kAvx2Mr; ++i) {
        const __m256 a = _mm256_broadcast_ss(ap + k * kAvx2Mr + i);
        p[i][0] = _mm256_fmadd_ps(a, b0, p[i][0]);
        p[i][1] = _mm256_fmadd_ps(a, b1, p[i][1]);
      }
    }
    const __m256 s0 = _mm256_loadu_ps(sb + b * kAvx2Nr), s1 = _mm256_loadu_ps(sb + b * kAvx2Nr + 8);
    for (int i = 0; i < kAvx2Mr; ++i) {
      const __m256 si = _mm256_broadcast_ss(sa + b * kAvx2Mr + i);
      _mm256_storeu_ps(c + i * ldc, _mm256_add_ps(_mm256_loadu_ps(c + i * ldc),
                                                  _mm256_mul_ps(_mm256_mul_ps(p[i][0], si), s0)));
      _mm256_storeu_ps(c + i * ldc + 8, _mm256_add_ps(_mm256_loadu_ps(c + i * ldc + 8),
                                                      _mm256_mul_ps(_mm256_mul_ps(p[i][1], si), s1)));
    }
  }
}

constexpr int64_t kAvx512Mr = 8, kAvx512Nr = 32;
__attribute__((target("avx512f"))) void block_kernel_avx512(int64_t kc, int64_t block, const float* ap,
                                                             const float* bp, const float* sa, const float* sb,
                                                             float* c, int64_t ldc) {
  for (int64_t k0 = 0, b = 0; k0 < kc; k0 += block, ++b) {
    __m512 p[kAvx512Mr][2];
    for (int i = 0; i < kAvx512Mr; ++i) p[i][0] = p[i][1] = _mm512_setzero_ps();
    for (int64_t k = k0; k < std::min(kc, k0 + block); ++k) {
      const __m512 b0 = _mm512_loadu_ps(bp + k * kAvx512Nr), b1 = _mm512_loadu_ps(bp + k * kAvx512Nr + 16);
      for (int i = 0; i < kAvx512Mr; ++i) {
        const __m512 a = _mm512_set1_ps(ap[k * kAvx512Mr + i]);
        p[i][0] = _mm512_fmadd_ps(a, b0, p[i][0]);
        p[i][1] = _mm512_fmadd_ps(a, b1, p[i][1]);
      }
    }
    const __m512 s0 = _mm512_loadu_ps(sb + b * kAvx512Nr), s1 = _mm512_loadu_ps(sb + b * kAvx512Nr + 16);
    for (int i = 0; i < kAvx512Mr; ++i) {
      const __m512 si = _mm512_set1_ps(sa[b * kAvx512Mr + i]);
      _mm512_storeu_ps(c + i * ldc, _mm512_add_ps(_mm512_loadu_ps(c + i * ldc),
                                                  _mm512_mul_ps(_mm512_mul_ps(p[i][0], si), s0)));
      _mm512_storeu_ps(c + i * ldc + 16, _mm512_add_ps(_mm512_loadu_ps(c + i * ldc + 16),
                                                       _mm512_mul_ps(_mm512_mul_ps(p[i][1], si), s1)));
    }
  }
}
__attribute__((target("avx512f"))) void kernel_avx512(int64_t kc, const float* ap, const float* bp, float* c,
                                                       int64_t ldc, bool zero) {
  __m512 acc[kAvx512Mr][2];
  for (int i = 0; i < kAvx512Mr; ++i) {
    acc[i][0] = zero ? _mm512_setzero_ps() : _mm512_loadu_ps(c + i * ldc);
    acc[i][1] = zero ? _mm512_setzero_ps() : _mm512_loadu_ps(c + i * ldc + 16);
  }
  for (int64_t k = 0; k < kc; ++k) {
    const __m512 b0 = _mm512_loadu_ps(bp + k * kAvx512Nr), b1 = _mm512_loadu_ps(bp + k * kAvx512Nr + 16);
    for (int i = 0; i < kAvx512Mr; ++i) {
      const __m512 a = _mm512_set1_ps(ap[k * kAvx512Mr + i]);
      acc[i][0] = _mm512_fmadd_ps(a, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(a, b1, acc[i][1]);
    }
  }
  for (int i = 0; i < kAvx512Mr; ++i) {
    _mm512_storeu_ps(c + i * ldc, acc[i][0]);
    _mm512_storeu_ps(c + i * ldc + 16, acc[i][1]);
  }
}
#endif

/*! The widest micro-kernel this CPU runs (chosen once); TWE_GEMM_ISA=scalar|avx2|avx512 overrides
 *  it (tests compare the variants' bytes). */
KernelShape select_kernel() {
  const char* forced = std::getenv("TWE_GEMM_ISA");
  const std::string want = forced ? forced : "";
#ifdef TWE_GEMM_X86
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx512 && (want.empty() || want == "avx512")) return {kernel_avx512, block_kernel_avx512, kAvx512Mr, kAvx512Nr};
  if (avx2 && (want.empty() || want == "avx512" || want == "avx2")) return {kernel_avx2, block_kernel_avx2, kAvx2Mr, kAvx2Nr};
#endif
  return {kernel_scalar, block_kernel_scalar, kScalarMr, kScalarNr};
}

const KernelShape& kernel_shape() {
  static const KernelShape shape = select_kernel();
  return shape;
}

// K-block of the high-precision / per-tensor chain (a packed B tile of kKc × nr floats stays in L1).
constexpr int64_t kKc = 256;

/*! dst[k][0:mr] = panel rows [r0, r0 + mr) at K [k0, k0 + kc); rows past `rows` are zero. */
void pack(const Panel& p, int64_t r0, int64_t mr, int64_t k0, int64_t kc, float* dst) {
  const int64_t live = std::min(mr, p.rows - r0);
  const int64_t rs = p.row_step(), ks = p.k_step();
  const float* src = p.data + r0 * rs + k0 * ks;
  if (live < mr) std::fill(dst, dst + kc * mr, 0.0f);
  if (p.k_major) {
    for (int64_t r = 0; r < live; ++r)
      for (int64_t k = 0; k < kc; ++k) dst[k * mr + r] = src[r * rs + k];
  } else {
    for (int64_t k = 0; k < kc; ++k)
      for (int64_t r = 0; r < live; ++r) dst[k * mr + r] = src[k * ks + r];
  }
}

/*! Workspace of one worker: packed A row-tiles, one packed B tile, an edge tile, packed scales. */
struct KernelBuffers {
  std::vector<float> a_packed;
  std::vector<float> b_packed;
  std::vector<float> edge;
  std::vector<float> sa_packed;
  std::vector<float> sb_packed;
};

/*! Block scales of one K-range for the block kernel: sa (rows, blocks) with row stride sa_stride for
 *  the chunk's rows, sb (blocks, n) with row stride n; block = 0 for the plain chain. */
struct RangeScales {
  int64_t block = 0;
  const float* sa = nullptr;
  int64_t sa_stride = 0;
  const float* sb = nullptr;
};

/*! c (rows, n) [+]= A[r0:r0+rows, k0:k0+kc] · B[:, k0:k0+kc]ᵀ. Plain: one FMA chain per element
 *  continued from c (zero: started at +0). Block-scaled (sc.block > 0, k0 a multiple of it): each
 *  block's chain from +0, scaled and added to c (§8). */
void chain_product(const Panel& a, const Panel& b, int64_t r0, int64_t rows, int64_t k0, int64_t kc, int64_t n,
                   float* c, bool zero, KernelBuffers& buf, const RangeScales& sc = {}) {
  const KernelShape& ks = kernel_shape();
  const int64_t mr = ks.mr, nr = ks.nr;
  const int64_t m_tiles = ceil_div(rows, mr);
  const int64_t blocks = sc.block > 0 ? ceil_div(kc, sc.block) : 0;
  buf.a_packed.resize(static_cast<size_t>(m_tiles * mr * kc));
  buf.b_packed.resize(static_cast<size_t>(nr * kc));
  buf.edge.resize(static_cast<size_t>(mr * nr));
  // Rows past this chunk's end are computed and discarded (edge tiles copy only live rows).
  for (int64_t t = 0; t < m_tiles; ++t) pack(a, r0 + t * mr, mr, k0, kc, buf.a_packed.data() + t * mr * kc);
  if (blocks > 0) {
    buf.sa_packed.assign(static_cast<size_t>(m_tiles * mr * blocks), 0.0f);
    buf.sb_packed.resize(static_cast<size_t>(nr * blocks));
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t t = i / mr, r = i % mr;
      for (int64_t j = 0; j < blocks; ++j) buf.sa_packed[(t * blocks + j) * mr + r] = sc.sa[i * sc.sa_stride + j];
    }
  }
  for (int64_t j0 = 0; j0 < n; j0 += nr) {
    const int64_t cols = std::min(nr, n - j0);
    pack(b, j0, nr, k0, kc, buf.b_packed.data());
    if (blocks > 0) {
      if (cols < nr) std::fill(buf.sb_packed.begin(), buf.sb_packed.end(), 0.0f);
      for (int64_t j = 0; j < blocks; ++j)
        std::copy(sc.sb + j * n + j0, sc.sb + j * n + j0 + cols, buf.sb_packed.data() + j * nr);
    }
    for (int64_t t = 0; t < m_tiles; ++t) {
      const int64_t i0 = t * mr, live = std::min(mr, rows - i0);
      float* ct = c + i0 * n + j0;
      const float* ap = buf.a_packed.data() + t * mr * kc;
      auto run = [&](float* dst, int64_t ldc) {
        if (blocks > 0) {
          ks.block_fn(kc, sc.block, ap, buf.b_packed.data(), buf.sa_packed.data() + t * blocks * mr,
                      buf.sb_packed.data(), dst, ldc);
        } else {
          ks.fn(kc, ap, buf.b_packed.data(), dst, ldc, zero);
        }
      };
      if (live == mr && cols == nr) {
        run(ct, n);
        continue;
      }
      float* e = buf.edge.data();
      if (!zero || blocks > 0) {
        std::fill(e, e + mr * nr, 0.0f);
        for (int64_t i = 0; i < live; ++i) std::copy(ct + i * n, ct + i * n + cols, e + i * nr);
      }
      run(e, nr);
      for (int64_t i = 0; i < live; ++i) std::copy(e + i * nr, e + i * nr + cols, ct + i * n);
    }
  }
}

/*! out rows = round(acc (+ bias)) to the output dtype. */
template <typename Out, typename Bias>
void epilogue(const float* acc, const Bias* bias, int64_t rows, int64_t n, Out* out) {
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float v = acc[i * n + j];
      if (bias) v = v + to_float(bias[j]);
      out[i * n + j] = FromFloat<Out>::apply(v);
    }
  }
}

/*! Writes output rows [r0, r0 + rows) from their fp32 accumulators. */
TweStatus write_rows(const GemmArgs& args, const float* acc, int64_t r0, int64_t rows) {
  return dispatch_high_precision(args.out->dtype, [&](auto out_tag) {
    using Out = decltype(out_tag);
    Out* out = static_cast<Out*>(args.out->data) + r0 * args.n;
    if (!args.bias) {
      epilogue<Out, float>(acc, nullptr, rows, args.n, out);
      return kTweSuccess;
    }
    return dispatch_high_precision(args.bias->dtype, [&](auto bias_tag) {
      using Bias = decltype(bias_tag);
      epilogue<Out, Bias>(acc, static_cast<const Bias*>(args.bias->data), rows, args.n, out);
      return kTweSuccess;
    });
  });
}

// Row chunks are the unit of work of one thread (a multiple of every micro-kernel's row tile);
// results do not depend on them (one chain per element).
constexpr int64_t kRowChunk = 96;

/*! Per-worker buffers of the block-scaled path. */
struct BlockBuffers {
  std::vector<float> scale_a;
  KernelBuffers kernel;
};

/*! Accumulators of rows [r0, r0 + rows) of a block format: Σ_blocks fl(fl(p · s_a) · s_b) in K
 *  order, each block's partial p one FMA chain from +0 over the block; scale_b holds every
 *  block's B scales, (blocks, n). K-ranges of whole blocks (about kKc values) run fused in the
 *  block micro-kernel, which keeps the same per-element order. */
void block_rows(const GemmArgs& args, const Panel& a, const Panel& b, int64_t r0, int64_t rows, float* acc,
                BlockBuffers& buf, const std::vector<float>& scale_b) {
  const int64_t n = args.n, block = gemm_block_length(args.scaling);
  const int64_t blocks = ceil_div(args.k, block);
  const int64_t a_stride = cols(args.a->scale_inv);
  const int64_t range_blocks = std::max<int64_t>(1, kKc / block);
  buf.scale_a.resize(static_cast<size_t>(rows * blocks));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < blocks; ++j)
      buf.scale_a[i * blocks + j] = gemm_block_scale(args.scaling, *args.a, a_stride, r0 + i, j);
  std::fill(acc, acc + rows * n, 0.0f);
  for (int64_t j = 0; j < blocks; j += range_blocks) {
    const int64_t k0 = j * block, len = std::min(range_blocks * block, args.k - k0);
    const RangeScales sc{block, buf.scale_a.data() + j, blocks, scale_b.data() + j * n};
    chain_product(a, b, r0, rows, k0, len, n, acc, false, buf.kernel, sc);
  }
}

/*! Accumulators of rows [r0, r0 + rows) of the other formats: one FMA chain over K per element. */
void full_k_rows(const GemmArgs& args, const Panel& a, const Panel& b, int64_t r0, int64_t rows, float* acc,
                 KernelBuffers& buf) {
  if (args.k == 0) {
    std::fill(acc, acc + rows * args.n, 0.0f);
    return;
  }
  for (int64_t k0 = 0; k0 < args.k; k0 += kKc) {
    chain_product(a, b, r0, rows, k0, std::min(kKc, args.k - k0), args.n, acc, k0 == 0, buf);
  }
}

/*! The whole-tensor factors applied after accumulation: per-tensor FP8 scale_inv, NVFP4 S_dec. */
bool final_scales(const GemmArgs& args, float* sa, float* sb) {
  if (args.scaling == kTweGemmFP8PerTensor) {
    *sa = *static_cast<const float*>(args.a->scale_inv.data);
    *sb = *static_cast<const float*>(args.b->scale_inv.data);
    return true;
  }
  if (args.scaling == kTweGemmNVFP4) {
    *sa = numerics::nvfp4_global_decode_scale(*static_cast<const float*>(args.a->amax.data));
    *sb = numerics::nvfp4_global_decode_scale(*static_cast<const float*>(args.b->amax.data));
    return true;
  }
  return false;
}

}  // namespace

TweStatus gemm(const GemmArgs& args) {
  ScopedIeeeSubnormals ieee;
  const int64_t m = args.m, n = args.n, k = args.k;
  if (m == 0 || n == 0) return kTweSuccess;
  std::vector<float> a_buffer, b_buffer;
  const Panel a{widen(*args.a, args.scaling, a_buffer), args.a->k_major != 0, m, k};
  const Panel b{widen(*args.b, args.scaling, b_buffer), args.b->k_major != 0, n, k};
  const int64_t block = gemm_block_length(args.scaling);
  const int64_t chunk = std::min(m, kRowChunk);
  const int64_t chunks = ceil_div(m, chunk);
  std::vector<float> scale_b;
  if (block > 0) {
    const int64_t blocks = ceil_div(k, block), b_stride = cols(args.b->scale_inv);
    scale_b.resize(static_cast<size_t>(blocks * n));
    for (int64_t j = 0; j < blocks; ++j) {
      for (int64_t c = 0; c < n; ++c) scale_b[j * n + c] = gemm_block_scale(args.scaling, *args.b, b_stride, c, j);
    }
  }
  float final_a = 1.0f, final_b = 1.0f;
  const bool scale_at_end = final_scales(args, &final_a, &final_b);
  std::atomic<int> status{kTweSuccess};
  // Multiply-adds per parallel_for work unit (it starts a thread per 2^18 units).
  constexpr int64_t kMacsPerWorkUnit = 16;
  parallel_for(chunks, m * n * std::max<int64_t>(k, 1) / kMacsPerWorkUnit, [&](int64_t first, int64_t last) {
    std::vector<float> acc(static_cast<size_t>(chunk * n));
    BlockBuffers buffers;
    for (int64_t c = first; c < last; ++c) {
      const int64_t r0 = c * chunk;
      const int64_t rows = std::min(chunk, m - r0);
      if (block > 0) block_rows(args, a, b, r0, rows, acc.data(), buffers, scale_b);
      else full_k_rows(args, a, b, r0, rows, acc.data(), buffers.kernel);
      if (scale_at_end) {
        for (int64_t i = 0; i < rows * n; ++i) acc[i] = numerics::gemm_scale_partial(acc[i], final_a, final_b);
      }
      const TweStatus st = write_rows(args, acc.data(), r0, rows);
      if (st) status = st;
    }
  });
  // Worker threads record errors in their own thread-local slot: restate it on this thread.
  if (status.load() != kTweSuccess) {
    return fail(static_cast<TweStatus>(status.load()), "unsupported GEMM output or bias dtype");
  }
  return kTweSuccess;
}

namespace {

/*! out[r][j] = fl(out[r][j] + bias[j]) rounded to out's dtype: each expert's output is its GEMM
 *  rounded to the output dtype, then the bias added — the bytes of BasicLinear + Bias / tep.Linear. */
void add_bias_rows(const TweTensorView& out, const TweTensorView& bias) {
  const int64_t r = rows(out), n = cols(out);
  dispatch_high_precision(out.dtype, [&](auto out_tag) {
    using Out = decltype(out_tag);
    return dispatch_high_precision(bias.dtype, [&](auto bias_tag) {
      using Bias = decltype(bias_tag);
      Out* y = static_cast<Out*>(out.data);
      const Bias* b = static_cast<const Bias*>(bias.data);
      for (int64_t i = 0; i < r; ++i)
        for (int64_t j = 0; j < n; ++j)
          y[i * n + j] = FromFloat<Out>::apply(numerics::add_f32(to_float(y[i * n + j]), to_float(b[j])));
      return kTweSuccess;
    });
  });
}

void zero_elements(const TweTensorView& v, int64_t offset, int64_t count) {
  if (count > 0) std::memset(static_cast<char*>(v.data) + offset * element_size(v.dtype), 0,
                             static_cast<size_t>(count * element_size(v.dtype)));
}

}  // namespace

TweStatus grouped_gemm(const GroupedGemmArgs& args) {
  const int32_t* splits = static_cast<const int32_t*>(args.m_splits->data);
  const int64_t n = args.n, k = args.k;
  int64_t last_end = 0;
  for (int64_t g = 0; g < args.groups; ++g) {
    int64_t begin, end;
    group_rows(splits, g, args.m, &begin, &end);
    const int64_t rows = end - begin;
    last_end = end;
    TweGemmOperand a{}, b{};
    TweTensorView out, bias;
    GemmArgs call{&a, &b, nullptr, &out, args.scaling, 0, n, 0, args.stream, nullptr};  // CPU: no workspace
    if (args.scaling == kTweGemmFP8PerTensor) {
      a.scale_inv = view_2d(*args.a_scale_inv, g, 1, 1);
      b.scale_inv = view_2d(*args.b_scale_inv, g, 1, 1);
    } else if (args.scaling == kTweGemmMXFP8) {
      // Rowwise (K-major) copies: roundup(m, 128) scale rows per group; columnwise copies:
      // roundup(m / 32, 4). Activations' m is the group's rows, the weights' m is N.
      auto region = [&](const TweTensorView& scales, bool k_major, const int32_t* sizes, int64_t uniform) {
        int64_t row = 0;
        for (int64_t j = 0; j < g; ++j) {
          const int64_t m = sizes ? std::max<int32_t>(sizes[j], 0) : uniform;
          row += k_major ? round_up(m, 128) : round_up(m / 32, 4);
        }
        const int64_t m = sizes ? std::max<int32_t>(sizes[g], 0) : uniform;
        const int64_t stride = scales.shape[scales.ndim - 1];
        return view_2d(scales, row * stride, k_major ? round_up(m, 128) : round_up(m / 32, 4), stride);
      };
      if (!args.ragged_k) {
        a.scale_inv = region(*args.a_scale_inv, true, splits, 0);
        b.scale_inv = region(*args.b_scale_inv, args.b_k_major, nullptr, args.b_k_major ? n : k);
      } else {
        a.scale_inv = region(*args.a_scale_inv, false, splits, 0);
        b.scale_inv = region(*args.b_scale_inv, false, splits, 0);
      }
    }
    if (args.scaling == kTweGemmFP8Block) {
      // Each operand's scales: its groups' scale tensors one after another (the shape of each
      // data block's twe_quantize_fp8_block scales); the weights' blocks all (N, K) / (K, N).
      auto region = [&](const TweTensorView& scales, bool two_d, int64_t other, bool ragged_rows, int64_t uniform) {
        int64_t offset = 0, sr = 0, sc = 0;
        for (int64_t j = 0; j <= g; ++j) {
          const int64_t m = uniform >= 0 ? uniform : std::max<int32_t>(splits[j], 0);
          // K-major data block: (m, other) for row-split operands, (other, m) for ragged-K ones
          if (ragged_rows) fp8_block_scale_dims(other, m, two_d, &sr, &sc);
          else fp8_block_scale_dims(m, other, two_d, &sr, &sc);
          if (j < g) offset += sr * sc;
        }
        return view_2d(scales, offset, sr, sc);
      };
      if (!args.ragged_k) {
        a.scale_inv = region(*args.a_scale_inv, args.a_block_2d, k, false, -1);
        b.scale_inv = region(*args.b_scale_inv, args.b_block_2d, k, false, n);
      } else {
        a.scale_inv = region(*args.a_scale_inv, args.a_block_2d, n, true, -1);
        b.scale_inv = region(*args.b_scale_inv, args.b_block_2d, k, true, -1);
      }
      a.block_2d = args.a_block_2d;
      b.block_2d = args.b_block_2d;
    }
    if (args.scaling == kTweGemmNVFP4) {
      // Each operand's E4M3 scales: its groups' scale tensors one after another, each of the
      // shape twe_quantize_nvfp4 gives its K-major data block (rows, cols): (roundup(rows, 128),
      // roundup(cols / 16, 4)). Row-split operands' blocks are (m_g, K) (weights (N, K));
      // ragged-K (wgrad) operands' blocks are (N, m_g) and (K, m_g).
      auto region = [&](const TweTensorView& scales, int64_t other, bool ragged_rows, int64_t uniform) {
        int64_t offset = 0, sr = 0, sc = 0;
        for (int64_t j = 0; j <= g; ++j) {
          const int64_t m = uniform >= 0 ? uniform : std::max<int32_t>(splits[j], 0);
          const int64_t r = ragged_rows ? other : m, c = ragged_rows ? m : other;
          sr = round_up(r, 128);
          sc = round_up(ceil_div(c, 16), 4);
          if (j < g) offset += sr * sc;
        }
        return view_2d(scales, offset, sr, sc);
      };
      if (!args.ragged_k) {
        a.scale_inv = region(*args.a_scale_inv, k, false, -1);
        b.scale_inv = region(*args.b_scale_inv, k, false, n);
      } else {
        a.scale_inv = region(*args.a_scale_inv, n, true, -1);
        b.scale_inv = region(*args.b_scale_inv, k, true, -1);
      }
      a.amax = view_2d(*args.a_amax, g, 1, 1);
      b.amax = view_2d(*args.b_amax, g, 1, 1);
    }
    // NVFP4 data holds two elements per byte along its last (K) dimension.
    const int64_t pack = args.scaling == kTweGemmNVFP4 ? 2 : 1;
    if (!args.ragged_k) {
      if (rows == 0) continue;
      a.data = view_2d(*args.a, begin * k / pack, rows, k / pack);
      a.k_major = 1;
      b.data = args.b_k_major ? view_2d(*args.b, g * n * k / pack, n, k / pack) : view_2d(*args.b, g * n * k, k, n);
      b.k_major = args.b_k_major;
      out = view_2d(*args.out, begin * n, rows, n);
      if (args.bias) bias = view_2d(*args.bias, g * n, 1, n);  // added after the GEMM's rounding (below)
      call.m = rows;
      call.k = k;
    } else {
      out = view_2d(*args.out, g * n * k, n, k);
      if (rows == 0) {
        zero_elements(*args.out, g * n * k, n * k);
        continue;
      }
      a.data = args.a_k_major ? view_2d(*args.a, begin * n / pack, n, rows / pack)
                              : view_2d(*args.a, begin * n, rows, n);
      a.k_major = args.a_k_major;
      b.data = args.b_k_major ? view_2d(*args.b, begin * k / pack, k, rows / pack)
                              : view_2d(*args.b, begin * k, rows, k);
      b.k_major = args.b_k_major;
      call.m = n;
      call.n = k;
      call.k = rows;
    }
    const TweStatus st = gemm(call);
    if (st) return st;
    if (!args.ragged_k && args.bias) add_bias_rows(out, bias);
  }
  if (!args.ragged_k) zero_elements(*args.out, last_end * n, (args.m - last_end) * n);
  return kTweSuccess;
}

}  // namespace cpu
}  // namespace twe
