"""Activations on CUDA: byte equality with the CPU kernels (NaNs by predicate: CUDA's NaN
results are canonical) for every kind × dtype, forward, backward, the fused quantize and
bias-gradient paths, in both frontends, compiled / jitted. Skipped (with the reason) without a CUDA device or CUDA kernels."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from elementwise_cases import DTYPES, FUSED_QUANTIZERS, SPECIAL_VALUES, assert_bytes_equal_nan, quantize_extras, sweep_input
from helpers import assert_quantized_equal, fields_as_numpy, from_torch, to_torch
from quantize_cases import case_id
from reference import activation as ref_act

import twinengine as te
from twinengine.pytorch._ops import activation as A

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() is False)"),
    pytest.mark.skipif(not te._C.has_cuda(), reason="twinengine was built without its CUDA kernels (nvcc not found)"),
]

def _both(fn, *arrays):
    """fn on CPU tensors and on CUDA tensors; the results as NumPy (flattened pytrees)."""
    cpu = fn(*[None if a is None else to_torch(a) for a in arrays])
    gpu = fn(*[None if a is None else to_torch(a).cuda() for a in arrays])
    return cpu, gpu


def _same(cpu, gpu, what: str) -> None:
    if isinstance(cpu, te.QuantizedTensor):
        assert_quantized_equal(fields_as_numpy(gpu), fields_as_numpy(cpu), what)
    elif cpu is not None:
        assert_bytes_equal_nan(from_torch(gpu), from_torch(cpu), what)


def _input(dtype: str, cols: int = 160) -> np.ndarray:
    x = sweep_input(96 * cols, dtype, seed=31).reshape(96, cols)
    x[0, : SPECIAL_VALUES.size] = ref_act.round_output(SPECIAL_VALUES, dtype)
    x[1, -SPECIAL_VALUES.size:] = ref_act.round_output(SPECIAL_VALUES, dtype)
    return x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", A.ACTIVATIONS)
def test_activation_cuda_matches_cpu(kind, dtype):
    x = _input(dtype)
    dy = ref_act.round_output(np.random.default_rng(2).standard_normal(
        (96, 80 if kind in ref_act.GATED else 160)).astype(np.float32), dtype)
    cpu, gpu = _both(lambda v: A.activation_fwd(v, kind)[0], x)
    _same(cpu, gpu, f"{kind} y")
    cpu, gpu = _both(lambda d, v: A.activation_bwd(d, v, kind), dy, x)
    _same(cpu, gpu, f"{kind} dx")
    cpu, gpu = _both(lambda d, v: A.activation_bwd_dbias(d, v, kind, bias_dtype=torch.float32)[:2], dy, x)
    for c, g, name in zip(cpu, gpu, ("dx", "dbias")):
        _same(c, g, f"{kind} {name}")


@pytest.mark.parametrize("q", FUSED_QUANTIZERS, ids=case_id)
def test_activation_fused_quantize_cuda_matches_cpu(q):
    x = ref_act.round_output(np.random.default_rng(4).standard_normal((128, 512)).astype(np.float32), "bfloat16")
    dy = ref_act.round_output(np.random.default_rng(5).standard_normal((128, 256)).astype(np.float32), "bfloat16")
    extras = quantize_extras(q)
    cpu, gpu = _both(lambda v, s, r: A.activation_fwd(v, "swiglu", quantizer=q, scale=s, rng=r), x, extras["scale"],
                     extras["rng"])
    _same(cpu[0], gpu[0], "y")
    _same(cpu[1], gpu[1], "quantized y")
    cpu, gpu = _both(lambda d, v, s, r: A.activation_bwd_dbias(d, v, "swiglu", quantizer=q, scale=s, rng=r), dy, x,
                     extras["scale"], extras["rng"])
    for c, g in zip(cpu, gpu):
        _same(c, g, "backward")


def test_activation_cuda_compiled_matches_eager():
    def step(x, dy):
        y, _ = A.activation_fwd(x, "geglu")
        dx, db, _ = A.activation_bwd_dbias(dy, x, "geglu")
        return y, dx, db

    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    for rows in (64, 96):
        x = torch.randn(rows, 128, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(rows, 64, device="cuda", dtype=torch.bfloat16)
        for a, b in zip(compiled(x, dy), step(x, dy)):
            _same(b, a, "compiled vs eager")


def test_activation_jax_cuda_matches_cpu():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from twinengine.jax._ops import activation as JA

    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        pytest.skip("JAX sees no GPU")
    x = _input("bfloat16")
    y_cpu = JA.activation_fwd(jax.device_put(jnp.asarray(x), jax.devices("cpu")[0]), "swiglu")[0]
    y_gpu = jax.jit(lambda v: JA.activation_fwd(v, "swiglu")[0])(jax.device_put(jnp.asarray(x), gpus[0]))
    assert_bytes_equal_nan(np.asarray(y_gpu), np.asarray(y_cpu), "jax swiglu")
