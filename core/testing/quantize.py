"""The NumPy reference applied to a quantizer spec: ``reference_quantize(x, quantizer)`` gives the
QuantizedTensor (NumPy arrays) the kernels must produce byte for byte, and
``reference_dequantize`` its decoded values. The reference itself (``reference.py``) never sees a
spec; this bridge only reads the spec's fields."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..quantized_tensor import QuantizedTensor
from ..quantizers import Quantizer
from . import reference as ref


def _numpy_dtype(name: str) -> np.dtype:
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name, name))


def reference_quantize(x: np.ndarray, quantizer: Quantizer, *, scale: Any = None, rng: Any = None) -> QuantizedTensor:
    """`x` (a NumPy float32 / bfloat16 / float16 array) quantized by the NumPy reference as
    `quantizer` describes: a QuantizedTensor of NumPy arrays (FP8 data with its ml_dtypes
    float8 dtype, NVFP4 data packed uint8), independent of every kernel.

    scale: the delayed-scaling encode scale (float32 (1,)); rng: [seed, offset] for NVFP4
    stochastic rounding (NUMERICS.md §7 step 9).
    Raises:
        ValueError: a missing scale / rng the quantizer needs.
    """
    x = np.asarray(x)
    mode = quantizer.scaling_mode
    rowwise, columnwise = quantizer.rowwise, quantizer.columnwise
    if mode == "fp8_current":
        fields = ref.quantize_fp8_current_ref(x, quantizer.fp8_dtype, rowwise, columnwise, quantizer.amax_epsilon,
                                              quantizer.force_pow_2_scales)
    elif mode == "fp8_delayed":
        if scale is None:
            raise ValueError("reference_quantize: Float8DelayedScalingQuantizer needs scale=")
        fields = ref.quantize_fp8_delayed_ref(x, quantizer.fp8_dtype, np.asarray(scale, np.float32), rowwise,
                                              columnwise)
    elif mode == "mxfp8":
        fields = ref.quantize_mxfp8_ref(x, quantizer.fp8_dtype, rowwise, columnwise, quantizer.with_2d_quantization)
    elif mode == "fp8_block":
        fields = ref.quantize_fp8_block_ref(x, quantizer.fp8_dtype, rowwise, columnwise, quantizer.block_scaling_dim,
                                            quantizer.force_pow_2_scales, quantizer.amax_epsilon)
    elif mode == "nvfp4":
        if quantizer.stochastic_rounding and rng is None:
            raise ValueError("reference_quantize: a stochastically rounding NVFP4Quantizer needs rng=[seed, offset]")
        state = (0, 0) if rng is None else (int(np.asarray(rng).reshape(-1)[0]), int(np.asarray(rng).reshape(-1)[1]))
        fields = ref.quantize_nvfp4_ref(x, rowwise, columnwise, quantizer.with_rht, quantizer.with_2d_quantization,
                                        quantizer.stochastic_rounding, state)
    else:
        raise ValueError(f"reference_quantize: no reference for {type(quantizer).__name__}")
    fp8 = getattr(quantizer, "fp8_dtype", None)
    if fp8 is not None:
        data_dtype = _numpy_dtype("float8_e4m3fn" if fp8 == "e4m3" else "float8_e5m2")
        fields = {name: (a.view(data_dtype) if name.endswith("_data") else a) for name, a in fields.items()}
    return QuantizedTensor(**fields, quantizer=quantizer, shape=tuple(x.shape), dtype=ref._input_dtype_name(x))


def reference_dequantize(qt: QuantizedTensor, dtype: str = "float32", *, columnwise: bool = False) -> np.ndarray:
    """The reference decoding of one copy of `qt` (arrays of any framework), rounded to `dtype`."""
    from .compare import to_numpy

    q, shape = qt.quantizer, tuple(qt.shape)
    prefix = "columnwise" if columnwise else "rowwise"
    data = to_numpy(getattr(qt, f"{prefix}_data"))
    data = data.view(np.uint8) if data.dtype.itemsize == 1 else data
    scale = to_numpy(getattr(qt, f"{prefix}_scale_inv"))
    mode = q.scaling_mode
    if mode in ("fp8_current", "fp8_delayed"):
        out = ref.dequantize_fp8_ref(data, scale, q.fp8_dtype, shape, columnwise)
    elif mode == "mxfp8":
        out = ref.dequantize_mxfp8_ref(data, scale, q.fp8_dtype, shape, columnwise)
    elif mode == "fp8_block":
        out = ref.dequantize_fp8_block_ref(data, scale, q.fp8_dtype, shape, columnwise, q.block_scaling_dim)
    elif mode == "nvfp4":
        amax = to_numpy(qt.columnwise_amax if columnwise else qt.amax)
        out = ref.dequantize_nvfp4_ref(data, scale, amax, shape, columnwise)
    else:
        raise ValueError(f"reference_dequantize: no reference for {type(q).__name__}")
    return ref.round_to_dtype_ref(out, dtype)
