"""JAX quantize / dequantize / delayed update: bytes vs the NumPy reference, jit, vmap."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import INPUT_FAMILIES, assert_bytes_equal, assert_quantized_equal, fields_as_numpy, make_input
from quantize_cases import DELAYED_SCALE, case_id, cases, reference_dequantize, reference_quantize, scale_for
from twinengine.testing import reference as ref

import twinengine as te
import twinengine.jax as tej

DTYPES = ["float32", "bfloat16", "float16"]


def _quantize(x_np: np.ndarray, q: te.Quantizer, fn=tej.quantize) -> te.QuantizedTensor:
    scale = scale_for(q)
    return fn(jnp.asarray(x_np), q, scale=None if scale is None else jnp.asarray(scale))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", INPUT_FAMILIES)
@pytest.mark.parametrize("q,shape", cases(), ids=case_id)
def test_quantize_matches_reference(q, shape, family, dtype):
    x = make_input(family, shape, dtype)
    qt = _quantize(x, q)
    assert qt.quantizer == q and qt.shape == shape and qt.dtype == dtype
    assert_quantized_equal(fields_as_numpy(qt), reference_quantize(x, q), f"{case_id(q)} {family} {dtype}")


_JITTED_QUANTIZE = jax.jit(lambda x, q, scale=None: tej.quantize(x, q, scale=scale), static_argnums=1)


@pytest.mark.parametrize("q,shape", cases(), ids=case_id)
def test_quantize_jit_matches_reference(q, shape):
    x = make_input("nan_inf", shape, "bfloat16", seed=2)
    qt = _quantize(x, q, fn=lambda x, q, scale: _JITTED_QUANTIZE(x, q, scale))
    assert_quantized_equal(fields_as_numpy(qt), reference_quantize(x, q), f"jit {case_id(q)}")


@pytest.mark.parametrize("q", [te.Float8CurrentScalingQuantizer("e4m3"), te.MXFP8Quantizer("e5m2"),
                               te.MXFP8Quantizer("e4m3", with_2d_quantization=True)], ids=case_id)
def test_quantize_vmap_quantizes_each_batch_element(q):
    x = make_input("mixed_scales", (3, 64, 32), "float32", seed=4)
    batched = jax.jit(jax.vmap(lambda xi: tej.quantize(xi, q)))(jnp.asarray(x))
    for b in range(x.shape[0]):
        element = {name: arr[b] for name, arr in fields_as_numpy(batched).items()}
        assert_quantized_equal(element, reference_quantize(x[b], q), f"vmap element {b}")


@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("q,shape", cases(), ids=case_id)
def test_dequantize_matches_reference(q, shape, out_dtype):
    x = make_input("mixed_scales", shape, "float32", seed=1)
    qt = _quantize(x, q)
    expected_fields = reference_quantize(x, q)
    for columnwise in (False, True):
        if not (q.columnwise if columnwise else q.rowwise):
            with pytest.raises(ValueError, match="no (rowwise|columnwise) copy"):
                tej.dequantize(qt, out_dtype, columnwise=columnwise)
            continue
        y = jax.jit(tej.dequantize, static_argnums=1, static_argnames="columnwise")(qt, jnp.dtype(out_dtype),
                                                                            columnwise=columnwise)
        assert y.dtype == jnp.dtype(out_dtype) and y.shape == shape
        expected = reference_dequantize(expected_fields, q, shape, out_dtype, columnwise)
        assert_bytes_equal(np.asarray(y), expected, f"dequantize columnwise={columnwise}")


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_update_delayed_scaling_matches_reference(fmt, algo):
    rng = np.random.default_rng(3)
    hist = np.abs(rng.standard_normal((16, 4))).astype(np.float32)
    hist[0, 1] = 0.0
    hist[0, 3] = np.float32(1e-45)
    scale = rng.random(4).astype(np.float32) + np.float32(0.5)
    new_hist, new_scale = jax.jit(tej.update_delayed_scaling, static_argnums=2, static_argnames=("margin", "amax_compute_algo"))(
        jnp.asarray(hist), jnp.asarray(scale), fmt, margin=2, amax_compute_algo=algo)
    exp_hist, exp_scale = ref.delayed_scaling_update_ref(hist, scale, fmt, 2, algo)
    assert_bytes_equal(np.asarray(new_hist), exp_hist, "amax_history")
    assert_bytes_equal(np.asarray(new_scale), exp_scale, "scale")


def test_delayed_scaling_state_is_functional_under_jit():
    q = te.Float8DelayedScalingQuantizer("e4m3")

    @jax.jit
    def step(x, scale, history):
        qt = tej.quantize(x, q, scale=scale)
        history = tej.record_amax(history, qt.amax)
        return tej.update_delayed_scaling(history, scale, "e4m3")

    x = jnp.asarray(make_input("normal_1e3", (16, 16), "float32"))
    history, scale = step(x, jnp.ones(1, jnp.float32), jnp.zeros(4, jnp.float32))
    amax = ref.amax_ref(np.asarray(x))
    assert float(history[-1]) == amax and float(history[0]) == 0.0
    assert_bytes_equal(np.asarray(scale), np.array([np.float32(448.0) / amax], np.float32), "scale after one step")


def test_quantize_mxfp8_inf_block_saturates_despite_xla_ftz():
    """XLA's CPU threads run with FTZ/DAZ; the kernel clears them so an inf block gives ±448."""
    x = np.zeros((32, 32), np.float32)
    x[0, 0], x[0, 1] = np.inf, 3.0
    qt = jax.jit(lambda v: tej.quantize(v, te.MXFP8Quantizer("e4m3", columnwise=False)))(jnp.asarray(x))
    data = np.asarray(qt.rowwise_data).view(np.uint8)
    assert data[0, 0] == 0x7E and data[0, 1] == 0x00
    assert_quantized_equal(fields_as_numpy(qt), ref.quantize_mxfp8_ref(x, "e4m3", True, False), "inf block")


def test_quantize_names_jax_dtype_classes():
    from twinengine.dtypes import canonical_dtype

    assert [canonical_dtype(d) for d in (jnp.float32, jnp.bfloat16, jnp.float8_e5m2)] == [
        "float32", "bfloat16", "float8_e5m2"]
