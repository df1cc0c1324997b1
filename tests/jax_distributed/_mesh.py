"""Meshes of the sharding tests and the subprocess fallback when JAX already runs with fewer
than 8 devices."""

import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

HAVE_8 = jax.device_count() >= 8
needs_8 = pytest.mark.skipif(not HAVE_8, reason="JAX started with < 8 devices; test_subprocess reruns these")

MESHES = {"dp8": (8,), "tp8": (8,), "dp2tp4": (2, 4)}
_NAMES = {"dp8": ("dp",), "tp8": ("tp",), "dp2tp4": ("dp", "tp")}


def mesh(name: str) -> Mesh:
    return Mesh(np.array(jax.devices()[:8]).reshape(MESHES[name]), _NAMES[name])


def run_in_subprocess(test_file: str) -> None:
    """Runs `test_file` under pytest in a fresh interpreter with 8 host devices."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    here = pathlib.Path(test_file).parent
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", test_file],
                          cwd=str(here), env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
