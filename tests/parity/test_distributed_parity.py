"""Cross-framework tensor parallelism: the same LayerNormMLP block (LayerNorm → FC1 column-parallel
→ SwiGLU → FC2 row-parallel) on 2 torch processes (gloo, 127.0.0.1, ``tep.LayerNormMLP(tp_group=)``)
and on 2 JAX host devices (``twinengine.jax.parallel.layernorm_mlp`` in ``shard_map``, a
subprocess with ``XLA_FLAGS=--xla_force_host_platform_device_count=2``) gives the same output
bytes for every recipe: the same kernels, amaxes reduced with MAX over the group (NUMERICS.md
§12), and the row-parallel fp32 partials summed in the same order (two terms)."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import torch.multiprocessing as mp

from distributed_cases import PARITY_RECIPES, free_port, parity_mlp_worker

_JAX = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    from twinengine import recipe as R
    from twinengine.jax import parallel
    recipes = {"high_precision": None, "fp8_current": R.Float8CurrentScaling(), "mxfp8": R.MXFP8BlockScaling(),
               "fp8_block": R.Float8BlockScaling()}
    data = dict(np.load(sys.argv[1]))
    x = jnp.asarray(data.pop("x"))
    params = {k: jnp.asarray(v) for k, v in data.items()}
    for k in ("fc1_weight", "fc1_bias"):
        params[k] = parallel.gated_fc1_for_tp(params[k], 2)
    mesh = Mesh(np.array(jax.devices()[:2]), ("tp",))
    specs = {"layer_norm_weight": P(), "layer_norm_bias": P(), "fc1_weight": P("tp", None), "fc1_bias": P("tp"),
             "fc2_weight": P(None, "tp"), "fc2_bias": P()}
    out = {}
    for name in sys.argv[3].split(","):
        fn = jax.jit(jax.shard_map(lambda x, p, r=recipes[name]: parallel.layernorm_mlp(
            x, p, tp_axis="tp", activation="swiglu", recipe=r), mesh=mesh, in_specs=(P(), specs), out_specs=P(),
            check_vma=False))
        out[name] = np.asarray(fn(x, params))
    np.savez(sys.argv[2], **out)
""")


def test_layernorm_mlp_tp2_torch_equals_jax(tmp_path):
    rng = np.random.default_rng(41)
    hidden, ffn = 128, 256
    inputs = {"x": rng.standard_normal((128, hidden)).astype(np.float32),
              "layer_norm_weight": (1 + rng.standard_normal(hidden) / 8).astype(np.float32),
              "layer_norm_bias": (rng.standard_normal(hidden) / 8).astype(np.float32),
              "fc1_weight": (rng.standard_normal((2 * ffn, hidden)) / 8).astype(np.float32),
              "fc1_bias": (rng.standard_normal(2 * ffn) / 8).astype(np.float32),
              "fc2_weight": (rng.standard_normal((hidden, ffn)) / 8).astype(np.float32),
              "fc2_bias": (rng.standard_normal(hidden) / 8).astype(np.float32)}
    path = str(tmp_path / "inputs.npz")
    np.savez(path, **inputs)
    mp.spawn(parity_mlp_worker, args=(2, free_port(), path, str(tmp_path)), nprocs=2, join=True)
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()
    jax_out = str(tmp_path / "jax.npz")
    proc = subprocess.run([sys.executable, "-c", _JAX, path, jax_out, ",".join(PARITY_RECIPES)], env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    torch_y, jax_y = np.load(str(tmp_path / "torch.npz")), np.load(jax_out)
    for name in PARITY_RECIPES:
        a, b = torch_y[name], jax_y[name]
        assert a.shape == b.shape == (128, hidden), name
        bad = np.flatnonzero(a.view(np.uint32) != b.view(np.uint32))
        assert bad.size == 0, f"{name}: {bad.size} elements differ, first at {np.unravel_index(bad[0], a.shape)}: " \
                              f"torch {a.flat[bad[0]]!r} jax {b.flat[bad[0]]!r}"
