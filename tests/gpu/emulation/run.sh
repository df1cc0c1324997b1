#!/usr/bin/env bash
# Runs the CUDA kernels of one family without a GPU: the family's .cu files are compiled as C++
# against cuda_emu.h (each thread block runs as std::threads, __shared__ is static, barriers stand
# in for __syncthreads and warp shuffles) and checked byte for byte against the CPU kernels by
# check_<family>.cc. Catches indexing, tiling, padding, reduction-order and synchronisation bugs;
# the hardware parts (sm_89+ FP8 conversion, memory ordering, performance) need tests/gpu on a
# device. Needs a C++20 compiler (std::barrier); quantize takes several minutes on two cores.
#   bash tests/gpu/emulation/run.sh [quantize|norm|gemm|attention|rope]   (default: quantize)
# (activation, dropout and bias: run_elementwise.sh)
set -euo pipefail
family="${1:-quantize}"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
emulate() {  # emulate SRC.cu OUT.cc: the source with kernel launches rewritten for cuda_emu.h
  python3 - "$1" "$2" <<'PY'
import re, sys
src = open(sys.argv[1]).read().replace("#include <cuda_runtime.h>", '#include "cuda_emu.h"')
launch = re.compile(r"([A-Za-z_][\w:]*(?:<[^;{}]*?>)?)\s*<<<(.*?)>>>\(", re.S)
open(sys.argv[2], "w").write(launch.sub(lambda m: f"::emu::launch({m.group(1)}, {m.group(2)})(", src))
PY
}
compile() {  # compile OUT SOURCES...
  local out="$1"; shift
  "${CXX:-g++}" -std=c++20 -O2 -ffp-contract=off -fno-fast-math -DTWE_WITH_CUDA=1 -I"$here" -I"$root/csrc/include" \
    -I"$root/csrc" "$@" "$root/csrc/common.cc" -lpthread -o "$out"
}
case "$family" in
  quantize)
    emulate "$root/csrc/cuda/quantize.cu" "$work/quantize_emu.cc"
    compile "$work/check_quantize" "$work/quantize_emu.cc" "$root/csrc/cpu/quantize.cc" "$root/csrc/abi/quantize.cc" \
      "$here/check_quantize.cc"
    "$work/check_quantize" ;;
  norm)  # checks the kernels directly (the fused quantize is quantize's)
    emulate "$root/csrc/cuda/norm.cu" "$work/norm_emu.cc"
    compile "$work/check_norm" "$work/norm_emu.cc" "$root/csrc/cpu/norm.cc" \
      "$root/csrc/cpu/quantize.cc" "$here/check_norm.cc"  # CPU norm+quantize calls the quantize kernels
    "$work/check_norm" ;;
  gemm)  # the GEMM kernels that need no cuBLAS: scale swizzle vs its host function, staging / epilogue kernels
    emulate "$root/csrc/cuda/gemm_swizzle.cu" "$work/gemm_swizzle_emu.cc"
    emulate "$root/csrc/cuda/gemm_staging.cu" "$work/gemm_staging_emu.cc"
    for check in check_gemm_swizzle check_gemm_staging; do
      compile "$work/$check" "$work/gemm_swizzle_emu.cc" "$work/gemm_staging_emu.cc" "$root/csrc/cpu/gemm_swizzle.cc" \
        "$here/$check.cc"
      "$work/$check"
    done
    emulate "$root/csrc/cuda/gemm_grouped.cu" "$work/gemm_grouped_emu.cc"  # GroupedLinear's kernels
    compile "$work/check_grouped_gemm" "$work/gemm_grouped_emu.cc" "$here/check_grouped_gemm.cc"
    "$work/check_grouped_gemm" ;;
  attention)  # forward / backward of every layout and mask vs the CPU kernels through the C ABI
    emulate "$root/csrc/cuda/attention.cu" "$work/attention_emu.cc"
    compile "$work/check_attention" "$work/attention_emu.cc" "$root/csrc/cpu/attention.cc" \
      "$root/csrc/abi/attention.cc" "$here/check_attention.cc"
    "$work/check_attention" ;;
  rope)  # forward / backward of every format vs the CPU kernel through the C ABI
    emulate "$root/csrc/cuda/rope.cu" "$work/rope_emu.cc"
    compile "$work/check_rope" "$work/rope_emu.cc" "$root/csrc/cpu/rope.cc" "$root/csrc/abi/rope.cc" \
      "$here/check_rope.cc"
    "$work/check_rope" ;;
  *) echo "unknown family $family (quantize, norm, gemm, attention or rope; run_elementwise.sh for the elementwise" \
          "families)" >&2
     exit 2 ;;
esac
