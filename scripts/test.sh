#!/usr/bin/env bash
# Sets up .venv/ if needed and runs the whole test suite (GPU tests skip without a device).
# Arguments are forwarded to pytest:  bash scripts/test.sh -k quantize tests/pytorch
#
# Sanitizer job:  bash scripts/test.sh --sanitize [pytest args]
#   Builds the extension with AddressSanitizer + UndefinedBehaviorSanitizer into
#   build/sanitize (CUDA off) and runs the tests that call into C++ (tests/pytorch,
#   tests/jax, tests/parity by default; pass test paths to narrow them) against it.
#   - Build type: $SKBUILD_CMAKE_BUILD_TYPE (the variable scikit-build-core reads; default
#     RelWithDebInfo). Extra compiler flags: $CXXFLAGS; extra cmake arguments: $CMAKE_ARGS.
#   - Python is not built with ASan, so the ASan runtime must be loaded first: the job sets
#     LD_PRELOAD to `g++ -print-file-name=libasan.so` followed by libstdc++ (torch and jaxlib
#     load their own C++ runtime; preloading the system libstdc++ next to libasan keeps ASan's
#     operator new/delete interception consistent across them).
#   - ASAN_OPTIONS: detect_leaks=0 (CPython and the frameworks keep allocations alive at exit
#     by design), alloc_dealloc_mismatch=0 and detect_odr_violation=0 (third-party wheels);
#     every real error still aborts the run. UBSAN_OPTIONS: halt_on_error=1, print_stacktrace=1.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

if [ "${1:-}" != "--sanitize" ]; then
  exec .venv/bin/python -m pytest -q "$@"
fi
shift

BUILD=build/sanitize
SAN_FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
# shellcheck disable=SC2086
cmake -S . -B "$BUILD" -G Ninja -DPython_EXECUTABLE="$PWD/.venv/bin/python" -DTWE_CUDA=OFF \
  -DCMAKE_BUILD_TYPE="${SKBUILD_CMAKE_BUILD_TYPE:-RelWithDebInfo}" \
  -DCMAKE_CXX_FLAGS="$SAN_FLAGS ${CXXFLAGS:-}" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" ${CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD" -j"$(nproc)"

# The package as a symlink farm over the sources plus the sanitized extension.
PKG="$BUILD/pkg/twinengine"
rm -rf "$BUILD/pkg"
mkdir -p "$PKG"
for f in core/*; do ln -s "$PWD/$f" "$PKG/$(basename "$f")"; done
ln -s "$PWD/torch_frontend" "$PKG/pytorch"
ln -s "$PWD/jax_frontend" "$PKG/jax"
for so in "$BUILD"/_C*.so; do ln -s "$PWD/$so" "$PKG/$(basename "$so")"; done

if [ "$#" -eq 0 ] || [ "${1#-}" != "$1" ]; then
  set -- tests/pytorch tests/jax tests/parity "$@"
fi
LD_PRELOAD="$(g++ -print-file-name=libasan.so):$(g++ -print-file-name=libstdc++.so)" \
ASAN_OPTIONS="detect_leaks=0:alloc_dealloc_mismatch=0:detect_odr_violation=0:abort_on_error=1" \
UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
PYTHONPATH="$PWD/$BUILD/pkg" \
  exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
