"""Cross-framework parity of grouped GEMMs: tep.grouped_linear (eager and compiled) and
tej.grouped_dense (jitted) give identical outputs and gradients, and the same error text."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from helpers import NUMPY_DTYPES, assert_bytes_equal, from_torch, no_recompiles, to_torch

import twinengine as te
import twinengine.jax as tej
import twinengine.pytorch as tep


@pytest.mark.parametrize("recipe_name", [None, "Float8CurrentScaling", "MXFP8BlockScaling", "Float8BlockScaling",
                                         "NVFP4BlockScaling"], ids=str)
def test_grouped_linear_torch_and_jax_agree(recipe_name):
    fp8 = recipe_name is not None
    recipe = getattr(te.recipe, recipe_name)() if fp8 else None
    nvfp4 = recipe_name == "NVFP4BlockScaling"  # RHT on the bf16 columnwise copies, SR of dy per expert
    seed_offset = np.array([12, 345], np.int64)
    kw = {"rng": torch.from_numpy(seed_offset)} if nvfp4 else {}
    rng = np.random.default_rng(0)
    bf16 = NUMPY_DTYPES["bfloat16"]
    f = 4 if recipe_name == "Float8BlockScaling" else 1  # 128-row blocks, 128x128 weight tiles
    splits = np.array([32 * f, 0, 64 * f, 32 * f], np.int32)
    m, k, n = 128 * f, 64 * 2 * f if f > 1 else 64, 32 * f
    x = rng.standard_normal((m, k)).astype(np.float32).astype(bf16)
    w = (rng.standard_normal((4, n, k)) * 0.2).astype(np.float32).astype(bf16)
    b = rng.standard_normal((4, n)).astype(np.float32).astype(bf16)
    dy = rng.standard_normal((m, n)).astype(np.float32).astype(bf16)
    results = []
    for fn in (tep.grouped_linear, torch.compile(tep.grouped_linear, fullgraph=True)):
        xt = to_torch(x).requires_grad_()
        wt = [to_torch(wg).requires_grad_() for wg in w]
        bt = [to_torch(bg).requires_grad_() for bg in b]
        with tep.autocast(enabled=fp8, recipe=recipe):
            y = fn(xt, wt, torch.from_numpy(splits), bt, **kw)
        y.backward(to_torch(dy))
        results.append([from_torch(y), from_torch(xt.grad), np.stack([from_torch(t.grad) for t in wt]),
                        np.stack([from_torch(t.grad) for t in bt])])
    def jax_fn(x, k, s, b):
        with tej.autocast(recipe, enabled=fp8):
            return tej.grouped_dense(x, k, s, b, rng=jnp.asarray(seed_offset, jnp.int32) if nvfp4 else None)

    y, vjp = jax.vjp(lambda x, k, b: jax.jit(jax_fn)(x, k, jnp.asarray(splits), b), x, np.transpose(w, (0, 2, 1)), b)
    dx, dk, db = vjp(dy)
    results.append([np.asarray(y), np.asarray(dx), np.transpose(np.asarray(dk), (0, 2, 1)), np.asarray(db)])
    for other in results[1:]:
        for j, (a, e) in enumerate(zip(other, results[0])):
            assert_bytes_equal(a, e, f"result {j}")


def test_grouped_linear_errors_have_the_same_text():
    messages = []
    for call in (lambda: tep.grouped_linear(torch.ones(6, 4), [torch.ones(2, 4)] * 2, torch.tensor([4, 3])),
                 lambda: tej.grouped_dense(jnp.ones((6, 4)), jnp.ones((2, 4, 2)), jnp.asarray([4, 3])),
                 lambda: tep.grouped_linear(torch.ones(6, 4), [torch.ones(2, 4)] * 3, torch.tensor([3, 3])),
                 lambda: tej.grouped_dense(jnp.ones((6, 4)), jnp.ones((3, 4, 2)), jnp.asarray([3, 3])),
                 lambda: tep.grouped_linear(torch.ones(6, 4), [torch.ones(2, 4)] * 2, torch.tensor([4, 1])),
                 lambda: tej.grouped_dense(jnp.ones((6, 4)), jnp.ones((2, 4, 2)), jnp.asarray([4, 1]))):
        with pytest.raises(ValueError) as err:
            call()
        messages.append(str(err.value))
    assert messages[0] == messages[1] and messages[2] == messages[3] and messages[4] == messages[5]
    assert messages[4] == "twinengine.grouped_linear: m_splits must sum to the 6 rows of the input, got sum 5"


def _delayed_torch_step(layer, x, splits, recipe):
    with tep.autocast(recipe=recipe):
        return layer(x, splits)


def test_grouped_linear_delayed_scaling_torch_eager_compiled_and_jax_agree():
    """Three DelayedScaling steps with changing splits: tep.GroupedLinear eager, compiled
    (fullgraph, m_splits a tensor: no recompile after the first step) and jitted
    tej.grouped_dense with its functional state give identical outputs, gradients and state."""
    recipe = te.recipe.DelayedScaling(amax_history_len=4)
    rng = np.random.default_rng(4)
    bf16 = NUMPY_DTYPES["bfloat16"]
    G, K, N = 4, 32, 16
    w = (rng.standard_normal((G, N, K)) * 0.2).astype(np.float32).astype(bf16)
    b = rng.standard_normal((G, N)).astype(np.float32).astype(bf16)
    steps = ([5, 3, 20, 4], [0, 0, 32, 0], [1, 13, 0, 18])
    data = [((rng.standard_normal((32, K)) * 4.0 ** i).astype(np.float32).astype(bf16),
             rng.standard_normal((32, N)).astype(np.float32).astype(bf16)) for i in range(len(steps))]
    fields = ("fwd_amax_history", "fwd_scale", "bwd_amax_history", "bwd_scale")
    runs = []
    compiled = torch.compile(_delayed_torch_step, fullgraph=True)
    for fn in (_delayed_torch_step, compiled):
        layer = tep.GroupedLinear(G, K, N, params_dtype=torch.bfloat16, amax_history_len=4)
        with torch.no_grad():
            for g in range(G):
                getattr(layer, f"weight{g}").copy_(to_torch(w[g]))
                getattr(layer, f"bias{g}").copy_(to_torch(b[g]))
        run = []
        for i, (splits, (x_np, dy_np)) in enumerate(zip(steps, data)):
            layer.zero_grad()
            x = to_torch(x_np).requires_grad_()
            ctx = no_recompiles() if fn is compiled and i > 0 else contextlib.nullcontext()
            with ctx:
                y = fn(layer, x, torch.tensor(splits, dtype=torch.int32), recipe)
                y.backward(to_torch(dy_np))
            run.append([from_torch(y), from_torch(x.grad),
                        np.stack([from_torch(getattr(layer, f"weight{g}").grad) for g in range(G)]),
                        np.stack([from_torch(getattr(layer, f"bias{g}").grad) for g in range(G)])]
                       + [from_torch(getattr(layer, f).clone()) for f in fields])
        runs.append(run)

    def jax_step(x, k, s, bias, state, dy):
        def f(x, k, bias, st):
            with tej.autocast(recipe):
                return tej.grouped_dense(x, k, s, bias, state=st)
        (y, _), vjp = jax.vjp(f, x, k, bias, state)
        dx, dk, db, new_state = vjp((dy, jax.tree_util.tree_map(jnp.zeros_like, state)))
        return y, dx, dk, db, new_state

    jitted = jax.jit(jax_step)
    state = tej.grouped_delayed_scaling_state(G, 4)
    run = []
    for splits, (x_np, dy_np) in zip(steps, data):
        y, dx, dk, db, state = jitted(x_np, np.transpose(w, (0, 2, 1)), jnp.asarray(splits, jnp.int32), b, state,
                                      dy_np)
        run.append([np.asarray(y), np.asarray(dx), np.transpose(np.asarray(dk), (0, 2, 1)), np.asarray(db)]
                   + [np.asarray(state[f]) for f in fields])
    runs.append(run)
    assert jitted._cache_size() == 1
    for name, other in (("compiled", runs[1]), ("jax", runs[2])):
        for i, (got_step, exp_step) in enumerate(zip(other, runs[0])):
            for j, (got, exp) in enumerate(zip(got_step, exp_step)):
                assert_bytes_equal(got, exp, f"{name} step {i} result {j}")


@pytest.mark.parametrize("recipe", [te.recipe.Float8CurrentScaling(), te.recipe.MXFP8BlockScaling(),
                                    te.recipe.Float8BlockScaling()], ids=lambda r: type(r).__name__)
def test_bad_split_and_align_size_errors_have_the_same_text(recipe):
    """A negative split, and an align_size that is not a multiple of the recipe's row alignment
    (16 FP8, 32 MXFP8, 128 FP8 block) — for permute-and-pad and block padding — give one
    message in both frontends."""
    alignment = {"Float8CurrentScaling": 16, "MXFP8BlockScaling": 32, "Float8BlockScaling": 128}[type(recipe).__name__]
    mask = np.ones((4, 2), bool)
    pairs = [
        (lambda: tep.grouped_linear(torch.ones(6, 4), [torch.ones(2, 4)] * 2, torch.tensor([8, -2])),
         lambda: tej.grouped_dense(jnp.ones((6, 4)), jnp.ones((2, 4, 2)), jnp.asarray([8, -2])), None),
        (lambda: tep.moe_permute_and_pad_with_probs(torch.ones(4, 8), torch.ones(4, 2), torch.from_numpy(mask),
                                                    torch.from_numpy(mask.sum(0)), alignment // 2),
         lambda: tej.moe_permute_and_pad_with_probs(jnp.ones((4, 8)), jnp.ones((4, 2)), mask, mask.sum(0),
                                                    alignment // 2), recipe),
        (lambda: tep.moe_pad_splits(torch.ones(4, 8), torch.tensor([2, 2]), alignment + alignment // 2),
         lambda: tej.moe_pad_splits(jnp.ones((4, 8)), jnp.asarray([2, 2]), alignment + alignment // 2), recipe),
    ]
    for torch_call, jax_call, active in pairs:
        messages = []
        with tep.autocast(enabled=active is not None, recipe=active), tej.autocast(active, enabled=active is not None):
            for call in (torch_call, jax_call):
                with pytest.raises(ValueError) as err:
                    call()
                messages.append(str(err.value))
        assert messages[0] == messages[1], messages
        assert "m_splits must be >= 0" in messages[0] or f"row alignment {alignment}" in messages[0]


@pytest.mark.parametrize("recipe_name", [None, "Float8CurrentScaling", "MXFP8BlockScaling"], ids=str)
def test_grouped_linear_basic_op_sequential_torch_and_jax_agree(recipe_name):
    """ops.Sequential(GroupedLinear, ReLU, GroupedLinear) with m_splits as the extra inputs:
    torch (eager) and JAX (jitted, new splits without a recompile) give identical outputs and
    gradients, parameters in the torch op's order (weight0…, bias0…)."""
    import twinengine.jax.ops as jops
    from twinengine.pytorch import ops

    recipe = getattr(te.recipe, recipe_name)() if recipe_name else None
    torch.manual_seed(0)
    fc1, fc2 = ops.GroupedLinear(3, 32, 64), ops.GroupedLinear(3, 64, 32, bias=False)
    seq = ops.Sequential(fc1, ops.ReLU(), fc2)
    jseq = jops.Sequential(jops.GroupedLinear(3, 32, 64), jops.ReLU(), jops.GroupedLinear(3, 64, 32, bias=False))
    ordered = [[getattr(op, name) for name in op.param_names] for op in (fc1, fc2)]
    params = ([from_torch(p.detach()) for p in ordered[0]], [], [from_torch(p.detach()) for p in ordered[1]])

    def jax_loss(x, params, s, dy):
        with tej.autocast(recipe, enabled=recipe is not None):
            y = jseq(x, params, s, s)
        return (y.astype(jnp.float32) * dy).sum(), y

    step = jax.jit(jax.grad(jax_loss, argnums=(0, 1), has_aux=True))
    rng = np.random.default_rng(3)
    for i, splits in enumerate(([32, 0, 64], [96, 0, 0], [0, 32, 64])):
        x_np = rng.standard_normal((96, 32)).astype(np.float32)
        dy_np = rng.standard_normal((96, 32)).astype(np.float32)
        for p in seq.parameters():
            p.grad = None
        x = to_torch(x_np).requires_grad_()
        s = torch.tensor(splits, dtype=torch.int32)
        with tep.autocast(enabled=recipe is not None, recipe=recipe):
            y = seq(x, s, s)
        y.backward(to_torch(dy_np))
        (dx, dparams), jy = step(x_np, params, jnp.asarray(splits, jnp.int32), dy_np)
        assert_bytes_equal(np.asarray(jy), from_torch(y), f"split {i} output")
        assert_bytes_equal(np.asarray(dx), from_torch(x.grad), f"split {i} dgrad")
        torch_grads = [from_torch(p.grad) for p in ordered[0] + ordered[1]]
        for j, (a, e) in enumerate(zip(list(dparams[0]) + list(dparams[2]), torch_grads)):
            assert_bytes_equal(np.asarray(a), e, f"split {i} param grad {j}")
    assert step._cache_size() == 1
