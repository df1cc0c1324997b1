// Host scale swizzle (the loop; the index math is in internal/gemm_swizzle.h, shared with the kernel).
#include "internal/gemm_swizzle.h"

namespace twe {
namespace cpu {

TweStatus gemm_swizzle_scales(const SwizzleArgs& args) {
  const uint8_t* in = static_cast<const uint8_t*>(args.in->data);
  uint8_t* out = static_cast<uint8_t*>(args.out->data);
  const int64_t count = args.rows * args.blocks;
  for (int64_t i = 0; i < count; ++i) {
    swizzle_scale_element(in, out, i, args.rows, args.blocks, args.transposed, args.inverse);
  }
  return kTweSuccess;
}

}  // namespace cpu
}  // namespace twe
