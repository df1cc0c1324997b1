"""The gemm family: one GEMM ``out = op(a) · op(b)ᵀ (+ bias)`` over quantized or
high-precision operands (NUMERICS.md §8).

An operand is a high-precision array or a :class:`QuantizedTensor`. ``*_columnwise=False``
uses the operand as stored, logically ``(R, C)`` with the contraction over its last
dimension C (the rowwise copy of a quantized tensor); ``*_columnwise=True`` uses its
transpose ``(C, R)``, contracting over the flattened leading dimensions R (the columnwise
copy). With ``x (M, K)``, ``w (N, K)``, ``dy (M, N)`` the three Linear GEMMs are
``gemm(x, w)`` (fprop), ``gemm(dy, w, b_columnwise=True)`` (dgrad) and
``gemm(dy, x, a_columnwise=True, b_columnwise=True)`` (wgrad).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..dtypes import ABI_CODES, HIGH_PRECISION, canonical_dtype
from ..quantized_tensor import QuantizedTensor
from .opdef import KernelCall, OpDef, TensorSpec, dims, fail, flatten_2d, round_up
from .quantize import ArrayMeta

_OP = "gemm"

# scaling_mode -> TweGemmScaling code (csrc/include/twinengine/gemm.h). Keyed by string so
# torch.compile traces the lookup.
_SCALING_CODES = {"high_precision": 0, "fp8_current": 1, "fp8_delayed": 1, "mxfp8": 2, "fp8_block": 3, "nvfp4": 4}

# scaling_mode -> whether the columnwise copy is stored transposed (K-major for the GEMM).
_COLUMNWISE_TRANSPOSED = {"fp8_current": True, "fp8_delayed": True, "mxfp8": False, "fp8_block": True,
                          "nvfp4": True}


def _scaling_mode(x: Any) -> str:
    return x.quantizer.scaling_mode if isinstance(x, QuantizedTensor) else "high_precision"


def _logical_dims(x: Any, columnwise: bool) -> tuple[Any, Any]:
    """(rows, K) of an operand as the GEMM uses it."""
    rows, cols = flatten_2d(x.shape)
    return (cols, rows) if columnwise else (rows, cols)


def _check_operand(name: str, x: Any, columnwise: bool) -> None:
    if isinstance(x, QuantizedTensor):
        quantizer = x.quantizer
        usage = "columnwise" if columnwise else "rowwise"
        if quantizer is None or quantizer.scaling_mode not in _COLUMNWISE_TRANSPOSED:
            fail(_OP, TypeError, f"{name}: no GEMM kernel for quantizer {quantizer!r}")
        if not getattr(quantizer, usage) or getattr(x, f"{usage}_data") is None:
            fail(_OP, ValueError, f"{name} has no {usage} copy (its quantizer was made with {usage}=False), "
                 f"but the GEMM needs it ({name}_columnwise={columnwise})")
    elif isinstance(x, ArrayMeta):
        if x.dtype not in HIGH_PRECISION:
            fail(_OP, TypeError, f"{name} must be float32, bfloat16 or float16 (or a QuantizedTensor), got {x.dtype}")
    else:
        fail(_OP, TypeError, f"{name} must be an array or a twinengine QuantizedTensor, got {type(x).__name__}")
    if len(x.shape) < 1:
        fail(_OP, ValueError, f"{name} must have rank >= 1, got a 0-d array")


def _block_2d(x: Any) -> bool:
    return _scaling_mode(x) == "fp8_block" and x.quantizer.block_scaling_dim == 2


def _hadamard(x: Any, columnwise: bool) -> bool:
    """Whether the copy used is an NVFP4 columnwise copy made with the random Hadamard transform."""
    return columnwise and _scaling_mode(x) == "nvfp4" and x.quantizer.with_rht


def _validate(a: Any, b: Any, bias: ArrayMeta | None = None, *, a_columnwise: bool = False,
              b_columnwise: bool = False, out_dtype: str = "float32") -> None:
    _check_operand("a", a, a_columnwise)
    _check_operand("b", b, b_columnwise)
    mode_a, mode_b = _scaling_mode(a), _scaling_mode(b)
    if _SCALING_CODES[mode_a] != _SCALING_CODES[mode_b]:
        fail(_OP, TypeError, f"a and b must use the same format, got {mode_a} and {mode_b}")
    if _block_2d(a) and _block_2d(b):
        fail(_OP, ValueError, "FP8 block GEMMs need at least one 1D (1x128) operand; both a and b are 2D (128x128) "
             "(NUMERICS.md §9)")
    if _hadamard(a, a_columnwise) != _hadamard(b, b_columnwise):
        fail(_OP, ValueError, "the random Hadamard transform must apply to both operands' contraction dimension or to "
             f"neither; a uses {'an RHT' if _hadamard(a, a_columnwise) else 'a plain'} copy, b "
             f"{'an RHT' if _hadamard(b, b_columnwise) else 'a plain'} copy (RHT is only on NVFP4 columnwise copies)")
    m, k_a = _logical_dims(a, a_columnwise)
    n, k_b = _logical_dims(b, b_columnwise)
    if k_a != k_b:
        fail(_OP, ValueError, f"a and b disagree on the contraction dimension: a {dims(a.shape)} "
             f"(columnwise={a_columnwise}) gives K={int(k_a)}, b {dims(b.shape)} (columnwise={b_columnwise}) "
             f"gives K={int(k_b)}")
    if out_dtype not in HIGH_PRECISION:
        fail(_OP, TypeError, f"out_dtype must be float32, bfloat16 or float16, got {out_dtype}")
    if bias is not None:
        if bias.dtype not in HIGH_PRECISION:
            fail(_OP, TypeError, f"bias must be float32, bfloat16 or float16, got {bias.dtype}")
        if tuple(bias.shape) != (n,):
            fail(_OP, ValueError, f"bias must have shape ({int(n)},), got {dims(bias.shape)}")


def _k_major(x: Any, columnwise: bool) -> bool:
    mode = _scaling_mode(x)
    if mode == "high_precision" or not columnwise:
        return not columnwise
    return _COLUMNWISE_TRANSPOSED[mode]


def _infer(a: Any, b: Any, bias: ArrayMeta | None = None, *, a_columnwise: bool = False,
           b_columnwise: bool = False, out_dtype: str = "float32") -> KernelCall:
    scaling = _SCALING_CODES[_scaling_mode(a)]
    inputs: list[str] = []
    for name in ("a", "b"):
        inputs.append(f"{name}_data")
        if scaling:
            inputs.append(f"{name}_scale_inv")
        if scaling == _SCALING_CODES["nvfp4"]:
            inputs.append(f"{name}_amax")
    if bias is not None:
        inputs.append("bias")
    m, _ = _logical_dims(a, a_columnwise)
    n, _ = _logical_dims(b, b_columnwise)
    return KernelCall(
        op="gemm",
        inputs=tuple(inputs),
        outputs=(TensorSpec("out", (m, n), out_dtype),),
        attrs=(("scaling", scaling), ("a_k_major", int(_k_major(a, a_columnwise))),
               ("b_k_major", int(_k_major(b, b_columnwise))), ("a_block_2d", int(_block_2d(a))),
               ("b_block_2d", int(_block_2d(b))), ("has_bias", int(bias is not None))),
    )


GEMM = OpDef(
    name="gemm",
    args=("a", "b", "bias"),
    attrs=("a_columnwise", "b_columnwise", "out_dtype"),
    validate=_validate,
    infer=_infer,
)
"""gemm(a, b, bias=None, *, a_columnwise, b_columnwise, out_dtype) -> out (M, N).

Shapes: op(a) (M, K), op(b) (N, K) after flattening leading dimensions; bias (N,).
Dtypes: operands both high precision (fp32/bf16/fp16, mixable) or both quantized with the
    same format family (per-tensor FP8 current/delayed, MXFP8, FP8 block, NVFP4; E4M3/E5M2
    mixable); out fp32 / bf16 / fp16.
Numerics: NUMERICS.md §8 — fp32 accumulation; per-tensor FP8 scales the full sum,
    fl(fl(Σ) · s_inv_a) · s_inv_b; block formats (MXFP8 32, FP8 block 128, NVFP4 16 along K)
    scale each K-block's partial sum by its two block scales and accumulate the blocks in fp32
    in K order; NVFP4 then multiplies by S_dec_a, S_dec_b; bias added in fp32, one final
    rounding to out_dtype.
Raises:
    TypeError: operand kinds/formats/dtypes not supported or mixed.
    ValueError: missing usage copy, K mismatch, bias shape, two 2D FP8-block operands, an RHT
        copy paired with a plain one.
"""


def copy_arrays(x: QuantizedTensor, columnwise: bool) -> tuple[Any, Any, Any]:
    """(data, scale_inv, amax) of the copy the GEMM uses (amax: that copy's NVFP4 global amax)."""
    if columnwise:
        return x.columnwise_data, x.columnwise_scale_inv, x.columnwise_amax
    return x.rowwise_data, x.rowwise_scale_inv, x.amax


def gemm_arrays(a: Any, b: Any, bias: Any, a_columnwise: bool, b_columnwise: bool) -> dict[str, Any]:
    """The kernel inputs by KernelCall input name, from frontend arrays / QuantizedTensors."""
    arrays = {"bias": bias}
    for name, x, columnwise in (("a", a, a_columnwise), ("b", b, b_columnwise)):
        if isinstance(x, QuantizedTensor):
            arrays[f"{name}_data"], arrays[f"{name}_scale_inv"], arrays[f"{name}_amax"] = copy_arrays(x, columnwise)
        else:
            arrays[f"{name}_data"] = x
    return arrays


def gemm_operand(data: Any, scale_inv: Any, quantizer: Any, columnwise: bool, amax: Any = None) -> QuantizedTensor:
    """The QuantizedTensor view of one stored copy (data, scale_inv, NVFP4 amax) of a quantized operand.

    Shapes: the logical 2-D-flattenable shape is recovered from the stored data: a transposed
    columnwise copy (K, R) stands for an (R, K) tensor; other copies keep the data's shape;
    NVFP4 packs two elements a byte along its last stored dimension.
    """
    shape = tuple(data.shape)
    if quantizer.scaling_mode == "nvfp4":
        shape = shape[:-1] + (shape[-1] * 2,)
    if columnwise and _COLUMNWISE_TRANSPOSED.get(quantizer.scaling_mode, False):
        shape = (shape[1], shape[0])
    prefix = "columnwise" if columnwise else "rowwise"
    amax_field = "columnwise_amax" if columnwise else "amax"
    return QuantizedTensor(**{f"{prefix}_data": data, f"{prefix}_scale_inv": scale_inv, amax_field: amax},
                           quantizer=quantizer, shape=shape)


# ---- CUDA plan and workspace (csrc/abi/gemm_plan.cc decides; core sizes the workspace) ----

GEMM_PATHS = {0: "none", 1: "cpu", 2: "tiled", 3: "cublaslt", 4: "dequant_cublaslt"}
"""TweGemmPath value -> name (csrc/include/twinengine/gemm.h)."""

GEMM_STAGINGS = {0: "none", 1: "swizzle", 2: "bfloat16", 3: "float32"}
"""TweGemmStaging value -> name."""

GEMM_EPILOGUES = {0: "direct", 1: "cublas_bias", 2: "bias_add", 3: "staged"}
"""TweGemmEpilogue value -> name."""

CUBLAS_WORKSPACE_BYTES = 32 * 1024 * 1024
"""The cuBLASLt part of the workspace (kTweGemmCublasWorkspaceBytes)."""

_WORKSPACE_ALIGN = 256
_SCALAR_BYTES = 256


def _dtype_code(x: Any) -> int:
    return ABI_CODES[canonical_dtype(x.dtype)]


def _nbytes(x: Any) -> int:
    if x is None:
        return 0
    itemsize = {"float32": 4, "bfloat16": 2, "float16": 2}.get(canonical_dtype(x.dtype), 1)
    return math.prod(tuple(x.shape)) * itemsize


def gemm_plan_query(a: Any, b: Any, bias: Any = None, *, a_columnwise: bool = False, b_columnwise: bool = False,
                    out_dtype: str = "float32", device: str = "cuda", sm: int = 0,
                    cublaslt_version: int = 0) -> dict[str, int]:
    """The dispatcher's query (TweGemmPlanQuery fields) for a validated gemm call.

    a, b: ArrayMeta-like descriptions or QuantizedTensors holding the copies the GEMM reads;
    bias: None or anything with shape/dtype. ``sm`` is the device's compute capability
    (major·10 + minor), ``cublaslt_version`` what ``twinengine._C.gemm_cublaslt_version()``
    reports (0 when cuBLASLt cannot be loaded).
    """
    call = _infer(a, b, bias, a_columnwise=a_columnwise, b_columnwise=b_columnwise, out_dtype=out_dtype)
    attrs = call.attr_dict()
    m, n = call.outputs[0].shape
    _, k = _logical_dims(a, a_columnwise)
    query = {"scaling": attrs["scaling"], "out_dtype": ABI_CODES[out_dtype], "has_bias": int(bias is not None),
             "bias_dtype": _dtype_code(bias) if bias is not None else 0, "a_k_major": attrs["a_k_major"],
             "b_k_major": attrs["b_k_major"], "a_block_2d": attrs["a_block_2d"], "b_block_2d": attrs["b_block_2d"],
             "m": m, "n": n, "k": k, "device": {"cpu": 0, "cuda": 1}[device], "sm": sm,
             "cublaslt_version": cublaslt_version}
    for name, x, columnwise in (("a", a, a_columnwise), ("b", b, b_columnwise)):
        if isinstance(x, QuantizedTensor):
            data, scale_inv, _ = copy_arrays(x, columnwise)
            query[f"{name}_dtype"] = _dtype_code(data)
            query[f"{name}_scale_bytes"] = _nbytes(scale_inv)
        else:
            query[f"{name}_dtype"] = _dtype_code(x)
            query[f"{name}_scale_bytes"] = 0
    return query


def _staging_bytes(staging: str, rows: int, k: int, scale_bytes: int) -> int:
    per_element = {"bfloat16": 2, "float32": 4}.get(staging)
    if staging == "swizzle":
        return round_up(scale_bytes, _WORKSPACE_ALIGN)
    return round_up(rows * k * per_element, _WORKSPACE_ALIGN) if per_element else 0


def gemm_workspace_bytes(plan: dict[str, Any], query: dict[str, int]) -> int:
    """Bytes of CUDA workspace a GEMM plan needs (0 unless cuBLASLt runs).

    Layout (csrc/include/twinengine/gemm.h), each part a multiple of 256 bytes: the cuBLASLt
    workspace, A's staging (swizzled scales, or dequantized data rows·K·2 / ·4), B's staging,
    the fp32 (M, N) output staging for a staged epilogue, 256 bytes of device scalars, and
    256 bytes of slack to align the base pointer.
    """
    if GEMM_PATHS[plan["path"]] not in ("cublaslt", "dequant_cublaslt"):
        return 0
    total = CUBLAS_WORKSPACE_BYTES
    total += _staging_bytes(GEMM_STAGINGS[plan["a_staging"]], query["m"], query["k"], query["a_scale_bytes"])
    total += _staging_bytes(GEMM_STAGINGS[plan["b_staging"]], query["n"], query["k"], query["b_scale_bytes"])
    if GEMM_EPILOGUES[plan["epilogue"]] == "staged":
        total += round_up(query["m"] * query["n"] * 4, _WORKSPACE_ALIGN)
    return total + _SCALAR_BYTES + _WORKSPACE_ALIGN


def with_workspace(call: KernelCall, nbytes: int) -> KernelCall:
    """The call with a uint8 (nbytes,) workspace output appended (none when nbytes is 0): the
    framework allocates it (torch caching allocator, XLA result buffer), so the kernel's
    scratch is stream-ordered and stays valid under CUDA-graph capture."""
    if nbytes <= 0:
        return call
    return dataclasses.replace(call, outputs=call.outputs + (TensorSpec("workspace", (nbytes,), "uint8"),))
# ---- grouped GEMMs (GroupedLinear: G experts, one kernel call per GEMM phase) ------------------

_GROUPED = "grouped_linear"


def _check_hp_operand(name: str, x: Any, rank: int) -> None:
    if isinstance(x, QuantizedTensor) or not isinstance(x, ArrayMeta):
        fail(_GROUPED, TypeError, f"{name} must be a high-precision array (grouped GEMMs take float32, bfloat16 or "
             f"float16 operands), got {type(x).__name__}")
    if x.dtype not in HIGH_PRECISION:
        fail(_GROUPED, TypeError, f"{name} must be float32, bfloat16 or float16, got {x.dtype}")
    if len(x.shape) != rank:
        fail(_GROUPED, ValueError, f"{name} must have rank {rank}, got shape {tuple(x.shape)}")


def check_m_splits(m_splits: ArrayMeta, num_gemms: Any) -> None:
    """m_splits: a 1-D int32 array of one row count per GEMM.

    Raises:
        TypeError: not a 1-D int32 array. ValueError: not num_gemms entries.
    """
    if not isinstance(m_splits, ArrayMeta) or m_splits.dtype != "int32" or len(m_splits.shape) != 1:
        fail(_GROUPED, TypeError, "m_splits must be a 1-D int32 array (one row count per GEMM), got "
             f"{getattr(m_splits, 'dtype', type(m_splits).__name__)} of shape {tuple(getattr(m_splits, 'shape', ()))}")
    if m_splits.shape[0] != num_gemms:
        fail(_GROUPED, ValueError, f"m_splits must have {num_gemms} entries (one per GEMM), got {m_splits.shape[0]}")


def check_m_split_values(splits: Any, num_rows: int) -> None:
    """The values of a GroupedLinear's m_splits: x is the concatenation of the G expert blocks,
    so every split is >= 0 and they sum to the row count (TE's rule). The same sentences are
    the C kernels' (csrc/abi/gemm.cc, csrc/abi/quantize.cc), which check splits they read on
    the host (a traced or device split that Python cannot inspect without a sync).

    Raises:
        ValueError: a negative split, or Σ m_splits != num_rows.
    """
    splits = [int(s) for s in splits]
    if any(s < 0 for s in splits):
        fail(_GROUPED, ValueError, f"m_splits must be >= 0, got {splits}")
    if sum(splits) != num_rows:
        fail(_GROUPED, ValueError, f"m_splits must sum to the {num_rows} rows of the input, got sum {sum(splits)}")


def check_grouped_weights(num_gemms: int, weights: Any, biases: Any = None) -> None:
    """The per-GEMM weights (and biases) of a grouped layer: num_gemms of each, one shape.

    Raises:
        ValueError: wrong count, differing shapes, or a bias that does not match its weight.
    """
    if num_gemms < 1:
        fail(_GROUPED, ValueError, f"num_gemms must be >= 1, got {num_gemms}")
    if len(weights) != num_gemms:
        fail(_GROUPED, ValueError, f"expected {num_gemms} weights (one per GEMM), got {len(weights)}")
    shapes = {tuple(w.shape) for w in weights}
    if len(shapes) != 1:
        fail(_GROUPED, ValueError, f"all weights must have one shape, got {sorted(shapes)}")
    if biases is not None:
        if len(biases) != num_gemms:
            fail(_GROUPED, ValueError, f"expected {num_gemms} biases (one per GEMM), got {len(biases)}")
        out_features = weights[0].shape[0]
        if any(tuple(b.shape) != (out_features,) for b in biases):
            fail(_GROUPED, ValueError, f"every bias must have shape ({out_features},), got "
                 f"{[tuple(b.shape) for b in biases]}")


def grouped_quantizers(recipe: Any, input_dtype: str | None = None, *, delayed_ok: bool = True) -> Any:
    """The LinearQuantizers of a GroupedLinear under `recipe` (None: high precision), for x of
    dtype `input_dtype` (NVFP4 applies the RHT to bfloat16 operands only, as Linear does).

    Raises:
        TypeError: a recipe whose quantized grouped path is not built (2D MXFP8, a
            CustomRecipe's other quantizers), DelayedScaling where `delayed_ok` is False (a
            caller without per-expert state), or the errors of core.linear.linear_quantizers.
    """
    if recipe is None:
        return None
    from ..linear import linear_quantizers

    qs = linear_quantizers(recipe, input_dtype)
    roles = (qs.input, qs.weight, qs.grad_output)
    if any(q.scaling_mode not in ("fp8_current", "fp8_delayed", "mxfp8", "fp8_block", "nvfp4")
           or (q.scaling_mode == "mxfp8" and q.with_2d_quantization) for q in roles):
        fail(_GROUPED, TypeError, "GroupedLinear runs in high precision or with DelayedScaling, Float8CurrentScaling, "
             f"1D MXFP8BlockScaling, Float8BlockScaling or NVFP4BlockScaling; quantized grouped GEMMs for "
             f"{type(recipe).__name__} with these quantizers are not implemented yet: call it outside autocast or in "
             "autocast(enabled=False)")
    if qs.delayed and not delayed_ok:
        fail(_GROUPED, TypeError, "DelayedScaling needs per-expert amax histories and scales: use "
             "twinengine.pytorch.GroupedLinear (buffers), grouped_linear(..., delayed_state=...) or "
             "twinengine.jax.grouped_dense(..., state=...)")
    return qs


def check_grouped_rng(qs: Any, has_rng: bool, has_weight_cache: bool = False) -> None:
    """A quantized GroupedLinear call's rng and weight cache under `qs`.

    Raises:
        ValueError: stochastic rounding without rng (core.linear.check_rng's text).
        TypeError: a weight cache with NVFP4 (its weights are quantized per call, as Linear's).
    """
    from ..linear import check_rng

    check_rng(qs, has_rng)
    if has_weight_cache and qs.weight.scaling_mode == "nvfp4":
        fail(_GROUPED, TypeError, "pre-quantized NVFP4 weights are not supported (no FP8 weight caching under "
             "NVFP4BlockScaling); the weights are quantized per call")


def block_2d(quantizer: Any) -> bool:
    """The quantizer makes 128x128 FP8 block tiles (the grouped GEMMs' a_block_2d / b_block_2d)."""
    return getattr(quantizer, "block_scaling_dim", 1) == 2


def check_grouped_delayed_state(num_gemms: int, history_len: Any, qs: Any, shapes: Any = None) -> None:
    """A GroupedLinear's DelayedScaling state: fwd_amax_history (L, 2G) (the G inputs' slots,
    then the G weights'), fwd_scale (2G,), bwd_amax_history (L, G), bwd_scale (G,).

    Raises:
        ValueError: state missing, of the recipe's wrong length, or of the wrong shapes.
    """
    from ..linear import check_delayed_state

    check_delayed_state(history_len, qs)
    if shapes is not None:
        want = ((history_len, 2 * num_gemms), (2 * num_gemms,), (history_len, num_gemms), (num_gemms,))
        if tuple(tuple(s) for s in shapes) != want:
            fail(_GROUPED, ValueError, "the delayed-scaling state of a GroupedLinear of {} GEMMs must have shapes "
                 "(fwd_amax_history {}, fwd_scale {}, bwd_amax_history {}, bwd_scale {}), got {}".format(
                     num_gemms, *want, [tuple(s) for s in shapes]))


def _check_fp8(name: str, x: ArrayMeta, rank: int, scaling_mode: str = "fp8_current") -> None:
    if scaling_mode == "nvfp4":
        if x.dtype != "uint8" or len(x.shape) != rank:
            fail(_GROUPED, TypeError, f"{name} must be packed NVFP4 (uint8) data of rank {rank}, got {x.dtype} "
                 f"{tuple(x.shape)}")
        return
    if x.dtype not in ("float8_e4m3fn", "float8_e5m2") or len(x.shape) != rank:
        fail(_GROUPED, TypeError, f"{name} must be FP8 data of rank {rank}, got {x.dtype} {tuple(x.shape)}")


def _check_group_amax(scaling_mode: str, groups: Any, a_amax: Any, b_amax: Any) -> None:
    """NVFP4 operands carry one global amax per group (float32 (G,)); other formats none."""
    for name, amax in (("a_amax", a_amax), ("b_amax", b_amax)):
        if scaling_mode != "nvfp4":
            if amax is not None:
                fail(_GROUPED, ValueError, f"{name} is only taken by NVFP4 grouped GEMMs")
        elif amax is None or amax.dtype != "float32" or tuple(amax.shape) != (groups,):
            fail(_GROUPED, ValueError, f"{name} must be float32 of shape ({groups},) (each group's NVFP4 global "
                 f"amax), got {None if amax is None else (amax.dtype, tuple(amax.shape))}")


def _check_group_scales(name: str, scale: ArrayMeta, groups: Any, scaling_mode: str = "fp8_current") -> None:
    if scaling_mode == "nvfp4":
        if scale.dtype != "uint8" or len(scale.shape) != 1:
            fail(_GROUPED, ValueError, f"{name} must be flat uint8 NVFP4 block scales, got {scale.dtype} "
                 f"{tuple(scale.shape)}")
        return
    if scaling_mode == "fp8_block":
        if scale.dtype != "float32" or len(scale.shape) != 1:
            fail(_GROUPED, ValueError, f"{name} must be flat float32 FP8 block scales, got {scale.dtype} "
                 f"{tuple(scale.shape)}")
        return
    if scaling_mode == "mxfp8":
        if scale.dtype != "uint8" or len(scale.shape) != 2:
            fail(_GROUPED, ValueError, f"{name} must be 2-D uint8 MXFP8 scales, got {scale.dtype} {tuple(scale.shape)}")
        return
    if scale.dtype != "float32" or tuple(scale.shape) != (groups,):
        fail(_GROUPED, ValueError, f"{name} must be float32 of shape ({groups},), got {scale.dtype} {tuple(scale.shape)}")


def _validate_grouped_fp8(a: ArrayMeta, a_scale_inv: ArrayMeta, b: ArrayMeta, b_scale_inv: ArrayMeta,
                          m_splits: ArrayMeta, bias: ArrayMeta | None = None, a_amax: ArrayMeta | None = None,
                          b_amax: ArrayMeta | None = None, *, scaling_mode: str = "fp8_current",
                          b_k_major: bool = True, out_dtype: str = "float32", a_block_2d: bool = False,
                          b_block_2d: bool = False) -> None:
    _check_fp8("a", a, 2, scaling_mode)
    _check_fp8("b", b, 3, scaling_mode)
    check_m_splits(m_splits, b.shape[0])
    _check_group_scales("a_scale_inv", a_scale_inv, b.shape[0], scaling_mode)
    _check_group_scales("b_scale_inv", b_scale_inv, b.shape[0], scaling_mode)
    _check_group_amax(scaling_mode, b.shape[0], a_amax, b_amax)
    if scaling_mode == "nvfp4" and not b_k_major:
        fail(_GROUPED, ValueError, "NVFP4 grouped GEMM operands must be K-major")
    if a.shape[1] != (b.shape[2] if b_k_major else b.shape[1]):
        fail(_GROUPED, ValueError, f"a {tuple(a.shape)} and b {tuple(b.shape)} disagree on K")
    if out_dtype not in HIGH_PRECISION:
        fail(_GROUPED, TypeError, f"out_dtype must be float32, bfloat16 or float16, got {out_dtype}")
    if bias is not None:
        _check_hp_operand("bias", bias, 2)
        if tuple(bias.shape) != tuple(b.shape[:2]):
            fail(_GROUPED, ValueError, f"bias must have shape {tuple(b.shape[:2])}, got {tuple(bias.shape)}")


def _grouped_inputs(scaling_mode: str) -> tuple[str, ...]:
    """Kernel input order of a quantized grouped GEMM: each operand's data, scales (and NVFP4 amax)."""
    if scaling_mode == "nvfp4":
        return ("a", "a_scale_inv", "a_amax", "b", "b_scale_inv", "b_amax", "m_splits")
    return ("a", "a_scale_inv", "b", "b_scale_inv", "m_splits")


def _infer_grouped_fp8(a: ArrayMeta, a_scale_inv: ArrayMeta, b: ArrayMeta, b_scale_inv: ArrayMeta,
                       m_splits: ArrayMeta, bias: ArrayMeta | None = None, a_amax: ArrayMeta | None = None,
                       b_amax: ArrayMeta | None = None, *, scaling_mode: str = "fp8_current",
                       b_k_major: bool = True, out_dtype: str = "float32", a_block_2d: bool = False,
                       b_block_2d: bool = False) -> KernelCall:
    inputs = _grouped_inputs(scaling_mode) + (("bias",) if bias is not None else ())
    n = b.shape[1] if b_k_major else b.shape[2]
    return KernelCall("grouped_gemm", inputs, (TensorSpec("out", (a.shape[0], n), out_dtype),),
                      (("scaling", _SCALING_CODES[scaling_mode]), ("a_k_major", 1), ("b_k_major", int(b_k_major)),
                       ("a_block_2d", int(a_block_2d)), ("b_block_2d", int(b_block_2d))))


GROUPED_GEMM_FP8 = OpDef(
    name="grouped_gemm_fp8",
    args=("a", "a_scale_inv", "b", "b_scale_inv", "m_splits", "bias", "a_amax", "b_amax"),
    attrs=("scaling_mode", "b_k_major", "out_dtype", "a_block_2d", "b_block_2d"),
    validate=_validate_grouped_fp8,
    infer=_infer_grouped_fp8,
)
"""grouped_gemm_fp8(a, a_scale_inv, b, b_scale_inv, m_splits, bias=None, a_amax=None, b_amax=None, *,
out_dtype) -> out (M, N).

Shapes: a (M, K) FP8 rows of G blocks (each quantized on its own, a_scale_inv (G,)); b (G, N, K)
    K-major FP8 (fprop: the rowwise weights; dgrad: the transposed columnwise copies (G, K, N)
    read as (G, N', K')), b_scale_inv (G,); bias (G, N). MXFP8 / FP8 block / NVFP4: the block
    scales as ``grouped_quantize`` lays them out. NVFP4: data packed (M, K/2) and (G, N, K/2),
    a_amax / b_amax (G,) each group's global amaxes.
Numerics: each group exactly ``gemm`` of the per-expert quantized operands (NUMERICS.md §8). CPU only.
"""


def _validate_grouped_wgrad_fp8(a: ArrayMeta, a_scale_inv: ArrayMeta, b: ArrayMeta, b_scale_inv: ArrayMeta,
                                m_splits: ArrayMeta, a_amax: ArrayMeta | None = None, b_amax: ArrayMeta | None = None,
                                *, scaling_mode: str = "fp8_current", out_dtype: str = "float32",
                                a_block_2d: bool = False, b_block_2d: bool = False) -> None:
    _check_fp8("a", a, 2, scaling_mode)
    _check_fp8("b", b, 2, scaling_mode)
    if not isinstance(m_splits, ArrayMeta) or m_splits.dtype != "int32" or len(m_splits.shape) != 1:
        check_m_splits(m_splits, -1)
    _check_group_scales("a_scale_inv", a_scale_inv, m_splits.shape[0], scaling_mode)
    _check_group_scales("b_scale_inv", b_scale_inv, m_splits.shape[0], scaling_mode)
    _check_group_amax(scaling_mode, m_splits.shape[0], a_amax, b_amax)
    transposed = _COLUMNWISE_TRANSPOSED[scaling_mode]
    if (a.shape[1] if transposed else a.shape[0]) != (b.shape[1] if transposed else b.shape[0]):
        fail(_GROUPED, ValueError, f"a {tuple(a.shape)} and b {tuple(b.shape)} disagree on the rows M")
    if out_dtype not in HIGH_PRECISION:
        fail(_GROUPED, TypeError, f"out_dtype must be float32, bfloat16 or float16, got {out_dtype}")


def _infer_grouped_wgrad_fp8(a: ArrayMeta, a_scale_inv: ArrayMeta, b: ArrayMeta, b_scale_inv: ArrayMeta,
                             m_splits: ArrayMeta, a_amax: ArrayMeta | None = None, b_amax: ArrayMeta | None = None,
                             *, scaling_mode: str = "fp8_current", out_dtype: str = "float32",
                             a_block_2d: bool = False, b_block_2d: bool = False) -> KernelCall:
    transposed = _COLUMNWISE_TRANSPOSED[scaling_mode]
    n, k = (a.shape[0], b.shape[0]) if transposed else (a.shape[1], b.shape[1])
    return KernelCall("grouped_gemm_wgrad", _grouped_inputs(scaling_mode),
                      (TensorSpec("out", (m_splits.shape[0], n, k), out_dtype),),
                      (("scaling", _SCALING_CODES[scaling_mode]), ("a_k_major", int(transposed)),
                       ("b_k_major", int(transposed)), ("a_block_2d", int(a_block_2d)),
                       ("b_block_2d", int(b_block_2d))))


GROUPED_GEMM_WGRAD_FP8 = OpDef(
    name="grouped_gemm_wgrad_fp8",
    args=("a", "a_scale_inv", "b", "b_scale_inv", "m_splits", "a_amax", "b_amax"),
    attrs=("scaling_mode", "out_dtype", "a_block_2d", "b_block_2d"),
    validate=_validate_grouped_wgrad_fp8,
    infer=_infer_grouped_wgrad_fp8,
)
"""grouped_gemm_wgrad_fp8(a, a_scale_inv, b, b_scale_inv, m_splits, a_amax=None, b_amax=None, *,
out_dtype) -> out (G, N, K).

Shapes: a: grad_output's grouped columnwise copy, the blocks (N, m_g) one after another viewed
    as (N, M) (NVFP4: packed, (N, M/2)); b: the input's, (K, m_g) blocks viewed as (K, M)
    (NVFP4: (K, M/2)); scales (G,) or as ``grouped_quantize`` lays them out; NVFP4 amaxes (G,).
Numerics: out[g] exactly ``gemm(dy_g, x_g, a_columnwise=True, b_columnwise=True)`` of the
    per-expert quantized tensors. CPU only.
"""


def _validate_grouped(a: Any, b: Any, m_splits: Any, bias: Any = None, *, b_columnwise: bool = False,
                      out_dtype: str = "float32") -> None:
    _check_hp_operand("x", a, 2)
    _check_hp_operand("weights", b, 3)
    check_m_splits(m_splits, b.shape[0])
    k_b = b.shape[1] if b_columnwise else b.shape[2]
    if a.shape[1] != k_b:
        fail(_GROUPED, ValueError, f"x has {a.shape[1]} features but the weights {tuple(b.shape)} "
             f"(columnwise={b_columnwise}) contract over {k_b}")
    if out_dtype not in HIGH_PRECISION:
        fail(_GROUPED, TypeError, f"out_dtype must be float32, bfloat16 or float16, got {out_dtype}")
    if bias is not None:
        _check_hp_operand("bias", bias, 2)
        n = b.shape[2] if b_columnwise else b.shape[1]
        if tuple(bias.shape) != (b.shape[0], n):
            fail(_GROUPED, ValueError, f"bias must have shape ({b.shape[0]}, {n}), got {tuple(bias.shape)}")


def _infer_grouped(a: Any, b: Any, m_splits: Any, bias: Any = None, *, b_columnwise: bool = False,
                   out_dtype: str = "float32") -> KernelCall:
    n = b.shape[2] if b_columnwise else b.shape[1]
    inputs = ("a", "b", "m_splits") + (("bias",) if bias is not None else ())
    return KernelCall("grouped_gemm", inputs, (TensorSpec("out", (a.shape[0], n), out_dtype),),
                      (("scaling", 0), ("a_k_major", 1), ("b_k_major", int(not b_columnwise))))


GROUPED_GEMM = OpDef(
    name="grouped_gemm",
    args=("a", "b", "m_splits", "bias"),
    attrs=("b_columnwise", "out_dtype"),
    validate=_validate_grouped,
    infer=_infer_grouped,
)
"""grouped_gemm(a, b, m_splits, bias=None, *, b_columnwise, out_dtype) -> out (M, N).

Shapes: a (M, K) rows in G consecutive blocks of m_splits; b (G, N, K) (fprop: the stacked
    weights) or, b_columnwise, (G, K, N) used transposed (dgrad); bias (G, N); out (M, N).
Dtypes: high precision (fp32 / bf16 / fp16) operands; m_splits int32 (G,); out fp32/bf16/fp16.
Numerics: each group's rows are exactly ``gemm`` on those rows (NUMERICS.md §8: fp32
    accumulation, bias in fp32, one rounding). m_splits is read by the kernel (no host sync);
    the CPU kernel raises ``check_m_split_values``'s error for negative sizes or Σ != M.
"""


def _validate_grouped_wgrad(a: Any, b: Any, m_splits: Any, *, a_row_sum: bool = False,
                            out_dtype: str = "float32") -> None:
    _check_hp_operand("grad_output" if not a_row_sum else "ones", a, 2)
    _check_hp_operand("x", b, 2)
    if not isinstance(m_splits, ArrayMeta) or m_splits.dtype != "int32" or len(m_splits.shape) != 1:
        check_m_splits(m_splits, -1)
    rows_a = a.shape[1] if a_row_sum else a.shape[0]
    if rows_a != b.shape[0] or (a_row_sum and a.shape[0] != 1):
        fail(_GROUPED, ValueError, f"grad_output {tuple(a.shape)} and x {tuple(b.shape)} must have the same rows")
    if out_dtype not in HIGH_PRECISION:
        fail(_GROUPED, TypeError, f"out_dtype must be float32, bfloat16 or float16, got {out_dtype}")


def _infer_grouped_wgrad(a: Any, b: Any, m_splits: Any, *, a_row_sum: bool = False,
                         out_dtype: str = "float32") -> KernelCall:
    n = 1 if a_row_sum else a.shape[1]
    return KernelCall("grouped_gemm_wgrad", ("a", "b", "m_splits"),
                      (TensorSpec("out", (m_splits.shape[0], n, b.shape[1]), out_dtype),),
                      (("scaling", 0), ("a_k_major", int(a_row_sum)), ("b_k_major", 0)))


GROUPED_GEMM_WGRAD = OpDef(
    name="grouped_gemm_wgrad",
    args=("a", "b", "m_splits"),
    attrs=("a_row_sum", "out_dtype"),
    validate=_validate_grouped_wgrad,
    infer=_infer_grouped_wgrad,
)
"""grouped_gemm_wgrad(a, b, m_splits, *, a_row_sum, out_dtype) -> out (G, N, K).

Shapes: a (M, N) (grad_output) or, a_row_sum, ones (1, M) (then N = 1: the bias gradient);
    b (M, K); out[g] = a[rows_g]ᵀ · b[rows_g].
Numerics: exactly ``gemm(a_g, b_g, a_columnwise=True, b_columnwise=True)`` per group (the
    Linear wgrad; with a_row_sum the Linear bias gradient ones(1, m_g) · dy_g); an empty group
    gives zeros.
"""
