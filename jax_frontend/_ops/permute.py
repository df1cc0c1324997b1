"""MoE token permutation for JAX over XLA FFI calls, custom_vjp-differentiable (NUMERICS.md §10).
Shapes, checks and errors come from core/ops/permute.py; output sizes are static."""

from __future__ import annotations

from functools import partial
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

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
from .._library import ffi, meta
from ..autocast import current_recipe


# ---- differentiable kernels ------------------------------------------------------------------

def _permute_call(inp, row_id_map, probs, num_tokens, num_out_tokens, map_type, out_rows):
    call = PERMUTE.plan(meta(inp), meta(row_id_map), meta(probs), num_tokens, num_out_tokens, map_type, out_rows)
    arrays = {"inp": inp, "row_id_map": row_id_map, "probs": probs}
    out, *permuted_probs = ffi(call, [arrays[name] for name in call.inputs])
    return out, (permuted_probs[0] if probs is not None else None)


@partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _permute(inp, row_id_map, probs, num_tokens, num_out_tokens, map_type, out_rows):
    return _permute_call(inp, row_id_map, probs, num_tokens, num_out_tokens, map_type, out_rows)


def _permute_fwd(inp, row_id_map, probs, num_tokens, num_out_tokens, map_type, out_rows):
    probs_slots = None if probs is None else probs.shape[1]
    return _permute_call(inp, row_id_map, probs, num_tokens, num_out_tokens, map_type, out_rows), (row_id_map,
                                                                                                    probs_slots)


def _permute_bwd(num_tokens, num_out_tokens, map_type, out_rows, residuals, grads):
    row_id_map, probs_slots = residuals
    grad_out, grad_pp = grads
    call = PERMUTE_BWD.plan(meta(grad_out), meta(row_id_map), meta(grad_pp), num_tokens, map_type, probs_slots)
    arrays = {"grad_out": grad_out, "row_id_map": row_id_map, "grad_permuted_probs": grad_pp}
    grad_inp, *grad_probs = ffi(call, [arrays[name] for name in call.inputs])
    return grad_inp, None, (grad_probs[0] if grad_pp is not None else None)


_permute.defvjp(_permute_fwd, _permute_bwd)


def _unpermute_call(y, row_id_map, merging_probs, num_tokens, map_type):
    call = UNPERMUTE.plan(meta(y), meta(row_id_map), meta(merging_probs), num_tokens, map_type)
    arrays = {"y": y, "row_id_map": row_id_map, "merging_probs": merging_probs}
    return ffi(call, [arrays[name] for name in call.inputs])[0]


@partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _unpermute(y, row_id_map, merging_probs, num_tokens, map_type):
    return _unpermute_call(y, row_id_map, merging_probs, num_tokens, map_type)


def _unpermute_fwd(y, row_id_map, merging_probs, num_tokens, map_type):
    return _unpermute_call(y, row_id_map, merging_probs, num_tokens, map_type), (y, row_id_map, merging_probs)


def _unpermute_bwd(num_tokens, map_type, residuals, grad_out):
    y, row_id_map, merging_probs = residuals
    call = UNPERMUTE_BWD.plan(meta(grad_out), meta(y), meta(row_id_map), meta(merging_probs), map_type)
    arrays = {"grad_out": grad_out, "y": y, "row_id_map": row_id_map, "merging_probs": merging_probs}
    grad_y, *grad_probs = ffi(call, [arrays[name] for name in call.inputs])
    return grad_y, None, (grad_probs[0] if merging_probs is not None else None)


_unpermute.defvjp(_unpermute_fwd, _unpermute_bwd)


# ---- public API ------------------------------------------------------------------------------

def _inspectable(x) -> bool:
    """Values can be read without tracing or a device transfer: concrete and on the CPU."""
    return not isinstance(x, jax.core.Tracer) and all(d.platform == "cpu" for d in x.devices())


def _routing_map(op: str, routing_map, map_type: str):
    """A bool mask as uint8; routing values checked when inspectable."""
    routing_map = jnp.asarray(routing_map)
    check_routing_map(op, map_type, meta(routing_map))
    if routing_map.dtype == jnp.bool_:
        routing_map = routing_map.astype(jnp.uint8)
    if _inspectable(routing_map) and routing_map.size > 0:
        values = np.asarray(routing_map)
        check_routing_values(op, map_type, int(values.min()), int(values.max()))
    if routing_map.dtype == jnp.int64:  # lax.top_k indices / one_hot masks with x64 enabled
        routing_map = routing_map.astype(jnp.int32)
    return routing_map


def _permute_rows(inp, row_id_map, probs, num_tokens, num_out_tokens, map_type: str, op: str):
    """(permuted inp, permuted probs or None): plain arrays, or the rows of a QuantizedTensor
    with their row scales."""
    if not isinstance(inp, QuantizedTensor):
        inp = jnp.asarray(inp)
        PERMUTE.validate(meta(inp), meta(row_id_map), meta(probs), num_tokens, num_out_tokens, map_type)
        return _permute(inp, row_id_map, probs, num_tokens, num_out_tokens, map_type, None)
    check_quantized_input(op, inp)
    fields = {name: getattr(inp, name) for name in ARRAY_FIELDS}
    permuted_probs = None
    for name, rows, transposed in quantized_row_fields(inp, num_out_tokens):
        array = fields[name].T if transposed else fields[name]
        PERMUTE.validate(meta(array), meta(row_id_map), meta(probs), num_tokens, num_out_tokens, map_type, rows)
        moved, moved_probs = _permute_call(array, row_id_map, probs, num_tokens, num_out_tokens, map_type, rows)
        fields[name] = moved.T if transposed else moved
        if probs is not None:
            permuted_probs, probs = moved_probs, None
    qt = QuantizedTensor(**fields, quantizer=inp.quantizer, shape=(num_out_tokens, inp.shape[1]), dtype=inp.dtype)
    return qt, permuted_probs


def _permute_with_map(op: str, inp, probs, routing_map, num_out_tokens: int, map_type: str):
    routing_map = _routing_map(op, routing_map, map_type)
    probs = None if probs is None else jnp.asarray(probs)
    traced = isinstance(routing_map, jax.core.Tracer)
    count_routed = None if traced else (lambda: int(np.count_nonzero(np.asarray(routing_map))))
    num_out = resolve_num_out_tokens(op, map_type, meta(routing_map), num_out_tokens, count_routed)
    map_call = ROW_ID_MAP.plan(meta(routing_map), num_out, map_type)
    map_spec = map_call.outputs[0]
    num_tokens = routing_map.shape[0]
    PERMUTE.validate(ArrayMeta(tuple(inp.shape[:1]) + (1,), "float32"), ArrayMeta(map_spec.shape, map_spec.dtype),
                     meta(probs), num_tokens, num_out, map_type)
    row_id_map = ffi(map_call, [routing_map])[0]
    out, permuted_probs = _permute_rows(inp, row_id_map, probs, num_tokens, num_out, map_type, op)
    return out, permuted_probs, row_id_map


def moe_permute(inp, routing_map, num_out_tokens: int = -1, map_type: str = "mask"):
    """Permutes token rows into expert-major order (NUMERICS.md §10); jit- and grad-clean.

    Shapes: inp (T, H) or a rowwise QuantizedTensor; routing_map (T, topK) expert ids (index
        map) or (T, E) 0/1 (mask map); returns (output (num_out_tokens, H), row_id_map).
    Numerics: as ``twinengine.pytorch.moe_permute`` (same kernels, same bytes). Output sizes
        are static: num_out_tokens is a Python int; num_out_tokens <= 0 means T·topK for the
        index map and, for the mask map, a count of the routing map that only a concrete
        (non-traced) routing map allows.
    Raises:
        TypeError / ValueError: shared core checks, including a missing num_out_tokens for a
            traced mask map; for concrete CPU arrays also expert ids < 0 or mask values
            outside {0, 1} (inside jit such pairs are dropped).
    """
    out, _, row_id_map = _permute_with_map("moe_permute", inp, None, routing_map, num_out_tokens, map_type)
    return out, row_id_map


def moe_permute_with_probs(inp, probs, routing_map, num_out_tokens: int = -1, map_type: str = "mask"):
    """moe_permute that also permutes ``probs``: returns (output, permuted_probs, row_id_map).

    Shapes: probs (T, E) mask map, (T, topK) index map; permuted_probs (num_out_tokens,).
    Numerics: as ``twinengine.pytorch.moe_permute_with_probs``; differentiable in inp and probs.
    """
    return _permute_with_map("moe_permute_with_probs", inp, probs, routing_map, num_out_tokens, map_type)


def moe_unpermute(inp, row_id_map, merging_probs=None, restore_shape: Sequence[int] | None = None,
                  map_type: str = "mask", pad_offsets=None):
    """Gathers permuted rows back to tokens and sums each token's copies (NUMERICS.md §10).

    Shapes / Numerics: as ``twinengine.pytorch.moe_unpermute`` (same kernel, same bytes),
        including ``pad_offsets`` of padded expert blocks; differentiable in inp and
        merging_probs.
    Raises:
        TypeError / ValueError: shared core checks.
    """
    op = "moe_unpermute"
    if isinstance(inp, QuantizedTensor):
        reject_quantized(op)
    inp = jnp.asarray(inp)
    num_tokens = unpermute_num_tokens(op, map_type, meta(inp), meta(row_id_map), meta(merging_probs), restore_shape)
    if pad_offsets is not None:
        pad_offsets = jnp.asarray(pad_offsets)
        check_pad_inputs(op, map_type, pad_offsets, row_id_map.shape[-1] // 2)
        pad_offsets = pad_offsets.astype(jnp.int32)
        row_id_map = ffi(PAD_MAP.plan(meta(row_id_map), meta(pad_offsets), num_tokens), [row_id_map, pad_offsets])[0]
    UNPERMUTE.validate(meta(inp), meta(row_id_map), meta(merging_probs), num_tokens, map_type)
    out = _unpermute(inp, row_id_map, merging_probs, num_tokens, map_type)
    return out if restore_shape is None else out.reshape(tuple(restore_shape))


def _sort_chunks(op: str, inp, probs, split_sizes, sorted_index):
    split_sizes = jnp.asarray(split_sizes).astype(jnp.int32)
    sorted_index = jnp.asarray(sorted_index).astype(jnp.int32)
    num_tokens = inp.shape[0]
    if probs is not None:
        probs = jnp.asarray(probs)
        check_sort_chunks_probs(op, meta(probs), num_tokens)
    CHUNK_MAP.validate(meta(split_sizes), meta(sorted_index), num_tokens)
    if _inspectable(split_sizes) and _inspectable(sorted_index):
        check_chunk_values(op, np.asarray(split_sizes).tolist(), np.asarray(sorted_index).tolist(), num_tokens)
    row_id_map = ffi(CHUNK_MAP.infer(meta(split_sizes), meta(sorted_index), num_tokens), [split_sizes, sorted_index])[0]
    probs = None if probs is None else jnp.asarray(probs).reshape(num_tokens, 1)
    return _permute_rows(inp, row_id_map, probs, num_tokens, num_tokens, "index", op)


def moe_sort_chunks_by_index(inp, split_sizes, sorted_index):
    """Reorders the row chunks of ``inp`` (sizes ``split_sizes``) as ``sorted_index`` says.

    Numerics / Raises: as ``twinengine.pytorch.moe_sort_chunks_by_index``.
    """
    out, _ = _sort_chunks("moe_sort_chunks_by_index", inp, None, split_sizes, sorted_index)
    return out


def moe_sort_chunks_by_index_with_probs(inp, probs, split_sizes, sorted_index):
    """moe_sort_chunks_by_index that also reorders ``probs`` (N,): returns (output, permuted_probs)."""
    return _sort_chunks("moe_sort_chunks_by_index_with_probs", inp, probs, split_sizes, sorted_index)


# ---- padding of expert blocks ------------------------------------------------------------------

def moe_permute_and_pad_with_probs(inp, probs, routing_map, tokens_per_expert, align_size: int,
                                   num_out_tokens: int = -1):
    """moe_permute_with_probs (mask map) with each expert block padded by zero rows to a multiple
    of ``align_size``: returns (output, permuted_probs, row_id_map, pad_offsets,
    target_tokens_per_expert).

    Shapes / Numerics / Raises: as ``twinengine.pytorch.moe_permute_and_pad_with_probs`` (same
        kernels, same static sizes, same bytes); num_out_tokens must be given under jit.
    """
    op = "moe_permute_and_pad_with_probs"
    check_align_size(op, align_size, current_recipe())
    routing_map = _routing_map(op, routing_map, "mask")
    probs = jnp.asarray(probs)
    tokens_per_expert = jnp.asarray(tokens_per_expert)
    check_pad_inputs(op, "mask", tokens_per_expert, routing_map.shape[1])
    counts = tokens_per_expert.astype(jnp.int32)
    traced = isinstance(routing_map, jax.core.Tracer)
    count_routed = None if traced else (lambda: int(np.count_nonzero(np.asarray(routing_map))))
    num_routed = resolve_num_out_tokens(op, "mask", meta(routing_map), num_out_tokens, count_routed)
    num_tokens, num_experts = routing_map.shape
    rows = padded_rows(num_routed, num_experts, align_size)
    row_id_map = ffi(ROW_ID_MAP.plan(meta(routing_map), num_routed, "mask"), [routing_map])[0]
    pad_offsets, target = ffi(PAD_OFFSETS.plan(meta(counts), align_size), [counts])
    padded_map = ffi(PAD_MAP.plan(meta(row_id_map), meta(pad_offsets), num_tokens), [row_id_map, pad_offsets])[0]
    out, permuted_probs = _permute_rows(inp, padded_map, probs, num_tokens, rows, "mask", op)
    return out, permuted_probs, row_id_map, pad_offsets, target


def _split_pad_map(op: str, m_splits, align_size: int, num_rows: int, rows: int):
    counts = jnp.asarray(m_splits).astype(jnp.int32)
    PAD_OFFSETS.validate(meta(counts), align_size)
    if _inspectable(counts):
        check_split_values(op, np.asarray(counts).tolist(), num_rows)
    pad_offsets, target = ffi(PAD_OFFSETS.infer(meta(counts), align_size), [counts])
    row_id_map = ffi(SPLIT_PAD_MAP.plan(meta(counts), meta(pad_offsets), num_rows, rows), [counts, pad_offsets])[0]
    return row_id_map, target


def moe_pad_splits(inp, m_splits, align_size: int):
    """Pads each consecutive row block of ``inp`` (sizes ``m_splits``) with zero rows to a
    multiple of ``align_size``: returns (padded, padded_m_splits).

    Shapes / Numerics / Raises: as ``twinengine.pytorch.moe_pad_splits``.
    """
    op = "moe_pad_splits"
    check_align_size(op, align_size, current_recipe())
    m_splits = jnp.asarray(m_splits)
    num_rows = inp.shape[0]
    rows = padded_rows(num_rows, m_splits.shape[0] if m_splits.ndim == 1 else 0, align_size)
    row_id_map, target = _split_pad_map(op, m_splits, align_size, num_rows, rows)
    out, _ = _permute_rows(inp, row_id_map, None, num_rows, rows, "index", op)
    return out, target


def moe_unpad_splits(inp, m_splits, align_size: int, num_rows: int):
    """Inverse of moe_pad_splits: the first m_splits[g] rows of each padded block.

    Shapes / Numerics / Raises: as ``twinengine.pytorch.moe_unpad_splits``.
    """
    op = "moe_unpad_splits"
    if isinstance(inp, QuantizedTensor):
        reject_quantized(op)
    require_num_rows(op, num_rows)
    check_align_size(op, align_size, current_recipe())
    inp = jnp.asarray(inp)
    row_id_map, _ = _split_pad_map(op, m_splits, align_size, num_rows, inp.shape[0])
    UNPERMUTE.validate(meta(inp), meta(row_id_map), None, num_rows, "index")
    return _unpermute(inp, row_id_map, None, num_rows, "index")


def token_dispatch(inp, routing_map, num_out_tokens: int, probs=None, align_size: int | None = None):
    """TE-JAX-style dispatch of tokens to experts (mask routing map): returns (output,
    permuted_probs, row_id_map, pad_offsets, tokens_per_expert).

    Without align_size: moe_permute(_with_probs); pad_offsets is None and tokens_per_expert the
    routed count of each expert. With align_size: moe_permute_and_pad_with_probs, and
    tokens_per_expert the padded block sizes. permuted_probs is None without
    probs. num_out_tokens (the routed pairs, a static size) is required, as under jit.

    Shapes / Numerics / Raises: as the functions it calls.
    """
    routing_map = jnp.asarray(routing_map)
    counts = routing_map.astype(jnp.int32).sum(axis=0).astype(jnp.int32)
    if align_size is not None:
        dispatch_probs = probs if probs is not None else jnp.zeros(routing_map.shape, jnp.float32)
        out, permuted_probs, row_id_map, pad_offsets, target = moe_permute_and_pad_with_probs(
            inp, dispatch_probs, routing_map, counts, align_size, num_out_tokens)
        return out, (permuted_probs if probs is not None else None), row_id_map, pad_offsets, target
    if probs is None:
        out, row_id_map = moe_permute(inp, routing_map, num_out_tokens)
        return out, None, row_id_map, None, counts
    out, permuted_probs, row_id_map = moe_permute_with_probs(inp, probs, routing_map, num_out_tokens)
    return out, permuted_probs, row_id_map, None, counts


def token_combine(inp, row_id_map, merging_probs=None, pad_offsets=None):
    """TE-JAX-style combine: moe_unpermute of a mask-map dispatch (with its pad_offsets when it
    was padded); returns (T, H).

    Shapes / Numerics / Raises: as ``moe_unpermute``.
    """
    return moe_unpermute(inp, row_id_map, merging_probs, map_type="mask", pad_offsets=pad_offsets)
