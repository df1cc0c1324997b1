// Pieces of the quantize family's adapters that fused ops (activation + quantize, ...) reuse,
// so a fused op reads the quantize attributes and outputs exactly as the quantize ops do.
#ifndef TWINENGINE_OPS_QUANTIZE_H_
#define TWINENGINE_OPS_QUANTIZE_H_

#include "ops/registry.h"
#include "twinengine/quantize.h"

namespace twe {
namespace ops {

/*! The quantize attributes of core/ops/quantize.py (_quantize_attrs). */
TweQuantizeParams quantize_params(const Attrs& attrs);

/*! Which amax outputs an op writes (after its data and scales). */
enum class AmaxOutputs { kNone, kTensor, kPerCopy };

/*! Outputs in core order: [rowwise_data, rowwise_scale_inv] if rowwise,
 *  [columnwise_data, columnwise_scale_inv] if columnwise, then the amax outputs; taken from
 *  the call's output cursor, which must then be at the end. */
TweQuantizedTensor quantized_outputs(OpCall& call, AmaxOutputs amax);

/*! The same outputs, leaving the cursor after them (for ops with further outputs). */
TweQuantizedTensor take_quantized_outputs(OpCall& call, AmaxOutputs amax);

/*! quantized_outputs with the amax outputs of the quantize kernel of `mode`. */
TweQuantizedTensor quantized_outputs(OpCall& call, TweScalingMode mode);

}  // namespace ops
}  // namespace twe

#endif  // TWINENGINE_OPS_QUANTIZE_H_
