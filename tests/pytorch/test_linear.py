"""twinengine.pytorch.Linear / autocast: wiring of the three GEMMs, every recipe compiled
(inductor, fullgraph) bit-identical to eager including DelayedScaling state, nested regions,
dynamic batch, pre-quantized weights and error text."""

import contextlib

import numpy as np
import pytest
import helpers
import torch
from reference.sums import canonical_sum_ref

import twinengine.pytorch as te
from twinengine import QuantizedTensor
from twinengine import recipe as R
from twinengine.quantizers import Float8CurrentScalingQuantizer, MXFP8Quantizer

IN, OUT = 128, 128  # FP8 block scaling needs rows and K divisible by 128
RECIPES = {
    "high_precision": None,
    "mxfp8": R.MXFP8BlockScaling(),
    "fp8_current": R.Float8CurrentScaling(),
    "delayed": R.DelayedScaling(amax_history_len=4, margin=1),
    "fp8_block": R.Float8BlockScaling(),
    "custom": R.CustomRecipe(lambda role: MXFP8Quantizer("e5m2" if role == "grad_output" else "e4m3",
                                                         with_2d_quantization=role == "weight")),
}


def make_layer(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return te.Linear(IN, OUT, params_dtype=dtype, amax_history_len=4)


def make_input(seed=1, batch=2, dtype=torch.float32):
    g = np.random.default_rng(seed)
    return torch.from_numpy(g.standard_normal((batch, 64, IN)).astype(np.float32)).to(dtype).requires_grad_()


GRAD_WEIGHTS = torch.linspace(-2.0, 1.0, OUT)


def _forward(layer, x, recipe):
    with te.autocast(enabled=recipe is not None, recipe=recipe):
        y = layer(x)
    return y, (y.float() * GRAD_WEIGHTS).sum()


_COMPILED_FORWARD = torch.compile(_forward, fullgraph=True, backend="inductor")


def _stepper(forward):
    def step(layer, x, recipe):
        y, loss = forward(layer, x, recipe)
        loss.backward()
        return y
    return step


_step = _stepper(_forward)
_COMPILED_STEP = _stepper(_COMPILED_FORWARD)


def run_steps(step, recipe, steps=3):
    layer, x = make_layer(), make_input()
    record = []
    for _ in range(steps):
        layer.zero_grad()
        x.grad = None
        y = step(layer, x, recipe)
        record.append([y.detach().clone(), x.grad.clone(), layer.weight.grad.clone(), layer.bias.grad.clone()]
                      + [b.clone() for b in layer.buffers()])
    return record


def assert_bytes_equal(a, b, what):
    """Byte equality of two torch tensors (helpers.assert_bytes_equal on their NumPy views)."""
    helpers.assert_bytes_equal(helpers.from_torch(a), helpers.from_torch(b), what)


@pytest.mark.parametrize("name", RECIPES)
def test_linear_compiled_matches_eager(name):
    eager = run_steps(_step, RECIPES[name])
    compiled = run_steps(_COMPILED_STEP, RECIPES[name])
    for step, (e, c) in enumerate(zip(eager, compiled)):
        assert len(e) == len(c)
        for index, (te_, tc) in enumerate(zip(e, c)):  # y, dx, dw, db, then every buffer in order
            assert_bytes_equal(te_, tc, f"step {step} output {index}")


def test_linear_delayed_scaling_state_follows_numerics():
    # NUMERICS.md §3 by hand: forward slots record max|x|, max|w| and roll after each forward,
    # the grad slot max|dy| after each backward; scale = (M · 2^-margin) / max(history).
    recipe = RECIPES["delayed"]
    layer, x = make_layer(), make_input()
    _step(layer, x, recipe)
    amax_x, amax_w = x.detach().abs().max(), layer.weight.detach().abs().max()
    amax_dy = GRAD_WEIGHTS.abs().max()
    assert torch.equal(layer.fwd_amax_history[-1], torch.stack([amax_x, amax_w]))
    assert torch.equal(layer.fwd_amax_history[:-1], torch.zeros(3, 2))
    assert torch.equal(layer.bwd_amax_history[-1], amax_dy.reshape(1))
    fwd_num = torch.tensor(448.0 / 2, dtype=torch.float32)
    assert torch.equal(layer.fwd_scale, torch.stack([fwd_num / amax_x, fwd_num / amax_w]))
    assert torch.equal(layer.bwd_scale, (torch.tensor(57344.0 / 2) / amax_dy).reshape(1))


def test_linear_matches_explicit_gemms():
    # The layer is exactly quantize + the three GEMMs of NUMERICS.md §8 with the recipe's quantizers.
    recipe = RECIPES["mxfp8"]
    layer, x = make_layer(), make_input()
    y = _step(layer, x, recipe)
    w, b = layer.weight.detach(), layer.bias.detach()
    x2 = x.detach().reshape(-1, IN)
    qx, qw = te.quantize(x2, recipe.quantizer("input")), te.quantize(w, recipe.quantizer("weight"))
    assert_bytes_equal(y.reshape(-1, OUT), te.gemm(qx, qw, b), "y")
    dy = GRAD_WEIGHTS.expand(x2.shape[0], OUT).contiguous()
    qdy = te.quantize(dy, recipe.quantizer("grad_output"))
    assert_bytes_equal(x.grad.reshape(-1, IN), te.gemm(qdy, qw, b_columnwise=True), "dx")
    assert_bytes_equal(layer.weight.grad, te.gemm(qdy, qx, a_columnwise=True, b_columnwise=True), "dw")
    # db is the canonical column sum Σc of dy (NUMERICS.md §11), as ops.Bias computes it
    assert_bytes_equal(layer.bias.grad, torch.from_numpy(canonical_sum_ref(dy.numpy(), axis=0)), "db")


def test_linear_high_precision_matches_float64():
    layer, x = make_layer(), make_input()
    y = _step(layer, x, None)
    x64, w64 = x.detach().double().reshape(-1, IN), layer.weight.detach().double()
    ref = x64 @ w64.T + layer.bias.detach().double()
    torch.testing.assert_close(y.reshape(-1, OUT).double(), ref, rtol=1e-5, atol=1e-5)
    dy = GRAD_WEIGHTS.double().expand(x64.shape[0], OUT)
    torch.testing.assert_close(layer.weight.grad.double(), dy.T @ x64, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(x.grad.reshape(-1, IN).double(), dy @ w64, rtol=1e-5, atol=1e-5)


def _nested_recipes():
    # Three custom recipes, distinguishable in forward (input/weight) and backward (grad_output).
    return [
        R.CustomRecipe(lambda role: Float8CurrentScalingQuantizer("e5m2" if role == "grad_output" else "e4m3")),
        R.CustomRecipe(lambda role: MXFP8Quantizer("e4m3")),
        R.CustomRecipe(lambda role: Float8CurrentScalingQuantizer("e4m3", force_pow_2_scales=True)),
    ]


def _nested_model(layers, x, recipes):
    a, b, c = recipes
    with te.autocast(recipe=a):
        h = layers[0](x)
        with te.autocast(recipe=b):
            h = layers[1](h)
            with te.autocast(recipe=c):
                h = layers[2](h)
            h = layers[3](h)
        h = layers[4](h)
    return h


def _run_nested(fn, hooks):
    torch.manual_seed(0)
    layers = [te.Linear(IN, IN) for _ in range(5)]
    x = make_input()
    acts = []

    def keep(module, inputs, output):
        acts.append((inputs[0], output))
        output.retain_grad()

    if hooks:
        for layer in layers:
            layer.register_forward_hook(keep)
    y = fn(layers, x, _nested_recipes())
    (y * torch.linspace(-1, 1, IN)).sum().backward()
    return y, layers, acts


def test_linear_nested_custom_recipes_route_quantizers():
    recipes = _nested_recipes()
    y, layers, acts = _run_nested(_nested_model, hooks=True)
    # Each layer's output (forward) and weight gradient (backward) are its own recipe's GEMMs.
    for layer, (inp, out), recipe in zip(layers, acts, [recipes[i] for i in (0, 1, 2, 1, 0)]):
        x2 = inp.detach().reshape(-1, IN)
        qx, qw = te.quantize(x2, recipe.quantizer("input")), te.quantize(layer.weight.detach(), recipe.quantizer("weight"))
        assert_bytes_equal(out.detach().reshape(-1, IN), te.gemm(qx, qw, layer.bias.detach()), "y")
        qdy = te.quantize(out.grad.reshape(-1, IN), recipe.quantizer("grad_output"))
        assert_bytes_equal(layer.weight.grad, te.gemm(qdy, qx, a_columnwise=True, b_columnwise=True), "dw")
    yc, layers_c, _ = _run_nested(torch.compile(_nested_model, fullgraph=True, backend="aot_eager"), hooks=False)
    assert_bytes_equal(y, yc, "nested output eager vs compiled")
    for a, b in zip(layers, layers_c):
        assert_bytes_equal(a.weight.grad, b.weight.grad, "nested dw eager vs compiled")


def test_linear_dynamic_batch_compiles_once():
    torch._dynamo.reset()
    step = _stepper(torch.compile(_forward, fullgraph=True, dynamic=True, backend="aot_eager"))
    layer = make_layer()
    for batch in (2, 3, 5):
        x = make_input(batch=batch)
        with helpers.no_recompiles() if batch != 2 else contextlib.nullcontext():
            y = step(layer, x, RECIPES["mxfp8"])
        ref_layer, ref_x = make_layer(), make_input(batch=batch)
        assert_bytes_equal(y, _step(ref_layer, ref_x, RECIPES["mxfp8"]), f"batch {batch}")


def test_linear_quantized_weight_eager_and_compiled():
    recipe = RECIPES["fp8_current"]

    def run(fn):
        layer, x = make_layer(), make_input()
        qw = te.quantize(layer.weight.detach(), recipe.quantizer("weight"))
        del layer.weight
        layer.weight = qw
        y = fn(layer, x, recipe)
        return y, x.grad, layer.bias.grad, qw

    y, dx, db, qw = run(_step)
    yc, dxc, dbc, _ = run(_stepper(torch.compile(_forward, fullgraph=True, backend="aot_eager")))
    for a, b, what in ((y, yc, "y"), (dx, dxc, "dx"), (db, dbc, "db")):
        assert_bytes_equal(a, b, what)
    x2 = make_input().detach().reshape(-1, IN)
    assert_bytes_equal(y.reshape(-1, OUT), te.gemm(te.quantize(x2, recipe.quantizer("input")), qw, make_layer().bias.detach()),
                       "y vs explicit")


@pytest.mark.parametrize("recipe", [R.MXFP8BlockScaling(), R.NVFP4BlockScaling()], ids=["mxfp8", "nvfp4"])
def test_linear_bf16_compiled_matches_eager(recipe):
    # NVFP4BlockScaling: RHT on the columnwise copies (bf16 only), 2D weights, stochastic
    # rounding of dy from the layer's rng_state, which advances per call (two steps differ).
    # MXFP8 leaves rng_state alone.
    def run(step):
        layer, x = make_layer(dtype=torch.bfloat16), make_input(dtype=torch.bfloat16)
        out = []
        for _ in range(2):
            layer.zero_grad()
            x.grad = None
            y = step(layer, x, recipe)
            out.append([t.detach().clone() for t in (y, x.grad, layer.weight.grad, layer.bias.grad, layer.rng_state)])
        return out

    eager, compiled = run(_step), run(_COMPILED_STEP)
    for e, c in zip(eager, compiled):
        for a, b in zip(e, c):
            assert_bytes_equal(a, b, "bf16")
    # only recipes that round stochastically draw from (and advance) rng_state
    assert torch.equal(eager[1][4], torch.tensor([0, 2] if getattr(recipe.quantizer("grad_output"), "stochastic_rounding", False)
                                                 else [0, 0]))


def test_linear_rejects_mixed_quantizer_families():
    recipe = R.CustomRecipe(lambda role: MXFP8Quantizer() if role == "input" else Float8CurrentScalingQuantizer())
    with pytest.raises(TypeError, match="twinengine.linear: CustomRecipe mixes quantizer families"):
        _step(make_layer(), make_input(), recipe)


def test_linear_custom_nvfp4_rht_rejects_fp32_input():
    # NVFP4BlockScaling turns the RHT off for fp32/fp16 (tests/parity/test_nvfp4_dtypes.py); a
    # CustomRecipe asking for it explicitly on fp32 gets the quantizer's error.
    from twinengine.quantizers import NVFP4Quantizer
    recipe = R.CustomRecipe(lambda role: NVFP4Quantizer(with_rht=role != "weight"))
    with pytest.raises(TypeError, match="twinengine.quantize: NVFP4 with_rht=True with columnwise usage needs bfloat16"):
        _step(make_layer(), make_input(), recipe)


def test_linear_stochastic_rounding_needs_rng():
    layer = make_layer(dtype=torch.bfloat16)
    with te.autocast(recipe=R.NVFP4BlockScaling()):
        with pytest.raises(ValueError, match="twinengine.linear: the recipe's grad_output quantizer rounds stochastically"):
            te.linear(make_input(dtype=torch.bfloat16), layer.weight, layer.bias)


def test_linear_rejects_history_length_mismatch():
    with pytest.raises(ValueError, match=r"twinengine.linear: DelayedScaling\(amax_history_len=1024\) does not match"):
        _step(make_layer(), make_input(), R.DelayedScaling())


def test_linear_rejects_quantized_weight_without_recipe():
    layer = make_layer()
    qw = te.quantize(layer.weight.detach(), MXFP8Quantizer())
    del layer.weight
    layer.weight = qw
    with pytest.raises(TypeError, match="twinengine.linear: a QuantizedTensor weight needs an active"):
        layer(make_input())


def test_autocast_rejects_missing_recipe():
    with pytest.raises(TypeError, match="twinengine.autocast: enabled=True needs recipe="):
        te.autocast()


def test_linear_opcheck():
    layer, x = make_layer(), make_input()
    w, b = layer.weight.detach().requires_grad_(), layer.bias.detach().requires_grad_()
    torch.library.opcheck(torch.ops.twinengine.linear.default, (x, w, b))
    q = MXFP8Quantizer()
    torch.library.opcheck(torch.ops.twinengine.linear_quantized.default,
                          (x, w, b, None, None, None, None, q, q, q, None, None, None, None, 0, "max"),
                          # test_aot_dispatch_dynamic sums every output, and torch cannot sum float8 ones;
                          # the compiled-vs-eager tests above cover AOT dispatch.
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
