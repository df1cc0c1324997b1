"""twinengine.jax.sharding: running twinengine ops on local shards inside ``jax.shard_map``
with the bytes of the unsharded run (NUMERICS.md §12).

Under a plain sharded ``jax.jit`` the ops partition themselves (``twinengine.jax.partitioning``).
Inside ``jax.shard_map`` (each device calls the op on its own shard, no all-gather of
operands) use the amax reduction of this module:

- ``amax_reduction(axes)``: inside the region, every per-tensor amax that a twinengine quantize
  forms (current scaling, the amax a delayed-scaling quantize reports) is ``pmax``-ed over the
  mesh axes `axes` before the scale is formed. Pass every axis of the ``shard_map``: along an
  axis where a tensor is replicated the reduction is the identity, along one where it is
  sharded it makes the amax the whole tensor's. Block formats (MXFP8, FP8 block) need no
  reduction; NVFP4's global amaxes are reduced and given to its kernel (with stochastic
  rounding it is refused under a reduction: its bits depend on the global element index).
- ``check_sharding(shape, spec, mesh, quantizer)``: the clear error for a spec that cannot give
  the unsharded bytes (an axis size that does not divide the dimension, a shard boundary inside
  a quantization block); call it before the ``shard_map``.

The region is a JAX user context like ``autocast``: it is part of the trace cache key.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
from jax import lax

from ..dtypes import FP8_MAX
from ..quantizers import Quantizer

_AXES = jax.make_user_context(())

_F32_ABS_MASK = 0x7FFFFFFF
_F32_INF_BITS = 0x7F800000
_F32_POW2_MASK = -0x800000  # 0xFF800000 as int32: sign and exponent bits
_FLT_MAX = 3.4028234663852886e38


def amax_axes() -> tuple[str, ...]:
    """The mesh axes of the innermost ``amax_reduction`` region (() outside any)."""
    return _AXES.value


class amax_reduction:
    """Context manager: per-tensor amaxes of twinengine quantizes traced inside are ``pmax``-ed
    over the mesh axes `axes` (a name or a sequence of names; use it inside ``jax.shard_map``
    over those axes). Regions nest; the innermost wins."""

    def __init__(self, axes: str | Sequence[str]):
        self._axes = (axes,) if isinstance(axes, str) else tuple(axes)
        self._cm = None

    def __enter__(self):
        self._cm = _AXES(self._axes)
        self._cm.__enter__()
        return self

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


def reduce_amax(amax, axes: tuple[str, ...]):
    """MAX of a non-negative fp32 amax over `axes`, on the bit patterns (a float max would flush
    subnormals on XLA's CPU threads; a NaN amax, above +inf in this order, wins)."""
    bits = lax.bitcast_convert_type(amax, jnp.int32)
    return lax.bitcast_convert_type(lax.pmax(bits, axes), jnp.float32)


def scale_from_amax(amax, quantizer: Quantizer):
    """NUMERICS.md §2 per-tensor scale (inf_value FLT_MAX) from a (1,) fp32 amax, as the
    current-scaling kernel forms it; zero and non-finite tests on the bits."""
    a = jnp.maximum(amax, jnp.float32(quantizer.amax_epsilon))
    bits = lax.bitcast_convert_type(a, jnp.int32)
    unusable = ((bits & _F32_ABS_MASK) == 0) | ((bits & _F32_ABS_MASK) >= _F32_INF_BITS)
    s = jnp.float32(FP8_MAX[quantizer.fp8_dtype]) / a
    s = jnp.where(lax.bitcast_convert_type(s, jnp.int32) == _F32_INF_BITS, jnp.float32(_FLT_MAX), s)
    s = jnp.where(unusable, jnp.float32(1.0), s)
    if quantizer.force_pow_2_scales:
        s = lax.bitcast_convert_type(lax.bitcast_convert_type(s, jnp.int32) & _F32_POW2_MASK, jnp.float32)
    return s


def _block_extents(quantizer: Quantizer | None) -> tuple[int, int]:
    """(rows, cols) of one quantization block of the flattened (R, K) input; 1 where a copy has
    no block along that dimension."""
    if quantizer is None:
        return 1, 1
    mode = quantizer.scaling_mode
    if mode == "mxfp8":
        return (32 if quantizer.columnwise else 1), (32 if quantizer.rowwise else 1)
    if mode == "fp8_block":
        return (128 if quantizer.columnwise or quantizer.block_scaling_dim == 2 else 1), 128
    if mode == "nvfp4":
        return (16 if quantizer.columnwise or quantizer.with_2d_quantization else 1), 16
    return 1, 1


def check_sharding(shape: Sequence[int], spec, mesh, quantizer: Quantizer | None = None) -> None:
    """Raises ValueError unless sharding an array of `shape` by the PartitionSpec `spec` over
    `mesh` gives equal shards whose boundaries fall on `quantizer`'s block boundaries (of the
    flattened (R, K) input: blocks along K and, for columnwise / 2D copies, along R)."""
    shape = tuple(int(d) for d in shape)
    entries = tuple(spec) + (None,) * (len(shape) - len(tuple(spec)))
    block_rows, block_cols = _block_extents(quantizer)
    for dim, entry in enumerate(entries):
        if entry is None:
            continue
        axes = (entry,) if isinstance(entry, str) else tuple(entry)
        parts = math.prod(mesh.shape[a] for a in axes)
        if shape[dim] % parts:
            raise ValueError(f"check_sharding: dimension {dim} of size {shape[dim]} is not divisible by the mesh "
                             f"axes {axes} of size {parts}")
        local = shape[dim] // parts
        if dim == len(shape) - 1:
            stride, block, name = local, block_cols, "K (last dimension)"
        else:
            stride, block, name = local * math.prod(shape[dim + 1:-1]), block_rows, "R (flattened rows)"
        if parts > 1 and stride % block:
            raise ValueError(f"check_sharding: a shard boundary falls inside a {type(quantizer).__name__} block: "
                             f"sharding dimension {dim} over {axes} ({parts} shards) puts boundaries every "
                             f"{stride} along {name}, not a multiple of the block size {block}")
