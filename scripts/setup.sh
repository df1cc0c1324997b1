#!/usr/bin/env bash
# Sets up .venv/ in the repository root from nothing (idempotent): pinned CPU torch, jax,
# the build tools, then twinengine itself (built with --no-build-isolation so no CUDA torch
# is ever pulled into an isolated build environment).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check \
  torch==2.13.0 jax==0.10.2 jaxlib==0.10.2 numpy ml_dtypes \
  flax==0.12.8 optax==0.2.8 nanobind scikit-build-core pytest hypothesis tqdm matplotlib flatbuffers
# CUDA builds need cublasLt.h (and the CUDA GEMM loads libcublasLt at run time): toolkits may
# ship without cuBLAS, so whenever CUDA code will be built (nvcc found where CMake looks, and
# TWE_CUDA not OFF in CMAKE_ARGS) install the nvidia-cublas wheel of the toolkit's version.
nvcc_bin=${CUDACXX:-$(command -v nvcc || true)}
for dir in "${CUDA_HOME:-}" "${CUDA_PATH:-}" "${CUDAToolkit_ROOT:-}" /usr/local/cuda /opt/cuda; do
  if [ -z "$nvcc_bin" ] && [ -n "$dir" ] && [ -x "$dir/bin/nvcc" ]; then nvcc_bin="$dir/bin/nvcc"; fi
done
if [ -n "$nvcc_bin" ] && [[ "${CMAKE_ARGS:-}" != *TWE_CUDA=OFF* ]]; then
  cuda_version=$("$nvcc_bin" --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
  read -r cuda_major cuda_minor <<<"$cuda_version"
  if [ "$cuda_major" -ge 13 ]; then cublas_pkg="nvidia-cublas==${cuda_major}.${cuda_minor}.*"
  else cublas_pkg="nvidia-cublas-cu${cuda_major}==${cuda_major}.${cuda_minor}.*"; fi
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps "$cublas_pkg"
fi
# TransformerEngine's pure-Python wheel (no CUDA libraries: --no-deps; imports on CPU with
# NVTE_PROJECT_BUILDING=1) for the TE migration tests: recipe conversion, checkpoint loading.
.venv/bin/python -m pip install -q --disable-pip-version-check pydantic
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps transformer-engine==2.20.2
.venv/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps .
