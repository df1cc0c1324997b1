"""twinengine.pytorch.ops: Sequential of basic ops — fused == unfused bytes for every recipe,
eager == compiled, user-defined ops, modules, bad input."""

from __future__ import annotations

import contextlib
import copy

import numpy as np
import pytest
import torch

import twinengine as te
import twinengine.pytorch as tep
from twinengine.pytorch import ops
from helpers import no_recompiles
from ops_cases import EXTRA_INPUTS, HIDDEN, RECIPES, ROWS, dtype_for, op_lists

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _autocast(recipe):
    return tep.autocast(recipe=recipe) if recipe is not None else contextlib.nullcontext()


def _build(case: str, dtype: torch.dtype, fuse: bool, seed: int = 0) -> ops.Sequential:
    torch.manual_seed(seed)
    seq = ops.Sequential(*op_lists(ops)[case], fuse=fuse).to(dtype)
    with torch.no_grad():
        for p in seq.parameters():
            p.uniform_(-0.5, 0.5)
    return seq


def _run(seq, recipe, x, extras, dy, steps: int = 2):
    """Runs `steps` training steps; returns every output, gradient and buffer as NumPy bytes."""
    results = []
    for _ in range(steps):
        xs = x.clone().requires_grad_(True)
        es = [e.clone().requires_grad_(True) for e in extras]
        for p in seq.parameters():
            p.grad = None
        with _autocast(recipe):
            out = seq(xs, *es)
        outs = out if isinstance(out, tuple) else (out,)
        torch.autograd.backward(outs, [dy] + [torch.ones_like(o) for o in outs[1:]])
        results += [o.detach() for o in outs] + [xs.grad] + [e.grad for e in es]
        results += [p.grad for p in seq.parameters()] + [b.clone() for b in seq.buffers()]
    return results


def _inputs(case: str, dtype: torch.dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, ROWS // 2, HIDDEN, generator=g).to(dtype)
    extras = [torch.randn(2, ROWS // 2, HIDDEN, generator=g).to(dtype) for _ in range(EXTRA_INPUTS[case])]
    dy = torch.randn(2, ROWS // 2, HIDDEN, generator=g).to(dtype)
    return x, extras, dy


def _assert_same(a, b, what):
    assert len(a) == len(b)
    for i, (u, v) in enumerate(zip(a, b)):
        assert (u is None) == (v is None), f"{what}: item {i}"
        if u is not None:
            assert u.dtype == v.dtype and u.shape == v.shape, f"{what}: item {i}"
            assert torch.equal(u.view(torch.uint8) if u.dtype != torch.int64 else u,
                               v.view(torch.uint8) if v.dtype != torch.int64 else v), f"{what}: item {i} differs"


@pytest.mark.parametrize("recipe_name", list(RECIPES))
@pytest.mark.parametrize("case", ["rmsnorm_mlp", "layernorm_quantize", "residual", "linear_tails"])
def test_sequential_fused_matches_unfused_bytes(recipe_name, case):
    recipe, dtype = RECIPES[recipe_name], TORCH_DTYPES[dtype_for(recipe_name)]
    x, extras, dy = _inputs(case, dtype)
    fused = _run(_build(case, dtype, True), recipe, x, extras, dy)
    unfused = _run(_build(case, dtype, False), recipe, x, extras, dy)
    _assert_same(fused, unfused, f"{case}/{recipe_name}")


@pytest.mark.parametrize("activation", ["GELU", "GEGLU", "QGELU", "QGEGLU", "ReLU", "ReGLU", "SReLU", "SReGLU", "SiLU",
                                        "SwiGLU", "ClampedSwiGLU"])
def test_sequential_every_activation_fused_matches_unfused(activation):
    recipe = RECIPES["mxfp8"]
    x, _, dy = _inputs("rmsnorm_mlp", torch.float32)
    runs = []
    for fuse in (True, False):
        torch.manual_seed(0)
        seq = ops.Sequential(*op_lists(ops, activation)["rmsnorm_mlp"], fuse=fuse)
        runs.append(_run(seq, recipe, x, [], dy, steps=1))
    _assert_same(*runs, activation)


def test_sequential_plan_lists_groups_under_the_recipe():
    seq = _build("rmsnorm_mlp", torch.float32, True)
    assert len(seq.plan()) == 3
    with tep.autocast(recipe=RECIPES["mxfp8"]):
        lines = seq.plan()
    assert "writes the quantized input of 1:BasicLinear" in lines[0]
    assert "backward dSwiGLU+dBias+Quantize" in lines[1]
    assert len(ops.Sequential(*op_lists(ops)["rmsnorm_mlp"], fuse=False).plan()) == 6


_COMPILED = {}


def _compiled(recipe_name):
    recipe = RECIPES[recipe_name]

    def step(seq, x):
        with _autocast(recipe):
            return seq(x)

    if recipe_name not in _COMPILED:
        _COMPILED[recipe_name] = (step, torch.compile(step, fullgraph=True))
    return _COMPILED[recipe_name]


@pytest.mark.parametrize("recipe_name", ["high_precision", "fp8_delayed", "mxfp8", "nvfp4"])
def test_sequential_compiled_matches_eager(recipe_name):
    eager, compiled = _compiled(recipe_name)
    dtype = TORCH_DTYPES[dtype_for(recipe_name)]
    seq_e = _build("rmsnorm_mlp", dtype, True)
    seq_c = copy.deepcopy(seq_e)
    x, _, dy = _inputs("rmsnorm_mlp", dtype)
    results = []
    for seq, fn in ((seq_e, eager), (seq_c, compiled)):
        out = []
        for _ in range(2):
            xs = x.clone().requires_grad_(True)
            for p in seq.parameters():
                p.grad = None
            y = fn(seq, xs)
            y.backward(dy)
            out += [y.detach(), xs.grad] + [p.grad for p in seq.parameters()] + [b.clone() for b in seq.buffers()]
        results.append(out)
    _assert_same(*results, f"compiled {recipe_name}")


def test_sequential_dynamic_batch_does_not_recompile():
    seq = _build("rmsnorm_mlp", torch.float32, True)
    recipe = RECIPES["mxfp8"]

    def step(x):
        with tep.autocast(recipe=recipe):
            return seq(x)

    # The batch dimension is marked dynamic. (dynamic=True would also make every Python float the
    # ops read — eps, activation limits, recipe epsilons — symbolic, which the kernels' float
    # attributes cannot take.)
    compiled = torch.compile(step, fullgraph=True)
    x = torch.randn(64, HIDDEN, requires_grad=True)
    torch._dynamo.mark_dynamic(x, 0)
    compiled(x).sum().backward()
    with no_recompiles():
        for rows in (96, 160):
            xs = torch.randn(rows, HIDDEN, requires_grad=True)
            torch._dynamo.mark_dynamic(xs, 0)
            y = compiled(xs)
            y.sum().backward()
            ref = step(xs.detach())
            assert torch.equal(y.detach(), ref.detach())


class Scale2(ops.BasicOperation):
    """A user op: y = 2x, written as the three split pieces only."""

    def op_forward_compute(self, x, params, **kwargs):
        return x * 2, x.shape

    def op_forward_save_ctx(self, ctx, saved):
        ctx.save(saved)
        ctx.factor = 2

    def op_backward(self, ctx, dy):
        assert ctx.saved == dy.shape
        return dy * ctx.factor, ()


class Square(ops.BasicOperation):
    """A user op in the legacy single-method API."""

    def op_forward(self, ctx, x, params, **kwargs):
        ctx.save_for_backward(x)
        return x * x

    def op_backward(self, ctx, dy):
        (x,) = ctx.saved_tensors
        return 2 * x * dy, ()


def test_user_ops_work_inside_compiled_sequential():
    torch.manual_seed(0)
    seq = ops.Sequential(ops.RMSNorm(HIDDEN), Scale2(), Square(), ops.Linear(HIDDEN, HIDDEN))
    x = torch.randn(32, HIDDEN)
    recipe = RECIPES["mxfp8"]

    def step(x):
        with tep.autocast(recipe=recipe):
            return seq(x)

    results = []
    for fn in (step, torch.compile(step, fullgraph=True)):
        xs = x.clone().requires_grad_(True)
        seq.zero_grad()
        y = fn(xs)
        y.sum().backward()
        results.append([y.detach(), xs.grad] + [p.grad.clone() for p in seq.parameters()])
    _assert_same(*results, "user ops")
    # the user ops' math is what they say: compare with the ops written inline in high precision
    ref = ops.Sequential(ops.RMSNorm(HIDDEN), ops.ConstantScale(2.0))
    ref.load_state_dict({"basic_ops.0.weight": seq.basic_ops[0].weight.detach()})
    xs = x.clone().requires_grad_(True)
    inner = ref(xs)
    assert torch.equal(seq.basic_ops[2](seq.basic_ops[1](seq.basic_ops[0](x))), inner * inner)


def test_user_op_defining_both_or_neither_api_is_rejected():
    with pytest.raises(TypeError, match="twinengine.ops: Both defines both op_forward and op_forward_compute"):
        type("Both", (ops.BasicOperation,), {"op_forward": lambda *a: None, "op_forward_compute": lambda *a: None,
                                             "op_backward": lambda *a: None})
    with pytest.raises(TypeError, match="twinengine.ops: Neither defines neither"):
        type("Neither", (ops.BasicOperation,), {"op_backward": lambda *a: None})


def test_bad_input_errors():
    with pytest.raises(ValueError, match="twinengine.Sequential: needs at least one basic operation"):
        ops.Sequential()
    with pytest.raises(TypeError, match="must be twinengine basic operations"):
        ops.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(ValueError, match=r"twinengine.Dropout: p must be a float in \[0, 1\)"):
        ops.Dropout(1.0)
    with pytest.raises(ValueError, match="eps must be a float >= 0"):
        ops.LayerNorm(8, eps=-1.0)
    seq = ops.Sequential(ops.SwiGLU())
    with pytest.raises(ValueError, match="must be even"):
        seq(torch.randn(4, 7))
    seq = ops.Sequential(ops.RMSNorm(16))
    with pytest.raises(ValueError, match="twinengine.rmsnorm"):
        seq(torch.randn(4, 8))
    quantized = tep.quantize(torch.randn(32, 32), te.MXFP8Quantizer())
    with pytest.raises(TypeError, match="twinengine.GELU: received a QuantizedTensor"):
        ops.Sequential(ops.GELU())(quantized)
    with pytest.raises(ValueError, match="extra input"):
        ops.Sequential(ops.AddExtraInput())(torch.randn(4, 4))


def test_zero_rows_give_empty_outputs_and_zero_gradients():
    torch.manual_seed(0)
    seq = ops.Sequential(ops.LayerNorm(HIDDEN), ops.Linear(HIDDEN, 64), ops.GELU())
    x = torch.zeros(0, HIDDEN, requires_grad=True)
    y = seq(x)
    assert y.shape == (0, 64)
    y.sum().backward()
    assert x.grad.shape == (0, HIDDEN)
    for p in seq.parameters():
        assert torch.count_nonzero(p.grad) == 0


def test_dropout_op_uses_and_advances_its_rng_state():
    seq = ops.Sequential(ops.Dropout(0.5, rng_seed=7))
    x = torch.ones(8, 64, requires_grad=True)
    y1 = seq(x)
    y2 = seq(x)
    assert seq.basic_ops[0].rng_state.tolist() == [7, 2]
    assert not torch.equal(y1, y2)
    kept = y1 != 0
    assert torch.all(y1[kept] == 2.0) and 0 < kept.float().mean() < 1
    y1.sum().backward()
    assert torch.equal(x.grad, kept.float() * 2)
    seq.eval()
    assert torch.equal(seq(x), x)


# ---- modules built on the basic ops ------------------------------------------------------

def _mlp_reference(x, m, activation):
    """float64 reference of LayerNormMLP (plain torch)."""
    x = x.double()
    h = torch.nn.functional.layer_norm(x, (x.shape[-1],), m.layer_norm_weight.double(), m.layer_norm_bias.double(),
                                       eps=1e-5)
    h = h @ m.fc1_weight.double().T + m.fc1_bias.double()
    gelu = lambda v: torch.nn.functional.gelu(v, approximate="tanh")  # noqa: E731
    acts = {"gelu": gelu, "relu": torch.relu, "silu": torch.nn.functional.silu, "srelu": lambda v: torch.relu(v) ** 2,
            "qgelu": lambda v: v * torch.sigmoid(1.702 * v)}
    base = activation.replace("glu", "lu").replace("geglu", "gelu") if activation.endswith("glu") else activation
    base = {"swiglu": "silu", "geglu": "gelu", "reglu": "relu", "sreglu": "srelu", "qgeglu": "qgelu"}.get(activation, base)
    if activation in ("swiglu", "geglu", "reglu", "sreglu", "qgeglu"):
        a, b = h.chunk(2, dim=-1)
        h = acts[base](a) * b
    else:
        h = acts[activation](h)
    return h @ m.fc2_weight.double().T + m.fc2_bias.double()


@pytest.mark.parametrize("activation", ["gelu", "geglu", "qgelu", "qgeglu", "relu", "reglu", "srelu", "sreglu", "silu",
                                        "swiglu"])
def test_layernorm_mlp_matches_float64_reference(activation):
    torch.manual_seed(0)
    m = tep.LayerNormMLP(64, 96, activation=activation)
    with torch.no_grad():
        m.layer_norm_weight.uniform_(0.5, 1.5)
        m.layer_norm_bias.uniform_(-0.5, 0.5)
        m.fc1_bias.uniform_(-0.5, 0.5)
        m.fc2_bias.uniform_(-0.5, 0.5)
    x = torch.randn(8, 64, requires_grad=True)
    y = m(x)
    x64 = x.detach().double().requires_grad_(True)
    ref = _mlp_reference(x64, m, activation)
    torch.testing.assert_close(y.double(), ref.detach(), rtol=1e-4, atol=1e-4)
    y.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-4, atol=1e-4)


def test_layernorm_linear_parameters_and_layernorm_output():
    torch.manual_seed(0)
    m = tep.LayerNormLinear(64, 32, normalization="RMSNorm", return_layernorm_output=True)
    names = [n for n, _ in m.named_parameters()]
    assert names == ["layer_norm_weight", "weight", "bias"]
    x = torch.randn(4, 64)
    y, ln_out = m(x)
    assert torch.equal(ln_out, tep.RMSNorm(64)(x))
    torch.testing.assert_close(y, ln_out @ m.weight.T + m.bias, rtol=1e-5, atol=1e-5)
    mlp = tep.LayerNormMLP(64, 32, activation="swiglu")
    assert [n for n, _ in mlp.named_parameters()] == ["layer_norm_weight", "layer_norm_bias", "fc1_weight",
                                                        "fc2_weight", "fc1_bias", "fc2_bias"]
    assert mlp.fc1_weight.shape == (64, 64) and mlp.fc2_weight.shape == (64, 32)


def test_norm_modules_match_torch_functional():
    torch.manual_seed(0)
    x = torch.randn(16, 48)
    ln = tep.LayerNorm(48)
    torch.testing.assert_close(ln(x), torch.nn.functional.layer_norm(x, (48,), eps=1e-5), rtol=1e-5, atol=1e-5)
    rms = tep.RMSNorm(48, zero_centered_gamma=True)
    torch.testing.assert_close(rms(x), torch.nn.functional.rms_norm(x, (48,), eps=1e-5), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_layernorm_mlp_module_matches_its_sequential(recipe_name):
    """The module is the basic-op list with TE-named parameters: the same bytes as the Sequential."""
    recipe, dtype = RECIPES[recipe_name], TORCH_DTYPES[dtype_for(recipe_name)]
    torch.manual_seed(0)
    m = tep.LayerNormMLP(HIDDEN, 128, activation="swiglu", normalization="RMSNorm", params_dtype=dtype,
                         amax_history_len=4)
    seq = ops.Sequential(ops.RMSNorm(HIDDEN), ops.BasicLinear(HIDDEN, 256, amax_history_len=4), ops.Bias(256),
                         ops.SwiGLU(), ops.BasicLinear(128, HIDDEN, amax_history_len=4, rng_seed=1),
                         ops.Bias(HIDDEN)).to(dtype)
    with torch.no_grad():
        for name, src in (("0.weight", m.layer_norm_weight), ("1.weight", m.fc1_weight), ("2.bias", m.fc1_bias),
                          ("4.weight", m.fc2_weight), ("5.bias", m.fc2_bias)):
            seq.get_parameter("basic_ops." + name).copy_(src)
    x, _, dy = _inputs("rmsnorm_mlp", dtype)
    a = _run(m, recipe, x, [], dy)
    b = _run(seq, recipe, x, [], dy)
    _assert_same([t for t in a if t is not None][:3], [t for t in b if t is not None][:3], recipe_name)


def test_rng_advance_op_returns_the_state_and_advances_it():
    state = torch.tensor([5, 9], dtype=torch.int64)
    torch.library.opcheck(torch.ops.twinengine.rng_advance.default, (state.clone(),))
    from twinengine.pytorch._ops.rng import rng_advance

    assert rng_advance(state).tolist() == [5, 9]
    assert state.tolist() == [5, 10]


@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_modules_compile_fullgraph_every_recipe(recipe_name):
    """Every module, every recipe, forward + backward under torch.compile(fullgraph=True) (the
    aot_eager backend: Dynamo and AOTAutograd trace exactly what inductor would get), equal to eager."""
    recipe, dtype = RECIPES[recipe_name], TORCH_DTYPES[dtype_for(recipe_name)]

    def step(module, x):
        with _autocast(recipe):
            out = module(x)
        return out[0] if isinstance(out, tuple) else out

    torch._dynamo.reset()  # the same step code object compiles once per module and recipe
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    builders = [lambda: tep.LayerNormMLP(HIDDEN, 128, activation="sreglu", normalization="RMSNorm", bias=False,
                                         params_dtype=dtype, amax_history_len=4),
                lambda: tep.LayerNormLinear(HIDDEN, HIDDEN, return_layernorm_output=True, params_dtype=dtype,
                                            amax_history_len=4),
                lambda: tep.LayerNorm(HIDDEN, params_dtype=dtype), lambda: tep.RMSNorm(HIDDEN, params_dtype=dtype)]
    x, _, dy = _inputs("rmsnorm_mlp", dtype)
    for build in builders:
        results = []
        for fn in (step, compiled):
            torch.manual_seed(0)
            module = build()
            out = []
            for _ in range(2):
                xs = x.clone().requires_grad_(True)
                module.zero_grad()
                y = fn(module, xs)
                y.backward(dy)
                out += [y.detach(), xs.grad] + [p.grad for p in module.parameters()]
                out += [b.clone() for b in module.buffers()]
            results.append(out)
        _assert_same(*results, f"{type(module).__name__} {recipe_name}")


@pytest.mark.parametrize("recipe_name", ["high_precision", "fp8_delayed", "mxfp8", "nvfp4"])
@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("autocast_inside", [False, True])
def test_checkpointed_blocks_match_plain_runs(recipe_name, reentrant, autocast_inside):
    """torch.utils.checkpoint over LayerNormMLP and a Sequential with Dropout: outputs, gradients and
    every buffer (amax histories, scales, rng offsets) equal the run without checkpointing — the
    recompute replays the recorded call instead of advancing state twice."""
    recipe, dtype = RECIPES[recipe_name], TORCH_DTYPES[dtype_for(recipe_name)]

    def build():
        torch.manual_seed(0)
        mlp = tep.LayerNormMLP(HIDDEN, 128, activation="swiglu", params_dtype=dtype, amax_history_len=4)
        drop = ops.Sequential(ops.Dropout(0.25, rng_seed=5), ops.GELU())
        return mlp, drop

    def body(mlp, drop, x):
        def inner(x):
            with _autocast(recipe) if autocast_inside else contextlib.nullcontext():
                return drop(mlp(x))
        return inner

    x, _, dy = _inputs("rmsnorm_mlp", dtype)
    results = []
    for checkpointed in (False, True):
        mlp, drop = build()
        out = []
        for _ in range(2):
            xs = x.clone().requires_grad_(True)
            fn = body(mlp, drop, xs)
            with _autocast(recipe) if not autocast_inside else contextlib.nullcontext():
                if checkpointed:
                    y = torch.utils.checkpoint.checkpoint(fn, xs, use_reentrant=reentrant)
                else:
                    y = fn(xs)
            y.backward(dy)
            out += [y.detach(), xs.grad] + [p.grad.clone() for p in mlp.parameters()]
            out += [b.clone() for b in list(mlp.buffers()) + list(drop.buffers())]
            mlp.zero_grad()
        results.append(out)
    _assert_same(*results, f"checkpoint {recipe_name} reentrant={reentrant} inside={autocast_inside}")
