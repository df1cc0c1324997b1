"""Quantizer specs are values: equality, hash, FX repr, plain fields only."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import twinengine as te
from twinengine import quantizers

ALL_QUANTIZERS = [
    te.Float8CurrentScalingQuantizer("e5m2", columnwise=False, force_pow_2_scales=True, amax_epsilon=1e-3),
    te.Float8DelayedScalingQuantizer("e4m3", rowwise=False),
    te.MXFP8Quantizer("e4m3", with_2d_quantization=True),
    te.Float8BlockQuantizer("e4m3", block_scaling_dim=2),
    te.NVFP4Quantizer(with_rht=True, stochastic_rounding=True),
]


@pytest.mark.parametrize("q", ALL_QUANTIZERS, ids=lambda q: type(q).__name__)
def test_quantizer_value_semantics(q):
    twin = dataclasses.replace(q)
    assert twin == q and hash(twin) == hash(q) and twin is not q
    assert q.with_usage(rowwise=not q.rowwise, columnwise=True) != q


@pytest.mark.parametrize("q", ALL_QUANTIZERS, ids=lambda q: type(q).__name__)
def test_quantizer_fx_repr_evaluates_to_an_equal_value(q):
    source, names = q.__fx_repr__()
    assert eval(source, dict(names)) == q


def test_quantizer_rejects_non_plain_fields():
    with pytest.raises(TypeError, match="never tensors or process groups"):
        te.Float8CurrentScalingQuantizer("e4m3", amax_epsilon=np.zeros(1))
    with pytest.raises(TypeError, match="must be a plain bool"):
        te.MXFP8Quantizer("e4m3", rowwise=np.bool_(True))
    with pytest.raises(TypeError, match="must be a plain str"):
        te.MXFP8Quantizer(object())


def test_quantizer_checks_field_values():
    with pytest.raises(ValueError, match="fp8_dtype must be 'e4m3' or 'e5m2'"):
        te.MXFP8Quantizer("e3m4")
    with pytest.raises(ValueError, match="amax_epsilon must be >= 0"):
        te.Float8CurrentScalingQuantizer(amax_epsilon=-1.0)
    with pytest.raises(ValueError, match="at least one of rowwise and columnwise"):
        te.MXFP8Quantizer(rowwise=False, columnwise=False)
    with pytest.raises(ValueError, match="block_scaling_dim must be 1 or 2"):
        te.Float8BlockQuantizer(block_scaling_dim=3)


def test_quantizer_int_epsilon_is_stored_as_float():
    q = te.Float8CurrentScalingQuantizer(amax_epsilon=1)
    assert type(q.amax_epsilon) is float and q == te.Float8CurrentScalingQuantizer(amax_epsilon=1.0)


def test_every_quantizer_has_a_scaling_mode():
    classes = [quantizers.Quantizer]
    for cls in classes:
        classes.extend(cls.__subclasses__())
    modes = [cls.scaling_mode for cls in classes[1:]]
    assert len(set(modes)) == len(modes) and all(modes)
