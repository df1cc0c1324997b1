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

/*! \brief Message describing the last failed call on this thread ("" if none). */
const char* twe_last_error(void);

/*! \brief 1 if this build contains the CUDA kernels, else 0. */
int twe_has_cuda(void);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // TWINENGINE_COMMON_H_
