// CPU-only helpers: IEEE subnormal handling on entry to every CPU kernel.
#ifndef TWINENGINE_INTERNAL_CPU_H_
#define TWINENGINE_INTERNAL_CPU_H_

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#include <xmmintrin.h>
#define TWE_X86 1
#endif

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

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

/*! Runs fn(begin, end) over [0, n) split into contiguous chunks on up to
 *  std::thread::hardware_concurrency() threads (one thread when `work` is small). Each chunk
 *  sets IEEE subnormal handling itself. Results must not depend on the split: callers give
 *  every index to exactly one chunk and combine nothing across chunks in a rounding way.
 */
template <typename Fn>
void parallel_for(int64_t n, int64_t work, Fn&& fn) {
  constexpr int64_t kMinWorkPerThread = int64_t(1) << 18;
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>({hw, n, work / kMinWorkPerThread}));
  auto run = [&fn](int64_t begin, int64_t end) {
    ScopedIeeeSubnormals ieee;
    fn(begin, end);
  };
  if (threads == 1) {
    run(0, n);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t chunk = (n + threads - 1) / threads;
  for (int64_t t = 1; t < threads; ++t) {
    const int64_t begin = t * chunk, end = std::min(n, begin + chunk);
    if (begin < end) pool.emplace_back(run, begin, end);
  }
  run(0, std::min(n, chunk));
  for (auto& th : pool) th.join();
}

}  // namespace cpu
}  // namespace twe

#endif  // TWINENGINE_INTERNAL_CPU_H_
