// The CUDA scale swizzle kernel (host-emulated, see run.sh) against the host function, byte for
// byte, both directions and orientations, on padded shapes; outputs start as 0xAB so a missed
// element shows.
#include <cstdio>
#include <random>
#include <vector>

#include "internal/gemm_swizzle.h"

using namespace twe;

int main() {
  int failures = 0, checks = 0;
  std::mt19937 g(7);
  const int64_t shapes[][2] = {{128, 4}, {256, 8}, {384, 12}, {128, 20}, {640, 4}};
  for (const auto& shape : shapes) {
    for (int transposed = 0; transposed < 2; ++transposed) {
      for (int inverse = 0; inverse < 2; ++inverse) {
        const int64_t rows = shape[0], blocks = shape[1], n = rows * blocks;
        std::vector<uint8_t> in(n), out_cpu(n, 0xAB), out_cuda(n, 0xAB);
        for (auto& v : in) v = static_cast<uint8_t>(g());
        TweTensorView vin{}, vcpu{}, vcuda{};
        vin.data = in.data();
        vcpu.data = out_cpu.data();
        vcuda.data = out_cuda.data();
        SwizzleArgs cpu_args{&vin, &vcpu, rows, blocks, transposed != 0, inverse != 0, nullptr};
        SwizzleArgs cuda_args{&vin, &vcuda, rows, blocks, transposed != 0, inverse != 0, nullptr};
        cpu::gemm_swizzle_scales(cpu_args);
        cuda::gemm_swizzle_scales(cuda_args);
        ++checks;
        if (out_cpu != out_cuda) {
          ++failures;
          std::printf("MISMATCH swizzle rows=%lld blocks=%lld transposed=%d inverse=%d\n",
                      static_cast<long long>(rows), static_cast<long long>(blocks), transposed, inverse);
        }
      }
    }
  }
  std::printf("gemm swizzle: %d checks, %d failures\n", checks, failures);
  return failures ? 1 : 0;
}
