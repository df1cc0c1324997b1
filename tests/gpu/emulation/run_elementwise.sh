#!/usr/bin/env bash
# Runs the CUDA kernels of the activation, dropout and bias families without a GPU, as run.sh does
# for quantize: the .cu files (and quantize.cu, which the fused entry points call) are compiled as
# C++ against cuda_emu.h and checked byte for byte against the CPU kernels through the C ABI
# (check_elementwise.cc). Needs a C++20 compiler; takes several minutes on two cores.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for family in quantize activation dropout bias; do
  python3 - "$root/csrc/cuda/$family.cu" "$work/${family}_emu.cc" <<'PY'
import re, sys
src = open(sys.argv[1]).read().replace("#include <cuda_runtime.h>", '#include "cuda_emu.h"')
launch = re.compile(r"([A-Za-z_][\w:]*(?:<[^;{}]*?>)?)\s*<<<(.*?)>>>\(", re.S)
open(sys.argv[2], "w").write(launch.sub(lambda m: f"::emu::launch({m.group(1)}, {m.group(2)})(", src))
PY
done
sources=("$root/csrc/common.cc" "$here/check_elementwise.cc")
for family in quantize activation dropout bias; do
  sources+=("$work/${family}_emu.cc" "$root/csrc/cpu/$family.cc" "$root/csrc/abi/$family.cc")
done
"${CXX:-g++}" -std=c++20 -O1 -ffp-contract=off -fno-fast-math -DTWE_WITH_CUDA=1 -I"$here" -I"$root/csrc/include" \
  -I"$root/csrc" "${sources[@]}" -lpthread -o "$work/check_elementwise"
"$work/check_elementwise"
