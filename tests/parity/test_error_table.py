"""Bad inputs reach the user as the same exception type and text in torch eager, torch compiled
(fullgraph=True), JAX eager and jax.jit — raised by the shared core checks before any kernel
(never a KeyError, IndexError, reshape error, ZeroDivisionError, Dynamo's "Observed exception"
or an XLA runtime error)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import twinengine as te
import twinengine.jax as tej
import twinengine.pytorch as tep
from twinengine import recipe as R
from twinengine.jax._ops import activation as jact
from twinengine.jax._ops import attention as jatt
from twinengine.jax._ops import bias as jbias
from twinengine.jax._ops import dropout as jdrop
from twinengine.jax._ops import norm as jnorm
from twinengine.pytorch._ops import activation as tact
from twinengine.pytorch._ops import attention as tatt
from twinengine.pytorch._ops import bias as tbias
from twinengine.pytorch._ops import dropout as tdrop
from twinengine.pytorch._ops import norm as tnorm

MX = te.MXFP8Quantizer("e4m3")
F32 = np.float32


def _np(shape, dtype=np.float32, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) + 2).astype(dtype)


def _bad_qt(quantize, x):
    """A QuantizedTensor whose rowwise data does not fit its shape (a hand-edited checkpoint)."""
    qt = quantize(x, MX)
    return te.QuantizedTensor(rowwise_data=qt.rowwise_data, rowwise_scale_inv=qt.rowwise_scale_inv, quantizer=MX,
                              shape=(32, 64))


def _linear_delayed(frontend, x, w):
    r = R.DelayedScaling(amax_history_len=4)
    if frontend == "torch":
        state = (torch.zeros(8, 2), torch.ones(2), torch.zeros(8, 1), torch.ones(1))
        with tep.autocast(r):
            return tep.linear(x, w, delayed_state=state)
    return tej.dense(x, w.T, recipe=r, state=tej.delayed_scaling_state(8))[0]


# name -> (inputs as NumPy, torch call, jax call, expected exception type, expected text start)
CASES = {
    "quantize_int32": ((_np((32, 32), np.int32),), lambda x: tep.quantize(x, MX).rowwise_data,
                       lambda x: tej.quantize(x, MX).rowwise_data, TypeError, "twinengine.quantize: x must be float32"),
    "quantize_mxfp8_shape": ((_np((16, 32)),), lambda x: tep.quantize(x, MX).rowwise_data,
                             lambda x: tej.quantize(x, MX).rowwise_data, ValueError,
                             "twinengine.quantize: MXFP8 needs"),
    "quantize_delayed_no_scale": ((_np((16, 32)),),
                                  lambda x: tep.quantize(x, te.Float8DelayedScalingQuantizer("e4m3")).amax,
                                  lambda x: tej.quantize(x, te.Float8DelayedScalingQuantizer("e4m3")).amax,
                                  ValueError, "twinengine.quantize: Float8DelayedScalingQuantizer needs scale="),
    "dequantize_inconsistent_qt": ((_np((64, 64)),), lambda x: tep.dequantize(_bad_qt(tep.quantize, x)),
                                   lambda x: tej.dequantize(_bad_qt(tej.quantize, x)), ValueError,
                                   "twinengine.dequantize: the QuantizedTensor's rowwise_data has shape (64, 64)"),
    "record_amax_slots": ((np.zeros((4, 2), F32), np.zeros(3, F32)), tep.record_amax, tej.record_amax, ValueError,
                          "twinengine.record_amax: amax must hold one value per history slot"),
    "update_margin": ((np.zeros((4, 2), F32), np.ones(2, F32)),
                      lambda h, s: tep.update_delayed_scaling(h, s, "e4m3", margin=-1)[1],
                      lambda h, s: tej.update_delayed_scaling(h, s, "e4m3", margin=-1)[1], ValueError,
                      "twinengine.update_delayed_scaling: margin must be an int"),
    "gemm_k_mismatch": ((_np((8, 32)), _np((8, 16))), tep.gemm, tej.gemm, ValueError, "twinengine.gemm:"),
    "linear_k0": ((np.zeros((4, 0), F32), np.zeros((8, 0), F32)), lambda x, w: tep.linear(x, w),
                  lambda x, w: tej.dense(x, w.T), ValueError, "twinengine.linear: in_features must be >= 1"),
    "linear_features_mismatch": ((_np((4, 32)), _np((8, 16))), lambda x, w: tep.linear(x, w),
                                 lambda x, w: tej.dense(x, w.T), ValueError,
                                 "twinengine.linear: x has 32 input features but the weight (8, 16) expects 16"),
    "linear_delayed_history": ((_np((32, 32)), _np((32, 32))), lambda x, w: _linear_delayed("torch", x, w),
                               lambda x, w: _linear_delayed("jax", x, w), ValueError,
                               "twinengine.linear: DelayedScaling(amax_history_len=4) does not match"),
    "permute_1d_routing_map": ((_np((8, 16)), np.zeros(8, np.int32)), lambda x, m: tep.moe_permute(x, m)[0],
                               lambda x, m: tej.moe_permute(x, m)[0], ValueError,
                               "twinengine.moe_permute: routing_map must be 2-D"),
    "permute_float_routing_map": ((_np((8, 16)), np.zeros((8, 2), F32)),
                                  lambda x, m: tep.moe_permute(x, m, 16, "index")[0],
                                  lambda x, m: tej.moe_permute(x, m, 16, "index")[0], TypeError,
                                  "twinengine.moe_permute: a index routing_map must have dtype int32 or int64"),
    "permute_int8_inp": ((_np((8, 16), np.int8), np.zeros((8, 1), np.int32)),
                         lambda x, m: tep.moe_permute(x, m, 8, "index")[0],
                         lambda x, m: tej.moe_permute(x, m, 8, "index")[0], TypeError,
                         "twinengine.moe_permute: inp must have dtype"),
    "permute_bool_inp": ((_np((8, 16)) > 2, np.zeros((8, 1), np.int32)),
                         lambda x, m: tep.moe_permute(x, m, 8, "index")[0],
                         lambda x, m: tej.moe_permute(x, m, 8, "index")[0], TypeError,
                         "twinengine.moe_permute: inp must have dtype"),
    "permute_complex_inp": ((_np((8, 16)).astype(np.complex64), np.zeros((8, 1), np.int32)),
                            lambda x, m: tep.moe_permute(x, m, 8, "index")[0],
                            lambda x, m: tej.moe_permute(x, m, 8, "index")[0], TypeError,
                            "twinengine.moe_permute: inp must have dtype"),
    "sort_chunks_probs_length": ((_np((8, 16)), _np((7,)), np.array([4, 4], np.int32), np.array([1, 0], np.int32)),
                                 lambda x, p, s, i: tep.moe_sort_chunks_by_index_with_probs(x, p, s, i)[0],
                                 lambda x, p, s, i: tej.moe_sort_chunks_by_index_with_probs(x, p, s, i)[0],
                                 ValueError,
                                 "twinengine.moe_sort_chunks_by_index_with_probs: probs must have shape (8,)"),
    "unpermute_int8_inp": ((_np((8, 16), np.int8), np.zeros(8, np.int32)),
                           lambda y, m: tep.moe_unpermute(y, m, map_type="index"),
                           lambda y, m: tej.moe_unpermute(y, m, map_type="index"), TypeError,
                           "twinengine.moe_unpermute: inp must be float32"),
    # The norm / activation / bias / dropout / attention families.
    "layernorm_eps": ((_np((8, 32)), np.ones(32, F32), np.zeros(32, F32)),
                      lambda x, w, b: tnorm.layernorm_fwd(x, w, b, -1.0, False)[0],
                      lambda x, w, b: jnorm.layernorm_fwd(x, w, b, -1.0, False)[0], ValueError,
                      "twinengine.layernorm_fwd: eps must be a float >= 0"),
    "layernorm_quantized_weight": ((_np((8, 32)), np.ones(16, F32), np.zeros(16, F32)),
                                   lambda x, w, b: tnorm.layernorm_fwd(x, w, b, 1e-5, False, quantizer=MX)[3].amax,
                                   lambda x, w, b: jnorm.layernorm_fwd(x, w, b, 1e-5, False, quantizer=MX)[3].amax,
                                   ValueError, "twinengine.layernorm_fwd: weight has shape (16,)"),
    "rmsnorm_weight": ((_np((8, 32)), np.ones(16, F32)), lambda x, w: tnorm.rmsnorm_fwd(x, w, 1e-5, False)[1],
                       lambda x, w: jnorm.rmsnorm_fwd(x, w, 1e-5, False)[1], ValueError,
                       "twinengine.rmsnorm_fwd: weight has shape (16,)"),
    "activation_kind": ((_np((8, 32)),), lambda x: tact.activation_fwd(x, "nope")[0],
                        lambda x: jact.activation_fwd(x, "nope")[0], ValueError,
                        "twinengine.activation_fwd: unknown activation 'nope'"),
    "activation_bwd_shapes": ((_np((8, 32)), _np((8, 16))), lambda dy, x: tact.activation_bwd(dy, x, "gelu"),
                              lambda dy, x: jact.activation_bwd(dy, x, "gelu"), ValueError,
                              "twinengine.activation_bwd:"),
    "bias_add_shape": ((_np((8, 32)), np.ones(16, F32)), tbias.bias_add, jbias.bias_add, ValueError,
                       "twinengine.bias_add: bias must have shape (32,)"),
    "dropout_p": ((_np((8, 32)), np.array([1, 2], np.int64)), lambda x, r: tdrop.dropout_fwd(x, 1.5, r)[0],
                  lambda x, r: jdrop.dropout_fwd(x, 1.5, r)[0], ValueError,
                  "twinengine.dropout_fwd: p must be in [0, 1)"),
    "attention_mask_type": ((_np((1, 8, 1, 32)),), lambda q: tatt.attention_fwd(q, q, q, mask_type="bogus")[0],
                            lambda q: jatt.attention_fwd(q, q, q, mask_type="bogus")[0], ValueError,
                            "twinengine.attention_fwd: mask_type must be one of"),
    # The rope family: freqs wider than the head, an odd rotary dimension, thd without cu_seqlens.
    "rope_freqs_too_wide": ((_np((4, 2, 3, 8)), _np((4, 1, 1, 10))), tep.apply_rotary_pos_emb,
                            tej.apply_rotary_pos_emb, ValueError,
                            "twinengine.apply_rotary_pos_emb: freqs has 10 rotary channels (freqs.shape[-1]), more "
                            "than the head dimension of t (8)"),
    "rope_odd_dim": ((_np((4, 2, 3, 8)), _np((4, 1, 1, 5))), tep.apply_rotary_pos_emb, tej.apply_rotary_pos_emb,
                     ValueError, "twinengine.apply_rotary_pos_emb: the rotary dimension freqs.shape[-1] = 5 must be even"),
    "rope_thd_without_cu_seqlens": ((_np((6, 3, 8)), _np((4, 1, 1, 8))),
                                    lambda t, f: tep.apply_rotary_pos_emb(t, f, "thd"),
                                    lambda t, f: tej.apply_rotary_pos_emb(t, f, "thd"), ValueError,
                                    "twinengine.apply_rotary_pos_emb: tensor_format 'thd' needs cu_seqlens"),
}


def _error(fn, *args):
    with pytest.raises(Exception) as info:
        out = fn(*args)
        jax.block_until_ready(out) if not isinstance(out, torch.Tensor) else None
    return info.type, str(info.value)


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_error_in_torch_eager_compiled_jax_eager_and_jit(name):
    inputs, torch_fn, jax_fn, exc_type, text = CASES[name]
    torch_inputs = [torch.from_numpy(np.ascontiguousarray(a)) for a in inputs]
    jax_inputs = [jnp.asarray(a) for a in inputs]
    torch._dynamo.reset()
    results = {
        "torch eager": _error(torch_fn, *torch_inputs),
        "torch compiled": _error(torch.compile(torch_fn, fullgraph=True, backend="aot_eager"), *torch_inputs),
        "torch compiled dynamic": _error(torch.compile(torch_fn, fullgraph=True, backend="aot_eager", dynamic=True),
                                         *torch_inputs),
        "jax eager": _error(jax_fn, *jax_inputs),
        "jax jit": _error(jax.jit(jax_fn), *jax_inputs),
    }
    for where, (typ, message) in results.items():
        assert typ is exc_type and message.startswith(text), f"{where}: {typ.__name__}: {message}"
    assert len({message for _, message in results.values()}) == 1, results


@pytest.mark.parametrize("dtype", [torch.float64, torch.int8, torch.bool, torch.complex64])
def test_permute_rejects_unmovable_dtypes_eager_and_inductor(dtype):
    x = torch.ones(8, 16, dtype=dtype)
    m = torch.zeros(8, 1, dtype=torch.int32)
    fn = lambda x, m: tep.moe_permute(x, m, 8, "index")[0]  # noqa: E731
    eager = _error(fn, x, m)
    torch._dynamo.reset()
    compiled = _error(torch.compile(fn, fullgraph=True, backend="inductor"), x, m)
    assert eager == compiled and eager[0] is TypeError and "inp must have dtype" in eager[1], (eager, compiled)


def test_linear_module_error_compiled():
    layer = tep.Linear(32, 32)
    r = R.CustomRecipe(lambda role: te.MXFP8Quantizer() if role == "input" else te.Float8CurrentScalingQuantizer())

    def f(x):
        with tep.autocast(r):
            return layer(x)

    x = torch.ones(32, 32)
    eager = _error(f, x)
    torch._dynamo.reset()
    assert _error(torch.compile(f, fullgraph=True, backend="aot_eager"), x) == eager
    assert eager[0] is TypeError and eager[1].startswith("twinengine.linear: CustomRecipe mixes quantizer families")


MODULES = {  # a module built for 16 features called with 32: eager == compiled
    "ops.Sequential": lambda: tep.ops.Sequential(tep.ops.LayerNorm(16), tep.ops.GELU()),
    "LayerNorm": lambda: tep.LayerNorm(16),
    "RMSNorm": lambda: tep.RMSNorm(16),
    "Linear": lambda: tep.Linear(16, 16),
    "LayerNormLinear": lambda: tep.LayerNormLinear(16, 16),
    "LayerNormMLP": lambda: tep.LayerNormMLP(16, 32),
    "ops.Sequential norm+Linear": lambda: tep.ops.Sequential(tep.ops.LayerNorm(16), tep.ops.Linear(16, 16)),
    "ops.Sequential norm+Bias": lambda: tep.ops.Sequential(tep.ops.RMSNorm(16), tep.ops.Bias(16)),
    "ops.Sequential Linear": lambda: tep.ops.Sequential(tep.ops.Linear(16, 16)),
}
# A failed op's stand-in has the shape a valid call would have (a norm's stand-in has the norm's
# width, amaxes are (1,) fp32), and BasicLinear's backward gives a zero stand-in gradient when
# the widths disagree, so the ops after the failing one and the whole backward still trace
# under AOT autograd, and the compiled call raises our error at run time.


@pytest.mark.parametrize("recipe_name", ["Float8CurrentScaling", "MXFP8BlockScaling", "DelayedScaling"])
def test_module_errors_compiled_under_recipes(recipe_name):
    recipe = getattr(R, recipe_name)()
    for module in (tep.LayerNormLinear(32, 32), tep.LayerNormMLP(32, 64),
                   tep.ops.Sequential(tep.ops.Linear(32, 32))):
        x = torch.ones(32, 64, requires_grad=True)

        def f(x):
            with tep.autocast(recipe):
                return module(x)

        eager = _error(f, x)
        torch._dynamo.reset()
        compiled = _error(torch.compile(f, fullgraph=True, backend="aot_eager"), x)
        assert compiled == eager, (type(module).__name__, eager, compiled)
        assert eager[0] is ValueError and eager[1].startswith("twinengine."), eager


@pytest.mark.parametrize("name", sorted(MODULES))
@pytest.mark.parametrize("x_requires_grad", [False, True])
def test_module_errors_compiled_with_and_without_input_grad(name, x_requires_grad):
    # Parameters always require grad; with x too, AOT autograd traces the joint graph of the
    # failing call (formerly BackendCompilerFailed for Linear): still our error, at run time.
    module = MODULES[name]()
    x = torch.ones(8, 32).requires_grad_(x_requires_grad)
    f = lambda x: module(x)  # noqa: E731
    eager = _error(f, x)
    torch._dynamo.reset()
    compiled = _error(torch.compile(f, fullgraph=True, backend="aot_eager"), x)
    assert compiled == eager, (eager, compiled)
    assert eager[0] is ValueError and eager[1].startswith("twinengine."), eager
