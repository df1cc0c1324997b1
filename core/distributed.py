"""Checks of the distributed (tensor / sequence parallel) arguments of a layer, shared by both
frontends so that a bad configuration fails with the same text (NUMERICS.md §12).

Meaning (TransformerEngine's): ``parallel_mode="column"`` shards the output features over the
``tp_size`` ranks of the tensor-parallel group, ``"row"`` the input features; ``None`` keeps the
layer whole. ``sequence_parallel`` additionally shards the activations along the sequence
(first) dimension outside the layer.
"""

from __future__ import annotations

from .ops.opdef import fail

PARALLEL_MODES = (None, "column", "row")


def check_tensor_parallel(op: str, in_features: int, out_features: int, *, tp_size: int, parallel_mode: str | None,
                          sequence_parallel: bool, has_group: bool, group_size: int | None) -> None:
    """Validates one layer's tensor-parallel configuration.

    ``group_size`` is the size of the given tp_group (None when there is none).
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
        fail(op, ValueError, f"out_features={out_features} is not divisible by tp_size={tp_size} "
             "(column-parallel shards the output features)")
    if parallel_mode == "row" and in_features % tp_size:
        fail(op, ValueError, f"in_features={in_features} is not divisible by tp_size={tp_size} "
             "(row-parallel shards the input features)")


def check_sequence_shard(op: str, rows: int, tp_size: int) -> None:
    """A sequence-parallel output's first dimension must split evenly over the group.

    Raises:
        ValueError: rows (the first dimension of the row-parallel output) not divisible by tp_size.
    """
    if rows % tp_size:
        fail(op, ValueError, f"sequence_parallel: the sequence dimension {rows} is not divisible by tp_size={tp_size}")
