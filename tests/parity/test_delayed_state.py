"""DelayedScaling state follows NUMERICS.md §3 bit for bit in both frontends for amaxes that a
float max would mishandle: subnormal (flushed by XLA's CPU FTZ/DAZ threads), zero, -0.0, inf
and NaN. record_amax and the whole Linear / dense state update are compared with the NumPy
reference and across torch eager, torch.compile, JAX eager and jax.jit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from helpers import assert_bytes_equal
from twinengine.testing import reference as ref

import twinengine.jax as tej
import twinengine.pytorch as tep
from twinengine import recipe as R

F32 = np.float32
SUB = F32(1e-40)  # subnormal
TINY = F32(1e-45)  # smallest subnormal
VALUES = [F32(0.0), F32(-0.0), SUB, TINY, F32(2.5), F32(np.inf), F32(np.nan), F32(-np.nan), F32(3e38)]


def _history_amax_pairs():
    """(history (4, S), amax (S,)) with every (H[0], amax) pair of VALUES in some slot."""
    pairs = [(h, a) for h in VALUES for a in VALUES]
    slots = len(pairs)
    hist = np.tile(np.array([0.0, 1.0, 2.0, 3.0], F32)[:, None], (1, slots))
    hist[0] = [h for h, _ in pairs]
    amax = np.array([a for _, a in pairs], F32)
    return hist, amax


_TORCH_COMPILED = torch.compile(tep.record_amax, fullgraph=True, backend="inductor")


def test_record_amax_matches_reference_in_every_frontend():
    hist, amax = _history_amax_pairs()
    expected = ref.record_amax_ref(hist, amax)
    assert expected[0, VALUES.index(SUB)] == SUB  # the reference keeps subnormals (H[0] = 0, a = 1e-40)
    results = {
        "torch eager": tep.record_amax(torch.from_numpy(hist), torch.from_numpy(amax)).numpy(),
        "torch compiled": _TORCH_COMPILED(torch.from_numpy(hist), torch.from_numpy(amax)).numpy(),
        "jax eager": np.asarray(tej.record_amax(jnp.asarray(hist), jnp.asarray(amax))),
        "jax jit": np.asarray(jax.jit(tej.record_amax)(jnp.asarray(hist), jnp.asarray(amax))),
    }
    for name, got in results.items():
        assert_bytes_equal(got, expected, name)


@pytest.mark.parametrize("shape", [(3,), (3, 1)])
def test_record_amax_one_slot_layouts(shape):
    hist = np.zeros(shape, F32)
    amax = np.array([SUB], F32)
    expected = ref.record_amax_ref(hist, amax)
    assert_bytes_equal(tep.record_amax(torch.from_numpy(hist), torch.from_numpy(amax)).numpy(), expected, "torch")
    assert_bytes_equal(np.asarray(jax.jit(tej.record_amax)(jnp.asarray(hist), jnp.asarray(amax))), expected, "jax")


def test_record_amax_errors_same_in_both_frontends():
    def error(fn):
        with pytest.raises((TypeError, ValueError)) as info:
            fn()
        return info.type, str(info.value)

    cases = [(np.zeros((4, 2), F32), np.zeros(3, F32)), (np.zeros((4, 2), np.float16), np.zeros(2, F32)),
             (np.zeros((0, 2), F32), np.zeros(2, F32))]
    for hist, amax in cases:
        t = error(lambda: tep.record_amax(torch.from_numpy(hist), torch.from_numpy(amax)))
        j = error(lambda: tej.record_amax(jnp.asarray(hist), jnp.asarray(amax)))
        jj = error(lambda: jax.jit(tej.record_amax)(jnp.asarray(hist), jnp.asarray(amax)))
        assert t == j == jj and t[1].startswith("twinengine.record_amax: "), (t, j, jj)


# ---- the whole DelayedScaling state of Linear / dense ----------------------------------------

K, N, L = 32, 32, 3
W = (np.random.default_rng(5).standard_normal((N, K)) * 0.1).astype(F32)
STEP_SCALES = {"subnormal": [SUB, F32(1.0)], "zero": [F32(0.0), F32(1.0)], "inf": [F32(np.inf), F32(1.0)],
               "nan": [F32(np.nan), F32(1.0)], "normal_then_subnormal": [F32(1.0), SUB]}


def _x(step_scale, step):
    base = np.random.default_rng(step).standard_normal((16, K)).astype(F32)
    with np.errstate(invalid="ignore", over="ignore"):
        x = (np.sign(base) * step_scale).astype(F32) if not np.isfinite(step_scale) else base * step_scale
    if np.isnan(step_scale):
        x = base.copy()
        x[0, 0] = np.nan  # a NaN element: the amax skips it
    return x.astype(F32)


def _torch_run(scales, compiled):
    layer = tep.Linear(K, N, bias=False, amax_history_len=L)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(W))
    r = R.DelayedScaling(amax_history_len=L)

    def fwd(x):
        with tep.autocast(r):
            return layer(x)

    if compiled:
        torch._dynamo.reset()
        fwd = torch.compile(fwd, fullgraph=True, backend="aot_eager")
    out = []
    for step, s in enumerate(scales):
        x = torch.from_numpy(_x(s, step)).requires_grad_()
        y = fwd(x)
        y.float().sum().backward()
        out.append([t.detach().clone().numpy() for t in (layer.fwd_amax_history, layer.fwd_scale,
                                                         layer.bwd_amax_history, layer.bwd_scale)])
    return out


def _jax_run(scales):
    r = R.DelayedScaling(amax_history_len=L)

    def loss(x, kernel, state):
        y, _ = tej.dense(x, kernel, recipe=r, state=state)
        return y.astype(jnp.float32).sum()

    step_fn = jax.jit(jax.grad(loss, argnums=2))
    state = tej.delayed_scaling_state(L)
    out = []
    for step, s in enumerate(scales):
        state = step_fn(jnp.asarray(_x(s, step)), jnp.asarray(W.T), state)
        out.append([np.asarray(state[k]) for k in ("fwd_amax_history", "fwd_scale", "bwd_amax_history", "bwd_scale")])
    return out


_compiled_runs: dict = {}


@pytest.mark.parametrize("case", sorted(STEP_SCALES))
def test_linear_delayed_state_same_bytes_for_special_amaxes(case):
    scales = STEP_SCALES[case]
    eager, compiled, jitted = _torch_run(scales, False), _torch_run(scales, True), _jax_run(scales)
    labels = ("fwd_amax_history", "fwd_scale", "bwd_amax_history", "bwd_scale")
    for step in range(len(scales)):
        for i, label in enumerate(labels):
            assert_bytes_equal(compiled[step][i], eager[step][i], f"step {step} {label}: torch.compile")
            assert_bytes_equal(jitted[step][i], eager[step][i], f"step {step} {label}: jax.jit")
    if case == "subnormal":
        # NUMERICS §3: a* = amax(x) ~ 4e-40 (subnormal, kept) -> s' = 448 / a* = +inf -> FLT_MAX (input slot)
        fwd_history, fwd_scale = eager[0][0], eager[0][1]
        x_amax = ref.amax_ref(_x(SUB, 0))
        assert 0 < x_amax < np.finfo(F32).tiny and fwd_history[-1, 0] == x_amax and fwd_scale[0] == np.finfo(F32).max
        expected_h, expected_s = ref.delayed_scaling_update_ref(
            ref.record_amax_ref(np.zeros((L, 2), F32), np.array([x_amax, ref.amax_ref(W)], F32)), np.ones(2, F32),
            "e4m3")
        assert_bytes_equal(fwd_history, expected_h, "fwd history vs reference")
        assert_bytes_equal(fwd_scale, expected_s, "fwd scale vs reference")
