"""The same NumPy inputs through twinengine.pytorch.Linear (eager and torch.compile) and
twinengine.jax.dense (jax.jit) give identical bytes for the output and every gradient, for
every recipe and input dtype; with DelayedScaling also the same state, step by step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import twinengine.jax as tj
import twinengine.pytorch as tp
from twinengine import recipe as R
from twinengine.quantizers import Float8CurrentScalingQuantizer

RECIPES = {
    "high_precision": None,
    "mxfp8": R.MXFP8BlockScaling(),
    "mxfp8_2d": R.MXFP8BlockScaling(enable_2d_quantization=True),
    "fp8_current": R.Float8CurrentScaling(),
    "delayed": R.DelayedScaling(amax_history_len=3),
    "fp8_block": R.Float8BlockScaling(),
    "nvfp4_no_rht": R.NVFP4BlockScaling(disable_rht=True),
    "custom": R.CustomRecipe(lambda role: Float8CurrentScalingQuantizer("e5m2" if role == "grad_output" else "e4m3",
                                                                        force_pow_2_scales=True)),
}
DTYPES = {"float32": (torch.float32, jnp.float32), "bfloat16": (torch.bfloat16, jnp.bfloat16)}
K, N, STEPS = 128, 128, 2  # FP8 block scaling needs rows and K divisible by 128
RNG = np.random.default_rng(2024)
X = [RNG.standard_normal((2, 64, K)).astype(np.float32) * (1 + step) for step in range(STEPS)]
W = (RNG.standard_normal((N, K)) * 0.1).astype(np.float32)
B = RNG.standard_normal(N).astype(np.float32)
GW = np.linspace(-1.5, 1.0, N).astype(np.float32)


def _bytes(a) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        a = a.detach()
        return (a.view(torch.int16) if a.dtype == torch.bfloat16 else a).numpy().view(np.uint8)
    return np.asarray(a).view(np.uint8)


def _torch_forward(layer, x, recipe):
    with tp.autocast(enabled=recipe is not None, recipe=recipe):
        y = layer(x)
    return y, (y.float() * torch.from_numpy(GW)).sum()


def run_torch(recipe, dtype, forward):
    layer = tp.Linear(K, N, params_dtype=dtype, amax_history_len=3)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(W))
        layer.bias.copy_(torch.from_numpy(B))
    steps = []
    for x_np in X:
        layer.zero_grad()
        x = torch.from_numpy(x_np).to(dtype).requires_grad_()
        y, loss = forward(layer, x, recipe)
        loss.backward()
        steps.append([y, x.grad, layer.weight.grad.T.contiguous(), layer.bias.grad, layer.fwd_amax_history,
                      layer.fwd_scale, layer.bwd_amax_history, layer.bwd_scale])
        steps[-1] = [t.detach().clone() for t in steps[-1]]
    return steps


def run_jax(recipe, dtype):
    def loss(x, kernel, bias, state, rng):
        with tj.autocast(recipe, enabled=recipe is not None):
            out = tj.dense(x, kernel, bias, state=state if isinstance(recipe, R.DelayedScaling) else None,
                           rng=rng if isinstance(recipe, R.NVFP4BlockScaling) else None)
        y = out[0] if isinstance(out, tuple) else out
        return (y.astype(jnp.float32) * GW).sum(), y

    step = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True))
    state = tj.delayed_scaling_state(3)
    kernel, bias = jnp.asarray(W.T, dtype), jnp.asarray(B, dtype)
    steps = []
    for i, x_np in enumerate(X):
        # the torch Linear's rng_state: [rng_seed=0, one offset per forward call]
        (dx, dk, db, ds), y = step(jnp.asarray(x_np, dtype), kernel, bias, state, jnp.array([0, i], jnp.int32))
        if isinstance(recipe, R.DelayedScaling):
            state = ds
        steps.append([y, dx, dk, db] + [state[k] for k in ("fwd_amax_history", "fwd_scale", "bwd_amax_history",
                                                             "bwd_scale")])
    return steps


LABELS = ["y", "dx", "dw", "db", "fwd_amax_history", "fwd_scale", "bwd_amax_history", "bwd_scale"]


CASES = [(name, dtype) for name in RECIPES for dtype in DTYPES] + [("nvfp4", "bfloat16")]
RECIPES["nvfp4"] = R.NVFP4BlockScaling()  # RHT (bf16 only), 2D weights, stochastic rounding


@pytest.mark.parametrize("name,dtype", CASES)
def test_linear_torch_eager_compiled_and_jax_bytes_identical(name, dtype):
    recipe = RECIPES[name]
    torch_dtype, jax_dtype = DTYPES[dtype]
    eager = run_torch(recipe, torch_dtype, _torch_forward)
    torch._dynamo.reset()  # each case compiles the same code object: start from a clean cache
    compiled = run_torch(recipe, torch_dtype, torch.compile(_torch_forward, fullgraph=True, backend="aot_eager"))
    jitted = run_jax(recipe, jax_dtype)
    for step in range(STEPS):
        for label, e, c, j in zip(LABELS, eager[step], compiled[step], jitted[step]):
            for other, what in ((c, "torch.compile"), (j, "jax.jit")):
                be, bo = _bytes(e), _bytes(other)
                bad = np.flatnonzero(be != bo)
                assert be.shape == bo.shape and bad.size == 0, \
                    f"step {step} {label}: eager vs {what} differ first at byte {bad[0] if bad.size else None}"


def test_linear_argument_errors_same_in_both_frameworks():
    import jax.numpy as jnp

    import twinengine.jax as tej
    import twinengine.pytorch as tep

    def error(fn):
        with pytest.raises((TypeError, ValueError)) as info:
            fn()
        return info.type, str(info.value)

    assert error(lambda: tep.autocast(recipe="mxfp8")) == error(lambda: tej.autocast("mxfp8"))
    r = R.DelayedScaling(amax_history_len=4)
    torch_error = error(lambda: _torch_linear_without_state(tep, r))
    jax_error = error(lambda: tej.dense(jnp.ones((2, 32)), jnp.ones((32, 32)), recipe=r))
    assert torch_error == jax_error and "needs the layer's delayed-scaling state" in jax_error[1]


def _torch_linear_without_state(tep, r):
    import torch

    with tep.autocast(recipe=r):
        return tep.linear(torch.ones(2, 32), torch.ones(32, 32))
