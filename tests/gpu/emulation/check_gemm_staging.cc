// The CUDA GEMM staging and epilogue kernels (csrc/cuda/gemm_staging.cu, host-emulated, see
// run.sh) — everything of the cuBLASLt path except cuBLASLt itself — against values computed
// here from the stored bytes with this file's own index math: the dequantize fallback for every
// format and layout (x̂ = q · scale in the operand's stored order, bf16 or fp32), the NVFP4 device
// alpha, and the bias / output-rounding epilogue. Byte for byte; outputs start as 0xAB.
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
static std::mt19937 rng(11);

static TweTensorView view(void* data, TweDType dtype, std::vector<int64_t> shape) {
  TweTensorView v{};
  v.data = data;
  v.dtype = dtype;
  v.device = kTweCUDA;
  v.ndim = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) v.shape[i] = shape[i];
  return v;
}

static void expect_bytes(const void* got, const void* want, size_t n, const std::string& what) {
  ++checks;
  if (std::memcmp(got, want, n) != 0) {
    const uint8_t* g = static_cast<const uint8_t*>(got);
    const uint8_t* w = static_cast<const uint8_t*>(want);
    size_t i = 0;
    while (g[i] == w[i]) ++i;
    std::printf("MISMATCH %s: byte %zu of %zu: kernel %02x expected %02x\n", what.c_str(), i, n, g[i], w[i]);
    ++failures;
  }
}

static uint8_t fp8_code() {  // any finite E4M3/E5M2 code (no 0x7F/0xFF, no E5M2 inf/NaN exponents)
  for (;;) {
    const uint8_t c = static_cast<uint8_t>(rng());
    if ((c & 0x7F) != 0x7F && (c & 0x7C) != 0x7C) return c;
  }
}

/*! Runs the staging of one operand and compares it with `expected` x̂ in stored order. */
static void check_stage(const TweGemmOperand& op, TweGemmScaling scaling, TweGemmStaging staging, int64_t rows,
                        int64_t k, const std::vector<float>& expected, const std::string& what) {
  const size_t elem = staging == kTweGemmStageBF16 ? 2 : 4;
  std::vector<uint8_t> got(expected.size() * elem, 0xAB), want(expected.size() * elem);
  for (size_t i = 0; i < expected.size(); ++i) {
    if (elem == 2) {
      const uint16_t b = nx::float_to_bf16(expected[i]);
      std::memcpy(&want[2 * i], &b, 2);
    } else {
      std::memcpy(&want[4 * i], &expected[i], 4);
    }
  }
  if (cuda::stage_operand(op, scaling, staging, rows, k, got.data(), nullptr) != kTweSuccess) {
    std::printf("FAILED %s: %s\n", what.c_str(), twe_last_error());
    ++failures;
    return;
  }
  expect_bytes(got.data(), want.data(), want.size(), what);
}

static void per_tensor() {
  const int64_t rows = 40, k = 96;
  std::vector<uint8_t> data(rows * k);
  for (auto& c : data) c = fp8_code();
  float s = 0.37f;
  TweGemmOperand op{};
  op.data = view(data.data(), kTweFloat8E5M2, {rows, k});
  op.scale_inv = view(&s, kTweFloat32, {1});
  op.k_major = 1;
  std::vector<float> want(rows * k);
  for (int64_t i = 0; i < rows * k; ++i) want[i] = nx::fp8_to_float<nx::FP8Format::kE5M2>(data[i]) * s;
  check_stage(op, kTweGemmFP8PerTensor, kTweGemmStageFP32, rows, k, want, "per-tensor E5M2 fp32 staging");
}

static void mxfp8(bool k_major) {
  const int64_t rows = 64, k = 96;
  std::vector<uint8_t> data(rows * k);
  for (auto& c : data) c = fp8_code();
  // Scales: K-major (roundup(rows,128), roundup(k/32,4)) [r][kb]; K-minor (roundup(k/32,4), roundup(rows,128)) [kb][r].
  const int64_t s0 = k_major ? 128 : 4, s1 = k_major ? 4 : 128;
  std::vector<uint8_t> scales(s0 * s1, 0);
  for (auto& e : scales) e = static_cast<uint8_t>(110 + rng() % 30);
  TweGemmOperand op{};
  op.data = view(data.data(), kTweFloat8E4M3, k_major ? std::vector<int64_t>{rows, k} : std::vector<int64_t>{k, rows});
  op.scale_inv = view(scales.data(), kTweUInt8, {s0, s1});
  op.k_major = k_major;
  std::vector<float> want(rows * k);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t kk = 0; kk < k; ++kk) {
      const int64_t at = k_major ? r * k + kk : kk * rows + r;
      const uint8_t e = k_major ? scales[r * s1 + kk / 32] : scales[(kk / 32) * s1 + r];
      want[at] = nx::fp8_to_float<nx::FP8Format::kE4M3>(data[at]) * std::ldexp(1.0f, e - 127);
    }
  }
  check_stage(op, kTweGemmMXFP8, kTweGemmStageBF16, rows, k, want,
              std::string("mxfp8 bf16 staging ") + (k_major ? "K-major" : "K-minor"));
}

static void fp8_block(bool two_d) {
  const int64_t rows = 40, k = 256;
  std::vector<uint8_t> data(rows * k);
  for (auto& c : data) c = fp8_code();
  // 1D (ceil(k/128), roundup(rows,4)) [kb][r]; 2D (ceil(rows/128), roundup(ceil(k/128),4)) [rb][kb].
  const int64_t s0 = two_d ? 1 : 2, s1 = two_d ? 4 : 40;
  std::vector<float> scales(s0 * s1);
  for (auto& s : scales) s = std::ldexp(1.0f + static_cast<float>(rng() % 1000) / 1000.0f, static_cast<int>(rng() % 9) - 4);
  TweGemmOperand op{};
  op.data = view(data.data(), kTweFloat8E4M3, {rows, k});
  op.scale_inv = view(scales.data(), kTweFloat32, {s0, s1});
  op.k_major = 1;
  op.block_2d = two_d;
  std::vector<float> want(rows * k);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t kk = 0; kk < k; ++kk) {
      const float s = two_d ? scales[(r / 128) * s1 + kk / 128] : scales[(kk / 128) * s1 + r];
      want[r * k + kk] = nx::fp8_to_float<nx::FP8Format::kE4M3>(data[r * k + kk]) * s;
    }
  }
  check_stage(op, kTweGemmFP8Block, kTweGemmStageFP32, rows, k, want,
              std::string("fp8 block fp32 staging ") + (two_d ? "2D" : "1D"));
}

static void nvfp4() {
  const int64_t rows = 32, k = 64;
  std::vector<uint8_t> packed(rows * k / 2);
  for (auto& b : packed) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> scales(128 * 4, 0);  // (roundup(rows,128), roundup(k/16,4)) E4M3 codes
  for (auto& c : scales) c = static_cast<uint8_t>(rng() % 0x7F);
  float amax = 5.0f;
  TweGemmOperand op{};
  op.data = view(packed.data(), kTweUInt8, {rows, k / 2});
  op.scale_inv = view(scales.data(), kTweUInt8, {128, 4});
  op.amax = view(&amax, kTweFloat32, {1});
  op.k_major = 1;
  std::vector<float> want(rows * k);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t kk = 0; kk < k; ++kk) {
      const uint8_t byte = packed[r * (k / 2) + kk / 2];
      const uint8_t nibble = (kk % 2 == 0) ? (byte & 0xF) : (byte >> 4);
      want[r * k + kk] = nx::e2m1_to_float(nibble) * nx::fp8_to_float<nx::FP8Format::kE4M3>(scales[r * 4 + kk / 16]);
    }
  }
  check_stage(op, kTweGemmNVFP4, kTweGemmStageBF16, rows, k, want, "nvfp4 bf16 staging (no global factor)");
}

static void high_precision_k_minor() {
  const int64_t rows = 40, k = 48;
  std::vector<uint16_t> data(rows * k);
  for (auto& b : data) b = nx::float_to_bf16(std::ldexp(static_cast<float>(static_cast<int>(rng() % 2001) - 1000), -7));
  TweGemmOperand op{};
  op.data = view(data.data(), kTweBFloat16, {k, rows});
  op.k_major = 0;
  std::vector<float> want(rows * k);
  for (int64_t i = 0; i < rows * k; ++i) want[i] = nx::bf16_to_float(data[i]);
  check_stage(op, kTweGemmHighPrecision, kTweGemmStageFP32, rows, k, want, "bf16 K-minor widened to fp32");
}

static void nvfp4_alpha() {
  const float amaxes[][2] = {{5.0f, 3.25f}, {0.0f, 1e-30f}, {448.0f * 6.0f, 7e8f}};
  for (const auto& a : amaxes) {
    float scalars[2] = {-1.0f, -1.0f};
    cuda::launch_nvfp4_alpha(&a[0], &a[1], scalars, nullptr);
    const float want[2] = {nx::nvfp4_global_decode_scale(a[0]) * nx::nvfp4_global_decode_scale(a[1]), 0.0f};
    expect_bytes(scalars, want, sizeof(want), "nvfp4 alpha");
  }
}

template <typename Out, typename Bias>
static void epilogue(TweDType out_dtype, TweDType bias_dtype, bool with_bias) {
  const int64_t m = 37, n = 53;
  std::vector<float> acc(m * n);
  for (auto& v : acc) v = std::ldexp(static_cast<float>(static_cast<int>(rng() % 200001) - 100000), -9);
  std::vector<Bias> bias(n);
  for (auto& b : bias) b = FromFloat<Bias>::apply(std::ldexp(static_cast<float>(static_cast<int>(rng() % 2001) - 1000), -5));
  std::vector<Out> got(m * n), want(m * n);
  std::memset(got.data(), 0xAB, got.size() * sizeof(Out));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float v = acc[i * n + j];
      if (with_bias) v = v + to_float(bias[j]);
      want[i * n + j] = FromFloat<Out>::apply(v);
    }
  TweTensorView out_view = view(got.data(), out_dtype, {m, n});
  TweTensorView bias_view = view(bias.data(), bias_dtype, {n});
  GemmArgs args{nullptr, nullptr, with_bias ? &bias_view : nullptr, &out_view, kTweGemmHighPrecision, m, n, 1, nullptr,
                nullptr};
  cuda::launch_gemm_epilogue(args, acc.data());
  expect_bytes(got.data(), want.data(), got.size() * sizeof(Out),
               std::string("epilogue out=") + dtype_name(out_dtype) + (with_bias ? std::string(" bias=") +
               dtype_name(bias_dtype) : std::string(" no bias")));
}

int main() {
  per_tensor();
  mxfp8(true);
  mxfp8(false);
  fp8_block(false);
  fp8_block(true);
  nvfp4();
  high_precision_k_minor();
  nvfp4_alpha();
  epilogue<BFloat16, float>(kTweBFloat16, kTweFloat32, true);
  epilogue<Float16, BFloat16>(kTweFloat16, kTweBFloat16, true);
  epilogue<float, Float16>(kTweFloat32, kTweFloat16, true);
  epilogue<BFloat16, float>(kTweBFloat16, kTweFloat32, false);
  std::printf("gemm staging: %d checks, %d failures\n", checks, failures);
  return failures ? 1 : 0;
}
