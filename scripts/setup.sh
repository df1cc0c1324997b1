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
  flax==0.12.8 optax==0.2.8 nanobind scikit-build-core scipy-openblas32 pytest hypothesis tqdm matplotlib flatbuffers
# TransformerEngine's pure-Python wheel (no CUDA libraries: --no-deps; imports on CPU with
# NVTE_PROJECT_BUILDING=1) for the TE migration tests: recipe conversion, checkpoint loading.
.venv/bin/python -m pip install -q --disable-pip-version-check pydantic
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps transformer-engine==2.20.2
.venv/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps .
