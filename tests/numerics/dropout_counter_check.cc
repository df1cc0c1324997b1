// Dropout's Philox counter layout at element indices no test tensor can reach (i >= 2^34, where
// the counter's second word is used): numerics::dropout_mask_byte against the spec formula
// written out here — counter (floor(i/4) mod 2^32, floor(i/2^34), offset, 0x44524F50), key
// (seed, 0), word x_{i mod 4}, kept iff word >= floor(p·2^32) — built on the shared
// numerics::philox4x32_10 (tested against the NumPy Random123 reference by the SR tests).
//
//   g++ -O2 -std=c++17 -ffp-contract=off -I csrc/include tests/numerics/dropout_counter_check.cc -o check && ./check
#include <cstdint>
#include <cstdio>

#include "twinengine/numerics.h"

using namespace twe::numerics;

static bool keep_from_spec(uint64_t i, float p, uint32_t seed, uint32_t offset) {
  const uint64_t block = i / 4;
  const Philox4x32 counter{{static_cast<uint32_t>(block & 0xFFFFFFFFull), static_cast<uint32_t>(i >> 34), offset,
                            0x44524F50u}};
  const Philox4x32 w = philox4x32_10(counter, seed, 0u);
  const uint64_t threshold = static_cast<uint64_t>(static_cast<double>(p) * 4294967296.0);  // exact, then floor
  return w.x[i % 4] >= threshold;
}

int main() {
  int failures = 0, checked = 0;
  const float ps[] = {0.0f, 0.25f, 0.5f, 0.9999999f, 1e-30f};
  const uint64_t starts[] = {0ull, (1ull << 32) - 16, (1ull << 34) - 16, (1ull << 34), (1ull << 35) + 8,
                             (1ull << 40) + 1024, (1ull << 62)};
  for (float p : ps) {
    for (uint64_t start : starts) {
      for (uint64_t m = start / 8; m < start / 8 + 64; ++m) {
        // The last byte of each range is partial (its 3 padding bits must be 0).
        const int64_t n = m + 1 == start / 8 + 64 ? static_cast<int64_t>(m * 8 + 5) : INT64_MAX;
        const uint8_t byte = dropout_mask_byte(static_cast<int64_t>(m), n, dropout_threshold(p), 0xDEADBEEFu, 77u);
        for (int e = 0; e < 8; ++e) {
          const uint64_t i = m * 8 + e;
          const bool want = i < static_cast<uint64_t>(n) && keep_from_spec(i, p, 0xDEADBEEFu, 77u);
          ++checked;
          if (((byte >> e) & 1) != want) {
            if (failures++ < 10) std::printf("MISMATCH p=%g i=%llu\n", p, static_cast<unsigned long long>(i));
          }
        }
      }
    }
  }
  std::printf("dropout counter: %d bits checked, %d failures\n", checked, failures);
  return failures ? 1 : 0;
}
