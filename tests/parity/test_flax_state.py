"""Flax DelayedScaling state moves as the torch Linear's buffers do: after N steps the
"fp8_meta" collection holds the same bytes as (fwd_amax_history, fwd_scale, bwd_amax_history,
bwd_scale) — forward-only through apply(..., mutable=["fp8_meta"]), training through the
mutable apply plus the fp8_meta gradient (the documented step)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from helpers import assert_bytes_equal

import twinengine.pytorch as tep
from twinengine import recipe as R
from twinengine.jax.flax import FP8_META, Dense

K, N, L, STEPS = 64, 32, 4, 3
RNG = np.random.default_rng(11)
W = (RNG.standard_normal((N, K)) * 0.1).astype(np.float32)
B = RNG.standard_normal(N).astype(np.float32)
XS = [RNG.standard_normal((16, K)).astype(np.float32) * np.float32(2.0 ** step) for step in range(STEPS)]
FIELDS = ("fwd_amax_history", "fwd_scale", "bwd_amax_history", "bwd_scale")
RECIPE = R.DelayedScaling(amax_history_len=L)


def _torch_states(train: bool):
    layer = tep.Linear(K, N, amax_history_len=L)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(W))
        layer.bias.copy_(torch.from_numpy(B))
    states = []
    for x in XS:
        with tep.autocast(RECIPE):
            if train:
                layer(torch.from_numpy(x)).sum().backward()
            else:
                with torch.no_grad():
                    layer(torch.from_numpy(x))
        states.append({f: getattr(layer, f).detach().clone().numpy() for f in FIELDS})
    return states


def _variables(model):
    variables = model.init(jax.random.key(0), jnp.asarray(XS[0]))
    assert all(np.array_equal(np.asarray(v), np.asarray(e)) for v, e in zip(
        jax.tree.leaves(variables[FP8_META]), jax.tree.leaves(jax.tree.map(jnp.zeros_like, variables[FP8_META]))
    ) if v.ndim == 2), "init must not advance the state"
    return {"params": {"kernel": jnp.asarray(W.T), "bias": jnp.asarray(B)}, FP8_META: variables[FP8_META]}


def _compare(flax_states, torch_states):
    for step, (f, t) in enumerate(zip(flax_states, torch_states)):
        for name in FIELDS:
            assert_bytes_equal(np.asarray(f["delayed_scaling"][name]), t[name], f"step {step} {name}")


def test_flax_forward_only_state_through_mutable_matches_torch_buffers():
    model = Dense(N, recipe=RECIPE)
    variables = _variables(model)

    @jax.jit
    def forward(variables, x):
        _, mutated = model.apply(variables, x, mutable=[FP8_META])
        return mutated[FP8_META]

    states = []
    for x in XS:
        variables = {**variables, FP8_META: forward(variables, jnp.asarray(x))}
        states.append(variables[FP8_META])
    _compare(states, _torch_states(train=False))
    assert float(states[-1]["delayed_scaling"]["fwd_scale"][0]) != 1.0  # the scale did change


@pytest.mark.parametrize("use_mutable", [True, False])
def test_flax_training_state_matches_torch_buffers(use_mutable):
    model = Dense(N, recipe=RECIPE)
    variables = _variables(model)

    @jax.jit
    def step(params, fp8_meta, x):
        def loss_fn(params, fp8_meta):
            if use_mutable:
                y, mutated = model.apply({"params": params, FP8_META: fp8_meta}, x, mutable=[FP8_META])
            else:
                y, mutated = model.apply({"params": params, FP8_META: fp8_meta}, x), None
            return y.sum(), mutated

        (_, mutated), (_, next_fp8_meta) = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)(params, fp8_meta)
        return next_fp8_meta, mutated

    fp8_meta, states = variables[FP8_META], []
    for x in XS:
        fp8_meta, mutated = step(variables["params"], fp8_meta, jnp.asarray(x))
        if use_mutable:  # the mutable output holds the forward slots of the same next state
            for name in ("fwd_amax_history", "fwd_scale"):
                assert_bytes_equal(np.asarray(mutated[FP8_META]["delayed_scaling"][name]),
                                   np.asarray(fp8_meta["delayed_scaling"][name]), name)
        states.append(fp8_meta)
    _compare(states, _torch_states(train=True))
    assert float(states[-1]["delayed_scaling"]["bwd_scale"][0]) != 1.0
