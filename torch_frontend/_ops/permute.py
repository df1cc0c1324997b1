"""MoE token permutation for PyTorch: torch.ops.twinengine.moe_* custom ops (fake impls and
autograd from core/ops/permute.py) and the public wrappers (NUMERICS.md §10)."""

from __future__ import annotations

from typing import Sequence

import torch

from ...ops.permute import (
    CHUNK_MAP,
    PAD_MAP,
    PAD_OFFSETS,
    PERMUTE,
    PERMUTE_BWD,
    ROW_ID_MAP,
    SPLIT_PAD_MAP,
    UNPERMUTE,
    UNPERMUTE_BWD,
    check_align_size,
    check_chunk_values,
    check_pad_inputs,
    check_split_values,
    require_num_rows,
    check_quantized_input,
    check_routing_map,
    check_routing_values,
    check_sort_chunks_probs,
    quantized_row_fields,
    reject_quantized,
    padded_rows,
    resolve_num_out_tokens,
    unpermute_num_tokens,
)
from ...ops.quantize import ArrayMeta
from ...quantized_tensor import ARRAY_FIELDS, QuantizedTensor
from .._library import (check_tensor_device, empty_outputs, launch, meta, surface_errors, tensor_fallback,
                        tuple_fallback)
from ..autocast import current_recipe

Tensor = torch.Tensor


# ---- custom ops ------------------------------------------------------------------------------

@torch.library.custom_op("twinengine::moe_row_id_map", mutates_args=())
def _row_id_map(routing_map: Tensor, num_out_tokens: int, map_type: str) -> Tensor:
    call = ROW_ID_MAP.plan(meta(routing_map), num_out_tokens, map_type)
    return launch(call, [routing_map], routing_map.device)[0]


@_row_id_map.register_fake
def _(routing_map, num_out_tokens, map_type):
    return empty_outputs(ROW_ID_MAP.plan(meta(routing_map), num_out_tokens, map_type), routing_map.device)[0]


@torch.library.custom_op("twinengine::moe_chunk_map", mutates_args=())
def _chunk_map(split_sizes: Tensor, sorted_index: Tensor, num_tokens: int) -> Tensor:
    call = CHUNK_MAP.plan(meta(split_sizes), meta(sorted_index), num_tokens)
    return launch(call, [split_sizes, sorted_index], split_sizes.device)[0]


@_chunk_map.register_fake
def _(split_sizes, sorted_index, num_tokens):
    return empty_outputs(CHUNK_MAP.plan(meta(split_sizes), meta(sorted_index), num_tokens), split_sizes.device)[0]


@torch.library.custom_op("twinengine::moe_pad_offsets", mutates_args=())
def _pad_offsets(counts: Tensor, align_size: int) -> list[Tensor]:
    return launch(PAD_OFFSETS.plan(meta(counts), align_size), [counts], counts.device)


@_pad_offsets.register_fake
def _(counts, align_size):
    return empty_outputs(PAD_OFFSETS.plan(meta(counts), align_size), counts.device)


@torch.library.custom_op("twinengine::moe_pad_map", mutates_args=())
def _pad_map(row_id_map: Tensor, pad_offsets: Tensor, num_tokens: int) -> Tensor:
    call = PAD_MAP.plan(meta(row_id_map), meta(pad_offsets), num_tokens)
    return launch(call, [row_id_map, pad_offsets], row_id_map.device)[0]


@_pad_map.register_fake
def _(row_id_map, pad_offsets, num_tokens):
    return empty_outputs(PAD_MAP.plan(meta(row_id_map), meta(pad_offsets), num_tokens), row_id_map.device)[0]


@torch.library.custom_op("twinengine::moe_split_pad_map", mutates_args=())
def _split_pad_map(split_sizes: Tensor, pad_offsets: Tensor, num_rows: int, out_rows: int) -> Tensor:
    call = SPLIT_PAD_MAP.plan(meta(split_sizes), meta(pad_offsets), num_rows, out_rows)
    return launch(call, [split_sizes, pad_offsets], split_sizes.device)[0]


@_split_pad_map.register_fake
def _(split_sizes, pad_offsets, num_rows, out_rows):
    call = SPLIT_PAD_MAP.plan(meta(split_sizes), meta(pad_offsets), num_rows, out_rows)
    return empty_outputs(call, split_sizes.device)[0]


@torch.library.custom_op("twinengine::moe_permute", mutates_args=())
def _permute(inp: Tensor, row_id_map: Tensor, probs: Tensor | None, num_tokens: int, num_out_tokens: int,
             map_type: str, out_rows: int | None) -> list[Tensor]:
    call = PERMUTE.plan(meta(inp), meta(row_id_map), meta(probs), num_tokens, num_out_tokens, map_type, out_rows)
    arrays = {"inp": inp, "row_id_map": row_id_map, "probs": probs}
    return launch(call, [arrays[name] for name in call.inputs], inp.device)


@_permute.register_fake
def _(inp, row_id_map, probs, num_tokens, num_out_tokens, map_type, out_rows):
    call = PERMUTE.plan(meta(inp), meta(row_id_map), meta(probs), num_tokens, num_out_tokens, map_type, out_rows)
    return empty_outputs(call, inp.device)


@torch.library.custom_op("twinengine::moe_permute_bwd", mutates_args=())
def _permute_bwd(grad_out: Tensor, row_id_map: Tensor, grad_permuted_probs: Tensor | None, num_tokens: int,
                 map_type: str, probs_slots: int | None = None) -> list[Tensor]:
    call = PERMUTE_BWD.plan(meta(grad_out), meta(row_id_map), meta(grad_permuted_probs), num_tokens, map_type,
                            probs_slots)
    arrays = {"grad_out": grad_out, "row_id_map": row_id_map, "grad_permuted_probs": grad_permuted_probs}
    return launch(call, [arrays[name] for name in call.inputs], grad_out.device)


@_permute_bwd.register_fake
def _(grad_out, row_id_map, grad_permuted_probs, num_tokens, map_type, probs_slots=None):
    call = PERMUTE_BWD.plan(meta(grad_out), meta(row_id_map), meta(grad_permuted_probs), num_tokens, map_type,
                            probs_slots)
    return empty_outputs(call, grad_out.device)


def _permute_setup_context(ctx, inputs, output):
    _, row_id_map, probs, num_tokens, _, map_type, _ = inputs
    ctx.save_for_backward(row_id_map)
    ctx.num_tokens, ctx.map_type, ctx.with_probs = num_tokens, map_type, probs is not None
    ctx.probs_slots = probs.shape[1] if probs is not None else None


def _permute_backward(ctx, grads):
    (row_id_map,) = ctx.saved_tensors
    grad_pp = grads[1] if ctx.with_probs else None
    grad_inp, *grad_probs = torch.ops.twinengine.moe_permute_bwd(grads[0], row_id_map, grad_pp, ctx.num_tokens,
                                                                 ctx.map_type, ctx.probs_slots)
    return grad_inp, None, (grad_probs[0] if ctx.with_probs else None), None, None, None, None


_permute.register_autograd(_permute_backward, setup_context=_permute_setup_context)


@torch.library.custom_op("twinengine::moe_unpermute", mutates_args=())
def _unpermute(y: Tensor, row_id_map: Tensor, merging_probs: Tensor | None, num_tokens: int,
               map_type: str) -> Tensor:
    call = UNPERMUTE.plan(meta(y), meta(row_id_map), meta(merging_probs), num_tokens, map_type)
    arrays = {"y": y, "row_id_map": row_id_map, "merging_probs": merging_probs}
    return launch(call, [arrays[name] for name in call.inputs], y.device)[0]


@_unpermute.register_fake
def _(y, row_id_map, merging_probs, num_tokens, map_type):
    call = UNPERMUTE.plan(meta(y), meta(row_id_map), meta(merging_probs), num_tokens, map_type)
    return empty_outputs(call, y.device)[0]


@torch.library.custom_op("twinengine::moe_unpermute_bwd", mutates_args=())
def _unpermute_bwd(grad_out: Tensor, y: Tensor, row_id_map: Tensor, merging_probs: Tensor | None,
                   map_type: str) -> list[Tensor]:
    call = UNPERMUTE_BWD.plan(meta(grad_out), meta(y), meta(row_id_map), meta(merging_probs), map_type)
    arrays = {"grad_out": grad_out, "y": y, "row_id_map": row_id_map, "merging_probs": merging_probs}
    return launch(call, [arrays[name] for name in call.inputs], y.device)


@_unpermute_bwd.register_fake
def _(grad_out, y, row_id_map, merging_probs, map_type):
    call = UNPERMUTE_BWD.plan(meta(grad_out), meta(y), meta(row_id_map), meta(merging_probs), map_type)
    return empty_outputs(call, y.device)


def _unpermute_setup_context(ctx, inputs, output):
    y, row_id_map, merging_probs, _, map_type = inputs
    ctx.save_for_backward(y, row_id_map, merging_probs)
    ctx.map_type = map_type


def _unpermute_backward(ctx, grad_out):
    y, row_id_map, merging_probs = ctx.saved_tensors
    grad_y, *grad_probs = torch.ops.twinengine.moe_unpermute_bwd(grad_out, y, row_id_map, merging_probs, ctx.map_type)
    return grad_y, None, (grad_probs[0] if grad_probs else None), None, None


_unpermute.register_autograd(_unpermute_backward, setup_context=_unpermute_setup_context)


# ---- public API ------------------------------------------------------------------------------

def _inspectable(t: Tensor) -> bool:
    """Values can be read without tracing or a device sync: eager and on the CPU."""
    return not torch.compiler.is_compiling() and t.device.type == "cpu"


def _routing_map(op: str, routing_map: Tensor, map_type: str) -> Tensor:
    """A bool mask viewed as uint8 (same bytes); routing values checked when inspectable."""
    check_tensor_device(op, "routing_map", routing_map)
    check_routing_map(op, map_type, meta(routing_map))
    if routing_map.dtype == torch.bool:
        routing_map = routing_map.view(torch.uint8)
    if _inspectable(routing_map) and routing_map.numel() > 0:
        check_routing_values(op, map_type, int(routing_map.min()), int(routing_map.max()))
    if routing_map.dtype == torch.int64:  # torch.topk's indices, F.one_hot's masks
        routing_map = routing_map.to(torch.int32)
    return routing_map


def _permute_rows(inp: Tensor | QuantizedTensor, row_id_map: Tensor, probs: Tensor | None, num_tokens, num_out_tokens,
                  map_type: str, op: str) -> tuple[Tensor | QuantizedTensor, Tensor | None]:
    """(permuted inp, permuted probs or None): plain tensors, or the rows of a QuantizedTensor
    with their row scales."""
    if not isinstance(inp, QuantizedTensor):
        check_tensor_device(op, "inp", inp)
        PERMUTE.validate(meta(inp), meta(row_id_map), meta(probs), num_tokens, num_out_tokens, map_type)
        out, *permuted_probs = torch.ops.twinengine.moe_permute(inp, row_id_map, probs, num_tokens, num_out_tokens,
                                                                map_type, None)
        return out, (permuted_probs[0] if probs is not None else None)
    check_quantized_input(op, inp)
    check_tensor_device(op, "inp", inp.rowwise_data)
    fields = {name: getattr(inp, name) for name in ARRAY_FIELDS}
    permuted_probs = None
    for name, rows, transposed in quantized_row_fields(inp, num_out_tokens):
        array = fields[name].t() if transposed else fields[name]
        PERMUTE.validate(meta(array), meta(row_id_map), meta(probs), num_tokens, num_out_tokens, map_type, rows)
        moved, *moved_probs = torch.ops.twinengine.moe_permute(array, row_id_map, probs, num_tokens, num_out_tokens,
                                                               map_type, rows)
        fields[name] = moved.t().contiguous() if transposed else moved
        if probs is not None:
            permuted_probs, probs = moved_probs[0], None
    qt = QuantizedTensor(**fields, quantizer=inp.quantizer, shape=(num_out_tokens, inp.shape[1]), dtype=inp.dtype)
    return qt, permuted_probs


def _permute_with_map(op: str, inp, probs, routing_map: Tensor, num_out_tokens: int, map_type: str):
    routing_map = _routing_map(op, routing_map, map_type)
    check_tensor_device(op, "probs", probs)
    count_routed = None if torch.compiler.is_compiling() else (lambda: int(torch.count_nonzero(routing_map)))
    num_out = resolve_num_out_tokens(op, map_type, meta(routing_map), num_out_tokens, count_routed)
    map_call = ROW_ID_MAP.plan(meta(routing_map), num_out, map_type)
    map_spec = map_call.outputs[0]
    PERMUTE.validate(ArrayMeta(tuple(inp.shape[:1]) + (1,), "float32"), ArrayMeta(map_spec.shape, map_spec.dtype),
                     meta(probs), routing_map.shape[0], num_out, map_type)
    row_id_map = torch.ops.twinengine.moe_row_id_map(routing_map, num_out, map_type)
    out, permuted_probs = _permute_rows(inp, row_id_map, probs, routing_map.shape[0], num_out, map_type, op)
    return out, permuted_probs, row_id_map


@surface_errors(tuple_fallback(2))
def moe_permute(inp: Tensor | QuantizedTensor, routing_map: Tensor, num_out_tokens: int = -1,
                map_type: str = "mask") -> tuple[Tensor | QuantizedTensor, Tensor]:
    """Permutes token rows into expert-major order (NUMERICS.md §10).

    Shapes: inp (T, H) or a rowwise QuantizedTensor of shape (T, H); routing_map (T, topK)
        expert ids (index map) or (T, E) 0/1 (mask map); returns output (num_out_tokens, H)
        and row_id_map int32 ((topK·T,) index map, (T, 2E+1) mask map).
    Dtypes: inp any float dtype (moved as bytes); routing_map int32 (index) or bool / uint8 /
        int32 (mask).
    Numerics: rows ordered by expert id, stable in (token, k) order; pairs at positions
        >= num_out_tokens are dropped (highest expert ids first) and output rows nobody
        fills are zero. num_out_tokens <= 0 means all routed pairs: T·topK for the index map;
        for the mask map a count of the routing map, so under torch.compile it must be given.
        A QuantizedTensor's rows move with their row scales (per-tensor FP8, 1D MXFP8 / FP8
        block / NVFP4, rowwise only; scale padding recomputed for the new row count); the
        result dequantizes to exactly the permuted dequantized input.
        Differentiable with respect to a plain inp.
    Raises:
        TypeError / ValueError: shared core checks (shapes, dtypes, map_type, quantized
            formats); eagerly on CPU also expert ids < 0 or mask values outside {0, 1}
            (inside a graph such pairs are dropped).
    """
    out, _, row_id_map = _permute_with_map("moe_permute", inp, None, routing_map, num_out_tokens, map_type)
    return out, row_id_map


@surface_errors(tuple_fallback(3))
def moe_permute_with_probs(inp: Tensor | QuantizedTensor, probs: Tensor, routing_map: Tensor,
                           num_out_tokens: int = -1, map_type: str = "mask"
                           ) -> tuple[Tensor | QuantizedTensor, Tensor, Tensor]:
    """moe_permute that also permutes ``probs``: returns (output, permuted_probs, row_id_map).

    Shapes: probs (T, E) for the mask map, (T, topK) for the index map; permuted_probs
        (num_out_tokens,), 0 in rows nobody fills.
    Dtypes: probs float32 / bfloat16 / float16, kept.
    Numerics: as moe_permute; differentiable with respect to inp and probs (the gradient of
        probs is the permuted-probs gradient gathered back, 0 for dropped pairs).
    Raises:
        TypeError / ValueError: as moe_permute, plus a probs shape that does not match.
    """
    return _permute_with_map("moe_permute_with_probs", inp, probs, routing_map, num_out_tokens, map_type)


@surface_errors(tensor_fallback)
def moe_unpermute(inp: Tensor, row_id_map: Tensor, merging_probs: Tensor | None = None,
                  restore_shape: Sequence[int] | None = None, map_type: str = "mask",
                  pad_offsets: Tensor | None = None) -> Tensor:
    """Gathers permuted rows back to tokens and sums each token's copies (NUMERICS.md §10).

    Shapes: inp (num_out_tokens, H); row_id_map from moe_permute; merging_probs (T, E) mask
        map or (T, topK) index map; returns restore_shape if given, else (T, H). For the index
        map T comes from restore_shape, else merging_probs, else len(row_id_map) (topK = 1).
    Dtypes: inp and merging_probs float32 / bfloat16 / float16; output inp's dtype.
    Numerics: out[t] = Σ fl(inp[row] · p) over the token's kept rows, fp32 from +0 in
        ascending slot order, rounded once; dropped (−1) and out-of-range rows are skipped.
        With ``pad_offsets`` (from moe_permute_and_pad_with_probs, mask map) inp holds the
        padded blocks and the padding rows are ignored (their gradient is 0).
        Differentiable with respect to inp and merging_probs.
    Raises:
        TypeError / ValueError: shared core checks (dtypes, shapes, restore_shape, pad_offsets).
    """
    op = "moe_unpermute"
    if isinstance(inp, QuantizedTensor):
        reject_quantized(op)
    for name, t in (("inp", inp), ("row_id_map", row_id_map), ("merging_probs", merging_probs),
                    ("pad_offsets", pad_offsets)):
        check_tensor_device(op, name, t)
    num_tokens = unpermute_num_tokens(op, map_type, meta(inp), meta(row_id_map), meta(merging_probs), restore_shape)
    if pad_offsets is not None:
        check_pad_inputs(op, map_type, pad_offsets, row_id_map.shape[-1] // 2)
        pad_offsets = pad_offsets.to(torch.int32)
        PAD_MAP.validate(meta(row_id_map), meta(pad_offsets), num_tokens)
        row_id_map = torch.ops.twinengine.moe_pad_map(row_id_map, pad_offsets, num_tokens)
    UNPERMUTE.validate(meta(inp), meta(row_id_map), meta(merging_probs), num_tokens, map_type)
    out = torch.ops.twinengine.moe_unpermute(inp, row_id_map, merging_probs, num_tokens, map_type)
    return out if restore_shape is None else out.reshape(tuple(restore_shape))


def _sort_chunks(op: str, inp, probs, split_sizes: Tensor, sorted_index: Tensor):
    for name, t in (("split_sizes", split_sizes), ("sorted_index", sorted_index)):
        check_tensor_device(op, name, t)
    split_sizes, sorted_index = split_sizes.to(torch.int32), sorted_index.to(torch.int32)
    num_tokens = inp.shape[0]
    if probs is not None:
        check_sort_chunks_probs(op, meta(probs), num_tokens)
    CHUNK_MAP.validate(meta(split_sizes), meta(sorted_index), num_tokens)
    if _inspectable(split_sizes) and _inspectable(sorted_index):
        check_chunk_values(op, split_sizes.tolist(), sorted_index.tolist(), num_tokens)
    row_id_map = torch.ops.twinengine.moe_chunk_map(split_sizes, sorted_index, num_tokens)
    probs = None if probs is None else probs.reshape(num_tokens, 1)
    return _permute_rows(inp, row_id_map, probs, num_tokens, num_tokens, "index", op)


@surface_errors(tensor_fallback)
def moe_sort_chunks_by_index(inp: Tensor | QuantizedTensor, split_sizes: Tensor,
                             sorted_index: Tensor) -> Tensor | QuantizedTensor:
    """Splits the rows of ``inp`` into chunks of ``split_sizes`` and concatenates them in the
    order ``sorted_index`` gives (NUMERICS.md §10).

    Shapes: inp (N, H) (or a rowwise QuantizedTensor); split_sizes and sorted_index (C,);
        returns (N, H).
    Dtypes: split_sizes / sorted_index int32 or int64 (converted to int32).
    Numerics: bytes moved; chunk c goes to the place of its first occurrence in sorted_index;
        rows of chunks missing from it (or past Σ split_sizes) are dropped and the output rows
        nobody fills are zero. Differentiable with respect to a plain inp.
    Raises:
        TypeError / ValueError: shared core checks; eagerly on CPU also negative splits, splits
            not summing to N, or sorted_index not a permutation.
    """
    out, _ = _sort_chunks("moe_sort_chunks_by_index", inp, None, split_sizes, sorted_index)
    return out


@surface_errors(tuple_fallback(2))
def moe_sort_chunks_by_index_with_probs(inp: Tensor | QuantizedTensor, probs: Tensor, split_sizes: Tensor,
                                        sorted_index: Tensor) -> tuple[Tensor | QuantizedTensor, Tensor]:
    """moe_sort_chunks_by_index that also reorders ``probs`` (N,): returns (output, permuted_probs).

    Dtypes: probs float32 / bfloat16 / float16, kept. Differentiable with respect to probs.
    """
    return _sort_chunks("moe_sort_chunks_by_index_with_probs", inp, probs, split_sizes, sorted_index)


# ---- padding of expert blocks ------------------------------------------------------------------

def _int32_splits(op: str, name: str, splits: Tensor | Sequence[int], device: torch.device) -> Tensor:
    if not isinstance(splits, torch.Tensor):
        splits = torch.tensor(list(splits), dtype=torch.int32, device=device)
    check_tensor_device(op, name, splits)
    return splits.to(torch.int32)


def moe_permute_and_pad_with_probs(inp: Tensor | QuantizedTensor, probs: Tensor, routing_map: Tensor,
                                   tokens_per_expert: Tensor, align_size: int, num_out_tokens: int = -1
                                   ) -> tuple[Tensor | QuantizedTensor, Tensor, Tensor, Tensor, Tensor]:
    """moe_permute_with_probs (mask map) whose expert blocks are each padded with zero rows to a
    multiple of ``align_size``: returns (output, permuted_probs, row_id_map, pad_offsets,
    target_tokens_per_expert).

    Shapes: inp (T, H); probs (T, E); routing_map (T, E); tokens_per_expert (E,) (the routed
        count of each expert, e.g. routing_map.sum(0)); output (R, H) and permuted_probs (R,)
        with the static worst case R = (N + min(E, N)·(align − 1)) rounded down to a multiple of
        align, N the routed pairs (num_out_tokens, or counted eagerly as moe_permute does);
        row_id_map (T, 2E+1), unpadded as moe_permute's; pad_offsets and
        target_tokens_per_expert int32 (E,).
    Numerics: expert e's rows start at Σ_{j<e} target[j], target[e] = roundup(count_e, align)
        (TE's); the rows past Σ target are padding too (R is static: no host sync, identical
        eager and compiled, unlike TE's exact size); GroupedLinear takes target with those rows
        added to its last entry as m_splits (its splits sum to the rows).
        Padding rows are zero (probs 0) and receive no gradient.
    Raises:
        TypeError / ValueError: as moe_permute_with_probs; align_size not a positive multiple of
            the active autocast recipe's row alignment (16 FP8, 32 MXFP8 / NVFP4, 128 FP8 block);
            tokens_per_expert not of shape (E,).
    """
    op = "moe_permute_and_pad_with_probs"
    check_align_size(op, align_size, current_recipe())
    routing_map = _routing_map(op, routing_map, "mask")
    check_tensor_device(op, "probs", probs)
    check_pad_inputs(op, "mask", tokens_per_expert, routing_map.shape[1])
    counts = _int32_splits(op, "tokens_per_expert", tokens_per_expert, routing_map.device)
    count_routed = None if torch.compiler.is_compiling() else (lambda: int(torch.count_nonzero(routing_map)))
    num_routed = resolve_num_out_tokens(op, "mask", meta(routing_map), num_out_tokens, count_routed)
    num_tokens, num_experts = routing_map.shape
    rows = padded_rows(num_routed, num_experts, align_size)
    ROW_ID_MAP.validate(meta(routing_map), num_routed, "mask")
    PAD_OFFSETS.validate(meta(counts), align_size)
    row_id_map = torch.ops.twinengine.moe_row_id_map(routing_map, num_routed, "mask")
    pad_offsets, target = torch.ops.twinengine.moe_pad_offsets(counts, align_size)
    padded_map = torch.ops.twinengine.moe_pad_map(row_id_map, pad_offsets, num_tokens)
    out, permuted_probs = _permute_rows(inp, padded_map, probs, num_tokens, rows, "mask", op)
    return out, permuted_probs, row_id_map, pad_offsets, target


def moe_pad_splits(inp: Tensor | QuantizedTensor, m_splits: Tensor | Sequence[int],
                   align_size: int) -> tuple[Tensor | QuantizedTensor, Tensor]:
    """Pads each consecutive row block of ``inp`` (sizes ``m_splits``) with zero rows to a
    multiple of ``align_size`` (TE's Fp8Padding): returns (padded, padded_m_splits).

    Shapes: inp (M, H) (or a rowwise QuantizedTensor); m_splits (G,) int tensor or ints;
        padded (R, H) with the static R = (M + min(G, M)·(align − 1)) rounded down to a
        multiple of align; padded_m_splits int32 (G,) = roundup(m_splits, align), the rows past
        their sum being padding too (as in moe_permute_and_pad_with_probs).
    Numerics: bytes moved; padding rows zero; differentiable (padding rows get no gradient).
    Raises:
        TypeError / ValueError: align_size (as moe_permute_and_pad_with_probs), m_splits not 1-D;
            eagerly on CPU also negative splits or Σ m_splits > M.
    """
    op = "moe_pad_splits"
    check_align_size(op, align_size, current_recipe())
    data = inp.rowwise_data if isinstance(inp, QuantizedTensor) else inp
    counts = _int32_splits(op, "m_splits", m_splits, data.device)
    num_rows = inp.shape[0]
    rows = padded_rows(num_rows, counts.shape[0] if counts.dim() == 1 else 0, align_size)
    PAD_OFFSETS.validate(meta(counts), align_size)
    if _inspectable(counts):
        check_split_values(op, counts.tolist(), num_rows)
    pad_offsets, target = torch.ops.twinengine.moe_pad_offsets(counts, align_size)
    SPLIT_PAD_MAP.validate(meta(counts), meta(pad_offsets), num_rows, rows)
    row_id_map = torch.ops.twinengine.moe_split_pad_map(counts, pad_offsets, num_rows, rows)
    out, _ = _permute_rows(inp, row_id_map, None, num_rows, rows, "index", op)
    return out, target


def moe_unpad_splits(inp: Tensor, m_splits: Tensor | Sequence[int], align_size: int, num_rows: int) -> Tensor:
    """Inverse of moe_pad_splits (TE's Fp8Unpadding): the first m_splits[g] rows of each padded
    block, concatenated.

    Shapes: inp (R, H) as moe_pad_splits returned it; m_splits (G,) the unpadded sizes;
        returns (num_rows, H), num_rows = Σ m_splits (static: the unpadded input's rows).
    Numerics: bytes moved; differentiable (padding rows get a zero gradient).
    Raises:
        TypeError / ValueError: as moe_pad_splits, plus a high-precision inp.
    """
    op = "moe_unpad_splits"
    if isinstance(inp, QuantizedTensor):
        reject_quantized(op)
    require_num_rows(op, num_rows)
    check_align_size(op, align_size, current_recipe())
    counts = _int32_splits(op, "m_splits", m_splits, inp.device)
    rows = inp.shape[0]
    PAD_OFFSETS.validate(meta(counts), align_size)
    if _inspectable(counts):
        check_split_values(op, counts.tolist(), num_rows)
    pad_offsets, _ = torch.ops.twinengine.moe_pad_offsets(counts, align_size)
    SPLIT_PAD_MAP.validate(meta(counts), meta(pad_offsets), num_rows, rows)
    row_id_map = torch.ops.twinengine.moe_split_pad_map(counts, pad_offsets, num_rows, rows)
    UNPERMUTE.validate(meta(inp), meta(row_id_map), None, num_rows, "index")
    return torch.ops.twinengine.moe_unpermute(inp, row_id_map, None, num_rows, "index")
