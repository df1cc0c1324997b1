// Validated arguments of the rope family and the per-device kernel entry points.
#ifndef TWINENGINE_INTERNAL_ROPE_H_
#define TWINENGINE_INTERNAL_ROPE_H_

#include "internal/common.h"
#include "twinengine/numerics_rope.h"
#include "twinengine/rope.h"

namespace twe {

/*! One rope call after the ABI layer checked every view. Rows of `d` channels: row r is token
 *  r / heads; a token's position follows `format` (see twinengine/rope.h). */
struct RopeArgs {
  const TweTensorView* x;           // x (forward) or dy (backward)
  const float* freqs;               // (freq_rows, d2)
  const int32_t* cu_seqlens;        // (batch + 1,), thd only
  TweTensorView* out;
  int32_t format;
  bool interleaved;
  bool backward;
  int64_t tokens;     // S·B (sbhd, bshd) or T (thd)
  int64_t seq;        // S (sbhd, bshd)
  int64_t batch;      // B
  int64_t heads;      // H
  int64_t d;          // channels per row
  int64_t d2;         // rotary channels
  int64_t freq_rows;  // S_f
  void* stream;
};

/*! The partner of rotary channel i (< d2) and the sign its value takes:
 *  forward: out_i = x_i·c_i + sign·x_j·s_i; backward: dx_i = dy_i·c_i + sign·dy_j·s_j. */
TWE_HOST_DEVICE void rope_partner(int64_t i, int64_t d2, bool interleaved, bool backward, int64_t* j, bool* negate) {
  bool first;
  if (interleaved) {
    first = (i % 2) == 0;
    *j = first ? i + 1 : i - 1;
  } else {
    first = i < d2 / 2;
    *j = first ? i + d2 / 2 : i - d2 / 2;
  }
  *negate = backward ? !first : first;
}

#define TWE_ROPE_KERNELS(NS)                 \
  namespace NS {                             \
  TweStatus rope_apply(const RopeArgs& args); \
  }

TWE_ROPE_KERNELS(cpu)
#ifdef TWE_WITH_CUDA
TWE_ROPE_KERNELS(cuda)
#endif
#undef TWE_ROPE_KERNELS

}  // namespace twe

#endif  // TWINENGINE_INTERNAL_ROPE_H_
