// The CUDA rope kernel (host-emulated, see run.sh rope) against the CPU kernel on the same input,
// byte for byte, through the C ABI: forward and backward for sbhd / bshd / thd (incl. an empty
// sequence and tokens outside every sequence), interleaved, partial rotary, fp32 / bf16 / fp16,
// and angles covering special values (±0, NaN, ±inf, |θ| >= 2^24).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "internal/common.h"
#include "twinengine/rope.h"

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

static void expect(TweStatus st, const std::string& what) {
  if (st != kTweSuccess) {
    std::printf("FAILED %s: status %d, %s\n", what.c_str(), static_cast<int>(st), twe_last_error());
    ++failures;
  }
}

static Buf random(TweDType dt, std::vector<int64_t> shape, uint32_t seed, float scale) {
  Buf buf(dt, shape);
  std::mt19937 g(seed);
  std::normal_distribution<float> nd;
  for (int64_t i = 0; i < numel(buf.v); ++i) {
    const float x = nd(g) * scale;
    if (dt == kTweFloat32) static_cast<float*>(buf.v.data)[i] = x;
    else if (dt == kTweBFloat16) static_cast<uint16_t*>(buf.v.data)[i] = numerics::float_to_bf16(x);
    else static_cast<uint16_t*>(buf.v.data)[i] = numerics::float_to_fp16(x);
  }
  return buf;
}

struct Case {
  const char* name;
  TweRopeFormat format;
  int interleaved;
  std::vector<int64_t> shape;
  int64_t freq_rows, d2;
  TweDType dt;
  std::vector<int32_t> cu;  // thd only
};

static void run(const Case& c) {
  const std::string n = c.name;
  Buf x = random(c.dt, c.shape, 1, 3.0f), dy = random(c.dt, c.shape, 2, 1.0f);
  Buf freqs = random(kTweFloat32, {c.freq_rows, 1, 1, c.d2}, 3, 100.0f);
  float* f = static_cast<float*>(freqs.v.data);
  const float specials[] = {0.0f, -0.0f, NAN, INFINITY, -INFINITY, 16777216.0f, -3e38f, 1e7f, 0.7853982f};
  for (size_t i = 0; i < sizeof(specials) / sizeof(float) && static_cast<int64_t>(i) < c.freq_rows * c.d2; ++i) {
    f[i * 3 % (c.freq_rows * c.d2)] = specials[i];
  }
  Buf cu;
  if (!c.cu.empty()) {
    cu = Buf(kTweInt32, {static_cast<int64_t>(c.cu.size())});
    std::memcpy(cu.v.data, c.cu.data(), c.cu.size() * 4);
  }
  TweRopeParams p{c.format, c.interleaved};
  Buf y[2], dx[2];
  for (int side = 0; side < 2; ++side) {
    const TweDevice dev = side ? kTweCUDA : kTweCPU;
    Buf xd = x.on(dev), dyd = dy.on(dev), fd = freqs.on(dev), cud = c.cu.empty() ? Buf() : cu.on(dev);
    const TweTensorView* cuv = c.cu.empty() ? nullptr : &cud.v;
    y[side] = Buf(c.dt, c.shape).on(dev);
    dx[side] = Buf(c.dt, c.shape).on(dev);
    expect(twe_rope_forward(&xd.v, &fd.v, cuv, &y[side].v, &p, nullptr), n + " fwd");
    expect(twe_rope_backward(&dyd.v, &fd.v, cuv, &dx[side].v, &p, nullptr), n + " bwd");
  }
  compare(y[0], y[1], n + " y");
  compare(dx[0], dx[1], n + " dx");
}

int main() {
  const auto F32 = kTweFloat32, BF16 = kTweBFloat16, F16 = kTweFloat16;
  const Case cases[] = {
      {"sbhd_full", kTweRopeSbhd, 0, {9, 2, 3, 16}, 12, 16, F32, {}},
      {"sbhd_partial_interleaved_bf16", kTweRopeSbhd, 1, {9, 2, 3, 20}, 9, 6, BF16, {}},
      {"bshd_partial_fp16", kTweRopeBshd, 0, {2, 7, 2, 24}, 7, 10, F16, {}},
      {"bshd_interleaved", kTweRopeBshd, 1, {3, 5, 1, 8}, 64, 8, F32, {}},
      {"thd_tail_empty", kTweRopeThd, 0, {23, 2, 16}, 10, 12, F32, {0, 4, 4, 14, 20}},
      {"thd_interleaved_bf16", kTweRopeThd, 1, {17, 3, 8}, 9, 8, BF16, {2, 11, 17}},
  };
  for (const Case& c : cases) run(c);
  std::printf("rope: %d checks, %d failures\n", checks, failures);
  return failures ? 1 : 0;
}
