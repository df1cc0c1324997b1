"""Quantizer cases shared by the quantize tests, and their reference bytes (through
``twinengine.testing.reference_quantize``, the public bridge from a quantizer spec to the
independent NumPy reference)."""

from __future__ import annotations

import numpy as np
from helpers import fields_as_numpy

import twinengine as te
from twinengine.testing import reference_dequantize as reference_dequantize_qt
from twinengine.testing import reference_quantize as reference_quantize_qt

DELAYED_SCALE = np.array([0.3712], np.float32)
"""Encode scale used for delayed-scaling cases (not a power of two, so rounding matters)."""

PER_TENSOR_QUANTIZERS = [
    te.Float8CurrentScalingQuantizer("e4m3"),
    te.Float8CurrentScalingQuantizer("e5m2"),
    te.Float8CurrentScalingQuantizer("e4m3", force_pow_2_scales=True),
    te.Float8CurrentScalingQuantizer("e4m3", amax_epsilon=0.5),
    te.Float8CurrentScalingQuantizer("e4m3", columnwise=False),
    te.Float8CurrentScalingQuantizer("e5m2", rowwise=False, force_pow_2_scales=True, amax_epsilon=1e-3),
    te.Float8DelayedScalingQuantizer("e4m3"),
    te.Float8DelayedScalingQuantizer("e5m2", columnwise=False),
]

MXFP8_QUANTIZERS = [
    te.MXFP8Quantizer("e4m3"),
    te.MXFP8Quantizer("e5m2"),
    te.MXFP8Quantizer("e4m3", with_2d_quantization=True),
    te.MXFP8Quantizer("e4m3", rowwise=False),
    te.MXFP8Quantizer("e5m2", columnwise=False, with_2d_quantization=True),
]

PER_TENSOR_SHAPES = [(64, 96), (3, 5, 7), (1, 1), (129,), (40, 50)]  # (40, 50): partial 16×16 transpose tiles
MXFP8_SHAPES = [(64, 96), (2, 32, 64), (32, 32)]


def cases() -> list[tuple[te.Quantizer, tuple[int, ...]]]:
    """(quantizer, shape) pairs covering every quantizer with shapes valid for it."""
    return ([(q, s) for q in PER_TENSOR_QUANTIZERS for s in PER_TENSOR_SHAPES]
            + [(q, s) for q in MXFP8_QUANTIZERS for s in MXFP8_SHAPES])


def case_id(value) -> str:
    if isinstance(value, te.Quantizer):
        return value.__fx_repr__()[0].replace(" ", "")
    return str(value)


def scale_for(q: te.Quantizer) -> np.ndarray | None:
    return DELAYED_SCALE if q.scaling_mode == "fp8_delayed" else None


def reference_quantize(x: np.ndarray, q: te.Quantizer) -> dict[str, np.ndarray]:
    """The NumPy reference's fields for quantizing `x` with `q` (uint8 codes for FP8 data)."""
    return fields_as_numpy(reference_quantize_qt(x, q, scale=scale_for(q)))


def reference_dequantize(fields: dict[str, np.ndarray], q: te.Quantizer, shape, dtype: str,
                         columnwise: bool) -> np.ndarray:
    """The reference dequantization of one copy, rounded to `dtype`."""
    return reference_dequantize_qt(te.QuantizedTensor(**fields, quantizer=q, shape=tuple(shape)), dtype,
                                   columnwise=columnwise)
