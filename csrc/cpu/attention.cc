// CPU kernels of the attention family: loops and memory movement only; every value step is
// numerics.h's (attention_score, attention_rescale, attention_prob, attention_lse,
// attention_dscore, attention_dropout_keep, canonical_sum). Rows never interact in the
// forward and in dq; dk / dv of one key are one sequential accumulation, so the thread split
// never changes a bit (docs/attention.md).
#include <algorithm>
#include <limits>
#include <vector>

#include "internal/attention.h"
#include "internal/cpu.h"

namespace twe {
namespace cpu {
namespace {

constexpr int64_t kKeyBlock = 64;  // docs/attention.md §3: blocks aligned to absolute key positions
constexpr int64_t kRowTile = 16;   // query rows sharing a pass over K/V (no effect on any value)

/*! Element offset of (b, s, h, 0) in a (B, S, Hh, Dd) tensor, or (S, B, Hh, Dd) with sbhd. */
int64_t offset_of(bool sbhd, int64_t b, int64_t s, int64_t b_n, int64_t s_n, int64_t h, int64_t h_n, int64_t d_n) {
  return ((sbhd ? s * b_n + b : b * s_n + s) * h_n + h) * d_n;
}

/*! The whole view widened exactly to fp32, in bshd order (from bshd or sbhd), reordered to
 *  (B, Hh, S, Dd) when `to_bhsd`. */
std::vector<float> widen(const TweTensorView* v, bool sbhd, int64_t b_n, int64_t s_n, int64_t h_n, int64_t d_n,
                         bool to_bhsd) {
  std::vector<float> dst(static_cast<size_t>(b_n * s_n * h_n * d_n));
  dispatch_high_precision(v->dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* src = static_cast<const T*>(v->data);
    for (int64_t b = 0; b < b_n; ++b)
      for (int64_t s = 0; s < s_n; ++s)
        for (int64_t h = 0; h < h_n; ++h) {
          const int64_t from = offset_of(sbhd, b, s, b_n, s_n, h, h_n, d_n);
          const int64_t to = to_bhsd ? ((b * h_n + h) * s_n + s) * d_n : ((b * s_n + s) * h_n + h) * d_n;
          for (int64_t d = 0; d < d_n; ++d) dst[to + d] = to_float(src[from + d]);
        }
    return kTweSuccess;
  });
  return dst;
}

/*! Elements offset .. offset + n - 1 of view v = src rounded (RNE) to v's dtype. */
void narrow(const float* src, int64_t n, TweTensorView* v, int64_t offset) {
  dispatch_high_precision(v->dtype, [&](auto tag) {
    using T = decltype(tag);
    T* dst = static_cast<T*>(v->data) + offset;
    for (int64_t i = 0; i < n; ++i) dst[i] = FromFloat<T>::apply(src[i]);
    return kTweSuccess;
  });
}

/*! The visible key range [lo, hi] of query row i of batch b (empty when lo > hi). With thd
 *  (cu_q set) the only "batch" is the token buffer: row i is token i, which belongs to the
 *  sequence s with cu_q[s] <= i < cu_q[s + 1] (none: fully masked), and its range is the
 *  sequence-local range shifted by cu_kv[s]. */
struct Masking {
  TweAttentionParams p;
  const int32_t* seqlens_q;
  const int32_t* seqlens_kv;
  int64_t seq_q, seq_kv;
  const int32_t* cu_q = nullptr;
  const int32_t* cu_kv = nullptr;
  int64_t n_seqs = 0;

  void range(int64_t b, int64_t i, int64_t* lo, int64_t* hi) const {
    *lo = 0;
    *hi = -1;
    if (cu_q) {
      const int32_t* after = std::upper_bound(cu_q, cu_q + n_seqs + 1, static_cast<int32_t>(i));
      const int64_t s = (after - cu_q) - 1;  // last s with cu_q[s] <= i
      if (s < 0 || s >= n_seqs) return;
      local(i - cu_q[s], cu_q[s + 1] - cu_q[s], cu_kv[s + 1] - cu_kv[s], lo, hi);
      if (*lo <= *hi) {
        *lo += cu_kv[s];
        *hi += cu_kv[s];
      }
      return;
    }
    local(i, seqlens_q ? seqlens_q[b] : seq_q, seqlens_kv ? seqlens_kv[b] : seq_kv, lo, hi);
  }

  /*! The range of row i of a sequence of sq queries and skv keys. */
  void local(int64_t i, int64_t sq, int64_t skv, int64_t* lo, int64_t* hi) const {
    *lo = 0;
    *hi = -1;
    if (i >= sq) return;
    const bool top_left = p.mask_type == kTweAttnMaskCausal || p.mask_type == kTweAttnMaskPaddingCausal;
    const int64_t delta = top_left ? 0 : skv - sq;
    *lo = p.window_left < 0 ? 0 : std::max<int64_t>(0, i + delta - p.window_left);
    *hi = p.window_right < 0 ? skv - 1 : std::min<int64_t>(skv - 1, i + delta + p.window_right);
  }
};

Masking masking(const AttentionArgs& a) {
  const int32_t* lens_q = a.seqlens_q ? static_cast<const int32_t*>(a.seqlens_q->data) : nullptr;
  const int32_t* lens_kv = a.seqlens_kv ? static_cast<const int32_t*>(a.seqlens_kv->data) : nullptr;
  if (a.params.layout == kTweAttnLayoutTHD) {
    return Masking{a.params, nullptr, nullptr, a.seq_q, a.seq_kv, lens_q, lens_kv, numel(*a.seqlens_q) - 1};
  }
  return Masking{a.params, lens_q, lens_kv, a.seq_q, a.seq_kv};
}

uint32_t rng_word(const TweTensorView& rng, int index) {
  if (rng.dtype == kTweInt64) return static_cast<uint32_t>(static_cast<const int64_t*>(rng.data)[index]);
  return static_cast<const uint32_t*>(rng.data)[index];  // uint32, or int32 read as its bits
}

/*! Dropout of the attention probabilities (docs/attention.md §5). */
struct Dropout {
  bool on = false;
  uint64_t threshold = 0;
  float scale = 1.0f;
  uint32_t seed = 0, offset = 0;

  explicit Dropout(const AttentionArgs& a) {
    on = a.params.dropout_p > 0.0f;
    if (!on) return;
    threshold = numerics::dropout_threshold(a.params.dropout_p);
    scale = numerics::dropout_scale(a.params.dropout_p);
    seed = rng_word(*a.rng, 0);
    offset = rng_word(*a.rng, 1);
  }
  /*! v as it reaches the output (p') or its gradient (dp), for probability index n. */
  float apply(float v, uint64_t n) const {
    if (!on) return v;
    return numerics::dropout_apply(v, numerics::attention_dropout_keep(n, threshold, seed, offset), scale);
  }
};

/*! Q8(x, s, F): fl(x · s), saturating RNE to F, widened back exactly (docs/attention.md §9). */
template <numerics::FP8Format F>
float quantize_value(float x, float scale) {
  return numerics::fp8_to_float<F>(numerics::float_to_fp8<F>(x * scale));
}

/*! FP8 attention (docs/attention.md §9): x replaced in place by Q8(x, s, F) with the per-tensor
 *  current scale s = S(amax x, max F) (ε = 0, no pow2); returns inv(s) = fl(1/s). */
template <numerics::FP8Format F>
float quantize_current(std::vector<float>& x) {
  uint32_t key = 0;
  for (float v : x) key = std::max(key, numerics::amax_key(v));
  const float scale = numerics::scale_from_amax(numerics::bits_to_float(key), numerics::FP8Traits<F>::kMax, 0.0f,
                                                false, std::numeric_limits<float>::max());
  for (float& v : x) v = quantize_value<F>(v, scale);
  return 1.0f / scale;
}

constexpr float kProbScale = 448.0f;  // §9: the fixed E4M3 scale of P

/*! Q8(p, 448, E4M3) of a probability p in [0, 1]. */
float quantize_prob(float p) { return quantize_value<numerics::FP8Format::kE4M3>(p, kProbScale); }

}  // namespace

TweStatus attention_fwd(const AttentionArgs& a) {
  ScopedIeeeSubnormals ieee;
  const int64_t B = a.batch, Sq = a.seq_q, Skv = a.seq_kv, H = a.heads, Hkv = a.kv_heads, D = a.head_dim,
                Dv = a.v_dim, G = H / Hkv;
  const bool sbhd = a.params.layout == kTweAttnLayoutSBHD;
  const int64_t rows = B * H * Sq;
  if (rows == 0) return kTweSuccess;
  std::vector<float> qf = widen(a.q, sbhd, B, Sq, H, D, false);
  std::vector<float> kf = widen(a.k, sbhd, B, Skv, Hkv, D, true);
  std::vector<float> vf = widen(a.v, sbhd, B, Skv, Hkv, Dv, true);
  const Masking mask = masking(a);
  const Dropout drop(a);
  const bool fp8 = a.params.fp8 != 0;
  float s = a.params.softmax_scale, c_pv = 1.0f;
  if (fp8) {  // §9: q8, k8, v8 in place; the score factor c_qk replaces s
    const float inv_q = quantize_current<numerics::FP8Format::kE4M3>(qf);
    const float inv_k = quantize_current<numerics::FP8Format::kE4M3>(kf);
    const float inv_v = quantize_current<numerics::FP8Format::kE4M3>(vf);
    const float inv_qk = inv_q * inv_k;
    s = inv_qk * s;
    c_pv = (1.0f / kProbScale) * inv_v;
  }
  float* lse = static_cast<float*>(a.lse->data);
  // Tiles of up to kRowTile consecutive query rows of one (b, h) walk the key blocks together,
  // so a block of K and V is reused from cache by every row of the tile. Each row keeps its own
  // state and performs exactly its own steps in its own order (docs/attention.md §3).
  const int64_t tiles_per_head = ceil_div(Sq, kRowTile), tiles = B * H * tiles_per_head;
  parallel_for(tiles, rows * std::max<int64_t>(Skv, 1) * (D + Dv), [&](int64_t begin, int64_t end) {
    std::vector<float> scores(kKeyBlock), acc(static_cast<size_t>(kRowTile * Dv));
    std::vector<float> k_block(static_cast<size_t>(D * kKeyBlock)), scratch(static_cast<size_t>(32 * kKeyBlock));
    int64_t lo[kRowTile], hi[kRowTile];
    float m[kRowTile], l[kRowTile];
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t b = tile / (H * tiles_per_head), h = (tile / tiles_per_head) % H, g = h / G;
      const int64_t i0 = (tile % tiles_per_head) * kRowTile, n_rows = std::min(kRowTile, Sq - i0);
      const float* k_head = kf.data() + (b * Hkv + g) * Skv * D;
      const float* v_head = vf.data() + (b * Hkv + g) * Skv * Dv;
      int64_t t_first = std::numeric_limits<int64_t>::max(), t_last = -1;
      for (int64_t r = 0; r < n_rows; ++r) {
        mask.range(b, i0 + r, &lo[r], &hi[r]);
        m[r] = -std::numeric_limits<float>::infinity();
        l[r] = 0.0f;
        if (lo[r] <= hi[r]) {
          t_first = std::min(t_first, lo[r] / kKeyBlock);
          t_last = std::max(t_last, hi[r] / kKeyBlock);
        }
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t t = t_first; t <= t_last; ++t) {
        // The block's keys d-major, so each row scores them with SIMD over keys (same bytes).
        const int64_t kb0 = t * kKeyBlock, kb_n = std::min(kKeyBlock, Skv - kb0);
        for (int64_t jj = 0; jj < kb_n; ++jj)
          for (int64_t d = 0; d < D; ++d) k_block[d * kKeyBlock + jj] = k_head[(kb0 + jj) * D + d];
        for (int64_t r = 0; r < n_rows; ++r) {
          const int64_t j0 = std::max(lo[r], t * kKeyBlock), j1 = std::min(hi[r], t * kKeyBlock + kKeyBlock - 1);
          if (j0 > j1) continue;  // this block holds none of the row's keys
          const int64_t i = i0 + r;
          const float* q_row = qf.data() + ((b * Sq + i) * H + h) * D;
          float* acc_row = acc.data() + r * Dv;
          const uint64_t n_row = static_cast<uint64_t>(((b * H + h) * Sq + i) * Skv);
          numerics::attention_scores_columns(q_row, k_block.data() + (j0 - kb0), D, kKeyBlock, j1 - j0 + 1, s,
                                             scratch.data(), scores.data());
          float m_blk = -std::numeric_limits<float>::infinity();
          for (int64_t j = j0; j <= j1; ++j) m_blk = scores[j - j0] > m_blk ? scores[j - j0] : m_blk;
          const float m_new = m_blk > m[r] ? m_blk : m[r];
          const float alpha = numerics::attention_rescale(m[r], m_new);
          float l_row = l[r] * alpha;
          for (int64_t d = 0; d < Dv; ++d) acc_row[d] = acc_row[d] * alpha;
          for (int64_t j = j0; j <= j1; ++j) scores[j - j0] = numerics::attention_prob(scores[j - j0], m_new);
          for (int64_t j = j0; j <= j1; ++j) {
            const float p = scores[j - j0];
            l_row = l_row + p;
            const float pd = drop.apply(fp8 ? quantize_prob(p) : p, n_row + static_cast<uint64_t>(j));
            const float* v_row = v_head + j * Dv;
            for (int64_t d = 0; d < Dv; ++d) acc_row[d] = acc_row[d] + pd * v_row[d];
          }
          l[r] = l_row;
          m[r] = m_new;
        }
      }
      for (int64_t r = 0; r < n_rows; ++r) {
        const int64_t i = i0 + r;
        float* acc_row = acc.data() + r * Dv;
        float* lse_out = lse + (b * H + h) * Sq + i;
        if (lo[r] > hi[r]) {  // fully masked row: out = +0 (acc stayed 0), lse = -inf
          *lse_out = -std::numeric_limits<float>::infinity();
        } else {
          for (int64_t d = 0; d < Dv; ++d) acc_row[d] = acc_row[d] / l[r];
          if (fp8)
            for (int64_t d = 0; d < Dv; ++d) acc_row[d] = acc_row[d] * c_pv;
          *lse_out = numerics::attention_lse(m[r], l[r]);
        }
        narrow(acc_row, Dv, a.out, offset_of(sbhd, b, i, B, Sq, h, H, Dv));
      }
    }
  });
  return kTweSuccess;
}

TweStatus attention_bwd(const AttentionArgs& a) {
  ScopedIeeeSubnormals ieee;
  const int64_t B = a.batch, Sq = a.seq_q, Skv = a.seq_kv, H = a.heads, Hkv = a.kv_heads, D = a.head_dim,
                Dv = a.v_dim, G = H / Hkv;
  const bool sbhd = a.params.layout == kTweAttnLayoutSBHD;
  std::vector<float> qf = widen(a.q, sbhd, B, Sq, H, D, false);
  std::vector<float> kf = widen(a.k, sbhd, B, Skv, Hkv, D, true);
  std::vector<float> vf = widen(a.v, sbhd, B, Skv, Hkv, Dv, true);
  const std::vector<float> dof = widen(a.dout, sbhd, B, Sq, H, Dv, false);
  const std::vector<float> of = widen(a.out_in, sbhd, B, Sq, H, Dv, false);
  const float* lse = static_cast<const float*>(a.lse->data);
  const Masking mask = masking(a);
  const Dropout drop(a);
  const float s = a.params.softmax_scale;
  // FP8 (docs/attention.md §9): q8, k8, v8 in place, do8 beside the high-precision dout (Δ
  // keeps dout and out); s_x / c_dov scale the scores / dp', c_dq / c_dk / c_dv the gradients.
  const bool fp8 = a.params.fp8 != 0;
  float s_x = s, c_dov = 1.0f, c_dq = s, c_dk = s, c_dv = 1.0f, s_ds = 1.0f, inv_q = 1.0f, inv_k = 1.0f;
  std::vector<float> do8;
  if (fp8) {
    inv_q = quantize_current<numerics::FP8Format::kE4M3>(qf);
    inv_k = quantize_current<numerics::FP8Format::kE4M3>(kf);
    const float inv_v = quantize_current<numerics::FP8Format::kE4M3>(vf);
    do8 = dof;
    const float inv_do = quantize_current<numerics::FP8Format::kE5M2>(do8);
    const float inv_qk = inv_q * inv_k;
    s_x = inv_qk * s;
    c_dov = inv_do * inv_v;
    c_dv = (1.0f / kProbScale) * inv_do;
  }
  const std::vector<float>& dmm = fp8 ? do8 : dof;  // the dout operand of dp' and dV
  const int64_t rows = B * H * Sq;
  // Δ per row (b, h, i), stored at (b·H + h)·S_q + i like lse.
  std::vector<float> delta(static_cast<size_t>(rows));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Sq; ++i)
      for (int64_t h = 0; h < H; ++h) {
        const float* o = of.data() + ((b * Sq + i) * H + h) * Dv;
        const float* dout = dof.data() + ((b * Sq + i) * H + h) * Dv;
        delta[(b * H + h) * Sq + i] = numerics::canonical_sum(Dv, [o, dout](int64_t d) { return dout[d] * o[d]; });
      }
  // One visible pair (i, j) of head h from its probability p = attention_prob(x, lse) and raw
  // dp' = Σc fl(dout · v): writes p' (dropped p) and returns ds.
  auto pair = [&](int64_t b, int64_t h, int64_t i, int64_t j, float p, float dp_raw, float* p_dropped) {
    const int64_t row = (b * H + h) * Sq + i;
    const uint64_t n = static_cast<uint64_t>(row * Skv + j);
    const float dp = drop.apply(dp_raw, n);
    *p_dropped = drop.apply(fp8 ? quantize_prob(p) : p, n);
    return numerics::attention_dscore(p, dp, delta[row]);
  };
  // dq: per row, keys ascending. Tiles of kRowTile rows of one (b, h) walk the keys in blocks
  // of kKeyBlock together (cache reuse of K / V); each row's accumulation order is unchanged.
  // Keys j0 .. j0 + n - 1 of kv head (b, g) of K and V, d-major with row stride kKeyBlock, so
  // scores and dp' of many keys come from attention_scores_columns (same bytes, SIMD over keys).
  auto transpose_keys = [&](int64_t b, int64_t g, int64_t j0, int64_t n, float* k_t, float* v_t) {
    const float* k_head = kf.data() + (b * Hkv + g) * Skv * D;
    const float* v_head = vf.data() + (b * Hkv + g) * Skv * Dv;
    for (int64_t jj = 0; jj < n; ++jj) {
      for (int64_t d = 0; d < D; ++d) k_t[d * kKeyBlock + jj] = k_head[(j0 + jj) * D + d];
      for (int64_t d = 0; d < Dv; ++d) v_t[d * kKeyBlock + jj] = v_head[(j0 + jj) * Dv + d];
    }
  };
  const int64_t tiles_per_head = ceil_div(Sq, kRowTile);
  // amax_only (FP8 pass 1): the amax key of every ds of a tile into tile_keys, nothing written.
  std::vector<uint32_t> tile_keys(static_cast<size_t>(B * H * tiles_per_head), 0u);
  auto dq_pass = [&](bool amax_only) {
  parallel_for(B * H * tiles_per_head, rows * std::max<int64_t>(Skv, 1) * (D + Dv), [&](int64_t begin, int64_t end) {
    std::vector<float> acc(static_cast<size_t>(kRowTile * D));
    std::vector<float> k_t(static_cast<size_t>(D * kKeyBlock)), v_t(static_cast<size_t>(Dv * kKeyBlock));
    std::vector<float> scratch(static_cast<size_t>(32 * kKeyBlock)), xs(kKeyBlock), dps(kKeyBlock);
    int64_t lo[kRowTile], hi[kRowTile];
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t b = tile / (H * tiles_per_head), h = (tile / tiles_per_head) % H, g = h / G;
      const int64_t i0 = (tile % tiles_per_head) * kRowTile, n_rows = std::min(kRowTile, Sq - i0);
      int64_t j_first = Skv, j_last = -1;
      for (int64_t r = 0; r < n_rows; ++r) {
        mask.range(b, i0 + r, &lo[r], &hi[r]);
        if (lo[r] <= hi[r]) {
          j_first = std::min(j_first, lo[r]);
          j_last = std::max(j_last, hi[r]);
        }
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t t0 = j_first; t0 <= j_last; t0 += kKeyBlock) {
        transpose_keys(b, g, t0, std::min(kKeyBlock, j_last + 1 - t0), k_t.data(), v_t.data());
        for (int64_t r = 0; r < n_rows; ++r) {
          const int64_t j0 = std::max(lo[r], t0), j1 = std::min(hi[r], t0 + kKeyBlock - 1);
          if (j0 > j1) continue;
          float* acc_row = acc.data() + r * D;
          const int64_t i = i0 + r;
          const float* q_row = qf.data() + ((b * Sq + i) * H + h) * D;
          const float* do_row = dmm.data() + ((b * Sq + i) * H + h) * Dv;
          numerics::attention_scores_columns(q_row, k_t.data() + (j0 - t0), D, kKeyBlock, j1 - j0 + 1, s_x,
                                             scratch.data(), xs.data());
          numerics::attention_scores_columns(do_row, v_t.data() + (j0 - t0), Dv, kKeyBlock, j1 - j0 + 1, c_dov,
                                             scratch.data(), dps.data());
          const float lse_row = lse[(b * H + h) * Sq + i];
          for (int64_t c = 0; c <= j1 - j0; ++c) xs[c] = numerics::attention_prob(xs[c], lse_row);
          for (int64_t j = j0; j <= j1; ++j) {
            float unused;
            float ds = pair(b, h, i, j, xs[j - j0], dps[j - j0], &unused);
            if (amax_only) {
              tile_keys[tile] = std::max(tile_keys[tile], numerics::amax_key(ds));
              continue;
            }
            if (fp8) ds = quantize_value<numerics::FP8Format::kE5M2>(ds, s_ds);
            const float* k_row = kf.data() + ((b * Hkv + g) * Skv + j) * D;
            for (int64_t d = 0; d < D; ++d) acc_row[d] = acc_row[d] + ds * k_row[d];
          }
        }
      }
      if (amax_only) continue;
      for (int64_t r = 0; r < n_rows; ++r) {
        float* acc_row = acc.data() + r * D;
        for (int64_t d = 0; d < D; ++d) acc_row[d] = acc_row[d] * c_dq;
        narrow(acc_row, D, a.dq, offset_of(sbhd, b, i0 + r, B, Sq, h, H, D));
      }
    }
  });
  };
  if (fp8) {  // pass 1: a_ds over every ds of the call, then s_ds and the gradient factors
    dq_pass(true);
    uint32_t key = 0;
    for (uint32_t k : tile_keys) key = std::max(key, k);
    s_ds = numerics::scale_from_amax(numerics::bits_to_float(key), numerics::kE5M2Max, 0.0f, false,
                                     std::numeric_limits<float>::max());
    const float inv_ds = 1.0f / s_ds;
    const float inv_ds_k = inv_ds * inv_k, inv_ds_q = inv_ds * inv_q;
    c_dq = inv_ds_k * s;
    c_dk = inv_ds_q * s;
  }
  dq_pass(false);
  // dk, dv: per (b, kv head g, key j), query heads of the group ascending, rows ascending. Tiles
  // of kRowTile keys of one (b, g) share each pass over the rows; each key's order is unchanged.
  const int64_t key_tiles_per_head = ceil_div(Skv, kRowTile);
  parallel_for(B * Hkv * key_tiles_per_head, std::max<int64_t>(B * Hkv * Skv, 1) * G * Sq * (D + Dv),
               [&](int64_t begin, int64_t end) {
    std::vector<float> acc_k(static_cast<size_t>(kRowTile * D)), acc_v(static_cast<size_t>(kRowTile * Dv));
    std::vector<float> k_t(static_cast<size_t>(D * kKeyBlock)), v_t(static_cast<size_t>(Dv * kKeyBlock));
    std::vector<float> scratch(static_cast<size_t>(32 * kKeyBlock)), xs(kKeyBlock), dps(kKeyBlock);
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t b = tile / (Hkv * key_tiles_per_head), g = (tile / key_tiles_per_head) % Hkv;
      const int64_t j0 = (tile % key_tiles_per_head) * kRowTile, n_keys = std::min(kRowTile, Skv - j0);
      transpose_keys(b, g, j0, n_keys, k_t.data(), v_t.data());
      std::fill(acc_k.begin(), acc_k.end(), 0.0f);
      std::fill(acc_v.begin(), acc_v.end(), 0.0f);
      for (int64_t h = g * G; h < (g + 1) * G; ++h) {
        for (int64_t i = 0; i < Sq; ++i) {
          int64_t lo, hi;
          mask.range(b, i, &lo, &hi);
          const int64_t k_first = std::max(lo, j0), k_last = std::min(hi, j0 + n_keys - 1);
          if (k_first > k_last) continue;
          const float* q_row = qf.data() + ((b * Sq + i) * H + h) * D;
          const float* do_row = dmm.data() + ((b * Sq + i) * H + h) * Dv;
          numerics::attention_scores_columns(q_row, k_t.data() + (k_first - j0), D, kKeyBlock, k_last - k_first + 1,
                                             s_x, scratch.data(), xs.data());
          numerics::attention_scores_columns(do_row, v_t.data() + (k_first - j0), Dv, kKeyBlock,
                                             k_last - k_first + 1, c_dov, scratch.data(), dps.data());
          const float lse_row = lse[(b * H + h) * Sq + i];
          for (int64_t c = 0; c <= k_last - k_first; ++c) xs[c] = numerics::attention_prob(xs[c], lse_row);
          for (int64_t j = k_first; j <= k_last; ++j) {
            float p_dropped;
            float ds = pair(b, h, i, j, xs[j - k_first], dps[j - k_first], &p_dropped);
            if (fp8) ds = quantize_value<numerics::FP8Format::kE5M2>(ds, s_ds);
            float* ak = acc_k.data() + (j - j0) * D;
            float* av = acc_v.data() + (j - j0) * Dv;
            for (int64_t d = 0; d < D; ++d) ak[d] = ak[d] + ds * q_row[d];
            for (int64_t d = 0; d < Dv; ++d) av[d] = av[d] + p_dropped * do_row[d];
          }
        }
      }
      for (int64_t jj = 0; jj < n_keys; ++jj) {
        float* ak = acc_k.data() + jj * D;
        for (int64_t d = 0; d < D; ++d) ak[d] = ak[d] * c_dk;
        narrow(ak, D, a.dk, offset_of(sbhd, b, j0 + jj, B, Skv, g, Hkv, D));
        float* av = acc_v.data() + jj * Dv;
        if (fp8)
          for (int64_t d = 0; d < Dv; ++d) av[d] = av[d] * c_dv;
        narrow(av, Dv, a.dv, offset_of(sbhd, b, j0 + jj, B, Skv, g, Hkv, Dv));
      }
    }
  });
  return kTweSuccess;
}

}  // namespace cpu
}  // namespace twe
