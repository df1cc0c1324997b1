"""Checks of the distributed (tensor / sequence parallel) arguments of a layer, shared by both
frontends so that a bad configuration fails with the same text (NUMERICS.md §12).

Meaning (TransformerEngine's): ``parallel_mode="column"`` shards the output features over the
``tp_size`` ranks of the tensor-parallel group, ``"row"`` the input features; ``None`` keeps the
layer whole. ``sequence_parallel`` additionally shards the activations along the sequence
(first) dimension outside the layer.
"""

from __future__ import annotations

from typing import Any

from .ops.opdef import fail
from .ops.quantize import quantized_layout, scale_extent

PARALLEL_MODES = (None, "column", "row")


def check_tensor_parallel(op: str, in_features: int, out_features: int, *, tp_size: int, parallel_mode: str | None,
                          sequence_parallel: bool, has_group: bool, group_size: int | None,
                          in_name: str = "in_features", out_name: str = "out_features") -> None:
    """Validates one layer's tensor-parallel configuration.

    ``group_size`` is the size of the given tp_group (None when there is none); ``in_name`` /
    ``out_name`` name the feature arguments in the errors (LayerNormMLP: its FC1 is
    column-parallel over ``ffn_hidden_size``).
    Raises:
        ValueError: parallel_mode not None / "column" / "row"; tp_size < 1; tp_size not the
            tp_group's size; a parallel_mode or sequence_parallel without a tp_group; the sharded
            feature count (out_features for column, in_features for row) not divisible by tp_size.
    """
    if parallel_mode not in PARALLEL_MODES:
        fail(op, ValueError, f"parallel_mode must be None, 'column' or 'row', got {parallel_mode!r}")
    if type(tp_size) is not int or tp_size < 1:
        fail(op, ValueError, f"tp_size must be an int >= 1, got {tp_size!r}")
    if sequence_parallel and not has_group:
        fail(op, ValueError, "sequence_parallel=True needs a tp_group (the group the sequence is sharded over)")
    if sequence_parallel and parallel_mode is None:
        fail(op, ValueError, "sequence_parallel=True needs parallel_mode='column' or 'row'")
    if parallel_mode is not None and not has_group:
        fail(op, ValueError, f"parallel_mode={parallel_mode!r} needs a tp_group")
    if has_group and group_size != tp_size:
        fail(op, ValueError, f"tp_size={tp_size} does not match the tp_group's size {group_size}")
    if parallel_mode == "column" and out_features % tp_size:
        fail(op, ValueError, f"{out_name}={out_features} is not divisible by tp_size={tp_size} "
             "(column-parallel shards the output features)")
    if parallel_mode == "row" and in_features % tp_size:
        fail(op, ValueError, f"{in_name}={in_features} is not divisible by tp_size={tp_size} "
             "(row-parallel shards the input features)")


def check_sequence_shard(op: str, rows: int, tp_size: int) -> None:
    """A sequence-parallel output's first dimension must split evenly over the group.

    Raises:
        ValueError: rows (the first dimension of the row-parallel output) not divisible by tp_size.
    """
    if rows % tp_size:
        fail(op, ValueError, f"sequence_parallel: the sequence dimension {rows} is not divisible by tp_size={tp_size}")


_ROW_AXES = {
    # scaling_mode -> axis of the rows R of the (R, K) input in (rowwise_data, rowwise_scale_inv,
    # columnwise_data, columnwise_scale_inv); None: a per-tensor scale, the same on every rank.
    "fp8_current": (0, None, 1, None),
    "fp8_delayed": (0, None, 1, None),
    "mxfp8": (0, 0, 0, 0),
    "fp8_block": (0, 1, 1, 0),
}
_COLUMNWISE_BLOCK = {"mxfp8": 32, "fp8_block": 128}
"""Rows per columnwise block: a shard whose rows are not a multiple splits a block."""

TRANSPOSED = "transpose"
"""Plan axis of a per-tensor columnwise copy: the transpose of the gathered rowwise data
(NUMERICS.md §4: identical bytes transposed, one scale), so only the rowwise copy travels."""


def quantized_gather_plan(quantizer: Any, rows: int, cols: int) -> tuple[tuple[str, Any, int | None], ...] | None:
    """How the quantized copies of each rank's (rows, cols) shard concatenate, in rank order, into
    the copies of the whole (size·rows, cols) tensor — TE's quantized (FP8) all-gather of a
    sequence-parallel input (NUMERICS.md §12). Per-tensor formats need the scale every rank
    shares (current scaling: quantized with the group's amax; delayed: the reduced history);
    block formats need blocks that do not straddle shards.

    Returns one (field, axis, used) per present field — axis: the rows' axis of that array
    (None: a per-tensor scale, kept as is; ``TRANSPOSED``: rebuilt from the gathered rowwise
    data); used: its unpadded extent along the axis — or None when the copies are not
    concatenations and the input is gathered in high precision: NVFP4 (its global amax, the
    columnwise RHT and stochastic-rounding layout), 2D FP8-block tiles, a shard splitting a
    columnwise block (rows not a multiple of 32 for MXFP8, 128 for FP8 block).
    """
    mode = quantizer.scaling_mode
    if mode not in _ROW_AXES or getattr(quantizer, "block_scaling_dim", 1) == 2:
        return None
    if quantizer.columnwise and rows % _COLUMNWISE_BLOCK.get(mode, 1):
        return None
    axes = _ROW_AXES[mode]
    per_tensor = axes[1] is None
    plan = []
    for copy, columnwise in (("rowwise", False), ("columnwise", True)):
        if not getattr(quantizer, copy):
            continue
        extent = scale_extent(quantizer, (rows, cols), columnwise)
        data_axis, scale_axis = axes[2 * columnwise], axes[2 * columnwise + 1]
        if columnwise and per_tensor and quantizer.rowwise:
            data_axis = TRANSPOSED
        plan.append((f"{copy}_data", data_axis, rows))
        plan.append((f"{copy}_scale_inv", scale_axis, None if scale_axis is None else extent[scale_axis]))
    return tuple(plan)


def gathered_shapes(quantizer: Any, rows: int, cols: int, size: int, dtype: str) -> dict[str, tuple[int, ...]]:
    """The shapes of the whole (size·rows, cols) tensor's quantized arrays (padding included):
    what a quantized all-gather pads each concatenation to (with zeros, NUMERICS.md §5–§6)."""
    return {spec.name: tuple(spec.shape) for spec in quantized_layout(quantizer, (size * rows, cols), dtype)}
