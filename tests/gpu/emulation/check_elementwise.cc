// The CUDA kernels of the activation, dropout and bias families (host-emulated, see
// run_elementwise.sh) against the CPU kernels on the same input, byte for byte, through the C ABI:
// every activation kind and dtype forward / backward / backward + dbias (incl. the fused quantize
// entry points), dropout forward / backward, bias add, residual add, scale and the bias gradient.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "internal/common.h"
#include "twinengine/activation.h"
#include "twinengine/bias.h"
#include "twinengine/dropout.h"

using namespace twe;

static int failures = 0, checks = 0;

static size_t esize(TweDType d) { return static_cast<size_t>(element_size(d)); }

struct Buf {
  std::vector<uint8_t> b;
  TweTensorView v{};
  Buf() = default;
  Buf(TweDType dt, std::vector<int64_t> shape, TweDevice dev) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    b.assign(static_cast<size_t>(n) * esize(dt) + 64, 0xAB);
    v.data = b.data() + 16;
    v.dtype = dt;
    v.device = dev;
    v.ndim = static_cast<int32_t>(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) v.shape[i] = shape[i];
  }
  Buf on(TweDevice dev) const {
    Buf c = *this;
    c.v.data = c.b.data() + 16;
    c.v.device = dev;
    return c;
  }
  size_t bytes() const { return static_cast<size_t>(numel(v)) * esize(v.dtype); }
};

/*! Element i of a high-precision view widened to fp32 (NaN test only). */
static float element(const Buf& a, int64_t i) {
  switch (a.v.dtype) {
    case kTweFloat32: return static_cast<const float*>(a.v.data)[i];
    case kTweBFloat16: return numerics::bf16_to_float(static_cast<const uint16_t*>(a.v.data)[i]);
    case kTweFloat16: return numerics::fp16_to_float(static_cast<const uint16_t*>(a.v.data)[i]);
    default: return 0.0f;
  }
}

/*! Byte equality per element, except that two NaNs of a float dtype match whatever their sign and
 *  payload (IEEE leaves them open; the emulation compiles the .cu code differently from the CPU
 *  kernels, so x86 picks NaN operands in another order). */
static void compare(const Buf& a, const Buf& b, const std::string& what) {
  ++checks;
  const size_t es = esize(a.v.dtype);
  const bool floating = is_high_precision(a.v.dtype);
  const uint8_t* pa = static_cast<const uint8_t*>(a.v.data);
  const uint8_t* pb = static_cast<const uint8_t*>(b.v.data);
  for (int64_t i = 0; i < numel(a.v); ++i) {
    if (std::memcmp(pa + i * es, pb + i * es, es) == 0) continue;
    if (floating && numerics::is_nan(element(a, i)) && numerics::is_nan(element(b, i))) continue;
    if (failures < 40) std::printf("MISMATCH %s: element %lld of %lld\n", what.c_str(), static_cast<long long>(i),
                                   static_cast<long long>(numel(a.v)));
    ++failures;
    return;
  }
}

static void expect_ok(TweStatus st, const std::string& what) {
  if (st != kTweSuccess) {
    std::printf("FAILED %s: %s\n", what.c_str(), twe_last_error());
    ++failures;
  }
}

static Buf make_data(TweDType dt, std::vector<int64_t> shape, uint32_t seed) {
  Buf buf(dt, shape, kTweCPU);
  std::mt19937 g(seed);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> ex(-30, 7);
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 3e38f, -3e38f, 1e-40f, -1e-40f, 7.0f, -7.0f, 88.7f};
  const int64_t n = numel(buf.v);
  for (int64_t i = 0; i < n; ++i) {
    float v = nd(g) * std::ldexp(1.0f, ex(g));
    if (i % 37 == 0) v = specials[(i / 37) % 12];
    switch (dt) {
      case kTweFloat32: static_cast<float*>(buf.v.data)[i] = v; break;
      case kTweBFloat16: static_cast<uint16_t*>(buf.v.data)[i] = numerics::float_to_bf16(v); break;
      default: static_cast<uint16_t*>(buf.v.data)[i] = numerics::float_to_fp16(v); break;
    }
  }
  return buf;
}

static const TweDType kDtypes[] = {kTweFloat32, kTweBFloat16, kTweFloat16};
static const char* name(TweDType d) { return dtype_name(d); }

static void check_activations() {
  const int64_t rows = 67, cols = 96;
  for (TweDType dt : kDtypes) {
    for (int kind = kTweActGelu; kind <= kTweActClampedSwiglu; ++kind) {
      const TweActivationParams p{static_cast<TweActivationKind>(kind), 5.0f, 1.5f};
      const bool gated = numerics::activation_is_gated(static_cast<numerics::Activation>(kind));
      const int64_t out_cols = gated ? cols / 2 : cols;
      const std::string what = std::string("activation ") + std::to_string(kind) + " " + name(dt);
      Buf x = make_data(dt, {rows, cols}, 1 + kind), dy = make_data(dt, {rows, out_cols}, 100 + kind);
      Buf y_cpu(dt, {rows, out_cols}, kTweCPU), y_gpu(dt, {rows, out_cols}, kTweCUDA);
      Buf xg = x.on(kTweCUDA), dyg = dy.on(kTweCUDA);
      expect_ok(twe_activation_forward(&x.v, &y_cpu.v, &p, nullptr), what + " cpu fwd");
      expect_ok(twe_activation_forward(&xg.v, &y_gpu.v, &p, nullptr), what + " cuda fwd");
      compare(y_gpu, y_cpu, what + " forward");
      Buf dx_cpu(dt, {rows, cols}, kTweCPU), dx_gpu(dt, {rows, cols}, kTweCUDA);
      Buf db_cpu(kTweFloat32, {cols}, kTweCPU), db_gpu(kTweFloat32, {cols}, kTweCUDA);
      expect_ok(twe_activation_backward_dbias(&dy.v, &x.v, &dx_cpu.v, &db_cpu.v, &p, nullptr), what + " cpu bwd");
      expect_ok(twe_activation_backward_dbias(&dyg.v, &xg.v, &dx_gpu.v, &db_gpu.v, &p, nullptr), what + " cuda bwd");
      compare(dx_gpu, dx_cpu, what + " backward");
      compare(db_gpu, db_cpu, what + " dbias");
    }
  }
}

static void check_fused_quantize() {
  // MXFP8 rowwise + columnwise of a SwiGLU output (64, 64) and of the dx of a GELU (64, 64).
  const int64_t rows = 64, cols = 128;
  const TweQuantizeParams q{kTweE4M3, 0.0f, 0, 0, 0, 0};
  for (int kind : {static_cast<int>(kTweActSwiglu), static_cast<int>(kTweActGelu)}) {
    const TweActivationParams p{static_cast<TweActivationKind>(kind), 7.0f, 1.702f};
    const int64_t out_cols = kind == kTweActSwiglu ? cols / 2 : cols;
    Buf x = make_data(kTweBFloat16, {rows, cols}, 7), xg = x.on(kTweCUDA);
    Buf y[2], data[2], scale[2], cdata[2], cscale[2];
    for (int d = 0; d < 2; ++d) {
      const TweDevice dev = d ? kTweCUDA : kTweCPU;
      y[d] = Buf(kTweBFloat16, {rows, out_cols}, dev);
      data[d] = Buf(kTweFloat8E4M3, {rows, out_cols}, dev);
      scale[d] = Buf(kTweUInt8, {round_up(rows, 128), round_up(out_cols / 32, 4)}, dev);
      cdata[d] = Buf(kTweFloat8E4M3, {rows, out_cols}, dev);
      cscale[d] = Buf(kTweUInt8, {round_up(rows / 32, 4), round_up(out_cols, 128)}, dev);
      TweQuantizedTensor out{};
      out.rowwise_data = data[d].v;
      out.rowwise_scale_inv = scale[d].v;
      out.columnwise_data = cdata[d].v;
      out.columnwise_scale_inv = cscale[d].v;
      const Buf& in = d ? xg : x;
      expect_ok(twe_activation_forward_quantize(&in.v, nullptr, nullptr, &y[d].v, &out, &p, &q, kTweScalingMXFP8,
                                                nullptr), "fused forward");
    }
    compare(y[1], y[0], "fused y");
    compare(data[1], data[0], "fused rowwise data");
    compare(scale[1], scale[0], "fused rowwise scale");
    compare(cdata[1], cdata[0], "fused columnwise data");
    compare(cscale[1], cscale[0], "fused columnwise scale");
  }
}

static void check_dropout() {
  for (TweDType dt : kDtypes) {
    for (float p : {0.0f, 0.3f, 0.9f}) {
      for (TweDType rng_dt : {kTweInt64, kTweUInt32}) {
        const std::string what = std::string("dropout ") + name(dt) + " p=" + std::to_string(p);
        Buf x = make_data(dt, {33, 29}, 3), xg = x.on(kTweCUDA);
        Buf rng(rng_dt, {2}, kTweCPU);
        if (rng_dt == kTweInt64) {
          static_cast<int64_t*>(rng.v.data)[0] = 0x1234ABCD;
          static_cast<int64_t*>(rng.v.data)[1] = 4000000007LL;
        } else {
          static_cast<uint32_t*>(rng.v.data)[0] = 0x1234ABCDu;
          static_cast<uint32_t*>(rng.v.data)[1] = 4000000007u;
        }
        Buf rngg = rng.on(kTweCUDA);
        const int64_t n = 33 * 29, bytes = (n + 7) / 8;
        Buf y_cpu(dt, {33, 29}, kTweCPU), y_gpu(dt, {33, 29}, kTweCUDA);
        Buf m_cpu(kTweUInt8, {bytes}, kTweCPU), m_gpu(kTweUInt8, {bytes}, kTweCUDA);
        const TweDropoutParams params{p};
        expect_ok(twe_dropout_forward(&x.v, &rng.v, &y_cpu.v, &m_cpu.v, &params, nullptr), what + " cpu");
        expect_ok(twe_dropout_forward(&xg.v, &rngg.v, &y_gpu.v, &m_gpu.v, &params, nullptr), what + " cuda");
        compare(y_gpu, y_cpu, what + " y");
        compare(m_gpu, m_cpu, what + " mask");
        Buf dx_cpu(dt, {33, 29}, kTweCPU), dx_gpu(dt, {33, 29}, kTweCUDA);
        Buf mg = m_cpu.on(kTweCUDA);
        expect_ok(twe_dropout_backward(&x.v, &m_cpu.v, &dx_cpu.v, &params, nullptr), what + " bwd cpu");
        expect_ok(twe_dropout_backward(&xg.v, &mg.v, &dx_gpu.v, &params, nullptr), what + " bwd cuda");
        compare(dx_gpu, dx_cpu, what + " dx");
      }
    }
  }
}

static void check_bias() {
  for (TweDType dt : kDtypes) {
    for (TweDType bt : kDtypes) {
      const std::string what = std::string("bias ") + name(dt) + "/" + name(bt);
      for (int64_t rows : {0, 1, 31, 33, 100}) {
        Buf x = make_data(dt, {rows, 45}, 5), xg = x.on(kTweCUDA);
        Buf b = make_data(bt, {45}, 6), bg = b.on(kTweCUDA);
        Buf r = make_data(bt, {rows, 45}, 8), rg = r.on(kTweCUDA);
        Buf c1(dt, {rows, 45}, kTweCPU), g1(dt, {rows, 45}, kTweCUDA);
        expect_ok(twe_bias_add(&x.v, &b.v, &c1.v, nullptr), what);
        expect_ok(twe_bias_add(&xg.v, &bg.v, &g1.v, nullptr), what);
        compare(g1, c1, what + " bias_add");
        Buf c2(dt, {rows, 45}, kTweCPU), g2(dt, {rows, 45}, kTweCUDA);
        expect_ok(twe_bias_add_residual(&x.v, &r.v, &c2.v, nullptr), what);
        expect_ok(twe_bias_add_residual(&xg.v, &rg.v, &g2.v, nullptr), what);
        compare(g2, c2, what + " add");
        const TweScaleParams sp{0.3f};
        Buf c3(dt, {rows, 45}, kTweCPU), g3(dt, {rows, 45}, kTweCUDA);
        expect_ok(twe_bias_scale(&x.v, &c3.v, &sp, nullptr), what);
        expect_ok(twe_bias_scale(&xg.v, &g3.v, &sp, nullptr), what);
        compare(g3, c3, what + " scale");
        Buf c4(bt, {45}, kTweCPU), g4(bt, {45}, kTweCUDA);
        expect_ok(twe_bias_grad(&x.v, &c4.v, nullptr), what);
        expect_ok(twe_bias_grad(&xg.v, &g4.v, nullptr), what);
        compare(g4, c4, what + " bias_grad rows=" + std::to_string(rows));
      }
    }
  }
}

int main() {
  check_activations();
  check_fused_quantize();
  check_dropout();
  check_bias();
  std::printf("%d checks, %d failures\n", checks, failures);
  return failures ? 1 : 0;
}
