// Every CUDA quantize op (host-emulated, see run.sh) against the CPU op on the same input, byte for
// byte, through the C ABI: all formats, dtypes and options, padding (outputs start as 0xAB), misaligned
// inputs, dequantize and the delayed-scaling update.
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "internal/quantize.h"

using namespace twe;

static int failures = 0, checks = 0;

struct Buf {
  std::vector<uint8_t> b;
  TweTensorView v{};
  Buf() = default;
  Buf(TweDType dt, std::vector<int64_t> shape, TweDevice dev, size_t elem) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    b.assign(static_cast<size_t>(n) * elem + 64, 0xAB);
    v.data = b.data() + 16;  // 16-byte aligned offset into vector storage (vector data is 16-aligned)
    v.dtype = dt;
    v.device = dev;
    v.ndim = static_cast<int32_t>(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) v.shape[i] = shape[i];
  }
  size_t bytes(size_t elem) const { return static_cast<size_t>(numel(v)) * elem; }
};

static size_t esize(TweDType d) {
  switch (d) {
    case kTweFloat32: case kTweInt32: case kTweUInt32: return 4;
    case kTweBFloat16: case kTweFloat16: return 2;
    case kTweInt64: return 8;
    default: return 1;
  }
}

static void compare(const Buf& a, const Buf& b, const std::string& what) {
  ++checks;
  const size_t n = a.bytes(esize(a.v.dtype));
  const uint8_t* pa = static_cast<const uint8_t*>(a.v.data);
  const uint8_t* pb = static_cast<const uint8_t*>(b.v.data);
  for (size_t i = 0; i < n; ++i) {
    if (pa[i] != pb[i]) {
      if (failures < 40) { std::printf("MISMATCH %s: byte %zu of %zu: cuda %02x cpu %02x\n", what.c_str(), i, n, pa[i], pb[i]); std::fflush(stdout); }
      ++failures;
      return;
    }
  }
}

static std::vector<float> make_values(int64_t n, int family, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> ex(-20, 20);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = nd(g) * (family == 0 ? 1.0f : std::ldexp(1.0f, ex(g)));
  if (family == 2) {
    const float sp[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-40f, 448.0f, 464.0f, 57344.0f, 3e38f, 1e-7f};
    for (int64_t i = 0; i < n; i += 7) x[static_cast<size_t>(i)] = sp[(i / 7) % 12];
    for (int64_t i = 0; i < n && i < 300; ++i) x[static_cast<size_t>(i)] = 0.0f;
  }
  return x;
}

static Buf make_input(const std::vector<float>& vals, TweDType dt, std::vector<int64_t> shape, TweDevice dev,
                      int misalign = 0) {
  Buf in(dt, shape, dev, esize(dt));
  in.v.data = static_cast<uint8_t*>(in.v.data) + misalign * esize(dt);
  for (size_t i = 0; i < vals.size(); ++i) {
    uint8_t* p = static_cast<uint8_t*>(in.v.data) + i * esize(dt);
    if (dt == kTweFloat32) std::memcpy(p, &vals[i], 4);
    else {
      uint16_t h = dt == kTweBFloat16 ? numerics::float_to_bf16(vals[i]) : numerics::float_to_fp16(vals[i]);
      std::memcpy(p, &h, 2);
    }
  }
  return in;
}

static int64_t ru(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

enum class Fmt { kCurrent, kDelayed, kMx, kBlock, kNv };

struct Out {
  Buf rd, rs, cd, cs, am, cam;
  TweQuantizedTensor q{};
};

static Out make_out(Fmt f, int64_t R, int64_t K, bool row, bool col, bool two_d, TweDevice dev, TweDType fp8,
                    bool with_amax) {
  Out o;
  auto mk = [&](TweDType dt, std::vector<int64_t> s) { return Buf(dt, s, dev, esize(dt)); };
  switch (f) {
    case Fmt::kCurrent: case Fmt::kDelayed:
      if (row) { o.rd = mk(fp8, {R, K}); o.rs = mk(kTweFloat32, {1}); }
      if (col) { o.cd = mk(fp8, {K, R}); o.cs = mk(kTweFloat32, {1}); }
      if (with_amax) o.am = mk(kTweFloat32, {1});
      break;
    case Fmt::kMx:
      if (row) { o.rd = mk(fp8, {R, K}); o.rs = mk(kTweUInt8, {ru(R, 128), ru(K / 32, 4)}); }
      if (col) { o.cd = mk(fp8, {R, K}); o.cs = mk(kTweUInt8, {ru(R / 32, 4), ru(K, 128)}); }
      break;
    case Fmt::kBlock:
      if (row) { o.rd = mk(fp8, {R, K}); o.rs = two_d ? mk(kTweFloat32, {R / 128, ru(K / 128, 4)}) : mk(kTweFloat32, {K / 128, ru(R, 4)}); }
      if (col) { o.cd = mk(fp8, {K, R}); o.cs = two_d ? mk(kTweFloat32, {K / 128, ru(R / 128, 4)}) : mk(kTweFloat32, {R / 128, ru(K, 4)}); }
      break;
    case Fmt::kNv:
      if (row) { o.rd = mk(kTweUInt8, {R, K / 2}); o.rs = mk(kTweUInt8, {ru(R, 128), ru(K / 16, 4)}); o.am = mk(kTweFloat32, {1}); }
      if (col) { o.cd = mk(kTweUInt8, {K, R / 2}); o.cs = mk(kTweUInt8, {ru(K, 128), ru(R / 16, 4)}); o.cam = mk(kTweFloat32, {1}); }
      break;
  }
  o.q.rowwise_data = o.rd.v; o.q.rowwise_scale_inv = o.rs.v; o.q.columnwise_data = o.cd.v;
  o.q.columnwise_scale_inv = o.cs.v; o.q.amax = o.am.v; o.q.columnwise_amax = o.cam.v;
  return o;
}

static void compare_out(const Out& a, const Out& b, const std::string& what) {
  const Buf* pa[] = {&a.rd, &a.rs, &a.cd, &a.cs, &a.am, &a.cam};
  const Buf* pb[] = {&b.rd, &b.rs, &b.cd, &b.cs, &b.am, &b.cam};
  const char* names[] = {"rowwise_data", "rowwise_scale_inv", "columnwise_data", "columnwise_scale_inv", "amax", "columnwise_amax"};
  for (int i = 0; i < 6; ++i)
    if (pa[i]->v.data) compare(*pa[i], *pb[i], what + " " + names[i]);
}

static TweStatus call(Fmt f, const TweTensorView* in, const TweTensorView* scale_or_rng, Out& o, const TweQuantizeParams& p) {
  switch (f) {
    case Fmt::kCurrent: return twe_quantize_fp8_current(in, &o.q, &p, nullptr);
    case Fmt::kDelayed: return twe_quantize_fp8_delayed(in, scale_or_rng, &o.q, &p, nullptr);
    case Fmt::kMx: return twe_quantize_mxfp8(in, &o.q, &p, nullptr);
    case Fmt::kBlock: return twe_quantize_fp8_block(in, &o.q, &p, nullptr);
    case Fmt::kNv: return twe_quantize_nvfp4(in, scale_or_rng, &o.q, &p, nullptr);
  }
  return kTweInternalError;
}

static void dequant_check(Fmt f, const Out& cpu, int64_t R, int64_t K, bool columnwise, bool two_d, TweDType out_dt,
                          const std::string& what) {
  const Buf& data = columnwise ? cpu.cd : cpu.rd;
  const Buf& sc = columnwise ? cpu.cs : cpu.rs;
  const Buf& am = columnwise ? cpu.cam : cpu.am;
  if (!data.v.data) return;
  Buf o1(out_dt, {R, K}, kTweCUDA, esize(out_dt)), o2(out_dt, {R, K}, kTweCPU, esize(out_dt));
  TweTensorView d1 = data.v, s1 = sc.v, a1 = am.v, d2 = data.v, s2 = sc.v, a2 = am.v;
  d1.device = s1.device = a1.device = kTweCUDA;
  d2.device = s2.device = a2.device = kTweCPU;
  TweStatus st1, st2;
  switch (f) {
    case Fmt::kCurrent: case Fmt::kDelayed:
      st1 = twe_dequantize_fp8(&d1, &s1, &o1.v, columnwise, nullptr); st2 = twe_dequantize_fp8(&d2, &s2, &o2.v, columnwise, nullptr); break;
    case Fmt::kMx:
      st1 = twe_dequantize_mxfp8(&d1, &s1, &o1.v, columnwise, nullptr); st2 = twe_dequantize_mxfp8(&d2, &s2, &o2.v, columnwise, nullptr); break;
    case Fmt::kBlock:
      st1 = twe_dequantize_fp8_block(&d1, &s1, &o1.v, columnwise, two_d, nullptr); st2 = twe_dequantize_fp8_block(&d2, &s2, &o2.v, columnwise, two_d, nullptr); break;
    case Fmt::kNv:
      st1 = twe_dequantize_nvfp4(&d1, &s1, &a1, &o1.v, columnwise, nullptr); st2 = twe_dequantize_nvfp4(&d2, &s2, &a2, &o2.v, columnwise, nullptr); break;
  }
  if (st1 || st2) { std::printf("DEQ STATUS %s: %d %d %s\n", what.c_str(), st1, st2, twe_last_error()); ++failures; return; }
  compare(o1, o2, what + " dequant col=" + std::to_string(columnwise) + " dt=" + std::to_string(out_dt));
}

static void run(Fmt f, int64_t R, int64_t K, TweDType dt, TweQuantizeParams p, bool row, bool col, int family,
                int misalign = 0, bool with_amax = true, float delayed_scale = 0.37f, int rng_dtype = 0) {
  const auto vals = make_values(R * K, family, static_cast<uint32_t>(R * 131 + K * 7 + family));
  Buf in_gpu = make_input(vals, dt, {R, K}, kTweCUDA, misalign), in_cpu = make_input(vals, dt, {R, K}, kTweCPU);
  const TweDType fp8 = p.format == kTweE5M2 ? kTweFloat8E5M2 : kTweFloat8E4M3;
  Out og = make_out(f, R, K, row, col, p.two_d, kTweCUDA, fp8, with_amax);
  Out oc = make_out(f, R, K, row, col, p.two_d, kTweCPU, fp8, with_amax);
  Buf s_gpu, s_cpu;
  if (f == Fmt::kDelayed) {
    s_gpu = Buf(kTweFloat32, {1}, kTweCUDA, 4); s_cpu = Buf(kTweFloat32, {1}, kTweCPU, 4);
    std::memcpy(s_gpu.v.data, &delayed_scale, 4); std::memcpy(s_cpu.v.data, &delayed_scale, 4);
  }
  if (f == Fmt::kNv && p.stochastic_rounding) {
    const TweDType rd = rng_dtype == 0 ? kTweInt64 : (rng_dtype == 1 ? kTweInt32 : kTweUInt32);
    s_gpu = Buf(rd, {2}, kTweCUDA, esize(rd)); s_cpu = Buf(kTweInt64, {2}, kTweCPU, 8);
    const uint32_t seed = 0x1234ABCDu, offset = 4000000007u;
    const int64_t v64[2] = {seed, offset};
    const uint32_t v32[2] = {seed, offset};
    std::memcpy(s_cpu.v.data, v64, 16);
    if (rd == kTweInt64) std::memcpy(s_gpu.v.data, v64, 16); else std::memcpy(s_gpu.v.data, v32, 8);
  }
  const TweStatus a = call(f, &in_gpu.v, s_gpu.v.data ? &s_gpu.v : nullptr, og, p);
  const TweStatus b = call(f, &in_cpu.v, s_cpu.v.data ? &s_cpu.v : nullptr, oc, p);
  char what[256];
  std::snprintf(what, sizeof what, "fmt=%d R=%ld K=%ld dt=%d e5m2=%d eps=%g pow2=%d 2d=%d rht=%d sr=%d row=%d col=%d fam=%d mis=%d amax=%d",
                static_cast<int>(f), (long)R, (long)K, dt, p.format, p.amax_epsilon, p.force_pow2_scales, p.two_d,
                p.with_rht, p.stochastic_rounding, row, col, family, misalign, with_amax);
  if (a || b) { std::printf("STATUS %s: cuda %d cpu %d: %s\n", what, a, b, twe_last_error()); ++failures; return; }
  compare_out(og, oc, what);
  if (with_amax || f == Fmt::kNv) {
    for (bool c : {false, true})
      for (TweDType odt : {kTweFloat32, kTweBFloat16, kTweFloat16}) dequant_check(f, oc, R, K, c, p.two_d, odt, what);
  }
}

int main() {
  const TweDType dts[] = {kTweFloat32, kTweBFloat16, kTweFloat16};
  const bool usages[3][2] = {{true, true}, {true, false}, {false, true}};
  for (auto dt : dts)
    for (int fam = 0; fam < 3; ++fam)
      for (auto& u : usages)
        for (int e5 = 0; e5 < 2; ++e5) {
          TweQuantizeParams p{};
          p.format = e5 ? kTweE5M2 : kTweE4M3;
          for (auto [R, K] : {std::pair<int64_t, int64_t>{1, 1}, {3, 5}, {65, 130}, {130, 8}, {128, 192}}) {
            run(Fmt::kCurrent, R, K, dt, p, u[0], u[1], fam);
            run(Fmt::kDelayed, R, K, dt, p, u[0], u[1], fam);
          }
          TweQuantizeParams q = p; q.force_pow2_scales = 1; q.amax_epsilon = 0.125f;
          run(Fmt::kCurrent, 65, 130, dt, q, u[0], u[1], fam);
          run(Fmt::kCurrent, 64, 96, dt, p, u[0], u[1], fam, 0, false);  // amax output absent
          run(Fmt::kDelayed, 64, 96, dt, p, u[0], u[1], fam, 0, true, 3e4f);
          for (int two_d = 0; two_d < 2; ++two_d) {
            TweQuantizeParams m = p; m.two_d = two_d;
            for (auto [R, K] : {std::pair<int64_t, int64_t>{32, 32}, {64, 96}, {96, 160}, {160, 288}})
              run(Fmt::kMx, R, K, dt, m, u[0], u[1], fam);
            TweQuantizeParams bp = m; bp.force_pow2_scales = 1;
            for (auto [R, K] : {std::pair<int64_t, int64_t>{128, 128}, {256, 384}})
              run(Fmt::kBlock, R, K, dt, bp, u[0], u[1], fam);
            TweQuantizeParams bq = m; bq.amax_epsilon = 0.5f;
            run(Fmt::kBlock, 128, 256, dt, bq, u[0], u[1], fam);
            for (int rht = 0; rht < 2; ++rht)
              for (int sr = 0; sr < 2; ++sr) {
                if (rht && u[1] && dt != kTweBFloat16) continue;
                if (e5) continue;
                TweQuantizeParams n{}; n.two_d = two_d; n.with_rht = rht; n.stochastic_rounding = sr;
                for (auto [R, K] : {std::pair<int64_t, int64_t>{16, 16}, {80, 272}, {32, 64}})
                  run(Fmt::kNv, R, K, dt, n, u[0], u[1], fam, 0, true, 0.f, sr ? (R % 3) : 0);
              }
          }
        }
  // Misaligned inputs (scalar-load paths).
  for (auto dt : dts) {
    TweQuantizeParams p{};
    run(Fmt::kCurrent, 64, 128, dt, p, true, true, 2, 1);
    run(Fmt::kDelayed, 64, 128, dt, p, true, true, 2, 1);
    run(Fmt::kMx, 64, 128, dt, p, true, true, 2, 1);
    TweQuantizeParams b = p; b.force_pow2_scales = 1;
    run(Fmt::kBlock, 128, 256, dt, b, true, true, 2, 1);
    TweQuantizeParams n{}; n.stochastic_rounding = 1; n.with_rht = dt == kTweBFloat16;
    run(Fmt::kNv, 64, 128, dt, n, true, true, 2, 1);
  }
  // Delayed-scaling update.
  for (int algo = 0; algo < 2; ++algo)
    for (int margin : {0, 3})
      for (auto [L, N] : {std::pair<int64_t, int64_t>{1, 1}, {16, 7}, {5, 300}}) {
        std::vector<float> h(static_cast<size_t>(L * N));
        std::mt19937 g(7);
        for (auto& v : h) v = std::ldexp(static_cast<float>(g() % 1000) / 100.0f, static_cast<int>(g() % 40) - 20);
        for (int64_t n = 0; n < N; n += 3) h[static_cast<size_t>(n)] = 0.0f;
        if (L > 1) h[static_cast<size_t>(N + N - 1)] = NAN;
        h[static_cast<size_t>(N - 1)] = 1e-45f;
        Buf hg(kTweFloat32, {L, N}, kTweCUDA, 4), hc(kTweFloat32, {L, N}, kTweCPU, 4);
        std::memcpy(hg.v.data, h.data(), h.size() * 4); std::memcpy(hc.v.data, h.data(), h.size() * 4);
        Buf sg(kTweFloat32, {N}, kTweCUDA, 4), scp(kTweFloat32, {N}, kTweCPU, 4);
        for (int64_t n = 0; n < N; ++n) { float s = 0.5f + n; std::memcpy(static_cast<float*>(sg.v.data) + n, &s, 4); std::memcpy(static_cast<float*>(scp.v.data) + n, &s, 4); }
        Buf nhg(kTweFloat32, {L, N}, kTweCUDA, 4), nhc(kTweFloat32, {L, N}, kTweCPU, 4), nsg(kTweFloat32, {N}, kTweCUDA, 4), nsc(kTweFloat32, {N}, kTweCPU, 4);
        TweDelayedScalingParams dp{kTweE4M3, margin, algo ? kTweAmaxMostRecent : kTweAmaxMax};
        const TweStatus a = twe_quantize_update_delayed_scaling(&hg.v, &sg.v, &nhg.v, &nsg.v, &dp, nullptr);
        const TweStatus b = twe_quantize_update_delayed_scaling(&hc.v, &scp.v, &nhc.v, &nsc.v, &dp, nullptr);
        if (a || b) { std::printf("UPDATE STATUS %d %d %s\n", a, b, twe_last_error()); ++failures; continue; }
        compare(nhg, nhc, "update history"); compare(nsg, nsc, "update scale");
      }
  std::printf("%d checks, %d failures\n", checks, failures);
  return failures != 0;
}
