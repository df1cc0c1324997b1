"""FP8 block and NVFP4 through both frontends: identical bytes (data, scales, global amaxes,
dequantized values) and identical error text."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from helpers import assert_bytes_equal, assert_quantized_equal, fields_as_numpy, from_torch, make_input, to_torch
from quantize_block_cases import DIVISIBILITY_MESSAGES, NON_MULTIPLE_SHAPES, block_cases, case_id

import twinengine as te
import twinengine.jax as tej
import twinengine.pytorch as tep

_JIT_QUANTIZE = jax.jit(lambda x, q, rng: tej.quantize(x, q, rng=rng), static_argnums=1)

STATES = [np.array([0, 0], np.uint32), np.array([0xDEADBEEF, 0xFFFFFFFF], np.uint32)]


def _both(x: np.ndarray, q: te.Quantizer, state: np.ndarray):
    sr = q.scaling_mode == "nvfp4" and q.stochastic_rounding
    torch_rng = torch.from_numpy(state.astype(np.int64)) if sr else None  # torch: int64
    jax_rng = jnp.asarray(state) if sr else None  # JAX without x64: uint32
    return tep.quantize(to_torch(x), q, rng=torch_rng), _JIT_QUANTIZE(jnp.asarray(x), q, jax_rng)


@pytest.mark.parametrize("state", range(len(STATES)))
@pytest.mark.parametrize("family", ["mixed_scales", "nan_inf", "normal_1e-30"])
@pytest.mark.parametrize("q,shape,dtype", block_cases(), ids=case_id)
def test_quantize_block_nvfp4_bytes_identical_across_frameworks(q, shape, dtype, family, state):
    x = make_input(family, shape, dtype, seed=7)
    qt_torch, qt_jax = _both(x, q, STATES[state])
    assert_quantized_equal(fields_as_numpy(qt_torch), fields_as_numpy(qt_jax), f"torch vs jax {case_id(q)}")
    for columnwise in (False, True):
        if q.columnwise if columnwise else q.rowwise:
            assert_bytes_equal(from_torch(tep.dequantize(qt_torch, torch.bfloat16, columnwise=columnwise)),
                               np.asarray(tej.dequantize(qt_jax, jnp.bfloat16, columnwise=columnwise)),
                               f"dequantize columnwise={columnwise}")


def _error(fn):
    with pytest.raises((TypeError, ValueError)) as info:
        fn()
    return info.type, str(info.value)


BAD_INPUTS = {
    **{f"fp8_block_{s}": (np.zeros(s, np.float32), te.Float8BlockQuantizer(), None)
       for s in NON_MULTIPLE_SHAPES["fp8_block"]},
    **{f"nvfp4_{s}": (np.zeros(s, np.float32), te.NVFP4Quantizer(), None) for s in NON_MULTIPLE_SHAPES["nvfp4"]},
    "rht_fp32": (np.zeros((16, 16), np.float32), te.NVFP4Quantizer(with_rht=True), None),
    "sr_without_rng": (np.zeros((16, 16), np.float32), te.NVFP4Quantizer(stochastic_rounding=True), None),
    "rng_without_sr": (np.zeros((16, 16), np.float32), te.NVFP4Quantizer(), np.array([1, 2], np.uint32)),
    "rng_float": (np.zeros((16, 16), np.float32), te.NVFP4Quantizer(stochastic_rounding=True),
                  np.array([1, 2], np.float32)),
    "rng_shape": (np.zeros((16, 16), np.float32), te.NVFP4Quantizer(stochastic_rounding=True),
                  np.array([1, 2, 3], np.uint32)),
    "block_rng": (np.zeros((128, 128), np.float32), te.Float8BlockQuantizer(), np.array([1, 2], np.uint32)),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_quantize_block_nvfp4_bad_input_same_error_in_both_frameworks(name):
    x, q, rng = BAD_INPUTS[name]
    torch_rng = None if rng is None else torch.from_numpy(rng.astype(np.int64) if rng.dtype == np.uint32 else rng)
    torch_error = _error(lambda: tep.quantize(torch.from_numpy(x), q, rng=torch_rng))
    jax_error = _error(lambda: tej.quantize(jnp.asarray(x), q, rng=None if rng is None else jnp.asarray(rng)))
    assert torch_error == jax_error
    assert torch_error[1].startswith("twinengine.quantize: ")
    if name.startswith(("fp8_block", "nvfp4")):
        assert DIVISIBILITY_MESSAGES[q.scaling_mode] in torch_error[1]


def test_dequantize_nvfp4_missing_amax_same_error_in_both_frameworks():
    q = te.NVFP4Quantizer()
    x = make_input("normal_1", (16, 32), "float32")
    qt_torch, qt_jax = tep.quantize(to_torch(x), q), tej.quantize(jnp.asarray(x), q)
    qt_torch.columnwise_amax = qt_jax.columnwise_amax = None
    torch_error = _error(lambda: tep.dequantize(qt_torch, torch.float32, columnwise=True))
    jax_error = _error(lambda: tej.dequantize(qt_jax, jnp.float32, columnwise=True))
    assert torch_error == jax_error
    assert "columnwise_amax" in torch_error[1]
