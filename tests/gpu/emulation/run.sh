#!/usr/bin/env bash
# Runs the CUDA quantize kernels (and the GEMM scale swizzle kernel) without a GPU: csrc/cuda/quantize.cu is compiled as C++ against
# cuda_emu.h (each thread block runs as std::threads, __shared__ is static, barriers stand in for
# __syncthreads and warp shuffles) and every op is checked byte for byte against the CPU kernels
# through the C ABI. Catches indexing, tiling, padding and synchronisation bugs; the hardware
# parts (sm_89+ FP8 conversion, memory ordering, performance) need tests/gpu on a device.
# Needs a C++20 compiler (std::barrier); takes several minutes on two cores.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 - "$root/csrc/cuda/quantize.cu" "$work/quantize_emu.cc" <<'PY'
import re, sys
src = open(sys.argv[1]).read().replace("#include <cuda_runtime.h>", '#include "cuda_emu.h"')
launch = re.compile(r"([A-Za-z_][\w:]*(?:<[^;{}]*?>)?)\s*<<<(.*?)>>>\(", re.S)
open(sys.argv[2], "w").write(launch.sub(lambda m: f"::emu::launch({m.group(1)}, {m.group(2)})(", src))
PY
"${CXX:-g++}" -std=c++20 -O2 -ffp-contract=off -fno-fast-math -DTWE_WITH_CUDA=1 -I"$here" -I"$root/csrc/include" \
  -I"$root/csrc" "$work/quantize_emu.cc" "$root/csrc/cpu/quantize.cc" "$root/csrc/abi/quantize.cc" \
  "$root/csrc/common.cc" "$here/check_quantize.cc" -lpthread -o "$work/check_quantize"
"$work/check_quantize"
# The GEMM kernels that need no cuBLAS: the scale swizzle against its host function, and the
# staging / epilogue kernels of the cuBLASLt path against values computed from the stored bytes.
emulate() {  # emulate SRC.cu OUT.cc: the source with kernel launches rewritten for cuda_emu.h
  python3 - "$1" "$2" <<'PY'
import re, sys
src = open(sys.argv[1]).read().replace("#include <cuda_runtime.h>", '#include "cuda_emu.h"')
launch = re.compile(r"([A-Za-z_][\w:]*(?:<[^;{}]*?>)?)\s*<<<(.*?)>>>\(", re.S)
open(sys.argv[2], "w").write(launch.sub(lambda m: f"::emu::launch({m.group(1)}, {m.group(2)})(", src))
PY
}
emulate "$root/csrc/cuda/gemm_swizzle.cu" "$work/gemm_swizzle_emu.cc"
emulate "$root/csrc/cuda/gemm_staging.cu" "$work/gemm_staging_emu.cc"
for check in check_gemm_swizzle check_gemm_staging; do
  "${CXX:-g++}" -std=c++20 -O2 -ffp-contract=off -fno-fast-math -DTWE_WITH_CUDA=1 -I"$here" -I"$root/csrc/include" \
    -I"$root/csrc" "$work/gemm_swizzle_emu.cc" "$work/gemm_staging_emu.cc" "$root/csrc/cpu/gemm_swizzle.cc" \
    "$root/csrc/common.cc" "$here/$check.cc" -lpthread -o "$work/$check"
  "$work/$check"
done
