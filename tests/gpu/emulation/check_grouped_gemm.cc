// The CUDA grouped GEMM kernels of GroupedLinear (csrc/cuda/gemm_grouped.cu, host-emulated, see
// run.sh gemm): the bias epilogue gives byte for byte the GEMM output rounded to the output dtype
// and then fl(y + b) (the CPU kernel's double rounding, NUMERICS.md §11), rows past the splits
// are zero, empty groups give zero weight gradients, and fprop / wgrad stay within fp32
// summation-order error of a double-precision reference.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "internal/gemm.h"

using namespace twe;
namespace nx = twe::numerics;

static int failures = 0, checks = 0;
static std::mt19937 rng(5);

static TweTensorView view(void* data, TweDType dtype, std::vector<int64_t> shape) {
  TweTensorView v{};
  v.data = data;
  v.dtype = dtype;
  v.device = kTweCUDA;
  v.ndim = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) v.shape[i] = shape[i];
  return v;
}

static float get(const std::vector<uint8_t>& b, TweDType dt, int64_t i) {
  switch (dt) {
    case kTweFloat32: { float f; std::memcpy(&f, b.data() + 4 * i, 4); return f; }
    case kTweBFloat16: { uint16_t h; std::memcpy(&h, b.data() + 2 * i, 2); return nx::bf16_to_float(h); }
    default: { uint16_t h; std::memcpy(&h, b.data() + 2 * i, 2); return nx::fp16_to_float(h); }
  }
}

static void put(std::vector<uint8_t>& b, TweDType dt, int64_t i, float v) {
  switch (dt) {
    case kTweFloat32: std::memcpy(b.data() + 4 * i, &v, 4); break;
    case kTweBFloat16: { uint16_t h = nx::float_to_bf16(v); std::memcpy(b.data() + 2 * i, &h, 2); break; }
    default: { uint16_t h = nx::float_to_fp16(v); std::memcpy(b.data() + 2 * i, &h, 2); break; }
  }
}

static void expect(bool ok, const std::string& what) {
  ++checks;
  if (!ok) {
    std::printf("MISMATCH %s\n", what.c_str());
    ++failures;
  }
}

static std::vector<uint8_t> random_buf(TweDType dt, int64_t n) {
  std::vector<uint8_t> b(static_cast<size_t>(n * element_size(dt)));
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) put(b, dt, i, d(rng));
  return b;
}

static void run_case(TweDType dt, std::vector<int32_t> splits, int64_t m, int64_t n, int64_t k) {
  const std::string tag = std::string(dtype_name(dt)) + " m=" + std::to_string(m) + " n=" + std::to_string(n) +
                          " k=" + std::to_string(k);
  const int64_t groups = static_cast<int64_t>(splits.size());
  std::vector<uint8_t> a = random_buf(dt, m * k), b = random_buf(dt, groups * n * k), bias = random_buf(dt, groups * n);
  std::vector<uint8_t> plain(static_cast<size_t>(m * n * element_size(dt)), 0xAB), with_bias = plain;
  TweTensorView av = view(a.data(), dt, {m, k}), bv = view(b.data(), dt, {groups, n, k});
  TweTensorView biasv = view(bias.data(), dt, {groups, n}), sv = view(splits.data(), kTweInt32, {groups});
  TweTensorView out_plain = view(plain.data(), dt, {m, n}), out_bias = view(with_bias.data(), dt, {m, n});
  GroupedGemmArgs args{&av, &bv, &sv, nullptr, &out_plain, nullptr, nullptr, kTweGemmHighPrecision, false, true,
                       true, groups, m, n, k, nullptr, false, false};
  expect(cuda::grouped_gemm(args) == kTweSuccess, tag + " fprop status");
  args.bias = &biasv;
  args.out = &out_bias;
  expect(cuda::grouped_gemm(args) == kTweSuccess, tag + " fprop+bias status");
  int64_t start = 0;
  double worst = 0.0;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t r = start; r < start + splits[g]; ++r) {
      for (int64_t c = 0; c < n; ++c) {
        // the bias epilogue: fl(round(y) + b) in out's dtype, from the no-bias output's bytes
        std::vector<uint8_t> want(static_cast<size_t>(element_size(dt)));
        put(want, dt, 0, get(plain, dt, r * n + c) + get(bias, dt, g * n + c));
        expect(std::memcmp(want.data(), with_bias.data() + (r * n + c) * element_size(dt), want.size()) == 0,
               tag + " bias epilogue row " + std::to_string(r) + " col " + std::to_string(c));
        double ref = 0.0, mag = 0.0;
        for (int64_t kk = 0; kk < k; ++kk) {
          const double p = static_cast<double>(get(a, dt, r * k + kk)) * get(b, dt, (g * n + c) * k + kk);
          ref += p;
          mag += std::fabs(p);
        }
        worst = std::max(worst, std::fabs(get(plain, dt, r * n + c) - ref) / (mag + 1e-30));
      }
    }
    start += splits[g];
  }
  const double tol = dt == kTweFloat32 ? 1e-5 : 1e-2;
  expect(worst <= tol, tag + " fprop vs double reference (relative " + std::to_string(worst) + ")");
  for (int64_t i = start * n; i < m * n; ++i) {
    expect(get(with_bias, dt, i) == 0.0f && get(plain, dt, i) == 0.0f, tag + " padding row zero");
  }
  // wgrad: out[g] (n, k) = Σ over group rows of dy[r, c] · x[r, kk]
  std::vector<uint8_t> dy = random_buf(dt, m * n), dw(static_cast<size_t>(groups * n * k * element_size(dt)), 0xAB);
  TweTensorView dyv = view(dy.data(), dt, {m, n}), xv = view(a.data(), dt, {m, k});
  TweTensorView dwv = view(dw.data(), dt, {groups, n, k});
  GroupedGemmArgs wargs{&dyv, &xv, &sv, nullptr, &dwv, nullptr, nullptr, kTweGemmHighPrecision, true, false,
                        false, groups, m, n, k, nullptr, false, false};
  expect(cuda::grouped_gemm(wargs) == kTweSuccess, tag + " wgrad status");
  start = 0;
  worst = 0.0;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t c = 0; c < n; ++c) {
      for (int64_t kk = 0; kk < k; ++kk) {
        double ref = 0.0, mag = 0.0;
        for (int64_t r = start; r < start + splits[g]; ++r) {
          const double p = static_cast<double>(get(dy, dt, r * n + c)) * get(a, dt, r * k + kk);
          ref += p;
          mag += std::fabs(p);
        }
        const float got = get(dw, dt, (g * n + c) * k + kk);
        if (splits[g] == 0) expect(got == 0.0f, tag + " empty group wgrad zero");
        else worst = std::max(worst, std::fabs(got - ref) / (mag + 1e-30));
      }
    }
    start += splits[g];
  }
  expect(worst <= tol, tag + " wgrad vs double reference (relative " + std::to_string(worst) + ")");
}

int main() {
  for (TweDType dt : {kTweFloat32, kTweBFloat16, kTweFloat16}) {
    run_case(dt, {5, 0, 20, 3}, 32, 24, 40);   // trailing padding rows, an empty group
    run_case(dt, {0, 17, 0}, 17, 16, 33);      // all rows in one group, K not a tile multiple
  }
  std::printf("grouped gemm: %d checks, %d failures\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
