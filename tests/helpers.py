"""Shared test helpers: byte-exact comparison, framework <-> NumPy conversion, input families."""

from __future__ import annotations

import contextlib

import ml_dtypes
import numpy as np

NUMPY_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _element_bytes(a: np.ndarray) -> np.ndarray:
    """(a.size, itemsize) uint8 bytes of each element."""
    a = np.ascontiguousarray(a)
    return a.reshape(-1).view(np.uint8).reshape(a.size, a.dtype.itemsize)


def assert_bytes_equal(actual, expected, name: str) -> None:
    """Asserts identical shapes, element widths and bytes; names the first differing element.

    Both sides are NumPy arrays (use `from_torch` / `np.asarray` first); NaNs compare by bits.
    """
    a, e = np.asarray(actual), np.asarray(expected)
    assert a.shape == e.shape, f"{name}: shape {a.shape} != expected {e.shape}"
    assert a.dtype.itemsize == e.dtype.itemsize, f"{name}: element width {a.dtype} vs expected {e.dtype}"
    bad = np.flatnonzero((_element_bytes(a) != _element_bytes(e)).any(axis=1))
    if bad.size:
        first = np.unravel_index(bad[0], a.shape)
        raise AssertionError(f"{name}: {bad.size} of {a.size} elements differ; first at {first}: "
                             f"got {a[first]!r} (bytes {_element_bytes(a)[bad[0]]}), "
                             f"expected {e[first]!r} (bytes {_element_bytes(e)[bad[0]]})")


def to_torch(x: np.ndarray):
    """A torch CPU tensor with the same bytes as NumPy array `x` (bf16 via a 16-bit view)."""
    import torch

    x = np.ascontiguousarray(x)
    if x.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(x.copy())


def from_torch(t) -> np.ndarray:
    """A NumPy array with the same bytes as torch tensor `t` (bf16 and float8 as ml_dtypes)."""
    import torch

    t = t.detach().cpu().contiguous()
    special = {torch.bfloat16: (torch.int16, ml_dtypes.bfloat16), torch.float8_e4m3fn: (torch.uint8, ml_dtypes.float8_e4m3fn),
               torch.float8_e5m2: (torch.uint8, ml_dtypes.float8_e5m2), torch.uint32: (torch.int32, np.uint32)}
    if t.dtype in special:
        raw, view = special[t.dtype]
        return t.view(raw).numpy().view(view)
    return t.numpy()


def fields_as_numpy(qt) -> dict[str, np.ndarray]:
    """The present array fields of a QuantizedTensor as NumPy arrays (uint8 view for FP8 data)."""
    from twinengine.quantized_tensor import ARRAY_FIELDS

    out = {}
    for name in ARRAY_FIELDS:
        value = getattr(qt, name)
        if value is None:
            continue
        arr = from_torch(value) if hasattr(value, "detach") else np.asarray(value)
        out[name] = arr.view(np.uint8) if arr.dtype.itemsize == 1 else arr
    return out


def assert_quantized_equal(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray], context: str) -> None:
    """Same set of fields, and each field byte-identical."""
    assert sorted(actual) == sorted(expected), f"{context}: fields {sorted(actual)} != {sorted(expected)}"
    for name in expected:
        assert_bytes_equal(actual[name], expected[name], f"{context}: {name}")


INPUT_FAMILIES = ("normal_1", "normal_1e-30", "normal_1e-3", "normal_1e3", "normal_1e30", "zeros", "nan_inf",
                  "subnormal", "mixed_scales")
"""Input families every quantizer is tested on."""


def make_input(family: str, shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    """A NumPy input of `dtype` from one of INPUT_FAMILIES (deterministic per seed)."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if family.startswith("normal_"):
        x = rng.standard_normal(n).astype(np.float32) * np.float32(float(family.split("_")[1]))
    elif family == "zeros":
        x = np.zeros(n, np.float32)
    elif family == "nan_inf":
        x = rng.standard_normal(n).astype(np.float32) * np.float32(10.0)
        idx = rng.permutation(n)
        k = max(1, n // 16)
        x[idx[:k]] = np.nan
        x[idx[k:2 * k]] = np.inf
        x[idx[2 * k:3 * k]] = -np.inf
        x[idx[-1]] = -np.nan
    elif family == "subnormal":
        x = rng.standard_normal(n).astype(np.float32) * np.float32(1e-39)
    elif family == "mixed_scales":
        x = rng.standard_normal(n).astype(np.float32) * (np.float32(10.0) ** rng.integers(-20, 20, n)).astype(np.float32)
    else:
        raise ValueError(family)
    with np.errstate(over="ignore"):  # fp16 / bf16 inputs of the 1e30 family overflow to inf on purpose
        return x.reshape(shape).astype(NUMPY_DTYPES[dtype])


@contextlib.contextmanager
def no_recompiles():
    """Inside, any recompilation of an already-compiled frame raises torch._dynamo's
    RecompileError. (Counting backend calls is not a reliable signal: Dynamo may call the
    backend twice for one frame when it restarts an analysis.)"""
    import torch._dynamo

    with torch._dynamo.config.patch(error_on_recompile=True):
        yield
