"""python -m demo: the README's main job."""

from .quantize_table import main

raise SystemExit(0 if main() else 1)
