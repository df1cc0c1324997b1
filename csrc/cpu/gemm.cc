// CPU kernel of the gemm family: operands widened to fp32 panels, packed into micro-panels, and
// multiplied by our own register-tiled kernel whose accumulation order is fixed per element (a
// sequential fp32 FMA chain over k, NUMERICS §8 batch invariance); block scaling and the epilogue
// in loops; value math is in numerics.h.

#include <algorithm>
#include <cmath>
#include <array>
#include <atomic>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

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

/*! A widened operand: rows [r0, ...) of K-slice [k0, ...) start at `at(r0, k0)`, leading dimension ld(). */
struct Panel {
  const float* data;
  bool k_major;
  int64_t rows;
  int64_t k;
  const float* at(int64_t r0, int64_t k0) const { return k_major ? data + r0 * k + k0 : data + k0 * rows + r0; }
  int64_t ld() const { return k_major ? k : rows; }
  int64_t k_step() const { return k_major ? 1 : rows; }  // distance between consecutive K indices
};

// ---- The multiply: packed micro-panels and one register-tiled kernel ----------------------------
//
// Every accumulator c[i][j] is one chain c = fma(a[i][k], b[j][k], c) over k in increasing order
// from c = 0 (the K range of one product: all of K, or one scaling block). Tiling, packing, the
// K blocking (a chain continued through a stored fp32 accumulator is the same chain), the row
// chunks given to threads, M and N never change that chain, so element (i, j) depends only on
// row i of A, row j of B and K: a GEMM over a slice of rows or columns gives exactly that
// slice of the full GEMM's bytes. Padding rows/columns of the micro-panels are zeros whose
// results are dropped.

constexpr int64_t kMR = 6;    // rows of A per micro-tile (broadcast operands)
constexpr int64_t kNR = 16;   // columns of B per micro-tile (one AVX-512 vector, two AVX2 ones)
constexpr int64_t kKC = 256;  // K steps per pass over a micro-panel pair (keeps them in L1/L2)

/*! Packs rows [r0, r0 + rows) of p over all K into micro-panels of `width` rows:
 *  dst[(panel * K + k) * width + i] = p(r0 + panel * width + i, k), zero past the last row. */
void pack_panels(const Panel& p, int64_t r0, int64_t rows, int64_t width, float* dst) {
  const int64_t K = p.k, panels = ceil_div(rows, width);
  for (int64_t q = 0; q < panels; ++q) {
    float* out = dst + q * K * width;
    const int64_t live = std::min(width, rows - q * width);
    if (p.k_major) {
      for (int64_t i = 0; i < width; ++i) {
        if (i >= live) {
          for (int64_t k = 0; k < K; ++k) out[k * width + i] = 0.0f;
          continue;
        }
        const float* row = p.data + (r0 + q * width + i) * K;
        for (int64_t k = 0; k < K; ++k) out[k * width + i] = row[k];
      }
    } else {
      for (int64_t k = 0; k < K; ++k) {
        const float* col = p.data + k * p.rows + r0 + q * width;
        for (int64_t i = 0; i < live; ++i) out[k * width + i] = col[i];
        for (int64_t i = live; i < width; ++i) out[k * width + i] = 0.0f;
      }
    }
  }
}

/*! c[i][j] = fma chain over `len` k steps continued from c (a kMR × kNR tile, row-major):
 *  the portable kernel. The vector kernels below run the same fmaf chain in every lane (fused
 *  multiply-add rounds once on every target), so all three give the same bytes. */
void micro_kernel_scalar(const float* ap, const float* bp, int64_t len, float* c) {
  float acc[kMR][kNR];
  for (int64_t i = 0; i < kMR; ++i)
    for (int64_t j = 0; j < kNR; ++j) acc[i][j] = c[i * kNR + j];
  for (int64_t k = 0; k < len; ++k)
    for (int64_t i = 0; i < kMR; ++i)
      for (int64_t j = 0; j < kNR; ++j) acc[i][j] = std::fma(ap[k * kMR + i], bp[k * kNR + j], acc[i][j]);
  for (int64_t i = 0; i < kMR; ++i)
    for (int64_t j = 0; j < kNR; ++j) c[i * kNR + j] = acc[i][j];
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f"))) void micro_kernel_avx512(const float* ap, const float* bp, int64_t len, float* c) {
  static_assert(kMR == 6 && kNR == 16, "one zmm per tile row");
  __m512 c0 = _mm512_loadu_ps(c), c1 = _mm512_loadu_ps(c + 16), c2 = _mm512_loadu_ps(c + 32);
  __m512 c3 = _mm512_loadu_ps(c + 48), c4 = _mm512_loadu_ps(c + 64), c5 = _mm512_loadu_ps(c + 80);
  for (int64_t k = 0; k < len; ++k) {
    const __m512 b = _mm512_loadu_ps(bp + k * kNR);
    const float* a = ap + k * kMR;
    c0 = _mm512_fmadd_ps(_mm512_set1_ps(a[0]), b, c0);
    c1 = _mm512_fmadd_ps(_mm512_set1_ps(a[1]), b, c1);
    c2 = _mm512_fmadd_ps(_mm512_set1_ps(a[2]), b, c2);
    c3 = _mm512_fmadd_ps(_mm512_set1_ps(a[3]), b, c3);
    c4 = _mm512_fmadd_ps(_mm512_set1_ps(a[4]), b, c4);
    c5 = _mm512_fmadd_ps(_mm512_set1_ps(a[5]), b, c5);
  }
  _mm512_storeu_ps(c, c0), _mm512_storeu_ps(c + 16, c1), _mm512_storeu_ps(c + 32, c2);
  _mm512_storeu_ps(c + 48, c3), _mm512_storeu_ps(c + 64, c4), _mm512_storeu_ps(c + 80, c5);
}

__attribute__((target("avx2,fma"))) void micro_kernel_avx2(const float* ap, const float* bp, int64_t len, float* c) {
  __m256 lo[kMR], hi[kMR];
  for (int i = 0; i < kMR; ++i) lo[i] = _mm256_loadu_ps(c + i * kNR), hi[i] = _mm256_loadu_ps(c + i * kNR + 8);
  for (int64_t k = 0; k < len; ++k) {
    const __m256 b0 = _mm256_loadu_ps(bp + k * kNR), b1 = _mm256_loadu_ps(bp + k * kNR + 8);
    for (int i = 0; i < kMR; ++i) {
      const __m256 a = _mm256_broadcast_ss(ap + k * kMR + i);
      lo[i] = _mm256_fmadd_ps(a, b0, lo[i]);
      hi[i] = _mm256_fmadd_ps(a, b1, hi[i]);
    }
  }
  for (int i = 0; i < kMR; ++i) _mm256_storeu_ps(c + i * kNR, lo[i]), _mm256_storeu_ps(c + i * kNR + 8, hi[i]);
}
#endif

using MicroKernel = void (*)(const float*, const float*, int64_t, float*);

/*! The widest kernel the running CPU supports (chosen once). */
MicroKernel micro_kernel() {
  static const MicroKernel kernel = [] {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return &micro_kernel_avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return &micro_kernel_avx2;
#endif
    return &micro_kernel_scalar;
  }();
  return kernel;
}

/*! Packed operands of one row chunk: A's rows of the chunk and all of B, each over all K. */
struct Packed {
  const float* a;  // ceil(rows / kMR) panels of (K, kMR)
  const float* b;  // ceil(n / kNR) panels of (K, kNR)
  int64_t rows, n, k;
};

/*! c (rows, n) row-major = Σ_{k0 <= k < k0 + len} A[i][k] · B[j][k] as one fma chain per element
 *  starting from 0; `tiles` is scratch of ceil(rows/kMR) · ceil(n/kNR) tiles. */
void product(const Packed& p, int64_t k0, int64_t len, float* tiles, float* c) {
  const int64_t row_panels = ceil_div(p.rows, kMR), col_panels = ceil_div(p.n, kNR);
  constexpr int64_t kTileFloats = kMR * kNR;
  std::fill(tiles, tiles + row_panels * col_panels * kTileFloats, 0.0f);
  const MicroKernel kernel = micro_kernel();
  for (int64_t kc = k0; kc < k0 + len; kc += kKC) {
    const int64_t steps = std::min(kKC, k0 + len - kc);
    for (int64_t jp = 0; jp < col_panels; ++jp) {
      const float* bp = p.b + (jp * p.k + kc) * kNR;
      for (int64_t ip = 0; ip < row_panels; ++ip)
        kernel(p.a + (ip * p.k + kc) * kMR, bp, steps, tiles + (ip * col_panels + jp) * kTileFloats);
    }
  }
  for (int64_t ip = 0; ip < row_panels; ++ip)
    for (int64_t i = 0; i < std::min(kMR, p.rows - ip * kMR); ++i)
      for (int64_t jp = 0; jp < col_panels; ++jp) {
        const float* tile = tiles + (ip * col_panels + jp) * kTileFloats + i * kNR;
        float* out = c + (ip * kMR + i) * p.n + jp * kNR;
        const int64_t width = std::min(kNR, p.n - jp * kNR);
        for (int64_t j = 0; j < width; ++j) out[j] = tile[j];
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

// Rows handed to a worker at a time (results do not depend on it: see the multiply above).
constexpr int64_t kRowChunk = 240;

// The scale-accumulate loop is elementwise (no contraction: -ffp-contract=off), so its wider
// vector clones give the same bytes as the baseline one.
#if defined(__x86_64__) && defined(__GNUC__)
#define TWE_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TWE_VECTOR_CLONES
#endif

/*! acc[c] += fl(fl(p[c] · sa) · sb[c]) for c < n (§8 block scaling). */
TWE_VECTOR_CLONES void scale_accumulate(float* acc, const float* p, float sa, const float* sb, int64_t n) {
  for (int64_t c = 0; c < n; ++c) acc[c] = acc[c] + numerics::gemm_scale_partial(p[c], sa, sb[c]);
}

/*! Per-worker buffers: packed A rows of a chunk, product tiles, one block's partial sums, A's block scales. */
struct WorkerBuffers {
  std::vector<float> packed_a;
  std::vector<float> tiles;
  std::vector<float> partial;
  std::vector<float> scale_a;
};

/*! Accumulators of rows [r0, r0 + rows) of a block format: Σ_blocks fl(fl(p · s_a) · s_b) in K
 *  order, p the block's partial product (its own fma chain from 0); scale_b holds every block's
 *  B scales, (blocks, n). */
void block_rows(const GemmArgs& args, const Packed& p, int64_t r0, float* acc, WorkerBuffers& buf,
                const std::vector<float>& scale_b) {
  const int64_t rows = p.rows, n = args.n, block = gemm_block_length(args.scaling);
  const int64_t blocks = ceil_div(args.k, block);
  const int64_t a_stride = cols(args.a->scale_inv);
  buf.partial.resize(static_cast<size_t>(rows * n));
  buf.scale_a.resize(static_cast<size_t>(rows));
  std::fill(acc, acc + rows * n, 0.0f);
  for (int64_t j = 0; j < blocks; ++j) {
    const int64_t k0 = j * block, len = std::min(block, args.k - k0);
    product(p, k0, len, buf.tiles.data(), buf.partial.data());
    for (int64_t i = 0; i < rows; ++i) buf.scale_a[i] = gemm_block_scale(args.scaling, *args.a, a_stride, r0 + i, j);
    for (int64_t i = 0; i < rows; ++i)
      scale_accumulate(acc + i * n, buf.partial.data() + i * n, buf.scale_a[i], scale_b.data() + j * n, n);
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
  // B packed once for every chunk: ceil(n / kNR) micro-panels over all K.
  std::vector<float> packed_b(static_cast<size_t>(round_up(n, kNR) * k));
  pack_panels(b, 0, n, kNR, packed_b.data());
  parallel_for(chunks, m * n * std::max<int64_t>(k, 1) / kMacsPerWorkUnit, [&](int64_t first, int64_t last) {
    std::vector<float> acc(static_cast<size_t>(chunk * n));
    WorkerBuffers buffers;
    buffers.packed_a.resize(static_cast<size_t>(round_up(chunk, kMR) * k));
    buffers.tiles.resize(static_cast<size_t>(round_up(chunk, kMR) * round_up(n, kNR)));
    for (int64_t c = first; c < last; ++c) {
      const int64_t r0 = c * chunk;
      const int64_t rows = std::min(chunk, m - r0);
      pack_panels(a, r0, rows, kMR, buffers.packed_a.data());
      const Packed p{buffers.packed_a.data(), packed_b.data(), rows, n, k};
      if (block > 0) block_rows(args, p, r0, acc.data(), buffers, scale_b);
      else product(p, 0, k, buffers.tiles.data(), acc.data());
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
    if (!args.ragged_k) {
      if (rows == 0) continue;
      a.data = view_2d(*args.a, begin * k, rows, k);
      a.k_major = 1;
      b.data = args.b_k_major ? view_2d(*args.b, g * n * k, n, k) : view_2d(*args.b, g * n * k, k, n);
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
      a.data = args.a_k_major ? view_2d(*args.a, begin * n, n, rows) : view_2d(*args.a, begin * n, rows, n);
      a.k_major = args.a_k_major;
      b.data = args.b_k_major ? view_2d(*args.b, begin * k, k, rows) : view_2d(*args.b, begin * k, rows, k);
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
