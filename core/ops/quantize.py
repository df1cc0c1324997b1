"""The quantize family: quantize, dequantize and the delayed-scaling update.

Each op is one :class:`OpDef`; both frontends call ``OP.plan(...)`` and never restate a
shape, a check or an error text. Shapes follow NUMERICS.md §4–§7.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from ..dtypes import FP8_DTYPES, HIGH_PRECISION, canonical_dtype
from ..quantized_tensor import ARRAY_FIELDS, QuantizedTensor
from ..quantizers import (
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8DelayedScalingQuantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
    Quantizer,
)
from .opdef import KernelCall, OpDef, Shape, TensorSpec, ceil_div, dims, fail, flatten_2d, round_up


@dataclasses.dataclass(frozen=True)
class ArrayMeta:
    """Shape and canonical dtype name of an array argument (what core sees of a tensor)."""

    shape: Shape
    dtype: str

    def plan_key(self) -> "ArrayMeta | None":
        """Itself as a plan-cache key when its shape is static (ints, not SymInts); else None."""
        for d in self.shape:
            if type(d) is not int:
                return None
        return self if type(self.dtype) is str else None


_FP8_FORMAT_CODES = {"e4m3": 0, "e5m2": 1}
_AMAX_ALGORITHMS = {"max": 0, "most_recent": 1}
_SCALAR_F32 = ((1,), "float32")

RNG_DTYPES = ("uint32", "int32", "int64")
"""The rng rule (NUMERICS.md §7 step 9): ``rng`` is an array of shape (2,) holding
``[seed, offset]``, each in [0, 2**32), of dtype uint32, int32 or int64. Kernels use the low
32 bits of each element (two's complement), so the same two numbers give the same bytes
whatever the dtype: JAX without x64 (which turns int64 into int32 keeping the low bits) and
torch (whose uint32 support is thin; use int64) agree. It is an array, never a Python int, so
a new offset does not recompile, and it is required exactly when the quantizer rounds
stochastically."""


# ---- quantize ---------------------------------------------------------------------------

def _validate_quantize(x: ArrayMeta, quantizer: Quantizer, scale: ArrayMeta | None = None,
                       rng: ArrayMeta | None = None, amax: ArrayMeta | None = None) -> None:
    op = "quantize"
    if not isinstance(quantizer, Quantizer):
        fail(op, TypeError, f"quantizer must be a twinengine Quantizer, got {type(quantizer).__name__}")
    if x.dtype not in HIGH_PRECISION:
        fail(op, TypeError, f"x must be float32, bfloat16 or float16, got {x.dtype}")
    if len(x.shape) < 1:
        fail(op, ValueError, "x must have rank >= 1, got a 0-d array")
    rows, cols = flatten_2d(x.shape)
    if rows * cols == 0:
        fail(op, ValueError, f"x must not be empty, got shape {dims(x.shape)}")
    if isinstance(quantizer, Float8DelayedScalingQuantizer):
        if scale is None:
            fail(op, ValueError, "Float8DelayedScalingQuantizer needs scale= (a float32 array of shape (1,))")
        if scale.dtype != "float32" or tuple(scale.shape) != (1,):
            fail(op, ValueError, f"scale must be float32 of shape (1,), got {scale.dtype} {dims(scale.shape)}")
    elif scale is not None:
        fail(op, ValueError, f"scale= is only used by Float8DelayedScalingQuantizer, not {type(quantizer).__name__}")
    _validate_rng(op, quantizer, rng)
    if amax is not None:
        if not isinstance(quantizer, NVFP4Quantizer):
            fail(op, ValueError, f"amax= (given global amaxes) is only used by NVFP4Quantizer, not "
                 f"{type(quantizer).__name__}")
        if amax.dtype != "float32" or tuple(amax.shape) != (2,):
            fail(op, ValueError, f"amax must be float32 of shape (2,) ([rowwise, columnwise] global amax), got "
                 f"{amax.dtype} {dims(amax.shape)}")
    if isinstance(quantizer, MXFP8Quantizer) and (rows % 32 != 0 or cols % 32 != 0):
        fail(op, ValueError, f"MXFP8 needs the flattened (R, K) shape to have R and K divisible by 32 "
             f"(1x32 / 32x1 blocks), {_got_shape(x)}")
    if isinstance(quantizer, Float8BlockQuantizer) and (rows % 128 != 0 or cols % 128 != 0):
        fail(op, ValueError, f"FP8 block scaling needs R and K divisible by 128 (1x128 blocks / 128x128 tiles "
             f"of the flattened (R, K) shape), {_got_shape(x)}")
    if isinstance(quantizer, NVFP4Quantizer):
        if rows % 16 != 0 or cols % 16 != 0:
            fail(op, ValueError, f"NVFP4 needs R and K divisible by 16 (1x16 blocks / 16x16 tiles of the "
                 f"flattened (R, K) shape), {_got_shape(x)}")
        if quantizer.with_rht and quantizer.columnwise and x.dtype != "bfloat16":
            fail(op, TypeError, f"NVFP4 with_rht=True with columnwise usage needs bfloat16 x (the RHT is "
                 f"defined for bf16 input only), got {x.dtype}; use columnwise=False or with_rht=False")
    if quantizer.scaling_mode not in _QUANTIZE_KERNELS:
        fail(op, TypeError, f"{type(quantizer).__name__} has no quantize kernel")


def _got_shape(x: ArrayMeta) -> str:
    """The shape part of a divisibility error. Call it only on failure: formatting symbolic sizes
    would specialize them under torch.compile(dynamic=True)."""
    rows, cols = flatten_2d(x.shape)
    return f"got x of shape {dims(x.shape)} -> (R, K) = ({int(rows)}, {int(cols)})"


def _validate_rng(op: str, quantizer: Quantizer, rng: ArrayMeta | None) -> None:
    """rng is required iff the quantizer rounds stochastically; see RNG_DTYPES for the rule."""
    if not getattr(quantizer, "stochastic_rounding", False):
        if rng is not None:
            fail(op, ValueError, f"rng= is only used by quantizers with stochastic rounding, not {quantizer!r}")
        return
    if rng is None:
        fail(op, ValueError, f"{quantizer!r} rounds stochastically and needs rng= (an integer array "
             "[seed, offset] of shape (2,), dtype uint32, int32 or int64)")
    if rng.dtype not in RNG_DTYPES:
        fail(op, TypeError, f"rng must have dtype uint32, int32 or int64, got {rng.dtype}")
    if tuple(rng.shape) != (2,):
        fail(op, ValueError, f"rng must have shape (2,) ([seed, offset]), got {dims(rng.shape)}")


def _two_d(quantizer: Quantizer) -> bool:
    """2D tiles: MXFP8 32x32, FP8 block 128x128 (block_scaling_dim=2), NVFP4 16x16."""
    return bool(getattr(quantizer, "with_2d_quantization", False)) or getattr(quantizer, "block_scaling_dim", 1) == 2


def _quantize_attrs(quantizer: Quantizer) -> tuple[tuple[str, int | float], ...]:
    return (
        ("rowwise", int(quantizer.rowwise)),
        ("columnwise", int(quantizer.columnwise)),
        ("fp8_format", _FP8_FORMAT_CODES[getattr(quantizer, "fp8_dtype", "e4m3")]),
        ("amax_epsilon", float(getattr(quantizer, "amax_epsilon", 0.0))),
        ("force_pow2_scales", int(getattr(quantizer, "force_pow_2_scales", False))),
        ("two_d", int(_two_d(quantizer))),
        ("with_rht", int(getattr(quantizer, "with_rht", False))),
        ("stochastic_rounding", int(getattr(quantizer, "stochastic_rounding", False))),
    )


def _per_tensor_outputs(x: ArrayMeta, q: Float8CurrentScalingQuantizer | Float8DelayedScalingQuantizer
                        ) -> tuple[TensorSpec, ...]:
    rows, cols = flatten_2d(x.shape)
    data = FP8_DTYPES[q.fp8_dtype]
    specs = []
    if q.rowwise:
        specs += [TensorSpec("rowwise_data", tuple(x.shape), data), TensorSpec("rowwise_scale_inv", *_SCALAR_F32)]
    if q.columnwise:
        specs += [TensorSpec("columnwise_data", (cols, rows), data), TensorSpec("columnwise_scale_inv", *_SCALAR_F32)]
    specs.append(TensorSpec("amax", *_SCALAR_F32))
    return tuple(specs)


def _mxfp8_outputs(x: ArrayMeta, q: MXFP8Quantizer) -> tuple[TensorSpec, ...]:
    rows, cols = flatten_2d(x.shape)
    data = FP8_DTYPES[q.fp8_dtype]
    specs = []
    if q.rowwise:
        specs += [TensorSpec("rowwise_data", tuple(x.shape), data),
                  TensorSpec("rowwise_scale_inv", (round_up(rows, 128), round_up(cols // 32, 4)), "uint8")]
    if q.columnwise:
        specs += [TensorSpec("columnwise_data", tuple(x.shape), data),
                  TensorSpec("columnwise_scale_inv", (round_up(rows // 32, 4), round_up(cols, 128)), "uint8")]
    return tuple(specs)


def _fp8_block_scale_shape(rows: Any, cols: Any, columnwise: bool, two_d: bool) -> Shape:
    """fp32 scale_inv shape of one FP8-block copy (NUMERICS.md §6): 1D rowwise (K/128, roundup(R,4))
    R-minor, 1D columnwise (R/128, roundup(K,4)); 2D rowwise (R/128, roundup(K/128,4)), 2D
    columnwise (K/128, roundup(R/128,4))."""
    if columnwise:
        rows, cols = cols, rows
    if two_d:
        return (ceil_div(rows, 128), round_up(ceil_div(cols, 128), 4))
    return (ceil_div(cols, 128), round_up(rows, 4))


def _fp8_block_outputs(x: ArrayMeta, q: Float8BlockQuantizer) -> tuple[TensorSpec, ...]:
    rows, cols = flatten_2d(x.shape)
    data = FP8_DTYPES[q.fp8_dtype]
    two_d = q.block_scaling_dim == 2
    specs = []
    if q.rowwise:
        specs += [TensorSpec("rowwise_data", tuple(x.shape), data),
                  TensorSpec("rowwise_scale_inv", _fp8_block_scale_shape(rows, cols, False, two_d), "float32")]
    if q.columnwise:
        specs += [TensorSpec("columnwise_data", (cols, rows), data),
                  TensorSpec("columnwise_scale_inv", _fp8_block_scale_shape(rows, cols, True, two_d), "float32")]
    return tuple(specs)


def _nvfp4_outputs(x: ArrayMeta, q: NVFP4Quantizer) -> tuple[TensorSpec, ...]:
    """NUMERICS.md §7 step 10: packed E2M1 data, E4M3 scale codes, one global amax per copy."""
    rows, cols = flatten_2d(x.shape)
    specs = []
    if q.rowwise:
        specs += [TensorSpec("rowwise_data", tuple(x.shape[:-1]) + (cols // 2,), "uint8"),
                  TensorSpec("rowwise_scale_inv", (round_up(rows, 128), round_up(ceil_div(cols, 16), 4)), "uint8")]
    if q.columnwise:
        specs += [TensorSpec("columnwise_data", (cols, rows // 2), "uint8"),
                  TensorSpec("columnwise_scale_inv", (round_up(cols, 128), round_up(ceil_div(rows, 16), 4)), "uint8")]
    if q.rowwise:
        specs.append(TensorSpec("amax", *_SCALAR_F32))
    if q.columnwise:
        specs.append(TensorSpec("columnwise_amax", *_SCALAR_F32))
    return tuple(specs)


def scale_extent(quantizer: Quantizer, shape: Sequence[int], columnwise: bool) -> tuple[int, ...]:
    """The used (unpadded) part of one copy's scale_inv: its leading corner; the rest of the
    padded array (MXFP8 / NVFP4 (128, 4) padding, FP8-block multiples of 4) is zero
    (NUMERICS.md §5–§7). Per-tensor formats: (1,), no padding."""
    rows, cols = flatten_2d(tuple(shape))
    mode = quantizer.scaling_mode
    if mode in ("fp8_current", "fp8_delayed"):
        return (1,)
    if mode == "mxfp8":
        return (rows // 32, cols) if columnwise else (rows, cols // 32)
    if mode == "nvfp4":
        return (cols, ceil_div(rows, 16)) if columnwise else (rows, ceil_div(cols, 16))
    if columnwise:
        rows, cols = cols, rows
    if _two_d(quantizer):
        return (ceil_div(rows, 128), ceil_div(cols, 128))
    return (ceil_div(cols, 128), rows)


# scaling_mode -> (kernel op, input names, output-spec function). Keyed by the quantizer's
# scaling_mode string (not its type) so that torch.compile traces the lookup. An rng array,
# when given (stochastic rounding), is appended to the inputs.
_QUANTIZE_KERNELS: dict[str, tuple[str, tuple[str, ...], Any]] = {
    "fp8_current": ("quantize_fp8_current", ("x",), _per_tensor_outputs),
    "fp8_delayed": ("quantize_fp8_delayed", ("x", "scale"), _per_tensor_outputs),
    "mxfp8": ("quantize_mxfp8", ("x",), _mxfp8_outputs),
    "fp8_block": ("quantize_fp8_block", ("x",), _fp8_block_outputs),
    "nvfp4": ("quantize_nvfp4", ("x",), _nvfp4_outputs),
}


SCALING_MODE_CODES = {"fp8_current": 0, "fp8_delayed": 1, "mxfp8": 2, "fp8_block": 3, "nvfp4": 4}
"""Quantizer scaling_mode -> TweScalingMode (csrc/include/twinengine/quantize.h): how a fused
kernel (activation + quantize, ...) names the quantize kernel it runs on its output."""


def _infer_quantize(x: ArrayMeta, quantizer: Quantizer, scale: ArrayMeta | None = None,
                    rng: ArrayMeta | None = None, amax: ArrayMeta | None = None) -> KernelCall:
    op, inputs, outputs = _QUANTIZE_KERNELS[quantizer.scaling_mode]
    if rng is not None:
        inputs = inputs + ("rng",)
    if amax is not None:
        inputs = inputs + ("amax",)
    return KernelCall(op, inputs, outputs(x, quantizer), _quantize_attrs(quantizer))


QUANTIZE = OpDef(
    name="quantize",
    args=("x", "scale", "rng", "amax"),
    attrs=("quantizer",),
    validate=_validate_quantize,
    infer=_infer_quantize,
)
"""quantize(x, quantizer, scale=None, rng=None, amax=None) -> QuantizedTensor fields.

amax (NVFP4 only): float32 (2,) given global amaxes [rowwise, columnwise (after RHT)] used
    instead of x's own (NUMERICS.md §7 step 1's all-reduce MAX: a shard quantized with its
    group's amax has the bytes of its rows / columns of the whole tensor's quantization).

Shapes: x any rank >= 1, flattened to (R, K). Outputs per quantizer as NUMERICS.md lays out;
    MXFP8 needs R, K divisible by 32, FP8 block by 128, NVFP4 by 16.
Dtypes: x float32 / bfloat16 / float16 (bfloat16 for NVFP4 with_rht and columnwise usage);
    rng per RNG_DTYPES (NVFP4 with stochastic_rounding only).
"""


def quantized_layout(quantizer: Quantizer, shape: Sequence[Any], dtype: str) -> tuple[TensorSpec, ...]:
    """The arrays ``quantize`` returns for an input of `shape` and `dtype`: name, shape, dtype
    of each present QuantizedTensor field, in kernel output order. What ``make_empty``
    allocates and ``quantize_`` checks its buffers against (one source: QUANTIZE's plan).

    Raises:
        TypeError / ValueError: as ``quantize`` for that input (dtype, rank, divisibility).
    """
    scale = ArrayMeta((1,), "float32") if getattr(quantizer, "scaling_mode", "") == "fp8_delayed" else None
    rng = ArrayMeta((2,), "int64") if getattr(quantizer, "stochastic_rounding", False) else None
    return QUANTIZE.plan(ArrayMeta(tuple(shape), dtype), quantizer, scale, rng).outputs


def validate_quantize_into(out: QuantizedTensor, x: ArrayMeta, scale: ArrayMeta | None = None,
                           rng: ArrayMeta | None = None) -> KernelCall:
    """Checks for ``quantize_(out, x)``: `out` holds exactly the arrays ``quantize(x,
    out.quantizer)`` would return (same names, shapes, dtypes) and was made for x's shape and
    dtype; returns the planned kernel call that writes them."""
    op = "quantize_"
    if not isinstance(out, QuantizedTensor):
        fail(op, TypeError, f"out must be a twinengine QuantizedTensor (see make_empty), got {type(out).__name__}")
    if tuple(out.shape) != tuple(x.shape) or out.dtype != x.dtype:
        fail(op, ValueError, f"out was made for an input of shape {tuple(out.shape)} and dtype {out.dtype}, "
             f"got x of shape {tuple(x.shape)} and dtype {x.dtype}")
    call = QUANTIZE.plan(x, out.quantizer, scale, rng)
    expected = {spec.name for spec in call.outputs}
    for name in ARRAY_FIELDS:
        if getattr(out, name) is not None and name not in expected:
            fail(op, ValueError, f"out.{name} is set, but {out.quantizer!r} does not write it")
    for spec in call.outputs:
        array = getattr(out, spec.name)
        if array is None:
            fail(op, ValueError, f"out.{spec.name} is missing; {out.quantizer!r} writes it")
        dtype = canonical_dtype(array.dtype)
        if tuple(array.shape) != tuple(spec.shape) or dtype != spec.dtype:
            fail(op, ValueError, f"out.{spec.name} must have shape {tuple(spec.shape)} and dtype {spec.dtype}, "
                 f"got {tuple(array.shape)} {dtype}")
    return call


# ---- dequantize -------------------------------------------------------------------------

# scaling_mode -> (kernel op, whether the copy's global amax is a kernel input)
_DEQUANTIZE_KERNELS = {
    "fp8_current": ("dequantize_fp8", False),
    "fp8_delayed": ("dequantize_fp8", False),
    "mxfp8": ("dequantize_mxfp8", False),
    "fp8_block": ("dequantize_fp8_block", False),
    "nvfp4": ("dequantize_nvfp4", True),
}


def _usage_fields(columnwise: bool) -> tuple[str, str]:
    prefix = "columnwise" if columnwise else "rowwise"
    return f"{prefix}_data", f"{prefix}_scale_inv"


def _amax_field(columnwise: bool) -> str:
    """The QuantizedTensor field holding a copy's global amax (NVFP4)."""
    return "columnwise_amax" if columnwise else "amax"


def _validate_dequantize(qt: QuantizedTensor, out_dtype: str, columnwise: bool = False) -> None:
    op = "dequantize"
    if not isinstance(qt, QuantizedTensor):
        fail(op, TypeError, f"expected a twinengine QuantizedTensor, got {type(qt).__name__}")
    if out_dtype not in HIGH_PRECISION:
        fail(op, TypeError, f"dtype must be float32, bfloat16 or float16, got {out_dtype}")
    usage = "columnwise" if columnwise else "rowwise"
    quantizer = qt.quantizer
    if quantizer is None or not getattr(quantizer, usage):
        fail(op, ValueError, f"the QuantizedTensor has no {usage} copy: its quantizer "
             f"{quantizer!r} was made with {usage}=False")
    data, scale_inv = _usage_fields(columnwise)
    if getattr(qt, data) is None or getattr(qt, scale_inv) is None:
        fail(op, ValueError, f"the QuantizedTensor's {data} / {scale_inv} are missing")
    if quantizer.scaling_mode not in _DEQUANTIZE_KERNELS:
        fail(op, TypeError, f"{type(quantizer).__name__} has no dequantize kernel")
    if _DEQUANTIZE_KERNELS[quantizer.scaling_mode][1] and getattr(qt, _amax_field(columnwise)) is None:
        fail(op, ValueError, f"the QuantizedTensor's {_amax_field(columnwise)} (the global amax of its {usage} "
             "copy) is missing")
    _check_layout(op, qt, (data, scale_inv, _amax_field(columnwise)))


def _check_layout(op: str, qt: QuantizedTensor, names: Sequence[str]) -> None:
    """The arrays of `qt` named in `names` must have the shapes and dtypes a quantize of an input
    of shape qt.shape gives (NUMERICS.md §4-§7 layouts), so that no kernel reads out of bounds."""
    shape = tuple(qt.shape)
    if len(shape) < 1:
        fail(op, ValueError, f"the QuantizedTensor's shape must have rank >= 1, got {dims(shape)}")
    expected = {spec.name: spec for spec in _QUANTIZE_KERNELS[qt.quantizer.scaling_mode][2](
        ArrayMeta(shape, "float32"), qt.quantizer)}
    for name in names:
        array, spec = getattr(qt, name), expected.get(name)
        if spec is None or not (hasattr(array, "shape") and hasattr(array, "dtype")):
            continue  # absent (checked above), or not an array (shape-only planning)
        dtype = canonical_dtype(array.dtype)
        if tuple(array.shape) != tuple(spec.shape) or dtype != spec.dtype:
            fail(op, ValueError, f"the QuantizedTensor's {name} has shape {dims(array.shape)} and dtype {dtype}, "
                 f"but a {type(qt.quantizer).__name__} of an input of shape {dims(shape)} gives {dims(spec.shape)} "
                 f"{spec.dtype}; the arrays do not belong to this shape / quantizer")


def _infer_dequantize(qt: QuantizedTensor, out_dtype: str, columnwise: bool = False) -> KernelCall:
    op, needs_amax = _DEQUANTIZE_KERNELS[qt.quantizer.scaling_mode]
    inputs = _usage_fields(columnwise) + ((_amax_field(columnwise),) if needs_amax else ())
    return KernelCall(
        op=op,
        inputs=inputs,
        outputs=(TensorSpec("out", tuple(qt.shape), out_dtype),),
        attrs=(("columnwise", int(columnwise)), ("two_d", int(_two_d(qt.quantizer)))),
    )


DEQUANTIZE = OpDef(
    name="dequantize",
    args=("qt",),
    attrs=("dtype", "columnwise"),
    validate=_validate_dequantize,
    infer=_infer_dequantize,
)
"""dequantize(qt, dtype, columnwise=False) -> array of qt.shape in `dtype`.

Numerics: x̂ computed in fp32 per the format's decode rule, then rounded (RNE) to `dtype`.
The columnwise copy of a transposed layout is transposed back to qt.shape. An NVFP4
columnwise copy made with the RHT dequantizes to the transformed values (RHT(xᵀ))ᵀ.
"""


# ---- delayed-scaling update -------------------------------------------------------------

def _validate_update(amax_history: ArrayMeta, scale: ArrayMeta, fp8_dtype: str, margin: int = 0,
                     amax_compute_algo: str = "max") -> None:
    op = "update_delayed_scaling"
    if amax_history.dtype != "float32" or scale.dtype != "float32":
        fail(op, TypeError, f"amax_history and scale must be float32, got {amax_history.dtype} and {scale.dtype}")
    if len(amax_history.shape) not in (1, 2) or amax_history.shape[0] < 1:
        fail(op, ValueError, "amax_history must have shape (history_len,) or (history_len, slots) with "
             f"history_len >= 1, got {dims(amax_history.shape)}")
    slots = amax_history.shape[1] if len(amax_history.shape) == 2 else 1
    if len(scale.shape) != 1 or scale.shape[0] != slots:
        fail(op, ValueError, f"scale must have shape ({int(slots)},) to match amax_history "
             f"{dims(amax_history.shape)}, got {dims(scale.shape)}")
    if fp8_dtype not in _FP8_FORMAT_CODES:
        fail(op, ValueError, f"fp8_dtype must be 'e4m3' or 'e5m2', got {fp8_dtype!r}")
    if type(margin) is not int or not 0 <= margin <= 64:
        fail(op, ValueError, f"margin must be an int in [0, 64], got {margin!r}")
    if amax_compute_algo not in _AMAX_ALGORITHMS:
        fail(op, ValueError, f"amax_compute_algo must be 'max' or 'most_recent', got {amax_compute_algo!r}")


def _infer_update(amax_history: ArrayMeta, scale: ArrayMeta, fp8_dtype: str, margin: int = 0,
                  amax_compute_algo: str = "max") -> KernelCall:
    return KernelCall(
        op="update_delayed_scaling",
        inputs=("amax_history", "scale"),
        outputs=(TensorSpec("amax_history", tuple(amax_history.shape), "float32"),
                 TensorSpec("scale", tuple(scale.shape), "float32")),
        attrs=(("fp8_format", _FP8_FORMAT_CODES[fp8_dtype]), ("margin", margin),
               ("algorithm", _AMAX_ALGORITHMS[amax_compute_algo])),
    )


UPDATE_DELAYED_SCALING = OpDef(
    name="update_delayed_scaling",
    args=("amax_history", "scale"),
    attrs=("fp8_dtype", "margin", "amax_compute_algo"),
    validate=_validate_update,
    infer=_infer_update,
)
"""update_delayed_scaling(amax_history, scale, fp8_dtype, margin, amax_compute_algo)
-> (new_amax_history, new_scale), NUMERICS.md §3 per slot (column)."""


# ---- recording an amax into the history -----------------------------------------------

RECORD_AMAX_RULE = """record_amax(H, a), per slot: H[0] becomes ``a`` when neither is NaN and ``a`` is above H[0]
in the fp32 order (subnormals kept, -0.0 below +0.0); otherwise H[0] is kept (a NaN amax is
skipped, a NaN already in H[0] stays); rows 1.. are unchanged (NUMERICS.md §3 quantize step:
``H[0] = max(H[0], max|x|)`` with every amax NaN-skipping). Both frontends compute it on the fp32 bit patterns as int32 (a float
comparison would flush subnormal amaxes to zero where the runtime sets FTZ/DAZ, as XLA's CPU
threads do): the order key of bits ``b`` is ``b`` for ``b >= 0`` and ``b ^ 0x7FFFFFFF`` for
``b < 0``, NaN is ``(b & 0x7FFFFFFF) > 0x7F800000``."""

F32_ABS_MASK = 0x7FFFFFFF
F32_INF_BITS = 0x7F800000


def validate_record_amax(amax_history: ArrayMeta, amax: ArrayMeta) -> None:
    op = "record_amax"
    if amax_history.dtype != "float32" or amax.dtype != "float32":
        fail(op, TypeError, f"amax_history and amax must be float32, got {amax_history.dtype} and {amax.dtype}")
    if len(amax_history.shape) not in (1, 2) or amax_history.shape[0] < 1:
        fail(op, ValueError, "amax_history must have shape (history_len,) or (history_len, slots) with "
             f"history_len >= 1, got {dims(amax_history.shape)}")
    slots = amax_history.shape[1] if len(amax_history.shape) == 2 else 1
    size = 1
    for dim in amax.shape:
        size = size * dim
    if size != slots:
        fail(op, ValueError, f"amax must hold one value per history slot ({int(slots)}), got shape {dims(amax.shape)}")


def array_meta(shape: Sequence[Any], dtype: str) -> ArrayMeta:
    return ArrayMeta(tuple(shape), dtype)


# ---- grouped per-tensor FP8 (GroupedLinear under Float8CurrentScaling) ------------------------

GROUPED_SCALING_MODES = ("fp8_current", "fp8_delayed", "mxfp8", "fp8_block", "nvfp4")
"""Quantizer families a grouped quantize (and a quantized GroupedLinear) supports."""


def _validate_grouped_quantize(x: ArrayMeta, m_splits: ArrayMeta, scale: ArrayMeta | None = None,
                               rng: ArrayMeta | None = None, *, quantizer: Quantizer) -> None:
    op = "grouped_linear"
    if (quantizer.scaling_mode not in GROUPED_SCALING_MODES
            or (_two_d(quantizer) and quantizer.scaling_mode not in ("fp8_block", "nvfp4"))
            or not (quantizer.rowwise and quantizer.columnwise)):
        fail(op, TypeError, "grouped quantization takes a Float8CurrentScalingQuantizer, a "
             "Float8DelayedScalingQuantizer, a Float8BlockQuantizer, a 1D MXFP8Quantizer or an NVFP4Quantizer with "
             f"both usages, got {quantizer!r}")
    if quantizer.scaling_mode == "nvfp4":
        if x.shape[1] % 16 != 0:
            fail(op, ValueError, f"NVFP4 needs in_features to be a multiple of 16, got {x.shape[1]}")
        if quantizer.with_rht and x.dtype != "bfloat16":
            fail(op, TypeError, f"NVFP4 with_rht=True needs bfloat16 x (the RHT is defined for bf16 input only), "
                 f"got {x.dtype}")
    _validate_rng(op, quantizer, rng)
    if quantizer.scaling_mode == "mxfp8" and x.shape[1] % 32 != 0:
        fail(op, ValueError, f"MXFP8 needs in_features to be a multiple of 32, got {x.shape[1]}")
    if quantizer.scaling_mode == "fp8_block" and x.shape[1] % 128 != 0:
        fail(op, ValueError, f"FP8 block scaling needs in_features to be a multiple of 128, got {x.shape[1]}")
    if x.dtype not in HIGH_PRECISION or len(x.shape) != 2:
        fail(op, TypeError, f"x must be a 2-D float32, bfloat16 or float16 array, got {x.dtype} {tuple(x.shape)}")
    if m_splits.dtype != "int32" or len(m_splits.shape) != 1 or m_splits.shape[0] < 1:
        fail(op, TypeError, f"m_splits must be a 1-D int32 array, got {m_splits.dtype} {tuple(m_splits.shape)}")
    if (scale is not None) != (quantizer.scaling_mode == "fp8_delayed"):
        fail(op, ValueError, "a grouped delayed-scaling quantize needs scale (one per group), other recipes take none")
    if scale is not None and (scale.dtype != "float32" or tuple(scale.shape) != (m_splits.shape[0],)):
        fail(op, ValueError, f"scale must be float32 of shape ({m_splits.shape[0]},) (one per group), got "
             f"{scale.dtype} {tuple(scale.shape)}")


def _infer_grouped_quantize(x: ArrayMeta, m_splits: ArrayMeta, scale: ArrayMeta | None = None,
                            rng: ArrayMeta | None = None, *, quantizer: Quantizer) -> KernelCall:
    rows, cols = x.shape
    groups = m_splits.shape[0]
    if quantizer.scaling_mode == "nvfp4":
        # Flat uint8 scales, each block's scale tensor after the previous one's (m_g multiples
        # of 16): rowwise Σ roundup(m_g, 128)·roundup(K/16, 4) <= (M + 127·G)·roundup(K/16, 4),
        # columnwise Σ roundup(K, 128)·roundup(m_g/16, 4) <= roundup(K, 128)·(ceil(M/16) + 3·G).
        return KernelCall("grouped_quantize_nvfp4", ("x", "m_splits") + (("rng",) if rng is not None else ()), (
            TensorSpec("rowwise_data", (rows, cols // 2), "uint8"),
            TensorSpec("rowwise_scale_inv", ((rows + 127 * groups) * round_up(cols // 16, 4),), "uint8"),
            TensorSpec("columnwise_data", (rows * cols // 2,), "uint8"),
            TensorSpec("columnwise_scale_inv", (round_up(cols, 128) * (ceil_div(rows, 16) + 3 * groups),), "uint8"),
            TensorSpec("amax", (groups,), "float32"), TensorSpec("columnwise_amax", (groups,), "float32")),
            _quantize_attrs(quantizer))
    data = FP8_DTYPES[quantizer.fp8_dtype]
    if quantizer.scaling_mode == "mxfp8":
        # Each block's scales in its own region: Σ roundup(m_g, 128) <= M + 127·G rowwise rows,
        # Σ roundup(m_g / 32, 4) <= ceil(M / 32) + 3·G columnwise rows (m_g multiples of 32).
        return KernelCall("grouped_quantize_mxfp8", ("x", "m_splits"), (
            TensorSpec("rowwise_data", (rows, cols), data),
            TensorSpec("rowwise_scale_inv", (rows + 127 * groups, round_up(cols // 32, 4)), "uint8"),
            TensorSpec("columnwise_data", (rows, cols), data),
            TensorSpec("columnwise_scale_inv", (ceil_div(rows, 32) + 3 * groups, round_up(cols, 128)), "uint8")),
            _quantize_attrs(quantizer))
    if quantizer.scaling_mode == "fp8_block":
        # Flat fp32 scales, each block's scale tensor after the previous one's (every m_g a
        # multiple of 128, so Σ m_g / 128 <= M // 128): 1x128 blocks K/128·m_g rowwise and
        # m_g/128·K columnwise; 128x128 tiles m_g/128·roundup(K/128, 4) and K/128·roundup(m_g/128, 4).
        kb = cols // 128
        if _two_d(quantizer):
            row_scales, col_scales = rows // 128 * round_up(kb, 4), kb * (rows // 128 + 3 * groups)
        else:
            row_scales, col_scales = kb * rows, rows // 128 * cols
        return KernelCall("grouped_quantize_fp8_block", ("x", "m_splits"), (
            TensorSpec("rowwise_data", (rows, cols), data), TensorSpec("rowwise_scale_inv", (row_scales,), "float32"),
            TensorSpec("columnwise_data", (rows * cols,), data),
            TensorSpec("columnwise_scale_inv", (col_scales,), "float32")), _quantize_attrs(quantizer))
    delayed = quantizer.scaling_mode == "fp8_delayed"
    return KernelCall("grouped_quantize_fp8_delayed" if delayed else "grouped_quantize_fp8_current",
                      ("x", "m_splits", "scale") if delayed else ("x", "m_splits"), (
        TensorSpec("rowwise_data", (rows, cols), data), TensorSpec("rowwise_scale_inv", (groups,), "float32"),
        TensorSpec("columnwise_data", (rows * cols,), data), TensorSpec("columnwise_scale_inv", (groups,), "float32"),
        TensorSpec("amax", (groups,), "float32")), _quantize_attrs(quantizer))


GROUPED_QUANTIZE = OpDef(
    name="grouped_quantize",
    args=("x", "m_splits", "scale", "rng"),
    attrs=("quantizer",),
    validate=_validate_grouped_quantize,
    infer=_infer_grouped_quantize,
)
"""grouped_quantize(x, m_splits, scale=None, rng=None, *, quantizer) -> per-tensor FP8: (rowwise_data
(M, K), rowwise_scale_inv (G,), columnwise_data (M·K,), columnwise_scale_inv (G,), amax (G,)); MXFP8:
(rowwise_data (M, K), rowwise_scale_inv, columnwise_data (M, K), columnwise_scale_inv); NVFP4:
(rowwise_data (M, K/2), rowwise_scale_inv (flat uint8), columnwise_data (M·K/2,),
columnwise_scale_inv (flat uint8), amax (G,), columnwise_amax (G,)).

Numerics: each row block of m_splits is quantized on its own (NUMERICS.md §4, §5), exactly the
bytes ``quantize`` gives the block alone (delayed scaling: with scale[g], scale (G,) float32;
amax[g] the block's unscaled amax, 0 for an empty block). Per-tensor FP8: columnwise_data holds each block's
transposed copy (K, m_g) one after another. MXFP8: every m_g a multiple of 32; each block's
scales in its own region (rowwise at Σ_{j<g} roundup(m_j, 128) rows, columnwise at
Σ_{j<g} roundup(m_j / 32, 4) rows). NVFP4 (§7): every m_g a multiple of 16; each block's
``quantize`` bytes with rng [seed, offset + g] for stochastic rounding (rng (2,) given iff the
quantizer rounds stochastically); columnwise_data holds each block's (K, m_g/2) copy one after
another; each block's scale tensors (of ``quantize``'s shapes) one after another in the flat
scale arrays, zero past them; amax / columnwise_amax each block's global amaxes. CPU only.
"""
