"""JAX NVFP4 (NUMERICS.md §7): bytes vs the NumPy reference, stochastic rounding, RHT errors,
dequantize, jit and vmap."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import INPUT_FAMILIES, assert_bytes_equal, assert_quantized_equal, fields_as_numpy, make_input
from quantize_block_cases import (
    DIVISIBILITY_MESSAGES,
    NON_MULTIPLE_SHAPES,
    NVFP4_QUANTIZERS,
    RNG_STATE,
    SR_DRAWS,
    assert_sr_unbiased,
    block_cases,
    check_dequantize_copies,
    case_id,
    reference_quantize,
    rng_for,
    sr_probe_input,
)

import twinengine as te
import twinengine.jax as tej

CASES = [c for c in block_cases() if c[0].scaling_mode == "nvfp4"]
DTYPES = ["float32", "bfloat16", "float16"]


def _dequantize(qt: te.QuantizedTensor, dtype: str, columnwise: bool):
    return tej.dequantize(qt, dtype, columnwise=columnwise)


def _quantize(x_np: np.ndarray, q: te.Quantizer, state: np.ndarray | None = RNG_STATE, fn=tej.quantize):
    rng = rng_for(q, state)
    return fn(jnp.asarray(x_np), q, rng=None if rng is None else jnp.asarray(rng))


@pytest.mark.parametrize("family", INPUT_FAMILIES)
@pytest.mark.parametrize("q,shape,dtype", CASES, ids=case_id)
def test_quantize_nvfp4_matches_reference(q, shape, dtype, family):
    x = make_input(family, shape, dtype)
    qt = _quantize(x, q)
    assert qt.quantizer == q and qt.shape == shape and qt.dtype == dtype
    expected = reference_quantize(x, q, rng_for(q))
    assert_quantized_equal(fields_as_numpy(qt), expected, f"{case_id(q)} {family} {dtype}")


@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("q", NVFP4_QUANTIZERS, ids=case_id)
def test_dequantize_nvfp4_matches_reference(q, out_dtype):
    x = make_input("mixed_scales", (2, 32, 48), "bfloat16", seed=1)
    qt = _quantize(x, q)
    expected_fields = reference_quantize(x, q, rng_for(q))
    check_dequantize_copies(_dequantize, np.asarray, qt, expected_fields, out_dtype)


def test_quantize_nvfp4_sr_int64_state_without_x64_keeps_the_low_bits():
    # Without jax_enable_x64 an int64 [seed, offset] becomes int32 with the same low 32 bits,
    # which is exactly what the kernels read (core/ops/quantize.py RNG_DTYPES).
    q = te.NVFP4Quantizer(stochastic_rounding=True)
    x = make_input("normal_1", (32, 64), "float32", seed=3)
    state = np.array([0xFFFFFFF0, 3_000_000_000], np.int64)
    qt = tej.quantize(jnp.asarray(x), q, rng=jnp.asarray(state))
    assert_quantized_equal(fields_as_numpy(qt), reference_quantize(x, q, state), "int64 state")


def test_quantize_nvfp4_sr_different_offset_different_bytes():
    q = te.NVFP4Quantizer(with_rht=True, stochastic_rounding=True)
    x = make_input("normal_1", (64, 64), "bfloat16", seed=4)
    a = fields_as_numpy(_quantize(x, q, np.array([11, 0], np.uint32)))
    b = fields_as_numpy(_quantize(x, q, np.array([11, 1], np.uint32)))
    for name in ("rowwise_data", "columnwise_data"):
        assert not np.array_equal(b[name], a[name]), f"a different offset gave the same {name}"


def test_quantize_nvfp4_sr_is_unbiased():
    x = sr_probe_input()
    sr_q = te.NVFP4Quantizer(columnwise=False, stochastic_rounding=True)
    draw = jax.jit(lambda x, rng: tej.dequantize(tej.quantize(x, sr_q, rng=rng)))
    samples = np.stack([np.asarray(draw(x, jnp.array([99, offset], jnp.uint32))) for offset in range(SR_DRAWS)])
    rne = np.asarray(tej.dequantize(tej.quantize(x, te.NVFP4Quantizer(columnwise=False))))
    assert_sr_unbiased(samples, rne, x)


def test_quantize_nvfp4_rng_is_required_iff_stochastic_rounding():
    x = jnp.zeros((16, 16))
    with pytest.raises(ValueError, match=r"rounds stochastically and needs rng="):
        tej.quantize(x, te.NVFP4Quantizer(stochastic_rounding=True))
    with pytest.raises(ValueError, match="rng= is only used by quantizers with stochastic rounding"):
        tej.quantize(x, te.NVFP4Quantizer(), rng=jnp.array([1, 2], jnp.uint32))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_quantize_nvfp4_rht_needs_bf16_only_with_columnwise(dtype):
    x = jnp.asarray(make_input("normal_1", (16, 32), dtype))
    with pytest.raises(TypeError, match=f"NVFP4 with_rht=True with columnwise usage needs bfloat16 x.*got {dtype}"):
        tej.quantize(x, te.NVFP4Quantizer(with_rht=True))


@pytest.mark.parametrize("shape", NON_MULTIPLE_SHAPES["nvfp4"], ids=str)
def test_quantize_nvfp4_rejects_non_multiple_shapes(shape):
    with pytest.raises(ValueError, match=f"twinengine.quantize: {DIVISIBILITY_MESSAGES['nvfp4']}"):
        tej.quantize(jnp.zeros(shape), te.NVFP4Quantizer())


# One jitted function for every NVFP4 quantizer: quantize, then dequantize both copies.
def _roundtrip(x, q, rng):
    qt = tej.quantize(x, q, rng=rng)
    return qt, tej.dequantize(qt, jnp.float32), tej.dequantize(qt, jnp.bfloat16, columnwise=True)


_ROUNDTRIP_JIT = jax.jit(_roundtrip, static_argnums=1)


@pytest.mark.parametrize("q", [te.NVFP4Quantizer(with_rht=True, stochastic_rounding=True),
                               te.NVFP4Quantizer(with_2d_quantization=True)], ids=case_id)
def test_quantize_nvfp4_jit_matches_eager(q):
    x = jnp.asarray(make_input("nan_inf", (2, 32, 48), "bfloat16"))
    for offset in (0, 5):
        state = rng_for(q, np.array([3, offset], np.uint32))
        rng = None if state is None else jnp.asarray(state)
        eager, jitted = _roundtrip(x, q, rng), _ROUNDTRIP_JIT(x, q, rng)
        assert_quantized_equal(fields_as_numpy(jitted[0]), fields_as_numpy(eager[0]), "jit vs eager")
        for got, want in zip(jitted[1:], eager[1:]):
            assert_bytes_equal(np.asarray(got), np.asarray(want), "dequantized")


def test_quantize_nvfp4_vmap_quantizes_each_batch_element():
    q = te.NVFP4Quantizer(with_rht=True, stochastic_rounding=True)
    x = make_input("mixed_scales", (3, 32, 16), "bfloat16", seed=4)
    batched = jax.jit(jax.vmap(lambda xi: tej.quantize(xi, q, rng=jnp.asarray(RNG_STATE))))(jnp.asarray(x))
    for b in range(x.shape[0]):
        element = {name: arr[b] for name, arr in fields_as_numpy(batched).items()}
        assert_quantized_equal(element, reference_quantize(x[b], q, RNG_STATE), f"vmap element {b}")
