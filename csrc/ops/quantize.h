// Adapter helpers of the quantize family that fused ops reuse (the norm family's fused
// quantization reads its attributes and outputs in exactly quantize's order).
#ifndef TWINENGINE_OPS_QUANTIZE_H_
#define TWINENGINE_OPS_QUANTIZE_H_

#include "ops/registry.h"
#include "twinengine/quantize.h"

namespace twe {
namespace ops {

/*! TweQuantizeParams from the quantize attributes of core/ops/quantize.py. */
TweQuantizeParams quantize_params(const Attrs& attrs);

/*! Which amax outputs an op writes (after its data and scales). */
enum class AmaxOutputs { kNone, kTensor, kPerCopy };

/*! Takes the quantized outputs in core order from the call's output cursor:
 *  [rowwise_data, rowwise_scale_inv] if rowwise, [columnwise_data, columnwise_scale_inv] if
 *  columnwise, then [amax] for kTensor, or [amax] if rowwise and [columnwise_amax] if columnwise
 *  for kPerCopy. */
TweQuantizedTensor take_quantized_outputs(OpCall& call, AmaxOutputs amax);

}  // namespace ops
}  // namespace twe

#endif  // TWINENGINE_OPS_QUANTIZE_H_
