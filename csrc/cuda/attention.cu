// CUDA kernels of the attention family (high precision; docs/attention.md §1–§5): the same bytes
// as csrc/cpu/attention.cc. One thread per query row (forward, dq) or per key (dk, dv), each
// performing exactly the documented steps in the documented order with numerics.h's functions
// (canonical_sum, attention_rescale / prob / lse / dscore, attention_dropout_keep): rows never
// interact and each key's dk / dv is one sequential accumulation, so the thread split cannot
// change a bit. Simple, not fast: a reference-order kernel, no shared-memory tiling. Head
// dimensions up to kMaxDim (per-thread fp32 accumulators); FP8 attention (§9) is CPU-only.
#include <cuda_runtime.h>

#include <string>

#include "internal/attention.h"

namespace twe {
namespace cuda {
namespace {

constexpr int kThreads = 128;
constexpr int64_t kKeyBlock = 64;  // §3: blocks aligned to absolute key positions
constexpr int64_t kMaxDim = 256;   // D and D_v limit of this kernel

inline unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

TweStatus check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return fail(kTweCudaError, std::string(what) + ": " + cudaGetErrorString(err));
  return kTweSuccess;
}

/*! Sizes, params and optional inputs of one call, passed by value to the kernels. */
struct Geometry {
  int64_t B, Sq, Skv, H, Hkv, D, Dv;
  bool sbhd;
  TweAttentionParams p;
  const int32_t* lens_q;   // padding lengths (B,) or nullptr
  const int32_t* lens_kv;
  const int32_t* cu_q;     // thd offsets (n + 1,) or nullptr
  const int32_t* cu_kv;
  int64_t n_seqs;
  const void* rng;         // [seed, offset] or nullptr
  bool rng_int64;
};

__device__ int64_t offset_of(bool sbhd, int64_t b, int64_t s, int64_t b_n, int64_t s_n, int64_t h, int64_t h_n,
                             int64_t d_n) {
  return ((sbhd ? s * b_n + b : b * s_n + s) * h_n + h) * d_n;
}

/*! §2 range of row i of a sequence of sq queries and skv keys. */
__device__ void local_range(const TweAttentionParams& p, int64_t i, int64_t sq, int64_t skv, int64_t* lo,
                            int64_t* hi) {
  *lo = 0;
  *hi = -1;
  if (i >= sq) return;
  const bool top_left = p.mask_type == kTweAttnMaskCausal || p.mask_type == kTweAttnMaskPaddingCausal;
  const int64_t delta = top_left ? 0 : skv - sq;
  const int64_t l = i + delta - p.window_left, h = i + delta + p.window_right;
  *lo = p.window_left < 0 ? 0 : (l > 0 ? l : 0);
  *hi = p.window_right < 0 ? skv - 1 : (h < skv - 1 ? h : skv - 1);
}

/*! The visible key range [lo, hi] of query row i of batch b (thd: token i of its sequence). */
__device__ void key_range(const Geometry& g, int64_t b, int64_t i, int64_t* lo, int64_t* hi) {
  *lo = 0;
  *hi = -1;
  if (g.cu_q != nullptr) {
    int64_t s = -1;  // last s with cu_q[s] <= i
    for (int64_t t = 0; t <= g.n_seqs && g.cu_q[t] <= i; ++t) s = t;
    if (s < 0 || s >= g.n_seqs) return;
    local_range(g.p, i - g.cu_q[s], g.cu_q[s + 1] - g.cu_q[s], g.cu_kv[s + 1] - g.cu_kv[s], lo, hi);
    if (*lo <= *hi) {
      *lo += g.cu_kv[s];
      *hi += g.cu_kv[s];
    }
    return;
  }
  local_range(g.p, i, g.lens_q ? g.lens_q[b] : g.Sq, g.lens_kv ? g.lens_kv[b] : g.Skv, lo, hi);
}

__device__ uint32_t rng_word(const Geometry& g, int index) {
  if (g.rng_int64) return static_cast<uint32_t>(static_cast<const int64_t*>(g.rng)[index]);
  return static_cast<const uint32_t*>(g.rng)[index];
}

/*! v as it reaches the output (p') or its gradient (dp) for probability index n (§5). */
__device__ float drop(const Geometry& g, float v, uint64_t n) {
  if (!(g.p.dropout_p > 0.0f)) return v;
  const bool keep = numerics::attention_dropout_keep(n, numerics::dropout_threshold(g.p.dropout_p), rng_word(g, 0),
                                                     rng_word(g, 1));
  return numerics::dropout_apply(v, keep, numerics::dropout_scale(g.p.dropout_p));
}

/*! x = fl(Σc_d fl(q_d · k_d) · s) (attention_score's operations, reading the input dtype). */
template <typename T>
__device__ float score(const T* q, const T* k, int64_t d_n, float s) {
  const float dot = numerics::canonical_sum(d_n, [q, k](int64_t d) { return to_float(q[d]) * to_float(k[d]); });
  return dot * s;
}

/*! Σc_d fl(a_d · b_d) of two input-dtype rows. */
template <typename T>
__device__ float dot(const T* a, const T* b, int64_t d_n) {
  return numerics::canonical_sum(d_n, [a, b](int64_t d) { return to_float(a[d]) * to_float(b[d]); });
}

/*! Thread = row (b, h, i): §3. */
template <typename T>
__global__ void fwd_kernel(Geometry g, const T* q, const T* k, const T* v, T* out, float* lse) {
  const int64_t row = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;  // (b·H + h)·S_q + i
  if (row >= g.B * g.H * g.Sq) return;
  const int64_t i = row % g.Sq, h = (row / g.Sq) % g.H, b = row / (g.Sq * g.H), kv = h / (g.H / g.Hkv);
  const float s = g.p.softmax_scale;
  const T* q_row = q + offset_of(g.sbhd, b, i, g.B, g.Sq, h, g.H, g.D);
  float acc[kMaxDim];
  for (int64_t d = 0; d < g.Dv; ++d) acc[d] = 0.0f;
  int64_t lo, hi;
  key_range(g, b, i, &lo, &hi);
  float m = -INFINITY, l = 0.0f;
  float x[kKeyBlock];
  const uint64_t n_row = static_cast<uint64_t>(row * g.Skv);
  for (int64_t t = lo < 0 ? 0 : lo / kKeyBlock; lo <= hi && t <= hi / kKeyBlock; ++t) {
    const int64_t j0 = lo > t * kKeyBlock ? lo : t * kKeyBlock;
    const int64_t j1 = hi < t * kKeyBlock + kKeyBlock - 1 ? hi : t * kKeyBlock + kKeyBlock - 1;
    float m_blk = -INFINITY;
    for (int64_t j = j0; j <= j1; ++j) {
      x[j - j0] = score(q_row, k + offset_of(g.sbhd, b, j, g.B, g.Skv, kv, g.Hkv, g.D), g.D, s);
      m_blk = x[j - j0] > m_blk ? x[j - j0] : m_blk;
    }
    const float m_new = m_blk > m ? m_blk : m;
    const float alpha = numerics::attention_rescale(m, m_new);
    l = l * alpha;
    for (int64_t d = 0; d < g.Dv; ++d) acc[d] = acc[d] * alpha;
    for (int64_t j = j0; j <= j1; ++j) {
      const float p = numerics::attention_prob(x[j - j0], m_new);
      l = l + p;
      const float pd = drop(g, p, n_row + static_cast<uint64_t>(j));
      const T* v_row = v + offset_of(g.sbhd, b, j, g.B, g.Skv, kv, g.Hkv, g.Dv);
      for (int64_t d = 0; d < g.Dv; ++d) acc[d] = acc[d] + pd * to_float(v_row[d]);
    }
    m = m_new;
  }
  T* o = out + offset_of(g.sbhd, b, i, g.B, g.Sq, h, g.H, g.Dv);
  if (lo > hi) {
    lse[row] = -INFINITY;
    for (int64_t d = 0; d < g.Dv; ++d) o[d] = FromFloat<T>::apply(0.0f);
    return;
  }
  for (int64_t d = 0; d < g.Dv; ++d) o[d] = FromFloat<T>::apply(acc[d] / l);
  lse[row] = numerics::attention_lse(m, l);
}

/*! ds of the visible pair (row (b, h, i), key j) and p' (§4). */
template <typename T>
__device__ float pair(const Geometry& g, const T* q_row, const T* do_row, const T* k_row, const T* v_row, float lse_i,
                      float delta_i, uint64_t n, float* p_dropped) {
  const float x = score(q_row, k_row, g.D, g.p.softmax_scale);
  const float p = numerics::attention_prob(x, lse_i);
  const float dp = drop(g, dot(do_row, v_row, g.Dv), n);
  *p_dropped = drop(g, p, n);
  return numerics::attention_dscore(p, dp, delta_i);
}

/*! Thread = row (b, h, i): dq over keys ascending. */
template <typename T>
__global__ void dq_kernel(Geometry g, const T* dout, const T* q, const T* k, const T* v, const T* out,
                          const float* lse, T* dq) {
  const int64_t row = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (row >= g.B * g.H * g.Sq) return;
  const int64_t i = row % g.Sq, h = (row / g.Sq) % g.H, b = row / (g.Sq * g.H), kv = h / (g.H / g.Hkv);
  const T* q_row = q + offset_of(g.sbhd, b, i, g.B, g.Sq, h, g.H, g.D);
  const T* do_row = dout + offset_of(g.sbhd, b, i, g.B, g.Sq, h, g.H, g.Dv);
  const float delta = dot(do_row, out + offset_of(g.sbhd, b, i, g.B, g.Sq, h, g.H, g.Dv), g.Dv);
  float acc[kMaxDim];
  for (int64_t d = 0; d < g.D; ++d) acc[d] = 0.0f;
  int64_t lo, hi;
  key_range(g, b, i, &lo, &hi);
  for (int64_t j = lo; j <= hi; ++j) {
    const T* k_row = k + offset_of(g.sbhd, b, j, g.B, g.Skv, kv, g.Hkv, g.D);
    float unused;
    const float ds = pair(g, q_row, do_row, k_row, v + offset_of(g.sbhd, b, j, g.B, g.Skv, kv, g.Hkv, g.Dv), lse[row],
                          delta, static_cast<uint64_t>(row * g.Skv + j), &unused);
    for (int64_t d = 0; d < g.D; ++d) acc[d] = acc[d] + ds * to_float(k_row[d]);
  }
  T* o = dq + offset_of(g.sbhd, b, i, g.B, g.Sq, h, g.H, g.D);
  for (int64_t d = 0; d < g.D; ++d) o[d] = FromFloat<T>::apply(acc[d] * g.p.softmax_scale);
}

/*! Thread = key (b, kv head, j): dk, dv over the group's query heads ascending, rows ascending. */
template <typename T>
__global__ void dkv_kernel(Geometry g, const T* dout, const T* q, const T* k, const T* v, const T* out,
                           const float* lse, T* dk, T* dv) {
  const int64_t key = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;  // (b·H_kv + kv)·S_kv + j
  if (key >= g.B * g.Hkv * g.Skv) return;
  const int64_t j = key % g.Skv, kv = (key / g.Skv) % g.Hkv, b = key / (g.Skv * g.Hkv), G = g.H / g.Hkv;
  const T* k_row = k + offset_of(g.sbhd, b, j, g.B, g.Skv, kv, g.Hkv, g.D);
  const T* v_row = v + offset_of(g.sbhd, b, j, g.B, g.Skv, kv, g.Hkv, g.Dv);
  float acc_k[kMaxDim], acc_v[kMaxDim];
  for (int64_t d = 0; d < g.D; ++d) acc_k[d] = 0.0f;
  for (int64_t d = 0; d < g.Dv; ++d) acc_v[d] = 0.0f;
  for (int64_t h = kv * G; h < (kv + 1) * G; ++h) {
    for (int64_t i = 0; i < g.Sq; ++i) {
      int64_t lo, hi;
      key_range(g, b, i, &lo, &hi);
      if (j < lo || j > hi) continue;
      const int64_t row = (b * g.H + h) * g.Sq + i;
      const T* q_row = q + offset_of(g.sbhd, b, i, g.B, g.Sq, h, g.H, g.D);
      const T* do_row = dout + offset_of(g.sbhd, b, i, g.B, g.Sq, h, g.H, g.Dv);
      const float delta = dot(do_row, out + offset_of(g.sbhd, b, i, g.B, g.Sq, h, g.H, g.Dv), g.Dv);
      float p_dropped;
      const float ds = pair(g, q_row, do_row, k_row, v_row, lse[row], delta, static_cast<uint64_t>(row * g.Skv + j),
                            &p_dropped);
      for (int64_t d = 0; d < g.D; ++d) acc_k[d] = acc_k[d] + ds * to_float(q_row[d]);
      for (int64_t d = 0; d < g.Dv; ++d) acc_v[d] = acc_v[d] + p_dropped * to_float(do_row[d]);
    }
  }
  T* ok = dk + offset_of(g.sbhd, b, j, g.B, g.Skv, kv, g.Hkv, g.D);
  T* ov = dv + offset_of(g.sbhd, b, j, g.B, g.Skv, kv, g.Hkv, g.Dv);
  for (int64_t d = 0; d < g.D; ++d) ok[d] = FromFloat<T>::apply(acc_k[d] * g.p.softmax_scale);
  for (int64_t d = 0; d < g.Dv; ++d) ov[d] = FromFloat<T>::apply(acc_v[d]);
}

TweStatus geometry(const AttentionArgs& a, Geometry* g) {
  if (a.params.fp8) return fail(kTweUnsupported, "FP8 attention has no CUDA kernel yet (CPU tensors only)");
  if (a.head_dim > kMaxDim || a.v_dim > kMaxDim) {
    return fail(kTweUnsupported, "the CUDA attention kernel supports head dimensions up to " +
                                     std::to_string(kMaxDim));
  }
  const bool thd = a.params.layout == kTweAttnLayoutTHD;
  *g = Geometry{a.batch, a.seq_q, a.seq_kv, a.heads, a.kv_heads, a.head_dim, a.v_dim,
                a.params.layout == kTweAttnLayoutSBHD, a.params, nullptr, nullptr, nullptr, nullptr, 0,
                nullptr, false};
  const int32_t* sq = a.seqlens_q ? static_cast<const int32_t*>(a.seqlens_q->data) : nullptr;
  const int32_t* skv = a.seqlens_kv ? static_cast<const int32_t*>(a.seqlens_kv->data) : nullptr;
  if (thd) {
    g->cu_q = sq;
    g->cu_kv = skv;
    g->n_seqs = numel(*a.seqlens_q) - 1;
  } else {
    g->lens_q = sq;
    g->lens_kv = skv;
  }
  if (a.params.dropout_p > 0.0f) {
    g->rng = a.rng->data;
    g->rng_int64 = a.rng->dtype == kTweInt64;
  }
  return kTweSuccess;
}

}  // namespace

TweStatus attention_fwd(const AttentionArgs& a) {
  Geometry g;
  TweStatus st = geometry(a, &g);
  if (st) return st;
  const int64_t rows = g.B * g.H * g.Sq;
  if (rows == 0) return kTweSuccess;
  const auto stream = static_cast<cudaStream_t>(a.stream);
  return dispatch_high_precision(a.q->dtype, [&](auto tag) {
    using T = decltype(tag);
    fwd_kernel<T><<<blocks_for(rows), kThreads, 0, stream>>>(
        g, static_cast<const T*>(a.q->data), static_cast<const T*>(a.k->data), static_cast<const T*>(a.v->data),
        static_cast<T*>(a.out->data), static_cast<float*>(a.lse->data));
    return check_launch("attention fwd_kernel");
  });
}

TweStatus attention_bwd(const AttentionArgs& a) {
  Geometry g;
  TweStatus st = geometry(a, &g);
  if (st) return st;
  const int64_t rows = g.B * g.H * g.Sq, keys = g.B * g.Hkv * g.Skv;
  const auto stream = static_cast<cudaStream_t>(a.stream);
  return dispatch_high_precision(a.q->dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* dout = static_cast<const T*>(a.dout->data);
    const T* q = static_cast<const T*>(a.q->data);
    const T* k = static_cast<const T*>(a.k->data);
    const T* v = static_cast<const T*>(a.v->data);
    const T* out = static_cast<const T*>(a.out_in->data);
    const float* lse = static_cast<const float*>(a.lse->data);
    if (rows > 0) {
      dq_kernel<T><<<blocks_for(rows), kThreads, 0, stream>>>(g, dout, q, k, v, out, lse,
                                                               static_cast<T*>(a.dq->data));
      TweStatus s1 = check_launch("attention dq_kernel");
      if (s1) return s1;
    }
    if (keys > 0) {
      dkv_kernel<T><<<blocks_for(keys), kThreads, 0, stream>>>(g, dout, q, k, v, out, lse,
                                                                static_cast<T*>(a.dk->data),
                                                                static_cast<T*>(a.dv->data));
      return check_launch("attention dkv_kernel");
    }
    return kTweSuccess;
  });
}

}  // namespace cuda
}  // namespace twe
