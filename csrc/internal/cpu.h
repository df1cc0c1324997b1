// CPU-only helpers: IEEE subnormal handling on entry to every CPU kernel.
#ifndef TWINENGINE_INTERNAL_CPU_H_
#define TWINENGINE_INTERNAL_CPU_H_

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#include <xmmintrin.h>
#define TWE_X86 1
#endif

#include <cstdint>

namespace twe {
namespace cpu {

/*! Clears flush-to-zero and denormals-are-zero for the lifetime of the object and restores the
 *  caller's mode afterwards (XLA's CPU threads run with both set; NUMERICS.md preamble). */
class ScopedIeeeSubnormals {
 public:
  ScopedIeeeSubnormals() {
#if defined(TWE_X86)
    saved_ = _mm_getcsr();
    _mm_setcsr(saved_ & ~(0x8000u | 0x0040u));  // FTZ bit 15, DAZ bit 6
#elif defined(__aarch64__)
    uint64_t fpcr;
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(fpcr));
    saved_ = fpcr;
    fpcr &= ~(uint64_t(1) << 24);  // FZ
    __asm__ __volatile__("msr fpcr, %0" : : "r"(fpcr));
#endif
  }
  ~ScopedIeeeSubnormals() {
#if defined(TWE_X86)
    _mm_setcsr(static_cast<unsigned int>(saved_));
#elif defined(__aarch64__)
    __asm__ __volatile__("msr fpcr, %0" : : "r"(saved_));
#endif
  }
  ScopedIeeeSubnormals(const ScopedIeeeSubnormals&) = delete;
  ScopedIeeeSubnormals& operator=(const ScopedIeeeSubnormals&) = delete;

 private:
  uint64_t saved_ = 0;
};

}  // namespace cpu
}  // namespace twe

#endif  // TWINENGINE_INTERNAL_CPU_H_
