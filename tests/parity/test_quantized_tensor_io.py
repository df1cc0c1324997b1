"""QuantizedTensor save / load: pickle (float8 through a uint8 codec: plain pickle of a float8
torch tensor fails upstream), torch.save + torch.load(weights_only=True) of state_dict(), and
JAX arrays — the loaded tensor dequantizes to the same bytes."""

from __future__ import annotations

import io
import pickle

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from helpers import assert_quantized_equal, fields_as_numpy

import twinengine as te
import twinengine.jax as tej
import twinengine.pytorch as tep

QUANTIZERS = [te.Float8CurrentScalingQuantizer("e5m2"), te.MXFP8Quantizer("e4m3"), te.NVFP4Quantizer(),
              te.Float8BlockQuantizer("e4m3", block_scaling_dim=2)]
X = np.random.default_rng(0).standard_normal((128, 128)).astype(np.float32)


def _same(a, b, what):
    assert a.quantizer == b.quantizer and tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype, what
    assert_quantized_equal(fields_as_numpy(a), fields_as_numpy(b), what)


@pytest.mark.parametrize("q", QUANTIZERS, ids=lambda q: q.scaling_mode)
def test_torch_quantized_tensor_pickle_and_state_dict_round_trip(q):
    qt = tep.quantize(torch.from_numpy(X), q)
    _same(pickle.loads(pickle.dumps(qt)), qt, "pickle")
    buf = io.BytesIO()
    torch.save(qt.state_dict(), buf)
    buf.seek(0)
    loaded = te.QuantizedTensor.from_state_dict(torch.load(buf, weights_only=True))
    _same(loaded, qt, "torch.save(state_dict) / torch.load(weights_only=True)")
    assert torch.equal(tep.dequantize(loaded), tep.dequantize(qt))


@pytest.mark.parametrize("q", QUANTIZERS, ids=lambda q: q.scaling_mode)
def test_jax_quantized_tensor_pickle_and_state_dict_round_trip(q):
    qt = tej.quantize(jnp.asarray(X), q)
    _same(pickle.loads(pickle.dumps(qt)), qt, "pickle")
    state = {k: (np.asarray(v) if hasattr(v, "shape") else v) for k, v in qt.state_dict().items()}
    loaded = te.QuantizedTensor.from_state_dict(pickle.loads(pickle.dumps(state)))
    _same(loaded, qt, "state_dict as NumPy")
    assert np.array_equal(np.asarray(tej.dequantize(loaded)), np.asarray(tej.dequantize(qt)))


def test_from_state_dict_rejects_unknown_quantizer_types():
    state = tep.quantize(torch.from_numpy(X), QUANTIZERS[0]).state_dict()
    state["quantizer"] = {**state["quantizer"], "type": "QuantizedTensor"}
    with pytest.raises(ValueError, match="is not a quantizer type"):
        te.QuantizedTensor.from_state_dict(state)
