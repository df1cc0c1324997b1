"""The permute family: MoE token permutation (NUMERICS.md §10).

Each op is one :class:`OpDef`; both frontends call ``OP.plan(...)`` and never restate a
shape, a check or an error text. The helpers below resolve the sizes a frontend needs before
planning (``num_out_tokens``, the token count of an unpermute) and check routing values when
the frontend can see them (eagerly, outside a compiled or jitted graph).

Map types:
    index: ``routing_map`` int32 (T, topK) of expert ids; ``row_id_map`` int32 (topK·T,)
        laid out [k][t].
    mask: ``routing_map`` (T, E) of 0/1 (bool, uint8 or int32); ``row_id_map`` int32
        (T, 2E+1).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..dtypes import ABI_CODES, HIGH_PRECISION
from ..quantized_tensor import QuantizedTensor
from .opdef import KernelCall, OpDef, TensorSpec, dims, fail, round_up

MAP_TYPES = {"index": 0, "mask": 1}
"""map_type name -> TweMapType code."""

ROUTING_DTYPES = {"index": ("int32",), "mask": ("uint8", "int32")}
"""Kernel dtypes of a routing map (frontends view a bool mask as uint8 first)."""

_MAX_ROWS = 2**31 - 1  # row ids are int32

MOVABLE_DTYPES = tuple(ABI_CODES)
"""dtypes whose rows the permutation kernels move as bytes (plain inputs and quantized fields)."""

FRONTEND_ROUTING_DTYPES = {"index": ("int32", "int64"), "mask": ("bool", "uint8", "int32", "int64")}
"""routing_map dtypes the public functions take: bool masks are viewed as uint8 and int64 maps
(what ``torch.topk`` / ``jax.lax.top_k`` with x64 / ``one_hot`` return) converted to int32
before the kernels see them (ROUTING_DTYPES)."""


def check_routing_map(op: str, map_type: str, routing_map: Any) -> None:
    """The frontends' first check of a routing map, before they read its values or convert it.

    Raises:
        ValueError: unknown map_type, or a routing map that is not 2-D.
        TypeError: a dtype outside FRONTEND_ROUTING_DTYPES.
    """
    _check_map_type(op, map_type)
    _check_2d(op, "routing_map", routing_map)
    if routing_map.dtype not in FRONTEND_ROUTING_DTYPES[map_type]:
        fail(op, TypeError, f"a {map_type} routing_map must have dtype "
             f"{' or '.join(FRONTEND_ROUTING_DTYPES[map_type])}, got {routing_map.dtype}")


def check_sort_chunks_probs(op: str, probs: Any, num_rows: Any) -> None:
    """probs of sort_chunks_by_index_with_probs: high precision, one value per row of inp.

    Raises:
        TypeError: not float32 / bfloat16 / float16. ValueError: not of shape (num_rows,).
    """
    _check_hp(op, "probs", probs)
    if tuple(probs.shape) != (num_rows,):
        fail(op, ValueError, f"probs must have shape ({int(num_rows)},) (one per row of inp), got {dims(probs.shape)}")


def _check_map_type(op: str, map_type: str) -> None:
    if map_type not in MAP_TYPES:
        fail(op, ValueError, f"map_type must be 'index' or 'mask', got {map_type!r}")


def _check_hp(op: str, name: str, meta: Any) -> None:
    if meta.dtype not in HIGH_PRECISION:
        fail(op, TypeError, f"{name} must be float32, bfloat16 or float16, got {meta.dtype}")


def _check_2d(op: str, name: str, meta: Any) -> None:
    if len(meta.shape) != 2:
        fail(op, ValueError, f"{name} must be 2-D, got shape {dims(meta.shape)}")


def _attrs(map_type: str, num_tokens: Any, num_slots: Any, num_out_tokens: Any) -> tuple[tuple[str, Any], ...]:
    return (("map_type", MAP_TYPES[map_type]), ("num_tokens", num_tokens), ("num_slots", num_slots),
            ("num_out_tokens", num_out_tokens))


def num_slots_of(op: str, map_type: str, row_id_map: Any, num_tokens: Any) -> Any:
    """topK (index map: len(row_id_map) / T) or E (mask map: (columns − 1) / 2) of a row_id_map.

    Raises:
        TypeError / ValueError: row_id_map is not int32 or its shape fits no map of T tokens.
    """
    if row_id_map.dtype != "int32":
        fail(op, TypeError, f"row_id_map must be int32, got {row_id_map.dtype}")
    shape = tuple(row_id_map.shape)
    if map_type == "index":
        if num_tokens == 0 and shape == (0,):
            return 1
        if len(shape) != 1 or num_tokens < 1 or shape[0] % num_tokens != 0 or shape[0] == 0:
            fail(op, ValueError, f"an index-map row_id_map must have shape (topK * {int(num_tokens)},), "
                 f"got {dims(shape)}")
        return shape[0] // num_tokens
    if len(shape) != 2 or shape[0] != num_tokens or shape[1] % 2 != 1 or shape[1] < 3:
        fail(op, ValueError, f"a mask-map row_id_map must have shape ({int(num_tokens)}, 2 * num_experts + 1), "
             f"got {dims(shape)}")
    return (shape[1] - 1) // 2


def probs_slots(num_slots: Any, num_tokens: Any, probs: Any, map_type: str) -> Any:
    """Slots of a probs array: num_slots, except for an index map of zero tokens, whose
    row_id_map (0,) does not tell topK: then probs' own (0, topK) columns."""
    if map_type == "index" and num_tokens == 0 and probs is not None and len(probs.shape) == 2:
        return probs.shape[1]
    return num_slots


def _check_probs(op: str, name: str, probs: Any, num_tokens: Any, num_slots: Any, map_type: str) -> None:
    if probs is None:
        return
    _check_hp(op, name, probs)
    num_slots = probs_slots(num_slots, num_tokens, probs, map_type)
    what = "topK" if map_type == "index" else "num_experts"
    if tuple(probs.shape) != (num_tokens, num_slots):
        fail(op, ValueError, f"{name} must have shape ({num_tokens}, {num_slots}) = (num_tokens, {what}), "
             f"got {dims(probs.shape)}")


# ---- sizes and eager value checks ----------------------------------------------------------

def resolve_num_out_tokens(op: str, map_type: str, routing_map: Any, num_out_tokens: Any,
                           count_routed: Callable[[], int] | None = None) -> Any:
    """The concrete number of permuted rows.

    ``num_out_tokens > 0`` is used as given. Otherwise (all routed tokens): T·topK for the
    index map (a static size); for the mask map the number of nonzero routing entries, which
    ``count_routed()`` reads from the values — a frontend passes None inside a compiled or
    jitted graph, where they cannot be read — except that a map of zero tokens routes none
    (0, static, so also inside a graph).

    Raises:
        ValueError: mask map, num_out_tokens <= 0 and no ``count_routed`` (traced).
    """
    _check_map_type(op, map_type)
    if num_out_tokens is None or isinstance(num_out_tokens, (bool, float)):
        fail(op, TypeError, f"num_out_tokens must be an int, got {num_out_tokens!r}")
    if num_out_tokens > 0:
        return num_out_tokens
    if map_type == "index" or routing_map.shape[0] == 0:
        return routing_map.shape[0] * routing_map.shape[1]
    if count_routed is None:
        fail(op, ValueError, "with map_type='mask', num_out_tokens <= 0 means 'all routed tokens', a size that "
             "depends on the routing map's values: inside torch.compile / jax.jit pass num_out_tokens explicitly "
             "(e.g. num_tokens * topK, or a capacity); routed pairs past it are dropped")
    return count_routed()


def check_routing_values(op: str, map_type: str, min_value: int, max_value: int) -> None:
    """Eager check of a routing map's values (index: ids >= 0; mask: entries in {0, 1}).

    Raises:
        ValueError: a value outside that range (inside a graph such entries are dropped instead).
    """
    if map_type == "index" and min_value < 0:
        fail(op, ValueError, f"routing_map holds expert id {min_value}; expert ids must be >= 0")
    if map_type == "index" and max_value > _MAX_ROWS:
        fail(op, ValueError, f"routing_map holds expert id {max_value}; expert ids must be < 2**31")
    if map_type == "mask" and (min_value < 0 or max_value > 1):
        bad = min_value if min_value < 0 else max_value
        fail(op, ValueError, f"a mask routing_map must hold only 0 and 1, found {bad}")


def check_chunk_values(op: str, split_sizes: Sequence[int], sorted_index: Sequence[int], num_rows: int) -> None:
    """Eager check of sort_chunks_by_index arguments.

    Raises:
        ValueError: a negative split size, splits not summing to the row count, or
            sorted_index not a permutation of range(len(split_sizes)).
    """
    if any(s < 0 for s in split_sizes):
        fail(op, ValueError, f"split_sizes must be >= 0, got {list(split_sizes)}")
    if sum(split_sizes) != num_rows:
        fail(op, ValueError, f"split_sizes must sum to the {int(num_rows)} rows of inp, got sum {sum(split_sizes)}")
    if sorted(sorted_index) != list(range(len(split_sizes))):
        fail(op, ValueError, f"sorted_index must be a permutation of range({len(split_sizes)}), "
             f"got {list(sorted_index)}")


def unpermute_num_tokens(op: str, map_type: str, y: Any, row_id_map: Any, merging_probs: Any,
                         restore_shape: Sequence[Any] | None) -> Any:
    """T of an unpermute: rows of the mask map; for the index map the rows of restore_shape
    (flattened to 2-D), else of merging_probs, else len(row_id_map) (topK = 1).

    Raises:
        ValueError: restore_shape does not describe (T, hidden) rows of y's hidden size.
    """
    _check_map_type(op, map_type)
    if len(y.shape) != 2:
        fail(op, ValueError, f"inp must be 2-D (num_out_tokens, hidden), got shape {dims(y.shape)}")
    rows = None
    if restore_shape is not None:
        restore_shape = tuple(restore_shape)
        if len(restore_shape) < 1 or restore_shape[-1] != y.shape[1]:
            fail(op, ValueError, f"restore_shape must end in the hidden size {int(y.shape[1])}, got {restore_shape}")
        rows = 1
        for dim in restore_shape[:-1]:
            rows = rows * dim
    if map_type == "mask":
        if len(row_id_map.shape) != 2:
            fail(op, ValueError, f"a mask-map row_id_map must be 2-D, got shape {dims(row_id_map.shape)}")
        if rows is not None and rows != row_id_map.shape[0]:
            fail(op, ValueError, f"restore_shape {restore_shape} does not hold the {int(row_id_map.shape[0])} tokens "
                 "of row_id_map")
        return row_id_map.shape[0]
    if rows is not None:
        return rows
    if merging_probs is not None:
        return merging_probs.shape[0]
    return row_id_map.shape[0]


# ---- row_id_map ------------------------------------------------------------------------------

def _validate_row_id_map(routing_map: Any, num_out_tokens: Any, map_type: str) -> None:
    op = "moe_permute"
    _check_map_type(op, map_type)
    _check_2d(op, "routing_map", routing_map)
    if routing_map.dtype not in ROUTING_DTYPES[map_type]:
        fail(op, TypeError, f"a {map_type} routing_map must have dtype "
             f"{' or '.join(ROUTING_DTYPES[map_type] + (('bool',) if map_type == 'mask' else ()))}, "
             f"got {routing_map.dtype}")
    tokens, slots = routing_map.shape
    if tokens < 0 or slots < 1:
        fail(op, ValueError, "routing_map must have at least one slot, got shape "
             f"{dims(routing_map.shape)}")
    if tokens * slots > _MAX_ROWS or num_out_tokens > _MAX_ROWS:
        fail(op, ValueError, "row ids are int32: num_tokens * slots and num_out_tokens must be < 2**31")
    if num_out_tokens < 0:
        fail(op, ValueError, f"num_out_tokens must be resolved to a size >= 0, got {int(num_out_tokens)}")


def _infer_row_id_map(routing_map: Any, num_out_tokens: Any, map_type: str) -> KernelCall:
    tokens, slots = routing_map.shape
    if map_type == "index":
        outputs = (TensorSpec("row_id_map", (slots * tokens,), "int32"),
                   TensorSpec("workspace", (2 * tokens * slots,), "int64"))
    else:
        outputs = (TensorSpec("row_id_map", (tokens, 2 * slots + 1), "int32"),
                   TensorSpec("workspace", (slots,), "int64"))
    return KernelCall(f"permute_row_id_map_{map_type}", ("routing_map",), outputs,
                      _attrs(map_type, tokens, slots, num_out_tokens))


ROW_ID_MAP = OpDef(
    name="moe_row_id_map",
    args=("routing_map",),
    attrs=("num_out_tokens", "map_type"),
    validate=_validate_row_id_map,
    infer=_infer_row_id_map,
)
"""row_id_map(routing_map, num_out_tokens, map_type) -> (row_id_map, workspace).

Shapes: index map (topK·T,), mask map (T, 2E+1); num_out_tokens already resolved (>= 0).
Numerics: NUMERICS.md §10 (stable expert order, highest expert ids drop first).
"""


# ---- chunk map -------------------------------------------------------------------------------

def _validate_chunk_map(split_sizes: Any, sorted_index: Any, num_tokens: Any) -> None:
    op = "moe_sort_chunks_by_index"
    for name, meta in (("split_sizes", split_sizes), ("sorted_index", sorted_index)):
        if meta.dtype != "int32" or len(meta.shape) != 1:
            fail(op, TypeError, f"{name} must be a 1-D int32 array, got {meta.dtype} of shape {dims(meta.shape)}")
    if tuple(split_sizes.shape) != tuple(sorted_index.shape):
        fail(op, ValueError, f"split_sizes and sorted_index must have the same length, got "
             f"{dims(split_sizes.shape)} and {dims(sorted_index.shape)}")
    if num_tokens < 0 or num_tokens > _MAX_ROWS:
        fail(op, ValueError, f"inp must have between 0 and 2**31 - 1 rows, got {int(num_tokens)}")


def _infer_chunk_map(split_sizes: Any, sorted_index: Any, num_tokens: Any) -> KernelCall:
    return KernelCall("permute_chunk_map", ("split_sizes", "sorted_index"),
                      (TensorSpec("row_id_map", (num_tokens,), "int32"),),
                      _attrs("index", num_tokens, 1, num_tokens))


CHUNK_MAP = OpDef(
    name="moe_chunk_map",
    args=("split_sizes", "sorted_index"),
    attrs=("num_tokens",),
    validate=_validate_chunk_map,
    infer=_infer_chunk_map,
)
"""chunk_map(split_sizes, sorted_index, num_tokens) -> row_id_map int32 (T,): an index map
with topK = 1 sending chunk sorted_index[j] to position j."""


# ---- permute rows ------------------------------------------------------------------------------

def _validate_permute(inp: Any, row_id_map: Any, probs: Any, num_tokens: Any, num_out_tokens: Any, map_type: str,
                      out_rows: Any = None) -> None:
    op = "moe_permute"
    _check_map_type(op, map_type)
    if inp.dtype not in MOVABLE_DTYPES:
        fail(op, TypeError, f"inp must have dtype {', '.join(MOVABLE_DTYPES)} (rows are moved as bytes), "
             f"got {inp.dtype}")
    if len(inp.shape) != 2:
        fail(op, ValueError, f"inp must be 2-D (num_tokens, hidden), got shape {dims(inp.shape)}")
    if inp.shape[0] != num_tokens and (out_rows is None or inp.shape[0] < num_tokens):
        fail(op, ValueError, f"inp must have {int(num_tokens)} rows (one per token of the routing map), "
             f"got shape {dims(inp.shape)}")
    slots = num_slots_of(op, map_type, row_id_map, num_tokens)
    _check_probs(op, "probs", probs, num_tokens, slots, map_type)
    if num_out_tokens < 0 or (out_rows is not None and out_rows < num_out_tokens):
        fail(op, ValueError, f"num_out_tokens must be resolved to a size >= 0, got {int(num_out_tokens)}")


def _infer_permute(inp: Any, row_id_map: Any, probs: Any, num_tokens: Any, num_out_tokens: Any, map_type: str,
                   out_rows: Any = None) -> KernelCall:
    slots = num_slots_of("moe_permute", map_type, row_id_map, num_tokens)
    rows = num_out_tokens if out_rows is None else out_rows
    outputs = (TensorSpec("output", (rows, inp.shape[1]), inp.dtype),)
    inputs = ("inp", "row_id_map")
    if probs is not None:
        outputs += (TensorSpec("permuted_probs", (num_out_tokens,), probs.dtype),)
        inputs += ("probs",)
    return KernelCall("permute_rows", inputs, outputs, _attrs(map_type, num_tokens, slots, num_out_tokens))


PERMUTE = OpDef(
    name="moe_permute",
    args=("inp", "row_id_map", "probs"),
    attrs=("num_tokens", "num_out_tokens", "map_type", "out_rows"),
    validate=_validate_permute,
    infer=_infer_permute,
)
"""permute(inp, row_id_map, probs, num_tokens, num_out_tokens, map_type, out_rows=None)
-> (output[, permuted_probs]).

Shapes: inp (R >= T, W) of any dtype (rows past T are not read); output (out_rows or
num_out_tokens, W), untargeted rows zero; permuted_probs (num_out_tokens,).
Numerics: bytes are moved, never converted.
"""


def _validate_permute_bwd(grad_out: Any, row_id_map: Any, grad_permuted_probs: Any, num_tokens: Any,
                          map_type: str, probs_slots: Any = None) -> None:
    op = "moe_permute"
    _check_hp(op, "the gradient of the permuted output", grad_out)
    _check_2d(op, "grad_out", grad_out)
    num_slots_of(op, map_type, row_id_map, num_tokens)
    if grad_permuted_probs is not None:
        _check_hp(op, "grad_permuted_probs", grad_permuted_probs)
        if tuple(grad_permuted_probs.shape) != (grad_out.shape[0],):
            fail(op, ValueError, f"grad_permuted_probs must have shape ({int(grad_out.shape[0])},), "
                 f"got {dims(grad_permuted_probs.shape)}")


def _infer_permute_bwd(grad_out: Any, row_id_map: Any, grad_permuted_probs: Any, num_tokens: Any,
                       map_type: str, probs_slots: Any = None) -> KernelCall:
    slots = num_slots_of("moe_permute", map_type, row_id_map, num_tokens)
    outputs = (TensorSpec("grad_inp", (num_tokens, grad_out.shape[1]), grad_out.dtype),)
    inputs = ("grad_out", "row_id_map")
    if grad_permuted_probs is not None:
        probs_cols = probs_slots if num_tokens == 0 and probs_slots is not None else slots
        outputs += (TensorSpec("grad_probs", (num_tokens, probs_cols), grad_permuted_probs.dtype),)
        inputs += ("grad_permuted_probs",)
    return KernelCall("permute_rows_backward", inputs, outputs, _attrs(map_type, num_tokens, slots, grad_out.shape[0]))


PERMUTE_BWD = OpDef(
    name="moe_permute_bwd",
    args=("grad_out", "row_id_map", "grad_permuted_probs"),
    attrs=("num_tokens", "map_type", "probs_slots"),
    validate=_validate_permute_bwd,
    infer=_infer_permute_bwd,
)
"""permute_bwd(grad_out, row_id_map, grad_permuted_probs, num_tokens, map_type, probs_slots=None)
-> (grad_inp[, grad_probs]).

Shapes: grad_probs (T, slots); probs_slots (probs' columns) sets slots when T = 0, where an
index map's empty row_id_map does not tell topK.

Numerics: grad_inp[t] = fp32 sum of its kept rows (ascending slot order), rounded once;
grad_probs[t, slot] = grad_permuted_probs[row] for kept pairs, 0 otherwise.
"""


# ---- unpermute -------------------------------------------------------------------------------

def _validate_unpermute(y: Any, row_id_map: Any, merging_probs: Any, num_tokens: Any, map_type: str) -> None:
    op = "moe_unpermute"
    _check_map_type(op, map_type)
    _check_hp(op, "inp", y)
    _check_2d(op, "inp", y)
    slots = num_slots_of(op, map_type, row_id_map, num_tokens)
    _check_probs(op, "merging_probs", merging_probs, num_tokens, slots, map_type)


def _infer_unpermute(y: Any, row_id_map: Any, merging_probs: Any, num_tokens: Any, map_type: str) -> KernelCall:
    slots = num_slots_of("moe_unpermute", map_type, row_id_map, num_tokens)
    inputs = ("y", "row_id_map") + (("merging_probs",) if merging_probs is not None else ())
    return KernelCall("permute_unpermute", inputs, (TensorSpec("output", (num_tokens, y.shape[1]), y.dtype),),
                      _attrs(map_type, num_tokens, slots, y.shape[0]))


UNPERMUTE = OpDef(
    name="moe_unpermute",
    args=("y", "row_id_map", "merging_probs"),
    attrs=("num_tokens", "map_type"),
    validate=_validate_unpermute,
    infer=_infer_unpermute,
)
"""unpermute(y, row_id_map, merging_probs, num_tokens, map_type) -> output (T, H).

Numerics: out[t] = Σ fl(y[row] · p) over kept pairs, fp32 from +0 in ascending slot order,
rounded once to y's dtype (p = 1 without merging_probs). Row ids outside y are skipped.
"""


def _validate_unpermute_bwd(grad_out: Any, y: Any, row_id_map: Any, merging_probs: Any, map_type: str) -> None:
    op = "moe_unpermute"
    _check_hp(op, "the gradient of the unpermuted output", grad_out)
    if grad_out.dtype != y.dtype or len(grad_out.shape) != 2 or grad_out.shape[1] != y.shape[1]:
        fail(op, ValueError, f"grad_out must be {y.dtype} (num_tokens, {y.shape[1]}), got {grad_out.dtype} "
             f"{dims(grad_out.shape)}")
    slots = num_slots_of(op, map_type, row_id_map, grad_out.shape[0])
    _check_probs(op, "merging_probs", merging_probs, grad_out.shape[0], slots, map_type)


def _infer_unpermute_bwd(grad_out: Any, y: Any, row_id_map: Any, merging_probs: Any, map_type: str) -> KernelCall:
    num_tokens = grad_out.shape[0]
    slots = num_slots_of("moe_unpermute", map_type, row_id_map, num_tokens)
    outputs = (TensorSpec("grad_y", tuple(y.shape), y.dtype),)
    inputs = ("grad_out", "y", "row_id_map")
    if merging_probs is not None:
        outputs += (TensorSpec("grad_merging_probs", (num_tokens, probs_slots(slots, num_tokens, merging_probs,
                                                                               map_type)), merging_probs.dtype),)
        inputs += ("merging_probs",)
    return KernelCall("permute_unpermute_backward", inputs, outputs, _attrs(map_type, num_tokens, slots, y.shape[0]))


UNPERMUTE_BWD = OpDef(
    name="moe_unpermute_bwd",
    args=("grad_out", "y", "row_id_map", "merging_probs"),
    attrs=("map_type",),
    validate=_validate_unpermute_bwd,
    infer=_infer_unpermute_bwd,
)
"""unpermute_bwd(grad_out, y, row_id_map, merging_probs, map_type) -> (grad_y[, grad_merging_probs]).

Numerics: grad_y[row] = fl(grad_out[t] · p) for kept pairs, 0 in other rows;
grad_merging_probs[t, slot] = Σ_h fl(grad_out[t, h] · y[row, h]) in fp32, ascending h.
"""


# ---- padding of expert blocks -------------------------------------------------------------------

ROW_ALIGNMENT = {"fp8_current": 16, "fp8_delayed": 16, "mxfp8": 32, "fp8_block": 128, "nvfp4": 32}
"""scaling_mode -> rows a quantized GEMM needs per expert block (per-tensor FP8 16, MXFP8 32,
FP8 block 128, NVFP4 32). Keyed by string so torch.compile traces the lookup."""


def recipe_row_alignment(recipe: Any) -> int:
    """Row alignment of the recipe's input quantizer (1 without a recipe or for other formats)."""
    if recipe is None:
        return 1
    return ROW_ALIGNMENT.get(recipe.quantizer("input").scaling_mode, 1)


def check_align_size(op: str, align_size: Any, recipe: Any) -> None:
    """Raises unless align_size is a positive int and a multiple of the recipe's row alignment.

    Raises:
        TypeError: align_size is not an int.
        ValueError: align_size < 1, or not a multiple of the active recipe's row alignment.
    """
    if isinstance(align_size, bool) or not isinstance(align_size, int):
        fail(op, TypeError, f"align_size must be an int, got {align_size!r}")
    if align_size < 1:
        fail(op, ValueError, f"align_size must be >= 1, got {align_size}")
    alignment = recipe_row_alignment(recipe)
    if align_size % alignment != 0:
        fail(op, ValueError, f"align_size={align_size} is not a multiple of the row alignment {alignment} that the "
             f"active {type(recipe).__name__} recipe's GEMMs need per expert block (16 per-tensor FP8, 32 MXFP8 and "
             "NVFP4, 128 FP8 block)")


def padded_rows(num_rows: Any, num_blocks: Any, align_size: int) -> Any:
    """Static rows of num_rows rows in num_blocks blocks each padded to a multiple of align_size:
    the worst case, (N + min(G, N)·(align − 1)) rounded down to a multiple of align (each
    nonempty block adds at most align − 1 rows)."""
    nonempty = num_blocks if num_blocks < num_rows else num_rows
    return (num_rows + nonempty * (align_size - 1)) // align_size * align_size


def _validate_pad_offsets(counts: Any, align_size: Any) -> None:
    op = "moe_permute_and_pad"
    if counts.dtype != "int32" or len(counts.shape) != 1 or counts.shape[0] < 1:
        fail(op, TypeError, "tokens_per_expert (m_splits) must be a 1-D int32 array with one entry per expert, got "
             f"{counts.dtype} of shape {tuple(counts.shape)}")
    if align_size < 1:
        fail(op, ValueError, f"align_size must be >= 1, got {align_size}")


def _infer_pad_offsets(counts: Any, align_size: Any) -> KernelCall:
    experts = counts.shape[0]
    return KernelCall("permute_pad_offsets", ("counts",),
                      (TensorSpec("pad_offsets", (experts,), "int32"), TensorSpec("padded_counts", (experts,), "int32")),
                      (("align_size", align_size),))


PAD_OFFSETS = OpDef(
    name="moe_pad_offsets",
    args=("counts",),
    attrs=("align_size",),
    validate=_validate_pad_offsets,
    infer=_infer_pad_offsets,
)
"""pad_offsets(counts, align_size) -> (pad_offsets int32 (E,), padded_counts int32 (E,)).

Numerics: padded_counts[e] = roundup(max(c_e, 0), align) (TE's target_tokens_per_expert);
pad_offsets[e] = Σ_{j<e} (padded_counts[j] − c_j). A static buffer of padded_rows(...) rows holds
the blocks first; its rows past Σ padded_counts belong to no block (a GroupedLinear adds them to
its last split, whose sum must equal the rows).
"""


def _validate_pad_map(row_id_map: Any, pad_offsets: Any, num_tokens: Any) -> None:
    op = "moe_unpermute"
    experts = num_slots_of(op, "mask", row_id_map, num_tokens)
    if pad_offsets.dtype != "int32" or tuple(pad_offsets.shape) != (experts,):
        fail(op, ValueError, f"pad_offsets must be int32 of shape ({experts},) (one per expert of the mask map), got "
             f"{pad_offsets.dtype} {tuple(pad_offsets.shape)}")


def _infer_pad_map(row_id_map: Any, pad_offsets: Any, num_tokens: Any) -> KernelCall:
    experts = num_slots_of("moe_unpermute", "mask", row_id_map, num_tokens)
    return KernelCall("permute_pad_map", ("row_id_map", "pad_offsets"),
                      (TensorSpec("row_id_map", tuple(row_id_map.shape), "int32"),),
                      _attrs("mask", num_tokens, experts, 0))


PAD_MAP = OpDef(
    name="moe_pad_map",
    args=("row_id_map", "pad_offsets"),
    attrs=("num_tokens",),
    validate=_validate_pad_map,
    infer=_infer_pad_map,
)
"""pad_map(row_id_map, pad_offsets, num_tokens) -> the mask map with each kept row shifted by
its expert's pad offset (the rows of the padded permuted tensor)."""


def _validate_split_pad_map(split_sizes: Any, pad_offsets: Any, num_rows: Any, out_rows: Any) -> None:
    op = "moe_pad_splits"
    if split_sizes.dtype != "int32" or len(split_sizes.shape) != 1 or split_sizes.shape[0] < 1:
        fail(op, TypeError, f"m_splits must be a 1-D int32 array with one entry per GEMM, got {split_sizes.dtype} of "
             f"shape {tuple(split_sizes.shape)}")
    if tuple(pad_offsets.shape) != tuple(split_sizes.shape) or pad_offsets.dtype != "int32":
        fail(op, ValueError, f"pad_offsets must be int32 of shape {tuple(split_sizes.shape)}, got "
             f"{pad_offsets.dtype} {tuple(pad_offsets.shape)}")
    if num_rows < 0 or out_rows < 0 or num_rows > _MAX_ROWS or out_rows > _MAX_ROWS:
        fail(op, ValueError, f"row counts must be in [0, 2**31), got {num_rows} and {out_rows}")


def _infer_split_pad_map(split_sizes: Any, pad_offsets: Any, num_rows: Any, out_rows: Any) -> KernelCall:
    return KernelCall("permute_split_pad_map", ("split_sizes", "pad_offsets"),
                      (TensorSpec("row_id_map", (num_rows,), "int32"),), _attrs("index", num_rows, 1, out_rows))


SPLIT_PAD_MAP = OpDef(
    name="moe_split_pad_map",
    args=("split_sizes", "pad_offsets"),
    attrs=("num_rows", "out_rows"),
    validate=_validate_split_pad_map,
    infer=_infer_split_pad_map,
)
"""split_pad_map(split_sizes, pad_offsets, num_rows, out_rows) -> index map int32 (num_rows,)
(topK = 1): row r of block g goes to r + pad_offsets[g]; rows past the blocks get −1."""


def check_pad_inputs(op: str, map_type: str, tokens_per_expert: Any, num_experts: Any) -> None:
    """Permute-and-pad needs a mask map and one count per expert.

    Raises:
        ValueError: an index map, or tokens_per_expert not of shape (E,).
    """
    if map_type != "mask":
        fail(op, ValueError, "padding needs map_type='mask' (the row_id_map must name each row's expert)")
    if len(tokens_per_expert.shape) != 1 or tokens_per_expert.shape[0] != num_experts:
        fail(op, ValueError, f"tokens_per_expert must have shape ({num_experts},) (one per expert of the routing "
             f"map), got {tuple(tokens_per_expert.shape)}")


def require_num_rows(op: str, num_rows: Any) -> None:
    """Raises ValueError when the unpadded row count is missing (a tensor m_splits holds it only
    as values, which a compiled or jitted graph cannot read)."""
    if num_rows is None:
        fail(op, ValueError, "num_rows (the unpadded row count, Σ m_splits) must be given when m_splits is an array")


def check_split_values(op: str, splits: Sequence[int], num_rows: int) -> None:
    """Eager check of m_splits values: the row blocks lie in the input, trailing rows past them
    being padding (the static buffers of permute-and-pad end in such rows, as in TE's JAX
    grouped GEMM).

    Raises:
        ValueError: a negative split, or splits summing to more than the row count.
    """
    if any(s < 0 for s in splits):
        fail(op, ValueError, f"m_splits must be >= 0, got {list(splits)}")
    if sum(splits) > num_rows:
        fail(op, ValueError, f"m_splits must sum to at most the {num_rows} rows of the input (rows past the sum are "
             f"padding), got sum {sum(splits)}")


# ---- quantized inputs --------------------------------------------------------------------------

# scaling_mode -> how the rowwise scale_inv follows permuted rows (NUMERICS.md §4–§7): "shared"
# (one per-tensor scale, kept as is), "rows" (one scale row per data row, rows padded to 128) or
# "columns" (one scale column per data row, stored R-minor, padded to 4). Keyed by the
# scaling_mode string so torch.compile traces the lookup.
_ROW_SCALES = {"fp8_current": "shared", "fp8_delayed": "shared", "mxfp8": "rows", "nvfp4": "rows",
               "fp8_block": "columns"}
_SCALE_ROW_PADDING = {"rows": 128, "columns": 4}


def check_quantized_input(op: str, qt: QuantizedTensor) -> None:
    """A QuantizedTensor can be permuted when its scales belong to single rows.

    Raises:
        TypeError: a format whose scales span rows (or are stored across rows).
        ValueError: a columnwise copy, missing rowwise data, or a shape that is not 2-D.
    """
    quantizer = qt.quantizer
    mode = quantizer.scaling_mode if quantizer is not None else None
    two_d = getattr(quantizer, "with_2d_quantization", False) or getattr(quantizer, "block_scaling_dim", 1) == 2
    if mode not in _ROW_SCALES or two_d:
        fail(op, TypeError, "quantized inputs must use per-tensor FP8, or 1D MXFP8, FP8 block or NVFP4 scaling "
             f"(scales of single rows), got {quantizer!r}")
    if quantizer.columnwise or qt.columnwise_data is not None:
        fail(op, ValueError, "quantized inputs must hold rowwise data only (a columnwise copy cannot follow a row "
             "permutation): quantize with quantizer.with_usage(columnwise=False)")
    if qt.rowwise_data is None or qt.rowwise_scale_inv is None:
        fail(op, ValueError, "the QuantizedTensor's rowwise_data / rowwise_scale_inv are missing")
    if len(qt.shape) != 2:
        fail(op, ValueError, f"inp must be 2-D (num_tokens, hidden), got shape {dims(qt.shape)}")


def reject_quantized(op: str) -> None:
    """Raises the TypeError of an op that needs high-precision values (sums, not moves)."""
    fail(op, TypeError, "inp must be a high-precision array (float32, bfloat16 or float16), not a QuantizedTensor: "
         "dequantize it first")


def quantized_row_fields(qt: QuantizedTensor, num_out_tokens: Any) -> tuple[tuple[str, Any, bool], ...]:
    """(field, output rows, transposed) of every QuantizedTensor array that moves with the rows;
    a transposed field (R-minor scales) is permuted as its transpose and transposed back. The
    other array fields (per-tensor scales, global amaxes) are carried over unchanged."""
    layout = _ROW_SCALES[qt.quantizer.scaling_mode]
    fields = (("rowwise_data", num_out_tokens, False),)
    if layout != "shared":
        fields += (("rowwise_scale_inv", round_up(num_out_tokens, _SCALE_ROW_PADDING[layout]), layout == "columns"),)
    return fields
