// The CUDA norm kernels (host-emulated, see run.sh) against the CPU kernels on the same input: every
// norm, forward and backward, every x / parameter dtype, K not a multiple of 32, zero and one row,
// NaN / inf rows. Outputs start as 0xAB so unwritten elements show. NaNs compare by predicate.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "internal/norm.h"

using namespace twe;

static int failures = 0, checks = 0;

struct Buf {
  std::vector<uint8_t> b;
  TweTensorView v{};
  Buf(TweDType dt, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    b.assign(static_cast<size_t>(n) * static_cast<size_t>(element_size(dt)) + 16, 0xAB);
    v.data = b.data();
    v.dtype = dt;
    v.device = kTweCUDA;
    v.ndim = static_cast<int32_t>(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) v.shape[i] = shape[i];
  }
  float at(int64_t i) const {
    switch (v.dtype) {
      case kTweBFloat16: return numerics::bf16_to_float(reinterpret_cast<const uint16_t*>(b.data())[i]);
      case kTweFloat16: return numerics::fp16_to_float(reinterpret_cast<const uint16_t*>(b.data())[i]);
      default: return reinterpret_cast<const float*>(b.data())[i];
    }
  }
  void set(int64_t i, float f) {
    if (v.dtype == kTweFloat32) std::memcpy(b.data() + 4 * i, &f, 4);
    else {
      const uint16_t h = v.dtype == kTweBFloat16 ? numerics::float_to_bf16(f) : numerics::float_to_fp16(f);
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
  }
};

static void compare(const Buf& cuda, const Buf& cpu, const std::string& what) {
  ++checks;
  const int64_t n = numel(cuda.v), width = element_size(cuda.v.dtype);
  for (int64_t i = 0; i < n; ++i) {
    const float a = cuda.at(i), e = cpu.at(i);
    const bool same = (std::isnan(a) && std::isnan(e)) ||
                      std::memcmp(cuda.b.data() + i * width, cpu.b.data() + i * width, static_cast<size_t>(width)) == 0;
    if (!same) {
      if (failures < 40) std::printf("MISMATCH %s: element %lld of %lld: cuda %g cpu %g\n", what.c_str(),
                                     static_cast<long long>(i), static_cast<long long>(n), a, e);
      ++failures;
      return;
    }
  }
}

static Buf make_rows(TweDType dt, int64_t rows, int64_t k, bool specials, uint32_t seed) {
  Buf out(dt, {rows, k});
  std::mt19937 g(seed);
  std::normal_distribution<float> nd;
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = std::ldexp(1.0f, static_cast<int>(g() % 13) - 6), shift = nd(g);
    for (int64_t i = 0; i < k; ++i) {
      float v = nd(g) * scale + shift;
      if (r % 5 == 1) v = 3.25f;                        // a row of constants
      if (r % 5 == 2) v = nd(g) * 1e-40f;               // subnormals
      if (specials && r % 5 == 3 && i % 3 == 0) v = NAN;
      if (specials && r % 5 == 4 && i == 0) v = (r % 2) ? INFINITY : -INFINITY;
      out.set(r * k + i, v);
    }
  }
  return out;
}

static void check(NormKind kind, TweDType xt, TweDType pt, int64_t rows, int64_t k, bool zcg, bool specials) {
  const std::string what = std::string(kind == NormKind::kLayerNorm ? "layernorm" : kind == NormKind::kRMSNorm ? "rmsnorm" : "l2norm") +
                           " x=" + dtype_name(xt) + " param=" + dtype_name(pt) + " R=" + std::to_string(rows) +
                           " K=" + std::to_string(k) + (zcg ? " zcg" : "") + (specials ? " nan/inf" : "");
  Buf x = make_rows(xt, rows, k, specials, static_cast<uint32_t>(rows * 131 + k));
  Buf dy = make_rows(xt, rows, k, false, static_cast<uint32_t>(rows * 17 + k + 5));
  Buf gamma = make_rows(pt, 1, k, false, static_cast<uint32_t>(k + 1)), beta = make_rows(pt, 1, k, false, static_cast<uint32_t>(k + 2));
  const bool ln = kind == NormKind::kLayerNorm, gain = kind != NormKind::kL2Norm;
  struct Result { Buf y, mu, rstd, dx, dg, db; };
  auto run = [&](bool cuda) {
    Result o{Buf(xt, {rows, k}), Buf(kTweFloat32, {rows}), Buf(kTweFloat32, {rows}), Buf(xt, {rows, k}), Buf(pt, {k}),
             Buf(pt, {k})};
    NormFwdArgs f{kind, &x.v, gain ? &gamma.v : nullptr, ln ? &beta.v : nullptr, &o.y.v, ln ? &o.mu.v : nullptr,
                  &o.rstd.v, 1e-5f, zcg, rows, k, nullptr};
    TweStatus st = cuda ? cuda::norm_fwd(f) : cpu::norm_fwd(f);
    NormBwdArgs b{kind, &dy.v, &x.v, ln ? &o.mu.v : nullptr, &o.rstd.v, gain ? &gamma.v : nullptr, &o.dx.v,
                  gain ? &o.dg.v : nullptr, ln ? &o.db.v : nullptr, zcg, rows, k, nullptr};
    if (st == kTweSuccess) st = cuda ? cuda::norm_bwd(b) : cpu::norm_bwd(b);
    if (st != kTweSuccess) {
      std::printf("FAILED %s (%s): %s\n", what.c_str(), cuda ? "cuda" : "cpu", twe_last_error());
      ++failures;
    }
    return o;
  };
  Result c = run(true), h = run(false);
  compare(c.y, h.y, what + " y");
  compare(c.rstd, h.rstd, what + " rstd");
  compare(c.dx, h.dx, what + " dx");
  if (ln) compare(c.mu, h.mu, what + " mu");
  if (gain) compare(c.dg, h.dg, what + " dgamma");
  if (ln) compare(c.db, h.db, what + " dbeta");
}

int main() {
  const TweDType dts[] = {kTweFloat32, kTweBFloat16, kTweFloat16};
  const NormKind kinds[] = {NormKind::kLayerNorm, NormKind::kRMSNorm, NormKind::kL2Norm};
  int n = 0;
  for (NormKind kind : kinds) {
    for (int xi = 0; xi < 3; ++xi) {
      for (int64_t k : {1, 7, 32, 33, 100, 1024}) {
        const TweDType pt = dts[(xi + n++) % 3];
        check(kind, dts[xi], pt, 37, k, n % 2 == 0, false);
        check(kind, dts[xi], pt, 70, k, n % 2 == 1, true);
      }
      check(kind, dts[xi], dts[xi], 0, 33, false, false);
      check(kind, dts[xi], dts[(xi + 1) % 3], 1, 40, true, false);
    }
  }
  std::printf("%d checks, %d failures\n", checks, failures);
  return failures ? 1 : 0;
}
