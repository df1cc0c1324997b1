"""JAX FP8 block scaling (NUMERICS.md §6): bytes vs the NumPy reference, dequantize, errors, jit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import INPUT_FAMILIES, assert_bytes_equal, assert_quantized_equal, fields_as_numpy, make_input
from quantize_block_cases import (
    DIVISIBILITY_MESSAGES,
    FP8_BLOCK_QUANTIZERS,
    NON_MULTIPLE_SHAPES,
    block_cases,
    check_dequantize_copies,
    case_id,
    reference_quantize,
)

import twinengine as te
import twinengine.jax as tej

CASES = [c for c in block_cases() if c[0].scaling_mode == "fp8_block"]
DTYPES = ["float32", "bfloat16", "float16"]


def _dequantize(qt: te.QuantizedTensor, dtype: str, columnwise: bool):
    return tej.dequantize(qt, dtype, columnwise=columnwise)


@pytest.mark.parametrize("family", INPUT_FAMILIES)
@pytest.mark.parametrize("q,shape,dtype", CASES, ids=case_id)
def test_quantize_fp8_block_matches_reference(q, shape, dtype, family):
    x = make_input(family, shape, dtype)
    qt = tej.quantize(jnp.asarray(x), q)
    assert qt.quantizer == q and qt.shape == shape and qt.dtype == dtype
    assert_quantized_equal(fields_as_numpy(qt), reference_quantize(x, q), f"{case_id(q)} {family} {dtype}")


@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("q", FP8_BLOCK_QUANTIZERS, ids=case_id)
def test_dequantize_fp8_block_matches_reference(q, out_dtype):
    x = make_input("mixed_scales", (2, 128, 256), "float32", seed=1)
    qt = tej.quantize(jnp.asarray(x), q)
    expected_fields = reference_quantize(x, q)
    check_dequantize_copies(_dequantize, np.asarray, qt, expected_fields, out_dtype)


@pytest.mark.parametrize("shape", NON_MULTIPLE_SHAPES["fp8_block"], ids=str)
def test_quantize_fp8_block_rejects_non_multiple_shapes(shape):
    with pytest.raises(ValueError, match=f"twinengine.quantize: {DIVISIBILITY_MESSAGES['fp8_block']}"):
        tej.quantize(jnp.zeros(shape), te.Float8BlockQuantizer("e4m3", block_scaling_dim=2))


# One jitted function for every FP8-block quantizer: quantize, then dequantize both copies.
def _roundtrip(x, q):
    qt = tej.quantize(x, q)
    return qt, tej.dequantize(qt, jnp.float32), tej.dequantize(qt, jnp.bfloat16, columnwise=True)


_ROUNDTRIP_JIT = jax.jit(_roundtrip, static_argnums=1)


@pytest.mark.parametrize("q", FP8_BLOCK_QUANTIZERS[:2], ids=case_id)
def test_quantize_fp8_block_jit_matches_eager(q):
    x = jnp.asarray(make_input("nan_inf", (2, 128, 128), "bfloat16"))
    eager, jitted = _roundtrip(x, q), _ROUNDTRIP_JIT(x, q)
    assert_quantized_equal(fields_as_numpy(jitted[0]), fields_as_numpy(eager[0]), "jit vs eager")
    for got, want in zip(jitted[1:], eager[1:]):
        assert_bytes_equal(np.asarray(got), np.asarray(want), "dequantized")
