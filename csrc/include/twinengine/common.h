/*! \file common.h
 *  \brief The twinengine C ABI's shared types: tensor views, dtypes, devices and status.
 *
 *  Every exported function is `extern "C"`, named `twe_<family>_<verb>[_<variant>]`,
 *  takes its inputs, then its outputs, then a params struct, then a stream, and returns a
 *  TweStatus. Nothing throws across the ABI; on failure `twe_last_error()` returns a
 *  thread-local message.
 */
#ifndef TWINENGINE_COMMON_H_
#define TWINENGINE_COMMON_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*! \brief Maximum rank of a tensor view. */
#define TWE_MAX_DIMS 8

/*! \brief Element types a view can hold. */
typedef enum {
  kTweFloat32 = 0,
  kTweBFloat16 = 1,
  kTweFloat16 = 2,
  kTweFloat8E4M3 = 3,  /*!< float8_e4m3fn */
  kTweFloat8E5M2 = 4,  /*!< float8_e5m2 */
  kTweUInt8 = 5,       /*!< raw bytes: E8M0 / E4M3 scale codes, packed E2M1 pairs */
  kTweInt32 = 6,
  kTweInt64 = 7,
  kTweUInt32 = 8,      /*!< e.g. the [seed, offset] RNG state */
} TweDType;

/*! \brief Where a view's memory lives. */
typedef enum {
  kTweCPU = 0,
  kTweCUDA = 1,
} TweDevice;

/*! \brief A non-owning, row-major, contiguous view of a tensor. data == NULL marks an absent tensor. */
typedef struct {
  void* data;
  TweDType dtype;
  TweDevice device;
  int32_t ndim;
  int64_t shape[TWE_MAX_DIMS];
} TweTensorView;

/*! \brief Result of every ABI call. */
typedef enum {
  kTweSuccess = 0,
  kTweInvalidArgument = 1, /*!< bad shape, dtype, device or parameter */
  kTweUnsupported = 2,     /*!< valid request this build cannot serve (e.g. CUDA not built) */
  kTweCudaError = 3,       /*!< a CUDA runtime call failed */
  kTweInternalError = 4,
} TweStatus;

/*! \brief How a CPU kernel may run in parallel: the `stream` argument of every ABI call on CPU views.
 *
 *  On CPU views the `stream` of an ABI call is a `const TweCpuExecutor*`, or NULL for the default:
 *  twinengine's own persistent thread pool with one thread per CPU the process may run on
 *  (`twe_cpu_default_threads()`). Results never depend on the executor or the thread count: a
 *  kernel splits its work in the same pieces whatever runs them.
 */
typedef struct {
  int32_t num_threads; /*!< threads the call may keep busy, the calling thread included; <= 0: the default */
  /*! Runs task(arg) once, soon, on some thread (the caller waits for nothing else it scheduled);
   *  NULL: twinengine's persistent pool. Frameworks pass their own pool here (XLA's intra-op pool). */
  void (*schedule)(void* pool, void (*task)(void* arg), void* arg);
  void* pool; /*!< first argument of schedule */
} TweCpuExecutor;

/*! \brief Threads a CPU kernel uses when its stream is NULL: the CPUs this process may run on. */
int twe_cpu_default_threads(void);

/*! \brief Message describing the last failed call on this thread ("" if none). */
const char* twe_last_error(void);

/*! \brief 1 if this build contains the CUDA kernels, else 0. */
int twe_has_cuda(void);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // TWINENGINE_COMMON_H_
