// Validated arguments of the attention family and the per-device kernel entry points.
#ifndef TWINENGINE_INTERNAL_ATTENTION_H_
#define TWINENGINE_INTERNAL_ATTENTION_H_

#include "internal/common.h"
#include "twinengine/attention.h"

namespace twe {

/*! One attention call after the ABI layer checked every view. Backward-only views (dout, out,
 *  dq, dk, dv) are nullptr in a forward call; optional inputs are nullptr when absent. */
struct AttentionArgs {
  const TweTensorView* q;
  const TweTensorView* k;
  const TweTensorView* v;
  const TweTensorView* seqlens_q;
  const TweTensorView* seqlens_kv;
  const TweTensorView* rng;
  const TweTensorView* dout;
  const TweTensorView* out_in;  // backward: the forward's output
  TweTensorView* out;           // forward output
  TweTensorView* lse;           // forward: written; backward: read
  TweTensorView* dq;
  TweTensorView* dk;
  TweTensorView* dv;
  TweAttentionParams params;
  int64_t batch, seq_q, seq_kv, heads, kv_heads, head_dim, v_dim;
  void* stream;
};

namespace cpu {
TweStatus attention_fwd(const AttentionArgs& args);
TweStatus attention_bwd(const AttentionArgs& args);
}  // namespace cpu

#ifdef TWE_WITH_CUDA
namespace cuda {
TweStatus attention_fwd(const AttentionArgs& args);
TweStatus attention_bwd(const AttentionArgs& args);
}  // namespace cuda
#endif

}  // namespace twe

#endif  // TWINENGINE_INTERNAL_ATTENTION_H_
