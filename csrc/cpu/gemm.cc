// CPU kernel of the gemm family: operands widened to fp32 panels, partial sums from the bundled
// OpenBLAS sgemm, block scaling and the epilogue in loops; value math is in numerics.h.
#include <cblas.h>

#include <algorithm>
#include <array>
#include <atomic>
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

void widen_fp8_into(const uint8_t* src, int64_t count, const std::array<float, 256>& table, float* dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = table[src[i]];
}

/*! The operand's data as exact fp32 values in its stored layout (no copy for fp32 data). */
const float* widen(const TweGemmOperand& op, std::vector<float>& buffer) {
  const int64_t count = numel(op.data);
  const TweDType dt = op.data.dtype;
  if (dt == kTweFloat32) return static_cast<const float*>(op.data.data);
  buffer.resize(static_cast<size_t>(count));
  switch (dt) {
    case kTweBFloat16: widen_into(static_cast<const BFloat16*>(op.data.data), count, buffer.data()); break;
    case kTweFloat16: widen_into(static_cast<const Float16*>(op.data.data), count, buffer.data()); break;
    case kTweFloat8E4M3: {
      static const std::array<float, 256> table = fp8_table<FP8Format::kE4M3>();
      widen_fp8_into(static_cast<const uint8_t*>(op.data.data), count, table, buffer.data());
      break;
    }
    default: {
      static const std::array<float, 256> table = fp8_table<FP8Format::kE5M2>();
      widen_fp8_into(static_cast<const uint8_t*>(op.data.data), count, table, buffer.data());
      break;
    }
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
};

/*! c (m_len, n) = A[r0:r0+m_len, k0:k0+len] · B[:, k0:k0+len]ᵀ, row-major, overwritten. */
void partial_product(const Panel& a, const Panel& b, int64_t r0, int64_t m_len, int64_t k0, int64_t len, int64_t n,
                     float* c) {
  scipy_cblas_sgemm(CblasRowMajor, a.k_major ? CblasNoTrans : CblasTrans, b.k_major ? CblasTrans : CblasNoTrans,
                    static_cast<blasint>(m_len), static_cast<blasint>(n), static_cast<blasint>(len), 1.0f,
                    a.at(r0, k0), static_cast<blasint>(a.ld()), b.at(0, k0), static_cast<blasint>(b.ld()), 0.0f, c,
                    static_cast<blasint>(n));
}

/*! Decode scales of MXFP8 K-block `block` for rows [r0, r0 + count) of an operand. */
void mxfp8_block_scales(const TweGemmOperand& op, int64_t r0, int64_t count, int64_t block, float* scales) {
  const uint8_t* codes = static_cast<const uint8_t*>(op.scale_inv.data);
  const int64_t stride = cols(op.scale_inv);
  for (int64_t r = 0; r < count; ++r) {
    const int64_t row = r0 + r;
    scales[r] = numerics::e8m0_to_float(op.k_major ? codes[row * stride + block] : codes[block * stride + row]);
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

// Output rows per chunk. MXFP8: all K-block partials of a chunk come from one strided batched
// sgemm into a buffer of about kMxfp8ChunkFloats floats; other formats take one sgemm per chunk.
constexpr int64_t kMxfp8ChunkFloats = int64_t{1} << 21;
constexpr int64_t kRowChunk = 256;

/*! Every K-block's partial product of rows [r0, r0 + rows): partial[block] (rows, n). */
void mxfp8_partials(const Panel& a, const Panel& b, int64_t r0, int64_t rows, int64_t n, int64_t blocks,
                    float* partial) {
  const int64_t a_stride = a.k_major ? kMxfp8GemmBlock : kMxfp8GemmBlock * a.rows;
  const int64_t b_stride = b.k_major ? kMxfp8GemmBlock : kMxfp8GemmBlock * b.rows;
  scipy_cblas_sgemm_batch_strided(
      CblasRowMajor, a.k_major ? CblasNoTrans : CblasTrans, b.k_major ? CblasTrans : CblasNoTrans,
      static_cast<blasint>(rows), static_cast<blasint>(n), static_cast<blasint>(kMxfp8GemmBlock), 1.0f, a.at(r0, 0),
      static_cast<blasint>(a.ld()), static_cast<blasint>(a_stride), b.at(0, 0), static_cast<blasint>(b.ld()),
      static_cast<blasint>(b_stride), 0.0f, partial, static_cast<blasint>(n), static_cast<blasint>(rows * n),
      static_cast<blasint>(blocks));
}

/*! Accumulators of rows [r0, r0 + rows): Σ_blocks fl(fl(partial · s_a) · s_b) in K order.
 *  scale_b holds every block's B scales, (blocks, n). */
void mxfp8_rows(const GemmArgs& args, const Panel& a, const Panel& b, int64_t r0, int64_t rows, float* acc,
                std::vector<float>& partial, std::vector<float>& scale_a, const std::vector<float>& scale_b) {
  const int64_t n = args.n;
  const int64_t blocks = args.k / kMxfp8GemmBlock;
  std::fill(acc, acc + rows * n, 0.0f);
  if (blocks == 0) return;
  mxfp8_partials(a, b, r0, rows, n, blocks, partial.data());
  for (int64_t block = 0; block < blocks; ++block) {
    mxfp8_block_scales(*args.a, r0, rows, block, scale_a.data() + block * rows);
  }
  for (int64_t i = 0; i < rows; ++i) {
    float* acc_row = acc + i * n;
    for (int64_t block = 0; block < blocks; ++block) {
      const float* p_row = partial.data() + (block * rows + i) * n;
      const float* sb = scale_b.data() + block * n;
      const float sa = scale_a[block * rows + i];
      for (int64_t j = 0; j < n; ++j) acc_row[j] = acc_row[j] + numerics::gemm_scale_partial(p_row[j], sa, sb[j]);
    }
  }
}

/*! Accumulators of rows [r0, r0 + rows): one fp32 sum over K, per-tensor scaled if FP8. */
void full_k_rows(const GemmArgs& args, const Panel& a, const Panel& b, int64_t r0, int64_t rows, float* acc) {
  const int64_t n = args.n;
  if (args.k == 0) {
    std::fill(acc, acc + rows * n, 0.0f);
    return;
  }
  partial_product(a, b, r0, rows, 0, args.k, n, acc);
  if (args.scaling != kTweGemmFP8PerTensor) return;
  const float sa = *static_cast<const float*>(args.a->scale_inv.data);
  const float sb = *static_cast<const float*>(args.b->scale_inv.data);
  for (int64_t i = 0; i < rows * n; ++i) acc[i] = numerics::gemm_scale_partial(acc[i], sa, sb);
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
  const Panel a{widen(*args.a, a_buffer), args.a->k_major != 0, m, k};
  const Panel b{widen(*args.b, b_buffer), args.b->k_major != 0, n, k};
  const bool mxfp8 = args.scaling == kTweGemmMXFP8;
  const int64_t blocks = k / kMxfp8GemmBlock;
  // Chunk sizes depend on the shape only, so the result does not depend on the worker count.
  const int64_t mxfp8_chunk = std::max<int64_t>(1, kMxfp8ChunkFloats / std::max<int64_t>(1, blocks * n));
  const int64_t chunk = std::min(m, mxfp8 ? mxfp8_chunk : kRowChunk);
  const int64_t chunks = ceil_div(m, chunk);
  std::vector<float> scale_b;
  if (mxfp8) {
    scale_b.resize(static_cast<size_t>(blocks * n));
    for (int64_t block = 0; block < blocks; ++block) mxfp8_block_scales(*args.b, 0, n, block, scale_b.data() + block * n);
  }
  std::atomic<int> status{kTweSuccess};
  // Multiply-adds per parallel_for work unit (it starts a thread per 2^18 units).
  constexpr int64_t kMacsPerWorkUnit = 16;
  parallel_for(chunks, m * n * std::max<int64_t>(k, 1) / kMacsPerWorkUnit, [&](int64_t first, int64_t last) {
    std::vector<float> acc(static_cast<size_t>(chunk * n));
    std::vector<float> partial, scale_a;
    if (mxfp8) {
      partial.resize(static_cast<size_t>(std::max<int64_t>(1, blocks) * chunk * n));
      scale_a.resize(static_cast<size_t>(blocks * chunk));
    }
    for (int64_t c = first; c < last; ++c) {
      const int64_t r0 = c * chunk;
      const int64_t rows = std::min(chunk, m - r0);
      if (mxfp8) mxfp8_rows(args, a, b, r0, rows, acc.data(), partial, scale_a, scale_b);
      else full_k_rows(args, a, b, r0, rows, acc.data());
      const TweStatus st = write_rows(args, acc.data(), r0, rows);
      if (st) status = st;
    }
  });
  return static_cast<TweStatus>(status.load());
}

}  // namespace cpu
}  // namespace twe
