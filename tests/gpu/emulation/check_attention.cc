// The CUDA attention kernels (host-emulated, see run.sh attention) against the CPU kernels on the
// same input, byte for byte, through the C ABI: forward (out, lse) and backward (dq, dk, dv) for
// bshd / sbhd / thd, every mask type, windows, padding lengths (incl. zero), GQA / MQA, dropout,
// fp32 / bf16 / fp16, sequence lengths not a multiple of the 64-key block. FP8 attention (§9) is
// CPU-only: a CUDA view gets kTweUnsupported.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "internal/common.h"
#include "twinengine/attention.h"

using namespace twe;

static int failures = 0, checks = 0;

struct Buf {
  std::vector<uint8_t> b;
  TweTensorView v{};
  Buf() = default;
  Buf(TweDType dt, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    b.assign(static_cast<size_t>(n) * static_cast<size_t>(element_size(dt)) + 64, 0xAB);
    v.data = b.data() + 16;
    v.dtype = dt;
    v.device = kTweCPU;
    v.ndim = static_cast<int32_t>(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) v.shape[i] = shape[i];
  }
  Buf on(TweDevice dev) const {
    Buf c = *this;
    c.v.data = c.b.data() + 16;
    c.v.device = dev;
    return c;
  }
};

static void compare(const Buf& a, const Buf& b, const std::string& what) {
  ++checks;
  const size_t n = static_cast<size_t>(numel(a.v)) * static_cast<size_t>(element_size(a.v.dtype));
  if (std::memcmp(a.v.data, b.v.data, n) != 0) {
    std::printf("MISMATCH %s\n", what.c_str());
    ++failures;
  }
}

static void expect(TweStatus st, TweStatus want, const std::string& what) {
  if (st != want) {
    std::printf("FAILED %s: status %d, %s\n", what.c_str(), static_cast<int>(st), twe_last_error());
    ++failures;
  }
}

static Buf random(TweDType dt, std::vector<int64_t> shape, uint32_t seed) {
  Buf buf(dt, shape);
  std::mt19937 g(seed);
  std::normal_distribution<float> nd;
  for (int64_t i = 0; i < numel(buf.v); ++i) {
    const float x = nd(g);
    if (dt == kTweFloat32) static_cast<float*>(buf.v.data)[i] = x;
    else if (dt == kTweBFloat16) static_cast<uint16_t*>(buf.v.data)[i] = numerics::float_to_bf16(x);
    else static_cast<uint16_t*>(buf.v.data)[i] = numerics::float_to_fp16(x);
  }
  return buf;
}

static Buf ints(std::vector<int32_t> values) {
  Buf buf(kTweInt32, {static_cast<int64_t>(values.size())});
  std::memcpy(buf.v.data, values.data(), values.size() * 4);
  return buf;
}

struct Case {
  const char* name;
  TweAttentionLayout layout;
  TweAttentionMask mask;
  int64_t B, Sq, Skv, H, Hkv, D, Dv, left, right;
  float dropout;
  TweDType dt;
  std::vector<int32_t> lens_q, lens_kv;  // padding lengths (B,), or thd cu_seqlens
};

static std::vector<int64_t> shape(const Case& c, int64_t s, int64_t h, int64_t d) {
  if (c.layout == kTweAttnLayoutTHD) return {s, h, d};
  if (c.layout == kTweAttnLayoutSBHD) return {s, c.B, h, d};
  return {c.B, s, h, d};
}

static void run(const Case& c) {
  const std::string n = c.name;
  Buf q = random(c.dt, shape(c, c.Sq, c.H, c.D), 1), k = random(c.dt, shape(c, c.Skv, c.Hkv, c.D), 2);
  Buf v = random(c.dt, shape(c, c.Skv, c.Hkv, c.Dv), 3), dout = random(c.dt, shape(c, c.Sq, c.H, c.Dv), 4);
  const bool thd = c.layout == kTweAttnLayoutTHD;
  std::vector<int64_t> lse_shape = thd ? std::vector<int64_t>{c.H, c.Sq} : std::vector<int64_t>{c.B, c.H, c.Sq};
  Buf lq = c.lens_q.empty() ? Buf() : ints(c.lens_q), lkv = c.lens_kv.empty() ? Buf() : ints(c.lens_kv);
  Buf rng(kTweInt64, {2});
  static_cast<int64_t*>(rng.v.data)[0] = 1234;
  static_cast<int64_t*>(rng.v.data)[1] = 5;
  TweAttentionParams p{c.layout, c.mask, c.left, c.right, 1.0f / std::sqrt(static_cast<float>(c.D)), c.dropout, 0};
  Buf out[2], lse[2], dq[2], dk[2], dv[2];
  for (int side = 0; side < 2; ++side) {
    const TweDevice dev = side ? kTweCUDA : kTweCPU;
    Buf qd = q.on(dev), kd = k.on(dev), vd = v.on(dev), dod = dout.on(dev), rd = rng.on(dev);
    Buf lqd = c.lens_q.empty() ? Buf() : lq.on(dev), lkd = c.lens_kv.empty() ? Buf() : lkv.on(dev);
    out[side] = Buf(c.dt, shape(c, c.Sq, c.H, c.Dv)).on(dev);
    lse[side] = Buf(kTweFloat32, lse_shape).on(dev);
    const TweTensorView* sq = c.lens_q.empty() ? nullptr : &lqd.v;
    const TweTensorView* skv = c.lens_kv.empty() ? nullptr : &lkd.v;
    const TweTensorView* r = c.dropout > 0 ? &rd.v : nullptr;
    expect(twe_attention_fwd(&qd.v, &kd.v, &vd.v, sq, skv, r, &out[side].v, &lse[side].v, &p, nullptr), kTweSuccess,
           n + " fwd");
    dq[side] = Buf(c.dt, shape(c, c.Sq, c.H, c.D)).on(dev);
    dk[side] = Buf(c.dt, shape(c, c.Skv, c.Hkv, c.D)).on(dev);
    dv[side] = Buf(c.dt, shape(c, c.Skv, c.Hkv, c.Dv)).on(dev);
    Buf o_in = out[0].on(dev), l_in = lse[0].on(dev);  // both sides differentiate the CPU forward
    expect(twe_attention_bwd(&dod.v, &qd.v, &kd.v, &vd.v, &o_in.v, &l_in.v, sq, skv, r, &dq[side].v, &dk[side].v,
                             &dv[side].v, &p, nullptr),
           kTweSuccess, n + " bwd");
    if (side == 1) {  // FP8 attention is CPU-only
      TweAttentionParams p8 = p;
      p8.fp8 = 1;
      expect(twe_attention_fwd(&qd.v, &kd.v, &vd.v, sq, skv, r, &out[side].v, &lse[side].v, &p8, nullptr),
             kTweUnsupported, n + " fp8 on cuda");
      expect(twe_attention_fwd(&qd.v, &kd.v, &vd.v, sq, skv, r, &out[side].v, &lse[side].v, &p, nullptr),
             kTweSuccess, n + " fwd again");
    }
  }
  compare(out[0], out[1], n + " out");
  compare(lse[0], lse[1], n + " lse");
  compare(dq[0], dq[1], n + " dq");
  compare(dk[0], dk[1], n + " dk");
  compare(dv[0], dv[1], n + " dv");
}

int main() {
  const auto F32 = kTweFloat32, BF16 = kTweBFloat16, F16 = kTweFloat16;
  const auto BSHD = kTweAttnLayoutBSHD, SBHD = kTweAttnLayoutSBHD, THD = kTweAttnLayoutTHD;
  const Case cases[] = {
      {"no_mask", BSHD, kTweAttnMaskNone, 2, 40, 40, 2, 2, 16, 16, -1, -1, 0.0f, F32, {}, {}},
      {"causal_gqa", BSHD, kTweAttnMaskCausal, 2, 70, 70, 4, 2, 16, 16, -1, 0, 0.0f, F32, {}, {}},
      {"causal_sq_gt_skv", BSHD, kTweAttnMaskCausal, 1, 75, 40, 2, 2, 8, 8, -1, 0, 0.0f, F32, {}, {}},
      {"bottom_right_mqa", BSHD, kTweAttnMaskCausalBottomRight, 2, 30, 140, 4, 1, 16, 24, -1, 0, 0.0f, F32, {}, {}},
      {"padding_zero_lengths", BSHD, kTweAttnMaskPadding, 3, 20, 33, 2, 1, 8, 8, -1, -1, 0.0f, F32, {20, 0, 7},
       {33, 5, 0}},
      {"sliding_window", BSHD, kTweAttnMaskNone, 2, 70, 150, 2, 2, 16, 16, 5, 3, 0.0f, F32, {}, {}},
      {"dropout_bf16", BSHD, kTweAttnMaskCausal, 2, 66, 66, 2, 1, 16, 16, -1, 0, 0.25f, BF16, {}, {}},
      {"sbhd_padding_fp16", SBHD, kTweAttnMaskPaddingCausalBottomRight, 2, 33, 40, 4, 2, 8, 8, -1, 0, 0.0f, F16,
       {33, 20}, {40, 31}},
      {"thd_window_dropout", THD, kTweAttnMaskPaddingCausalBottomRight, 1, 90, 100, 2, 1, 8, 8, 9, 0, 0.2f, F32,
       {0, 20, 90}, {0, 50, 100}},
      {"thd_unused_tail", THD, kTweAttnMaskPaddingCausal, 1, 80, 75, 2, 2, 8, 8, -1, 0, 0.0f, F32, {0, 7, 70},
       {0, 7, 70}},
  };
  for (const Case& c : cases) run(c);
  std::printf("attention: %d checks, %d failures\n", checks, failures);
  return failures ? 1 : 0;
}
