// Portable SIMD for the elementwise CPU kernels (norm, activation): run-time choice of the
// instruction set. The shipped build keeps its baseline target (no -march=native); a kernel file
// compiles its vector rows once per x86 vector ISA through internal/simd_foreach.h (AVX2: 8 fp32
// lanes, AVX-512: 16), each copy inside a `#pragma GCC target` region with the lane helpers of
// internal/simd_lanes.h, and calls the copy elementwise_isa() names (scalar loops otherwise).
// Every variant performs numerics.h's operations lane by lane in the same order, so the bytes do
// not depend on the ISA (tests/pytorch/test_elementwise_simd.py compares them).
#ifndef TWINENGINE_INTERNAL_SIMD_H_
#define TWINENGINE_INTERNAL_SIMD_H_

#include <cstdlib>
#include <string>

// GCC on x86-64 (the `#pragma GCC target` regions are GCC's; elsewhere the scalar loops run).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define TWE_SIMD_X86 1
#endif

/*! A vector helper: inlined into (and so compiled for the ISA of) its caller. */
#define TWE_SIMD_INLINE __attribute__((always_inline)) inline

namespace twe {
namespace cpu {
namespace simd {

/*! The elementwise kernels' instruction-set variants (all give the same bytes). */
enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

/*! The widest variant this CPU runs, capped by TWE_ELEMENTWISE_ISA (scalar|avx2|avx512; a variant
 *  the CPU lacks falls back to the next narrower one; unset or any other value: no cap). */
inline Isa detect_isa() {
  const char* forced = std::getenv("TWE_ELEMENTWISE_ISA");
  const std::string want = forced ? forced : "";
  if (want == "scalar") return Isa::kScalar;
#if defined(TWE_SIMD_X86)
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx512 && want != "avx2") return Isa::kAvx512;
  if (avx2) return Isa::kAvx2;
#endif
  return Isa::kScalar;
}

/*! detect_isa(), evaluated once per process. */
inline Isa elementwise_isa() {
  static const Isa isa = detect_isa();
  return isa;
}

}  // namespace simd
}  // namespace cpu
}  // namespace twe

#endif  // TWINENGINE_INTERNAL_SIMD_H_
