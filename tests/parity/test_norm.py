"""The same NumPy inputs through both frontends' norm functions: identical bytes forward, backward
and fused-quantized, and identical error text for bad input."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from helpers import assert_bytes_equal, assert_quantized_equal, fields_as_numpy, from_torch, to_torch
from norm_cases import (DTYPES, EPS, FUSED_QUANTIZERS, FUSED_SHAPE, NORMS, case_id, fused_dtype, make_param, make_rows,
                        param_dtype, quantize_kwargs, run_norm)

import twinengine as te
from twinengine.jax._ops import norm as jn
from twinengine.pytorch._ops import norm as tn


def _both(norm, x, weight, bias, zcg, dy, q=None):
    """(torch results, jax results) as flat lists of NumPy arrays, plus both qt field dicts."""
    def conv(a, f):
        return None if a is None else f(a)

    t_kwargs = quantize_kwargs(q, torch.from_numpy) if q is not None else {}
    j_kwargs = quantize_kwargs(q, jnp.asarray) if q is not None else {}
    t_fwd, t_qt, t_bwd = run_norm(tn, norm, *(conv(a, to_torch) for a in (x, weight, bias)), zcg, to_torch(dy),
                                  quantizer=q, **t_kwargs)
    j_fwd, j_qt, j_bwd = jax.jit(lambda x, w, b, dy: run_norm(jn, norm, x, w, b, zcg, dy, quantizer=q, **j_kwargs))(
        *(conv(a, jnp.asarray) for a in (x, weight, bias, dy)))
    t = [from_torch(a) for a in (*t_fwd, *t_bwd)]
    j = [np.asarray(a) for a in (*j_fwd, *j_bwd)]
    return t, j, t_qt, j_qt


@pytest.mark.parametrize("family", ["mixed", "nan_inf"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", NORMS)
def test_norm_bytes_identical_across_frameworks(norm, dtype, family):
    for k, zcg, shift in ((1, False, 0), (33, True, 1), (100, False, 2)):
        x = make_rows(45, k, dtype, family, seed=k)
        weight = make_param(k, param_dtype(dtype, shift), k) if norm != "l2norm" else None
        bias = make_param(k, param_dtype(dtype, shift), k + 1) if norm == "layernorm" else None
        dy = make_rows(45, k, dtype, "mixed", seed=k + 2)
        t, j, _, _ = _both(norm, x, weight, bias, zcg and norm != "l2norm", dy)
        for i, (a, b) in enumerate(zip(t, j, strict=True)):
            assert_bytes_equal(a, b, f"{norm} {dtype} K={k} output {i}: torch vs jax")


@pytest.mark.parametrize("q", FUSED_QUANTIZERS, ids=case_id)
@pytest.mark.parametrize("norm", NORMS)
def test_norm_fused_quantize_bytes_identical_across_frameworks(norm, q):
    dtype = fused_dtype(q)
    k = FUSED_SHAPE[-1]
    x = make_rows(128, k, dtype, "mixed", seed=9).reshape(FUSED_SHAPE)
    weight = make_param(k, "float32", 9) if norm != "l2norm" else None
    bias = make_param(k, "bfloat16", 10) if norm == "layernorm" else None
    t, j, t_qt, j_qt = _both(norm, x, weight, bias, True, x, q)
    for i, (a, b) in enumerate(zip(t, j, strict=True)):
        assert_bytes_equal(a, b, f"{norm} output {i}: torch vs jax")
    assert_quantized_equal(fields_as_numpy(t_qt), fields_as_numpy(j_qt), f"{norm} {case_id(q)}: torch vs jax")


# ---- bad input: the same error text from core in both frontends ---------------------------

def _f32(*shape):
    return np.zeros(shape, np.float32)


BAD_CALLS = {
    # name: (norm op, positional arrays, kwargs, message fragment)
    "normalized_shape": ("layernorm_fwd", (_f32(4, 8), _f32(7), _f32(8)), {}, "normalized shape must match"),
    "bias_shape": ("layernorm_fwd", (_f32(4, 8), _f32(8), _f32(8, 1)), {}, "normalized shape must match"),
    "rms_weight_shape": ("rmsnorm_fwd", (_f32(4, 8), _f32(4)), {}, "normalized shape must match"),
    "x_int": ("rmsnorm_fwd", (np.zeros((4, 8), np.int32), _f32(8)), {}, "x must be float32"),
    "weight_float64": ("rmsnorm_fwd", (_f32(4, 8), np.zeros(8, np.float64)), {}, "weight must be float32"),
    "rank0": ("l2norm_fwd", (_f32(),), {}, "rank >= 1"),
    "k0": ("l2norm_fwd", (_f32(3, 0),), {}, "normalized size"),
    "eps_negative": ("l2norm_fwd", (_f32(4, 8),), {"eps": -1e-5}, "eps must be a float >= 0"),
    "eps_nan": ("rmsnorm_fwd", (_f32(4, 8), _f32(8)), {"eps": float("nan")}, "eps must be a float >= 0"),
    "dy_shape": ("layernorm_bwd", (_f32(4, 9), _f32(4, 8), _f32(4), _f32(4), _f32(8)), {}, "dy must have x's shape"),
    "mu_shape": ("layernorm_bwd", (_f32(4, 8), _f32(4, 8), _f32(5), _f32(4), _f32(8)), {}, "mu must have shape"),
    "rstd_dtype": ("rmsnorm_bwd", (_f32(4, 8), _f32(4, 8), np.zeros(4, np.float16), _f32(8)), {}, "rstd must be float32"),
    "l2_rstd_shape": ("l2norm_bwd", (_f32(2, 4, 8), _f32(2, 4, 8), _f32(8)), {}, "rstd must have shape"),
    "quantizer_shape": ("rmsnorm_fwd", (_f32(48, 64), _f32(64)), {"quantizer": te.MXFP8Quantizer()},
                        "MXFP8 needs the flattened"),
    "quantizer_empty": ("l2norm_fwd", (_f32(0, 64),), {"quantizer": te.Float8CurrentScalingQuantizer()},
                        "must not be empty"),
    "quantizer_missing_scale": ("l2norm_fwd", (_f32(4, 8),), {"quantizer": te.Float8DelayedScalingQuantizer()},
                                "needs scale="),
    "quantizer_missing_rng": ("rmsnorm_fwd", (np.zeros((16, 16), np.float32), _f32(16)),
                              {"quantizer": te.NVFP4Quantizer(stochastic_rounding=True)}, "needs rng="),
    "scale_without_quantizer": ("l2norm_fwd", (_f32(4, 8),), {"scale": np.ones(1, np.float32)},
                                "only used with quantizer="),
}

_DEFAULTS = {"layernorm_fwd": {"eps": EPS, "zero_centered_gamma": False}, "rmsnorm_fwd": {"eps": EPS,
             "zero_centered_gamma": False}, "l2norm_fwd": {"eps": EPS}, "layernorm_bwd": {"zero_centered_gamma": False},
             "rmsnorm_bwd": {"zero_centered_gamma": False}, "l2norm_bwd": {}}


def _error(fn):
    with pytest.raises((TypeError, ValueError)) as info:
        fn()
    return info.type, str(info.value)


def _call(api, op, arrays, kwargs, convert):
    params = dict(_DEFAULTS[op])
    params.update(kwargs)
    positional = [convert(a) for a in arrays]
    keyword = {name: params.pop(name) for name in ("quantizer", "scale", "rng") if name in params}
    if "scale" in keyword:
        keyword["scale"] = convert(keyword["scale"])
    return getattr(api, op)(*positional, *params.values(), **keyword)


@pytest.mark.parametrize("name", sorted(BAD_CALLS))
def test_norm_bad_input_same_error_in_both_frameworks(name):
    op, arrays, kwargs, fragment = BAD_CALLS[name]
    torch_error = _error(lambda: _call(tn, op, arrays, kwargs, torch.from_numpy))
    needs_x64 = any(a.dtype == np.float64 for a in arrays)
    with jax.enable_x64(needs_x64):  # without x64, JAX would silently narrow float64
        jax_error = _error(lambda: _call(jn, op, arrays, kwargs, jnp.asarray))
    assert torch_error == jax_error
    assert fragment in torch_error[1], torch_error[1]
    prefix = "twinengine.quantize: " if name.startswith("quantizer_") else f"twinengine.{op}: "
    assert torch_error[1].startswith(prefix), torch_error[1]
