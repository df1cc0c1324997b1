// CPU kernel of the gemm family: operands widened to fp32 panels, partial sums from the bundled
// OpenBLAS sgemm (single-threaded inside our row-chunk workers), block scaling and the epilogue
// in loops; value math is in numerics.h.
#include <cblas.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
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

CBLAS_TRANSPOSE a_trans(const Panel& a) { return a.k_major ? CblasNoTrans : CblasTrans; }
CBLAS_TRANSPOSE b_trans(const Panel& b) { return b.k_major ? CblasTrans : CblasNoTrans; }

/*! c (m_len, n) = A[r0:r0+m_len, k0:k0+len] · B[:, k0:k0+len]ᵀ, row-major, overwritten. */
void partial_product(const Panel& a, const Panel& b, int64_t r0, int64_t m_len, int64_t k0, int64_t len, int64_t n,
                     float* c) {
  scipy_cblas_sgemm(CblasRowMajor, a_trans(a), b_trans(b), static_cast<blasint>(m_len), static_cast<blasint>(n),
                    static_cast<blasint>(len), 1.0f, a.at(r0, k0), static_cast<blasint>(a.ld()), b.at(0, k0),
                    static_cast<blasint>(b.ld()), 0.0f, c, static_cast<blasint>(n));
}

/*! `count` consecutive full K-blocks of length `block` starting at block `first`: partial[j] (rows, n). */
void block_partials(const Panel& a, const Panel& b, int64_t r0, int64_t rows, int64_t n, int64_t block, int64_t first,
                    int64_t count, float* partial) {
  scipy_cblas_sgemm_batch_strided(
      CblasRowMajor, a_trans(a), b_trans(b), static_cast<blasint>(rows), static_cast<blasint>(n),
      static_cast<blasint>(block), 1.0f, a.at(r0, first * block), static_cast<blasint>(a.ld()),
      static_cast<blasint>(block * a.k_step()), b.at(0, first * block), static_cast<blasint>(b.ld()),
      static_cast<blasint>(block * b.k_step()), 0.0f, partial, static_cast<blasint>(n),
      static_cast<blasint>(rows * n), static_cast<blasint>(count));
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

// Row chunks depend on the shape only, so results do not depend on the thread count. A block
// format computes the partials of up to kPartialFloats floats of K-blocks per batched sgemm.
constexpr int64_t kRowChunk = 256;
constexpr int64_t kPartialFloats = int64_t{1} << 21;

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

/*! Per-worker buffers of the block-scaled path. */
struct BlockBuffers {
  std::vector<float> partial;
  std::vector<float> scale_a;
};

/*! Accumulators of rows [r0, r0 + rows) of a block format: Σ_blocks fl(fl(p · s_a) · s_b) in K
 *  order; scale_b holds every block's B scales, (blocks, n). */
void block_rows(const GemmArgs& args, const Panel& a, const Panel& b, int64_t r0, int64_t rows, float* acc,
                BlockBuffers& buf, const std::vector<float>& scale_b) {
  const int64_t n = args.n, block = gemm_block_length(args.scaling);
  const int64_t blocks = ceil_div(args.k, block), full = args.k / block;
  const int64_t group = std::max<int64_t>(1, std::min(blocks, kPartialFloats / std::max<int64_t>(1, rows * n)));
  const int64_t a_stride = cols(args.a->scale_inv);
  buf.partial.resize(static_cast<size_t>(group * rows * n));
  buf.scale_a.resize(static_cast<size_t>(group * rows));
  std::fill(acc, acc + rows * n, 0.0f);
  for (int64_t first = 0; first < blocks; first += group) {
    const int64_t count = std::min(group, blocks - first);
    const int64_t full_count = std::max<int64_t>(0, std::min(count, full - first));
    if (full_count > 0) block_partials(a, b, r0, rows, n, block, first, full_count, buf.partial.data());
    if (full_count < count) {  // the last, shorter block
      partial_product(a, b, r0, rows, full * block, args.k - full * block, n,
                      buf.partial.data() + full_count * rows * n);
    }
    for (int64_t j = 0; j < count; ++j) {
      for (int64_t i = 0; i < rows; ++i) {
        buf.scale_a[j * rows + i] = gemm_block_scale(args.scaling, *args.a, a_stride, r0 + i, first + j);
      }
    }
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < count; ++j) {
        scale_accumulate(acc + i * n, buf.partial.data() + (j * rows + i) * n, buf.scale_a[j * rows + i],
                         scale_b.data() + (first + j) * n, n);
      }
    }
  }
}

/*! Accumulators of rows [r0, r0 + rows) of the other formats: one fp32 sum over K. */
void full_k_rows(const GemmArgs& args, const Panel& a, const Panel& b, int64_t r0, int64_t rows, float* acc) {
  if (args.k == 0) {
    std::fill(acc, acc + rows * args.n, 0.0f);
    return;
  }
  partial_product(a, b, r0, rows, 0, args.k, args.n, acc);
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

/*! OpenBLAS runs single-threaded inside our workers (its own spinning pool would compete with them). */
void use_single_threaded_blas() {
  static const bool done = [] {
    scipy_openblas_set_num_threads(1);
    return true;
  }();
  (void)done;
}

}  // namespace

TweStatus gemm(const GemmArgs& args) {
  ScopedIeeeSubnormals ieee;
  use_single_threaded_blas();
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
      else full_k_rows(args, a, b, r0, rows, acc.data());
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
