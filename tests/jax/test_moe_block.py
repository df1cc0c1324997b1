"""The JAX MoE block example (demo/moe_jax.py): expert parallel under shard_map with
lax.all_to_all on 8 CPU devices gives every device's tokens the bytes of the single-device
block, outputs and gradients (input, expert parameters). Runs in a subprocess so XLA_FLAGS
(8 host devices) does not leak into this process."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_expert_parallel_block_matches_single_device_bytes(tmp_path):
    out = tmp_path / "moe.npz"
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    result = subprocess.run([sys.executable, "-m", "demo.moe_jax", str(out)], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    got = np.load(out)
    assert int(got["devices"]) == 8
    single, parallel = got["single"], got["expert_parallel"]
    assert single.shape == parallel.shape == (48, 16)
    assert np.array_equal(single.view(np.uint32), parallel.view(np.uint32))
    # backward: input gradients and every expert's parameter gradients (the router's is a
    # cross-device sum, another reduction order, and is not compared)
    for name in ("dx", "kernel1", "bias1", "kernel2", "bias2"):
        a, b = got[f"single_{name}"], got[f"expert_parallel_{name}"]
        assert a.shape == b.shape and np.abs(a).sum() > 0, name
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), name


_ROWWISE_ROUTER = """
import sys
import jax, jax.numpy as jnp
import twinengine.jax as tej
from demo import moe_jax

def route(x, router, topk):  # the router one token row per GEMM: bytes independent of the batch
    probs = jax.nn.softmax(jax.lax.map(lambda r: tej.dense(r[None], router)[0], x), axis=-1)
    _, top = jax.lax.top_k(probs, topk)
    mask = jnp.zeros(probs.shape, jnp.bool_).at[jnp.arange(x.shape[0])[:, None], top].set(True)
    return mask, jnp.where(mask, probs, 0.0)

moe_jax.route = route
moe_jax.compare(sys.argv[1])
"""


def test_expert_parallel_gradients_with_a_batch_invariant_router(tmp_path):
    """The expert-parallel backward (all_to_all transposes, grouped GEMM gradients) alone: with
    the router computed one token per GEMM (so its bytes do not depend on how many tokens a
    device holds, which the CPU dense GEMM does not yet guarantee), outputs, input gradients
    and every expert's parameter gradients equal the single-device block's bit for bit."""
    out = tmp_path / "moe.npz"
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    result = subprocess.run([sys.executable, "-c", _ROWWISE_ROUTER, str(out)], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    got = np.load(out)
    for name in ("", "_dx", "_kernel1", "_bias1", "_kernel2", "_bias2"):
        a, b = got[f"single{name}"], got[f"expert_parallel{name}"]
        assert a.shape == b.shape and np.abs(a).sum() > 0, name
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), name or "output"


def test_single_device_block_gradients():
    import jax
    import jax.numpy as jnp

    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from demo import moe_jax

    params = moe_jax.init_params(jax.random.PRNGKey(0), 4, 16, 32)
    x = jax.random.normal(jax.random.PRNGKey(1), (12, 16))
    loss = jax.jit(jax.grad(lambda p, x: jnp.sum(moe_jax.moe_block(p, x, 2, 16) ** 2), argnums=(0, 1)))
    grads, dx = loss(params, x)
    assert float(jnp.abs(dx).sum()) > 0
    for name in ("kernel1", "bias1", "kernel2", "bias2"):
        assert bool(jnp.isfinite(grads[name]).all()) and float(jnp.abs(grads[name]).sum()) > 0, name
