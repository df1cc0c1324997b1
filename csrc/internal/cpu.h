// CPU-only helpers: IEEE subnormal handling on entry to every CPU kernel, and parallel_for, which
// runs a kernel's pieces on the call's executor (the TweCpuExecutor passed as the ABI stream).
#ifndef TWINENGINE_INTERNAL_CPU_H_
#define TWINENGINE_INTERNAL_CPU_H_

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#include <xmmintrin.h>
#define TWE_X86 1
#endif

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <type_traits>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "twinengine/common.h"

/*! Marks a CPU loop function to be compiled three times, for x86-64-v4 (AVX-512), x86-64-v3
 *  (AVX2 + FMA; -ffp-contract=off keeps FMA out of the arithmetic) and the baseline, with the
 *  best one the running CPU supports picked once at load time (GCC function multiversioning
 *  through an ifunc). Elsewhere (clang, non-x86, non-ELF) the function is compiled once for
 *  the build target, which the compiler vectorizes itself (NEON on aarch64). The clones run
 *  the same per-element operations in the same order, so every clone gives the same bytes. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define TWE_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TWE_CPU_CLONES
#endif

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

/*! Work (elements) below which parallel_for gives the call no piece of its own. */
constexpr int64_t kMinWorkPerThread = int64_t(1) << 18;

/*! Most pieces parallel_for cuts one call into (a fixed number: the split never depends on threads). */
constexpr int64_t kMaxPieces = 256;

/*! Threads a kernel uses when its stream (TweCpuExecutor*) is NULL: the CPUs this process may run
 *  on (its affinity mask, so a container or `taskset` limit is honoured), at least 1. */
int default_threads();

/*! The executor of the ABI call running on this thread (set by CpuStreamScope in run_on_device);
 *  nullptr: the default. */
inline thread_local const TweCpuExecutor* tls_executor = nullptr;

/*! True while this thread runs parallel_for pieces: a nested parallel_for runs inline. */
inline thread_local bool tls_in_parallel = false;

/*! Threads the current call may use (>= 1). */
inline int64_t current_threads() {
  const TweCpuExecutor* ex = tls_executor;
  return ex && ex->num_threads > 0 ? ex->num_threads : default_threads();
}

/*! Runs task(arg) on twinengine's persistent pool, which keeps at least `threads` workers
 *  (started on first need, never stopped; a forked child starts a fresh pool). */
void pool_schedule(int64_t threads, void (*task)(void*), void* arg);

namespace detail {

/*! Shared state of one parallel_for: pieces are claimed from `next` by the caller and by every
 *  scheduled task; the caller waits only for pieces already claimed, so a task that starts late
 *  (or never, on a saturated framework pool) costs nothing and cannot deadlock the call. */
struct ParallelState {
  int64_t n = 0, pieces = 0, piece = 0;
  void (*invoke)(void* fn, int64_t begin, int64_t end) = nullptr;
  void* fn = nullptr;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex mutex;
  std::condition_variable cv;
  std::exception_ptr error;  // first exception a piece threw (guarded by mutex)

  void work() {
    ScopedIeeeSubnormals ieee;  // every worker clears FTZ/DAZ for the pieces it runs
    const bool was_in = tls_in_parallel;
    tls_in_parallel = true;
    for (int64_t p; (p = next.fetch_add(1, std::memory_order_relaxed)) < pieces;) {
      try {
        invoke(fn, p * piece, std::min(n, (p + 1) * piece));
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!error) error = std::current_exception();
      }
      if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == pieces) {
        std::lock_guard<std::mutex> lock(mutex);
        cv.notify_all();
      }
    }
    tls_in_parallel = was_in;
  }
};

inline void run_task(void* arg) {
  auto* state = static_cast<std::shared_ptr<ParallelState>*>(arg);
  (*state)->work();
  delete state;
}

}  // namespace detail

/*! Runs fn(begin, end) over [0, n) cut into contiguous pieces: min(n, work / kMinWorkPerThread,
 *  kMaxPieces) of them (at least one), a split that depends only on (n, work). The pieces run on
 *  the current call's executor (TweCpuExecutor: XLA's intra-op pool, the torch thread count, or
 *  the default pool) with the calling thread taking part; every worker clears FTZ/DAZ for its
 *  pieces. Results must not depend on the split: callers give every index to exactly one piece and
 *  combine nothing across pieces in a rounding way. An exception thrown by a piece is rethrown
 *  here after every claimed piece has finished.
 */
template <typename Fn>
void parallel_for(int64_t n, int64_t work, Fn&& fn) {
  if (n <= 0) return;
  const int64_t pieces = std::max<int64_t>(1, std::min<int64_t>({n, work / kMinWorkPerThread, kMaxPieces}));
  const int64_t piece = (n + pieces - 1) / pieces;
  const int64_t used = (n + piece - 1) / piece;  // pieces left non-empty by the rounding
  const int64_t threads = tls_in_parallel ? 1 : std::min<int64_t>(current_threads(), used);
  if (threads <= 1) {
    ScopedIeeeSubnormals ieee;
    for (int64_t p = 0; p < used; ++p) fn(p * piece, std::min(n, (p + 1) * piece));
    return;
  }
  auto state = std::make_shared<detail::ParallelState>();
  state->n = n;
  state->pieces = used;
  state->piece = piece;
  using F = std::remove_reference_t<Fn>;
  state->fn = const_cast<void*>(static_cast<const void*>(&fn));
  state->invoke = [](void* f, int64_t begin, int64_t end) { (*static_cast<F*>(f))(begin, end); };
  const TweCpuExecutor* ex = tls_executor;
  for (int64_t t = 1; t < threads; ++t) {
    auto* arg = new std::shared_ptr<detail::ParallelState>(state);
    if (ex && ex->schedule) ex->schedule(ex->pool, &detail::run_task, arg);
    else pool_schedule(threads - 1, &detail::run_task, arg);
  }
  state->work();
  {
    std::unique_lock<std::mutex> lock(state->mutex);
    state->cv.wait(lock, [&] { return state->done.load(std::memory_order_acquire) == state->pieces; });
    if (state->error) std::rethrow_exception(state->error);
  }
}

/*! Asks the kernel to back the 2 MB-aligned inside of [p, p + bytes) with transparent huge
 *  pages when it is first touched (madvise MADV_HUGEPAGE; advice only: no byte changes, pages
 *  already touched keep their size, an error is ignored). For a kernel's freshly allocated
 *  output of many MB, which otherwise costs a page fault per 4 KB: more CPU time than the
 *  writes that fill it. Below 8 MB it does nothing. */
inline void advise_huge_pages(void* p, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  if (p == nullptr || bytes < int64_t(4) * static_cast<int64_t>(kHuge)) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes)) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

}  // namespace cpu
}  // namespace twe

#endif  // TWINENGINE_INTERNAL_CPU_H_
