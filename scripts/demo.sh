#!/usr/bin/env bash
# Sets up .venv/ if needed and runs the main job (the demo).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m demo "$@"
