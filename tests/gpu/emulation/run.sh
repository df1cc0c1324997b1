#!/usr/bin/env bash
# Runs the CUDA kernels of one family without a GPU: csrc/cuda/<family>.cu is compiled as C++
# against cuda_emu.h (each thread block runs as std::threads, __shared__ is static, barriers stand
# in for __syncthreads and warp shuffles) and checked byte for byte against the CPU kernels by
# check_<family>.cc. Catches indexing, tiling, padding, reduction-order and synchronisation bugs;
# the hardware parts (sm_89+ FP8 conversion, memory ordering, performance) need tests/gpu on a
# device. Needs a C++20 compiler (std::barrier); quantize takes several minutes on two cores.
#   bash tests/gpu/emulation/run.sh [quantize|norm]   (default: quantize)
set -euo pipefail
family="${1:-quantize}"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 - "$root/csrc/cuda/$family.cu" "$work/${family}_emu.cc" <<'PY'
import re, sys
src = open(sys.argv[1]).read().replace("#include <cuda_runtime.h>", '#include "cuda_emu.h"')
launch = re.compile(r"([A-Za-z_][\w:]*(?:<[^;{}]*?>)?)\s*<<<(.*?)>>>\(", re.S)
open(sys.argv[2], "w").write(launch.sub(lambda m: f"::emu::launch({m.group(1)}, {m.group(2)})(", src))
PY
case "$family" in
  quantize) sources=("$root/csrc/cpu/quantize.cc" "$root/csrc/abi/quantize.cc") ;;
  norm) sources=("$root/csrc/cpu/norm.cc") ;;  # checks the kernels directly (the fused quantize is quantize's)
  *) echo "unknown family $family" >&2; exit 2 ;;
esac
"${CXX:-g++}" -std=c++20 -O2 -ffp-contract=off -fno-fast-math -DTWE_WITH_CUDA=1 -I"$here" -I"$root/csrc/include" \
  -I"$root/csrc" "$work/${family}_emu.cc" "${sources[@]}" "$root/csrc/common.cc" "$here/check_$family.cc" \
  -lpthread -o "$work/check_$family"
"$work/check_$family"
