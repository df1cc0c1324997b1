"""twinengine.pytorch.GroupedLinear / grouped_linear / ops.GroupedLinear: each expert's rows give
exactly the bytes of a tep.Linear with that expert's parameters (forward, dgrad, wgrad, bias
gradient), for random and degenerate splits; m_splits as a tensor under torch.compile without
recompiles; bad inputs; opcheck of the grouped kernels."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from helpers import NUMPY_DTYPES, assert_bytes_equal, from_torch, no_recompiles, to_torch

import twinengine as te
import twinengine.pytorch as tep
from twinengine.pytorch import ops

SPLITS = [[5, 0, 20, 3], [0, 0, 28, 0], [7, 7, 7, 7], [0, 0, 0, 0], [1, 13, 0, 14]]


def _per_expert(x_np, w, b, dy_np, splits, dtype, recipe=None):
    """(y, dx, dws, dbs) from one tep.Linear per expert on its own rows (empty experts: zeros)."""
    ys, dxs, dws, dbs = [], [], [], []
    off = 0
    for g, size in enumerate(splits):
        if size == 0:
            ys.append(np.zeros((0, w.shape[1]), w.dtype))
            dxs.append(np.zeros((0, w.shape[2]), w.dtype))
            dws.append(np.zeros(w.shape[1:], w.dtype))
            if b is not None:
                dbs.append(np.zeros(b.shape[1:], b.dtype))
            continue
        lin = tep.Linear(w.shape[2], w.shape[1], bias=b is not None, params_dtype=dtype)
        with torch.no_grad():
            lin.weight.copy_(to_torch(w[g]))
            if b is not None:
                lin.bias.copy_(to_torch(b[g]))
        xg = to_torch(x_np[off:off + size]).requires_grad_()
        with tep.autocast(enabled=recipe is not None, recipe=recipe):
            yg = lin(xg)
        yg.backward(to_torch(dy_np[off:off + size]))
        ys.append(from_torch(yg))
        dxs.append(from_torch(xg.grad))
        dws.append(from_torch(lin.weight.grad))
        if b is not None:
            dbs.append(from_torch(lin.bias.grad))
        off += size
    return np.concatenate(ys), np.concatenate(dxs), dws, dbs


def _case(splits, dtype, bias, seed=0, K=48, N=24):
    rng = np.random.default_rng(seed)
    np_dtype = NUMPY_DTYPES[dtype]
    M, G = sum(splits), len(splits)
    x = rng.standard_normal((M, K)).astype(np.float32).astype(np_dtype)
    w = (rng.standard_normal((G, N, K)) * 0.2).astype(np.float32).astype(np_dtype)
    b = rng.standard_normal((G, N)).astype(np.float32).astype(np_dtype) if bias else None
    dy = rng.standard_normal((M, N)).astype(np.float32).astype(np_dtype)
    return x, w, b, dy


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("splits", SPLITS, ids=str)
def test_grouped_linear_matches_per_expert_linear(splits, dtype, bias):
    x_np, w, b, dy = _case(splits, dtype, bias)
    layer = tep.GroupedLinear(len(splits), w.shape[2], w.shape[1], bias=bias, params_dtype=getattr(torch, dtype))
    with torch.no_grad():
        for g in range(len(splits)):
            getattr(layer, f"weight{g}").copy_(to_torch(w[g]))
            if bias:
                getattr(layer, f"bias{g}").copy_(to_torch(b[g]))
    x = to_torch(x_np).requires_grad_()
    y = layer(x, torch.tensor(splits))
    y.backward(to_torch(dy))
    exp_y, exp_dx, exp_dw, exp_db = _per_expert(x_np, w, b, dy, splits, getattr(torch, dtype))
    assert_bytes_equal(from_torch(y), exp_y.reshape(y.shape), "output")
    assert_bytes_equal(from_torch(x.grad), exp_dx.reshape(x.shape), "dgrad")
    for g in range(len(splits)):
        assert_bytes_equal(from_torch(getattr(layer, f"weight{g}").grad), exp_dw[g], f"wgrad expert {g}")
        if bias:
            assert_bytes_equal(from_torch(getattr(layer, f"bias{g}").grad), exp_db[g], f"bias grad expert {g}")


QUANTIZED = [("Float8CurrentScaling", [5, 3, 20, 4]), ("Float8CurrentScaling", [0, 0, 28, 0]),
             ("Float8CurrentScaling", [1, 13, 0, 14]), ("MXFP8BlockScaling", [32, 0, 64, 32]),
             ("MXFP8BlockScaling", [0, 0, 96, 0])]


BLOCK = [("Float8BlockScaling", [128, 0, 256, 128]), ("Float8BlockScaling", [0, 0, 384, 0])]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("recipe_name, splits", QUANTIZED + BLOCK, ids=str)
def test_grouped_linear_quantized_matches_per_expert_linear(recipe_name, splits, dtype):
    recipe = getattr(te.recipe, recipe_name)()
    block = recipe_name == "Float8BlockScaling"  # 128-row blocks, 128x128 weight tiles
    x_np, w, b, dy = _case(splits, dtype, True, seed=7, K=256 if block else 64, N=128 if block else 32)
    torch_dtype = getattr(torch, dtype)
    layer = tep.GroupedLinear(len(splits), w.shape[2], w.shape[1], params_dtype=torch_dtype)
    with torch.no_grad():
        for g in range(len(splits)):
            getattr(layer, f"weight{g}").copy_(to_torch(w[g]))
            getattr(layer, f"bias{g}").copy_(to_torch(b[g]))
    x = to_torch(x_np).requires_grad_()
    with tep.autocast(recipe=recipe):
        y = layer(x, torch.tensor(splits))
    y.backward(to_torch(dy))
    exp_y, exp_dx, exp_dw, exp_db = _per_expert(x_np, w, b, dy, splits, torch_dtype, recipe)
    assert_bytes_equal(from_torch(y), exp_y, "output")
    assert_bytes_equal(from_torch(x.grad), exp_dx, "dgrad")
    for g in range(len(splits)):
        assert_bytes_equal(from_torch(getattr(layer, f"weight{g}").grad), exp_dw[g], f"wgrad expert {g}")
        assert_bytes_equal(from_torch(getattr(layer, f"bias{g}").grad), exp_db[g], f"bias grad expert {g}")


NVFP4_CASES = [("bfloat16", [16, 0, 32, 16], True), ("bfloat16", [0, 0, 64, 0], True),
               ("float32", [32, 16, 0, 16], True), ("bfloat16", [16, 0, 32, 16], False)]


@pytest.mark.parametrize("dtype, splits, stochastic", NVFP4_CASES, ids=str)
def test_grouped_linear_nvfp4_matches_per_expert_linear(dtype, splits, stochastic):
    """Each expert quantized on its own (global amax, 1x16 / 16x16 blocks, RHT on bf16
    columnwise copies, SR of the gradient with [seed, offset + g]): the bytes of tep.linear on
    the expert's rows with rng [seed, offset + g]; the module advances its offset by G."""
    recipe = te.recipe.NVFP4BlockScaling(disable_stochastic_rounding=not stochastic)
    x_np, w, b, dy = _case(splits, dtype, True, seed=11, K=64, N=32)
    torch_dtype = getattr(torch, dtype)
    layer = tep.GroupedLinear(len(splits), 64, 32, params_dtype=torch_dtype, rng_seed=5)
    _load(layer, w, b)
    with torch.no_grad():
        layer.rng_state.copy_(torch.tensor([5, 40]))
    x = to_torch(x_np).requires_grad_()
    with tep.autocast(recipe=recipe):
        y = layer(x, torch.tensor(splits))
    y.backward(to_torch(dy))
    assert layer.rng_state.tolist() == ([5, 40 + len(splits)] if stochastic else [5, 40])
    off = 0
    for g, size in enumerate(splits):
        if size == 0:
            assert not from_torch(getattr(layer, f"weight{g}").grad).astype(np.float32).any()
            continue
        xg, wg, bg = (to_torch(a).requires_grad_() for a in (x_np[off:off + size], w[g], b[g]))
        with tep.autocast(recipe=recipe):
            yg = tep.linear(xg, wg, bg, rng=torch.tensor([5, 40 + g]) if stochastic else None)
        yg.backward(to_torch(dy[off:off + size]))
        for name, got, exp in (("output", y[off:off + size], yg), ("dgrad", x.grad[off:off + size], xg.grad),
                               ("wgrad", getattr(layer, f"weight{g}").grad, wg.grad),
                               ("bias grad", getattr(layer, f"bias{g}").grad, bg.grad)):
            assert_bytes_equal(from_torch(got), from_torch(exp), f"{name} expert {g}")
        off += size


def _nvfp4_step(layer, x, splits, recipe):
    with tep.autocast(recipe=recipe):
        return layer(x, splits)


def test_grouped_linear_nvfp4_compiled_matches_eager_without_recompiles():
    recipe = te.recipe.NVFP4BlockScaling()
    torch.manual_seed(0)
    eager_layer = tep.GroupedLinear(3, 32, 16, params_dtype=torch.bfloat16)
    compiled_layer = tep.GroupedLinear(3, 32, 16, params_dtype=torch.bfloat16)
    compiled_layer.load_state_dict(eager_layer.state_dict())
    compiled = torch.compile(_nvfp4_step, fullgraph=True)
    x_np = np.random.default_rng(6).standard_normal((64, 32)).astype(np.float32).astype(NUMPY_DTYPES["bfloat16"])
    for i, splits in enumerate(([16, 16, 32], [0, 64, 0], [32, 0, 32])):
        outs = []
        for fn, layer in ((_nvfp4_step, eager_layer), (compiled, compiled_layer)):
            layer.zero_grad()
            x = to_torch(x_np).requires_grad_()
            with no_recompiles() if fn is compiled and i > 0 else contextlib.nullcontext():
                y = fn(layer, x, torch.tensor(splits, dtype=torch.int32), recipe)
                y.sum().backward()
            outs.append([from_torch(y), from_torch(x.grad), from_torch(layer.rng_state)]
                        + [from_torch(p.grad) for p in layer.parameters()])
        for j, (eager, comp) in enumerate(zip(*outs)):
            assert_bytes_equal(comp, eager, f"splits {splits} result {j}")


def test_grouped_linear_nvfp4_errors():
    layer = tep.GroupedLinear(2, 32, 16)
    with tep.autocast(recipe=te.recipe.NVFP4BlockScaling()):
        with pytest.raises(ValueError, match="multiple of 16 \\(pad the blocks: align_size=32\\), got 8"):
            layer(torch.ones(32, 32), torch.tensor([8, 24]))
        with pytest.raises(ValueError, match="needs rng="):
            tep.grouped_linear(torch.ones(32, 32), layer.weights(), torch.tensor([16, 16]))
        with pytest.raises(TypeError, match="twinengine.grouped_linear: pre-quantized NVFP4 weights are not supported"):
            layer(torch.ones(32, 32), torch.tensor([16, 16]), is_first_microbatch=True)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_grouped_linear_basic_op_nvfp4_matches_module(dtype):
    """ops.GroupedLinear under NVFP4 (RHT for bf16 only, SR with its rng_state advanced by G per
    call): the module's bytes and rng state over two calls."""
    torch.manual_seed(2)
    torch_dtype = getattr(torch, dtype)
    op = ops.GroupedLinear(3, 32, 16, dtype=torch_dtype, rng_seed=9)
    module = tep.GroupedLinear(3, 32, 16, params_dtype=torch_dtype, rng_seed=9)
    module.load_state_dict(op.state_dict())
    x_np = np.random.default_rng(4).standard_normal((48, 32)).astype(np.float32).astype(NUMPY_DTYPES[dtype])
    dy_np = np.random.default_rng(5).standard_normal((48, 16)).astype(np.float32).astype(NUMPY_DTYPES[dtype])
    seq = ops.Sequential(op)
    for splits in ([16, 0, 32], [32, 16, 0]):
        outs = []
        for layer in (seq, module):
            layer.zero_grad()
            x = to_torch(x_np).requires_grad_()
            with tep.autocast(recipe=te.recipe.NVFP4BlockScaling()):
                y = layer(x, torch.tensor(splits))
            y.backward(to_torch(dy_np))
            outs.append([from_torch(y), from_torch(x.grad)] + [from_torch(p.grad) for p in layer.parameters()])
        for j, (a, b) in enumerate(zip(*outs)):
            assert_bytes_equal(a, b, f"splits {splits} result {j}")
        assert op.rng_state.tolist() == module.rng_state.tolist()


def _load(layer, w, b):
    with torch.no_grad():
        for g in range(w.shape[0]):
            getattr(layer, f"weight{g}").copy_(to_torch(w[g]))
            if b is not None:
                getattr(layer, f"bias{g}").copy_(to_torch(b[g]))


DELAYED_STEPS = ([5, 3, 20, 4], [0, 0, 32, 0], [1, 13, 0, 18])


def _delayed_reference_step(lins, xs, dys, splits, recipe):
    """Each expert's tep.Linear on its rows (an empty expert: on one zero row, so its slots move
    on with input and grad amax 0 as the grouped layer's do); [(y, dx, dw, db) or None]."""
    out, off = [], 0
    for g, size in enumerate(splits):
        lin = lins[g]
        lin.zero_grad()
        rows = xs[off:off + size] if size else np.zeros((1, xs.shape[1]), xs.dtype)
        drows = dys[off:off + size] if size else np.zeros((1, dys.shape[1]), dys.dtype)
        off += size
        xg = to_torch(rows).requires_grad_()
        with tep.autocast(recipe=recipe):
            yg = lin(xg)
        yg.backward(to_torch(drows))
        out.append((yg, xg.grad, lin.weight.grad, lin.bias.grad) if size else None)
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_grouped_linear_delayed_scaling_matches_per_expert_linear_over_steps(dtype):
    """Three steps of DelayedScaling with changing splits: each expert's output, gradients and
    amax histories / scales equal a tep.Linear's run on its rows (the state moves, so later
    steps use non-unit scales)."""
    recipe = te.recipe.DelayedScaling(amax_history_len=4)
    torch_dtype = getattr(torch, dtype)
    G, K, N = 4, 32, 16
    _, w, b, _ = _case([1] * G, dtype, True, seed=11, K=K, N=N)
    layer = tep.GroupedLinear(G, K, N, params_dtype=torch_dtype, amax_history_len=4)
    _load(layer, w, b)
    lins = []
    for g in range(G):
        lin = tep.Linear(K, N, params_dtype=torch_dtype, amax_history_len=4)
        with torch.no_grad():
            lin.weight.copy_(to_torch(w[g]))
            lin.bias.copy_(to_torch(b[g]))
        lins.append(lin)
    for step, splits in enumerate(DELAYED_STEPS):
        xs, _, _, dys = _case(splits, dtype, True, seed=20 + step, K=K, N=N)
        xs = xs * np.asarray(4.0 ** step, xs.dtype)
        layer.zero_grad()
        x = to_torch(xs).requires_grad_()
        with tep.autocast(recipe=recipe):
            y = layer(x, torch.tensor(splits))
        y.backward(to_torch(dys))
        ref = _delayed_reference_step(lins, xs, dys, splits, recipe)
        off = 0
        for g, size in enumerate(splits):
            if size:
                yg, dxg, dwg, dbg = ref[g]
                assert_bytes_equal(from_torch(y[off:off + size]), from_torch(yg), f"step {step} output {g}")
                assert_bytes_equal(from_torch(x.grad[off:off + size]), from_torch(dxg), f"step {step} dgrad {g}")
                assert_bytes_equal(from_torch(getattr(layer, f"weight{g}").grad), from_torch(dwg),
                                   f"step {step} wgrad {g}")
                assert_bytes_equal(from_torch(getattr(layer, f"bias{g}").grad), from_torch(dbg),
                                   f"step {step} dbias {g}")
            else:
                assert not getattr(layer, f"weight{g}").grad.any()
            off += size
            lin = lins[g]
            for name, cols in (("fwd_amax_history", [g, G + g]), ("fwd_scale", [g, G + g]),
                               ("bwd_amax_history", [g]), ("bwd_scale", [g])):
                assert_bytes_equal(from_torch(getattr(layer, name)[..., cols]), from_torch(getattr(lin, name)),
                                   f"step {step} {name} {g}")
    assert (layer.fwd_scale != 1).any()


@pytest.mark.parametrize("recipe_name", ["Float8CurrentScaling", "DelayedScaling", "MXFP8BlockScaling"])
def test_grouped_linear_weight_caching_matches_per_expert_linear(recipe_name):
    """is_first_microbatch=True quantizes the expert weights, False reuses them after the
    weights changed: each expert equals a tep.Linear with the same flags (outputs, gradients,
    DelayedScaling state: weight amax 0 on the cached micro-batch)."""
    recipe = (te.recipe.DelayedScaling(amax_history_len=4) if recipe_name == "DelayedScaling"
              else getattr(te.recipe, recipe_name)())
    splits = [32, 64, 32]
    G, K, N = 3, 32, 32
    _, w, b, _ = _case([1] * G, "bfloat16", True, seed=13, K=K, N=N)
    layer = tep.GroupedLinear(G, K, N, params_dtype=torch.bfloat16, amax_history_len=4)
    _load(layer, w, b)
    lins = []
    for g in range(G):
        lin = tep.Linear(K, N, params_dtype=torch.bfloat16, amax_history_len=4)
        with torch.no_grad():
            lin.weight.copy_(to_torch(w[g]))
            lin.bias.copy_(to_torch(b[g]))
        lins.append(lin)
    for mb, first in enumerate((True, False, False)):
        xs, _, _, dys = _case(splits, "bfloat16", True, seed=30 + mb, K=K, N=N)
        layer.zero_grad()
        x = to_torch(xs).requires_grad_()
        with tep.autocast(recipe=recipe):
            y = layer(x, torch.tensor(splits), is_first_microbatch=first)
        y.backward(to_torch(dys))
        off = 0
        for g, size in enumerate(splits):
            lin = lins[g]
            lin.zero_grad()
            xg = to_torch(xs[off:off + size]).requires_grad_()
            with tep.autocast(recipe=recipe):
                yg = lin(xg, is_first_microbatch=first)
            yg.backward(to_torch(dys[off:off + size]))
            assert_bytes_equal(from_torch(y[off:off + size]), from_torch(yg), f"mb {mb} output {g}")
            assert_bytes_equal(from_torch(x.grad[off:off + size]), from_torch(xg.grad), f"mb {mb} dgrad {g}")
            assert_bytes_equal(from_torch(getattr(layer, f"weight{g}").grad), from_torch(lin.weight.grad),
                               f"mb {mb} wgrad {g}")
            for name, cols in (("fwd_amax_history", [g, G + g]), ("fwd_scale", [g, G + g]),
                               ("bwd_amax_history", [g]), ("bwd_scale", [g])):
                assert_bytes_equal(from_torch(getattr(layer, name)[..., cols]), from_torch(getattr(lin, name)),
                                   f"mb {mb} {name} {g}")
            off += size
        with torch.no_grad():  # an optimizer step between micro-batches: the caches keep the old weights
            for g in range(G):
                getattr(layer, f"weight{g}").mul_(2)
                lins[g].weight.mul_(2)
    with tep.autocast(recipe=recipe):
        x = to_torch(xs)
        cached = layer(x, torch.tensor(splits), is_first_microbatch=False)
        fresh = layer(x, torch.tensor(splits))
    assert not torch.equal(cached, fresh)


def test_grouped_linear_delayed_scaling_state_errors():
    recipe = te.recipe.DelayedScaling(amax_history_len=4)
    with tep.autocast(recipe=recipe):
        with pytest.raises(ValueError,
                           match="twinengine.linear: DelayedScaling\\(amax_history_len=4\\) does not match"):
            tep.GroupedLinear(2, 16, 16, amax_history_len=8)(torch.ones(4, 16), torch.tensor([2, 2]))
        with pytest.raises(ValueError, match="twinengine.grouped_linear: the delayed-scaling state of a GroupedLinear "
                                             "of 2 GEMMs must have shapes"):
            state = (torch.zeros(4, 2), torch.ones(2), torch.zeros(4, 1), torch.ones(1))
            tep.grouped_linear(torch.ones(4, 16), [torch.ones(16, 16)] * 2, torch.tensor([2, 2]), delayed_state=state)
        with pytest.raises(ValueError, match="twinengine.linear: DelayedScaling needs the layer's delayed-scaling"):
            tep.grouped_linear(torch.ones(4, 16), [torch.ones(16, 16)] * 2, torch.tensor([2, 2]))
        with pytest.raises(TypeError, match="twinengine.grouped_linear: DelayedScaling needs per-expert amax"):
            seq = ops.Sequential(ops.GroupedLinear(2, 16, 16))
            seq(torch.ones(4, 16), torch.tensor([2, 2]))


def _fp8_step(layer, x, splits, recipe):
    with tep.autocast(recipe=recipe):
        return layer(x, splits)


@pytest.mark.parametrize("recipe_name", ["Float8CurrentScaling", "Float8BlockScaling"])
def test_grouped_linear_fp8_compiled_matches_eager_without_recompiles(recipe_name):
    recipe = getattr(te.recipe, recipe_name)()
    f = 16 if recipe_name == "Float8BlockScaling" else 1  # 128-row blocks
    torch.manual_seed(0)
    layer = tep.GroupedLinear(3, 128, 128) if f > 1 else tep.GroupedLinear(3, 32, 16)
    compiled = torch.compile(_fp8_step, fullgraph=True)
    x_np = np.random.default_rng(5).standard_normal((24 * f, layer.in_features)).astype(np.float32)
    for i, splits in enumerate(([8, 8, 8], [0, 24, 0], [8, 0, 16] if f > 1 else [3, 0, 21])):
        splits = [s * f for s in splits]
        outs = []
        for fn in (_fp8_step, compiled):
            layer.zero_grad()
            x = to_torch(x_np).requires_grad_()
            if fn is compiled and i > 0:
                with no_recompiles():
                    y = fn(layer, x, torch.tensor(splits, dtype=torch.int32), recipe)
                    y.sum().backward()
            else:
                y = fn(layer, x, torch.tensor(splits, dtype=torch.int32), recipe)
                y.sum().backward()
            outs.append([from_torch(y), from_torch(x.grad)] + [from_torch(p.grad) for p in layer.parameters()])
        for j, (eager, comp) in enumerate(zip(*outs)):
            assert_bytes_equal(comp, eager, f"splits {splits} result {j}")


def test_grouped_linear_matches_float64_math():
    splits = [9, 0, 30, 25]
    x_np, w, b, dy = _case(splits, "float32", True, seed=4)
    x = to_torch(x_np)
    y = tep.grouped_linear(x, [to_torch(wg) for wg in w], splits, [to_torch(bg) for bg in b])
    offs = np.cumsum([0] + splits)
    exact = np.concatenate([x_np[offs[g]:offs[g + 1]].astype(np.float64) @ w[g].T.astype(np.float64) + b[g]
                            for g in range(len(splits))])
    np.testing.assert_allclose(from_torch(y), exact, rtol=1e-5, atol=1e-5)


def test_grouped_linear_compiled_matches_eager_without_recompiles():
    torch.manual_seed(0)
    layer = tep.GroupedLinear(4, 32, 16)
    compiled = torch.compile(layer, fullgraph=True, dynamic=False)
    x_np = np.random.default_rng(1).standard_normal((40, 32)).astype(np.float32)
    for i, splits in enumerate(([10, 10, 10, 10], [0, 40, 0, 0], [3, 0, 30, 7])):
        outs = []
        for fn in (layer, compiled):
            layer.zero_grad()
            x = to_torch(x_np).requires_grad_()
            if fn is compiled and i > 0:
                with no_recompiles():
                    y = fn(x, torch.tensor(splits, dtype=torch.int32))
                    y.sum().backward()
            else:
                y = fn(x, torch.tensor(splits, dtype=torch.int32))
                y.sum().backward()
            outs.append([from_torch(y), from_torch(x.grad)] + [from_torch(p.grad) for p in layer.parameters()])
        for j, (eager, comp) in enumerate(zip(*outs)):
            assert_bytes_equal(comp, eager, f"splits {splits} result {j}")


def test_grouped_linear_basic_op_in_sequential_matches_module():
    torch.manual_seed(0)
    fc1, fc2 = ops.GroupedLinear(3, 16, 32), ops.GroupedLinear(3, 32, 16, bias=False)
    seq = ops.Sequential(fc1, ops.ReLU(), fc2)
    m1, m2 = tep.GroupedLinear(3, 16, 32), tep.GroupedLinear(3, 32, 16, bias=False)
    m1.load_state_dict(fc1.state_dict())
    m2.load_state_dict(fc2.state_dict())
    x_np = np.random.default_rng(2).standard_normal((21, 16)).astype(np.float32)
    splits = torch.tensor([4, 0, 17])
    compiled = torch.compile(lambda x, s: seq(x, s, s), fullgraph=True)
    outs = []
    for fn in (lambda x, s: seq(x, s, s), compiled, lambda x, s: m2(torch.relu(m1(x, s)), s)):
        for p in (*seq.parameters(), *m1.parameters(), *m2.parameters()):
            p.grad = None
        x = to_torch(x_np).requires_grad_()
        y = fn(x, splits)
        y.sum().backward()
        params = (*m1.parameters(), *m2.parameters()) if len(outs) == 2 else (*fc1.parameters(), *fc2.parameters())
        outs.append([from_torch(y), from_torch(x.grad)] + [from_torch(p.grad) for p in params])
    for name, other in (("compiled Sequential", outs[1]), ("modules", outs[2])):
        for j, (a, b) in enumerate(zip(other, outs[0])):
            assert_bytes_equal(a, b, f"{name} result {j}")


def _sum_check_step(x, weights, splits):
    return tep.grouped_linear(x, weights, splits)


@pytest.mark.parametrize("splits, total", [([5, 0, 12, 3], 20), ([5, 0, 20, 4], 29)], ids=str)
def test_grouped_linear_split_sum_must_equal_rows(splits, total):
    """Σ m_splits != rows is an error: eagerly from core (host-visible splits), and under
    torch.compile (splits traced: no host sync) from the kernel when it reads them, with the
    same sentence."""
    x, weights = torch.ones(28, 48), [torch.ones(24, 48)] * 4
    msg = f"m_splits must sum to the 28 rows of the input, got sum {total}"
    with pytest.raises(ValueError, match=f"twinengine.grouped_linear: {msg}"):
        tep.grouped_linear(x, weights, torch.tensor(splits))
    with pytest.raises(ValueError, match=msg):
        tep.GroupedLinear(4, 48, 24)(x, splits)
    compiled = torch.compile(_sum_check_step, fullgraph=True, backend="aot_eager")
    compiled(x, weights, torch.tensor([7, 7, 7, 7], dtype=torch.int32))
    with pytest.raises(ValueError, match=msg):
        compiled(x, weights, torch.tensor(splits, dtype=torch.int32))
    with tep.autocast(recipe=te.recipe.Float8CurrentScaling()):  # the grouped quantize reads them first
        with pytest.raises(ValueError, match=msg):
            torch.compile(_sum_check_step, fullgraph=True, backend="aot_eager")(x, weights,
                                                                                 torch.tensor(splits, dtype=torch.int32))


def test_grouped_linear_basic_op_fp8_matches_module():
    torch.manual_seed(1)
    op = ops.GroupedLinear(3, 32, 16)
    module = tep.GroupedLinear(3, 32, 16)
    module.load_state_dict(op.state_dict())
    x_np = np.random.default_rng(3).standard_normal((40, 32)).astype(np.float32)
    splits = torch.tensor([8, 0, 32])
    outs = []
    for layer in (ops.Sequential(op), module):
        x = to_torch(x_np).requires_grad_()
        with tep.autocast(recipe=te.recipe.Float8CurrentScaling()):
            y = layer(x, splits)
        y.sum().backward()
        outs.append([from_torch(y), from_torch(x.grad)] + [from_torch(p.grad) for p in layer.parameters()])
    for j, (a, b) in enumerate(zip(*outs)):
        assert_bytes_equal(a, b, f"result {j}")


def test_grouped_linear_state_dict_uses_te_names():
    layer = tep.GroupedLinear(3, 8, 4)
    assert sorted(layer.state_dict()) == sorted([f"weight{g}" for g in range(3)] + [f"bias{g}" for g in range(3)])


@pytest.mark.parametrize("call, error, match", [
    (lambda: tep.grouped_linear(torch.ones(6, 4), [torch.ones(2, 4)] * 2, torch.tensor([4, 3])), ValueError,
     "m_splits must sum to the 6 rows of the input, got sum 7"),
    (lambda: tep.grouped_linear(torch.ones(6, 4), [torch.ones(2, 4)] * 2, torch.tensor([4, 1])), ValueError,
     "m_splits must sum to the 6 rows of the input, got sum 5"),
    (lambda: tep.grouped_linear(torch.ones(6, 4), [torch.ones(2, 4)] * 2, torch.tensor([8, -2])), ValueError,
     "m_splits must be >= 0"),
    (lambda: tep.grouped_linear(torch.ones(6, 4), [torch.ones(2, 4)] * 3, torch.tensor([3, 3])), ValueError,
     "expected 2 weights \\(one per GEMM\\), got 3"),
    (lambda: tep.GroupedLinear(3, 4, 2)(torch.ones(6, 4), torch.tensor([3, 3])), ValueError,
     "m_splits must have 3 entries"),
    (lambda: tep.grouped_linear(torch.ones(6, 5), [torch.ones(2, 4)] * 2, torch.tensor([3, 3])), ValueError,
     "x has 5 features"),
])
def test_grouped_linear_rejects_bad_arguments(call, error, match):
    with pytest.raises(error, match=f"twinengine.grouped_linear: {match}"):
        call()


def test_grouped_linear_under_an_unsupported_recipe_raises():
    with tep.autocast(recipe=te.recipe.MXFP8BlockScaling(enable_2d_quantization=True)):
        with pytest.raises(TypeError, match="twinengine.grouped_linear: GroupedLinear runs in high precision or with "
                                            "DelayedScaling, Float8CurrentScaling, 1D MXFP8BlockScaling, "
                                            "Float8BlockScaling or NVFP4BlockScaling"):
            tep.GroupedLinear(2, 128, 128)(torch.ones(256, 128), torch.tensor([128, 128]))


def test_grouped_linear_mxfp8_needs_aligned_splits():
    with tep.autocast(recipe=te.recipe.MXFP8BlockScaling()):
        with pytest.raises(ValueError, match="multiple of 32 \\(pad the blocks: align_size=32\\), got 16"):
            tep.GroupedLinear(2, 32, 32)(torch.ones(64, 32), torch.tensor([16, 48]))


def test_grouped_linear_fp8_block_needs_aligned_splits():
    with tep.autocast(recipe=te.recipe.Float8BlockScaling()):
        with pytest.raises(ValueError, match="multiple of 128 \\(pad the blocks: align_size=128\\), got 64"):
            tep.GroupedLinear(2, 128, 128)(torch.ones(256, 128), torch.tensor([64, 192]))


def test_grouped_kernels_pass_opcheck():
    x, w, b = torch.randn(9, 8), torch.randn(3, 5, 8), torch.randn(3, 5)
    splits = torch.tensor([4, 0, 5], dtype=torch.int32)
    dy = torch.randn(9, 5)
    for op, args in ((torch.ops.twinengine.grouped_gemm, (x, w, splits, b, False, "float32")),
                     (torch.ops.twinengine.grouped_gemm, (dy, w, splits, None, True, "float32")),
                     (torch.ops.twinengine.grouped_gemm_wgrad, (dy, x, splits, False, "float32")),
                     (torch.ops.twinengine.grouped_gemm_wgrad, (torch.ones(1, 9), dy, splits, True, "float32")),
                     (torch.ops.twinengine.grouped_linear, (x.clone().requires_grad_(), w.clone().requires_grad_(),
                                                            splits, b.clone().requires_grad_())),
                     (torch.ops.twinengine.grouped_quantize, (x, splits, None, te.Float8CurrentScalingQuantizer())),
                     (torch.ops.twinengine.grouped_quantize, (x, splits, torch.tensor([2.0, 1.0, 0.5]),
                                                              te.Float8DelayedScalingQuantizer())),
                     (torch.ops.twinengine.grouped_quantize, (torch.randn(48, 32), torch.tensor([16, 0, 32], dtype=torch.int32), None,
                                                              te.NVFP4Quantizer(stochastic_rounding=True),
                                                              torch.tensor([3, 9])))):
        torch.library.opcheck(op, args)
