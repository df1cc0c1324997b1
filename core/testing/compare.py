"""assert_quantized_equal: two QuantizedTensors (torch, JAX or NumPy arrays) equal bit for bit —
data, scales (zero padding included) and amaxes — with a report of the first difference that a
person can read: its index, both raw codes and decoded values, the block it belongs to and that
block's scales."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ops.quantize import scale_extent
from ..quantized_tensor import ARRAY_FIELDS, QuantizedTensor
from . import reference as ref


def to_numpy(array: Any) -> np.ndarray:
    """A NumPy array with the bytes and dtype of a torch tensor, JAX array or NumPy array
    (bfloat16 / float8 as ml_dtypes dtypes); torch tensors are copied to the host."""
    import ml_dtypes

    if type(array).__module__.startswith("torch"):
        import torch

        t = array.detach().cpu().contiguous()
        name = str(t.dtype).removeprefix("torch.")
        raw = t.reshape(-1).view(torch.uint8).numpy()
        return raw.view(np.dtype(getattr(ml_dtypes, name, name))).reshape(tuple(t.shape))
    return np.asarray(array)


def _hex(value: np.ndarray) -> str:
    return "0x" + np.ascontiguousarray(value).reshape(1).view(np.uint8)[::-1].tobytes().hex()


def _data_decoder(qt: QuantizedTensor):
    """code (uint8) -> text of the decoded element value(s)."""
    q = qt.quantizer
    if q.scaling_mode == "nvfp4":
        def decode(code):
            lo, hi = ref.decode_e2m1_ref(np.array([code & 0xF, code >> 4], np.uint8))
            return f"E2M1 pair (low nibble {lo:g}, high nibble {hi:g})"
        return decode
    fmt = q.fp8_dtype

    def decode(code):
        return f"{fmt.upper()} {float(ref.decode_fp8_ref(np.array([code], np.uint8), fmt)[0]):g}"
    return decode


def _scale_value(mode: str, code: np.ndarray) -> str:
    if mode == "mxfp8":
        return f"E8M0 {int(code)} = 2^{int(code) - 127}"
    if mode == "nvfp4":
        return f"E4M3 {float(ref.decode_fp8_ref(np.array([int(code)], np.uint8), 'e4m3')[0]):g}"
    return f"{float(code):.9g}"


def _scale_factor(mode: str, code: np.ndarray) -> float:
    """The decode multiplier of an FP8-format scale entry (E8M0 code or fp32 scale_inv)."""
    return float(ref.e8m0_to_float_ref(np.array([code], np.uint8))[0]) if mode == "mxfp8" else float(code)


def _scale_index(qt: QuantizedTensor, columnwise: bool, i: int, j: int) -> tuple[tuple[int, ...], str]:
    """(index into the copy's scale_inv, words naming the block) for element (i, j) of the copy's
    data flattened to 2-D (NUMERICS.md §4–§7 layouts)."""
    q = qt.quantizer
    mode, two_d = q.scaling_mode, bool(getattr(q, "with_2d_quantization", False)) or getattr(q, "block_scaling_dim", 1) == 2
    if mode in ("fp8_current", "fp8_delayed"):
        return (0,), "the whole tensor (per-tensor scale)"
    if mode == "mxfp8":
        if two_d:
            return ((i // 32, j) if columnwise else (i, j // 32)), \
                f"32x32 tile rows {i // 32 * 32}..{i // 32 * 32 + 31}, cols {j // 32 * 32}..{j // 32 * 32 + 31}"
        if columnwise:
            return (i // 32, j), f"32x1 block rows {i // 32 * 32}..{i // 32 * 32 + 31} of column {j}"
        return (i, j // 32), f"1x32 block cols {j // 32 * 32}..{j // 32 * 32 + 31} of row {i}"
    layout = "transposed (K, R) layout, " if columnwise else ""
    if mode == "fp8_block":
        if two_d:
            return (i // 128, j // 128), (f"{layout}128x128 tile rows {i // 128 * 128}..{i // 128 * 128 + 127}, "
                                          f"cols {j // 128 * 128}..{j // 128 * 128 + 127}")
        return (j // 128, i), f"{layout}1x128 block cols {j // 128 * 128}..{j // 128 * 128 + 127} of row {i}"
    element = 2 * j  # NVFP4 bytes pack two elements along the row
    if two_d:
        return (i, element // 16), (f"{layout}16x16 tile rows {i // 16 * 16}..{i // 16 * 16 + 15}, "
                                    f"elements {element // 16 * 16}..{element // 16 * 16 + 15}")
    return (i, element // 16), f"{layout}1x16 block elements {element // 16 * 16}..{element // 16 * 16 + 15} of row {i}"


def _check_padding(label: str, name: str, qt: QuantizedTensor, scale: np.ndarray, columnwise: bool) -> None:
    extent = scale_extent(qt.quantizer, qt.shape, columnwise)
    used = np.zeros(scale.shape, bool)
    used[tuple(slice(0, n) for n in extent)] = True
    raw = scale.view(np.uint8).reshape(scale.shape + (-1,)) if scale.ndim else scale.view(np.uint8)
    bad = np.argwhere(~used & raw.any(axis=-1))
    if bad.size:
        index = tuple(int(v) for v in bad[0])
        raise AssertionError(f"{label}.{name}: padding must be zero, but {len(bad)} padding entries are not; first at "
                             f"{index} (= {_hex(scale[index])}); only the leading {extent} corner is used")


def _report(prefix: str, name: str, actual: QuantizedTensor, expected: QuantizedTensor, a: np.ndarray,
            e: np.ndarray, bad: np.ndarray) -> str:
    index = tuple(int(v) for v in np.unravel_index(int(bad[0]), a.shape))
    lines = [f"{prefix}{name}: {bad.size} of {a.size} elements differ; first at {index}"]
    mode = actual.quantizer.scaling_mode
    columnwise = name.startswith("columnwise")
    if name.endswith("_data"):
        decode = _data_decoder(actual)
        ca, ce = int(a.reshape(-1).view(np.uint8)[bad[0]]), int(e.reshape(-1).view(np.uint8)[bad[0]])
        lines.append(f"  actual   {ca:#04x} = {decode(ca)}")
        lines.append(f"  expected {ce:#04x} = {decode(ce)}")
        cols = a.shape[-1]
        i, j = divmod(int(bad[0]), cols)
        scale_at, block = _scale_index(actual, columnwise, i, j)
        scale_name = name.replace("_data", "_scale_inv")
        sa, se = to_numpy(getattr(actual, scale_name)), to_numpy(getattr(expected, scale_name))
        lines.append(f"  block: {block}; {scale_name}{list(scale_at)}: actual {_scale_value(mode, sa[scale_at])}, "
                     f"expected {_scale_value(mode, se[scale_at])}")
        if mode != "nvfp4":  # NVFP4 decoding also needs the global amax: see reference_dequantize
            fmt = actual.quantizer.fp8_dtype
            values = [float(ref.decode_fp8_ref(np.array([c], np.uint8), fmt)[0]) * _scale_factor(mode, s[scale_at])
                      for c, s in ((ca, sa), (ce, se))]
            lines.append(f"  dequantized: actual {values[0]:.9g}, expected {values[1]:.9g}")
    elif name.endswith("_scale_inv"):
        lines.append(f"  actual   {_hex(a[index])} = {_scale_value(mode, a[index])}")
        lines.append(f"  expected {_hex(e[index])} = {_scale_value(mode, e[index])}")
    else:
        lines.append(f"  actual {float(a[index]):.9g} ({_hex(a[index])}), expected {float(e[index]):.9g} "
                     f"({_hex(e[index])})")
    return "\n".join(lines)


def assert_quantized_equal(actual: QuantizedTensor, expected: QuantizedTensor, context: str = "") -> None:
    """Asserts two QuantizedTensors are equal bit for bit.

    Equal means: the same quantizer, logical shape and input dtype; the same present fields;
    each field of the same shape and dtype with identical bytes (NaNs compared by bits); and the
    padding of every scale array zero on both sides (MXFP8 / NVFP4 scales are padded to (128, 4)
    multiples, FP8-block scales to multiples of 4: a kernel must write zeros there). Arrays may
    be torch tensors, JAX arrays or NumPy arrays, mixed freely.

    Raises:
        AssertionError: naming the field and the first differing element with both raw codes,
            their decoded values, the block it belongs to and that block's scale on each side.
    """
    prefix = f"{context}: " if context else ""
    for label, qt in (("actual", actual), ("expected", expected)):
        if not isinstance(qt, QuantizedTensor):
            raise AssertionError(f"{prefix}{label} is a {type(qt).__name__}, not a twinengine QuantizedTensor")
    if actual.quantizer != expected.quantizer:
        raise AssertionError(f"{prefix}quantizers differ: actual {actual.quantizer!r}, expected {expected.quantizer!r}")
    if tuple(actual.shape) != tuple(expected.shape) or actual.dtype != expected.dtype:
        raise AssertionError(f"{prefix}made from different inputs: actual shape {tuple(actual.shape)} {actual.dtype}, "
                             f"expected {tuple(expected.shape)} {expected.dtype}")
    present = {label: [n for n in ARRAY_FIELDS if getattr(qt, n) is not None]
               for label, qt in (("actual", actual), ("expected", expected))}
    if present["actual"] != present["expected"]:
        raise AssertionError(f"{prefix}fields differ: actual has {present['actual']}, expected {present['expected']}")
    for name in present["actual"]:
        a, e = to_numpy(getattr(actual, name)), to_numpy(getattr(expected, name))
        if a.shape != e.shape or a.dtype != e.dtype:
            raise AssertionError(f"{prefix}{name}: actual {a.shape} {a.dtype}, expected {e.shape} {e.dtype}")
        if name.endswith("_scale_inv"):
            for label, qt, arr in (("actual", actual, a), ("expected", expected, e)):
                _check_padding(f"{prefix}{label}", name, qt, arr, name.startswith("columnwise"))
        width = a.dtype.itemsize
        bytes_a = np.ascontiguousarray(a).reshape(-1).view(np.uint8).reshape(-1, width)
        bytes_e = np.ascontiguousarray(e).reshape(-1).view(np.uint8).reshape(-1, width)
        bad = np.flatnonzero((bytes_a != bytes_e).any(axis=1))
        if bad.size:
            raise AssertionError(_report(prefix, name, actual, expected, a, e, bad))
