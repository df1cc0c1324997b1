"""twinengine.jax quantize / dequantize / update_delayed_scaling over XLA FFI calls.
Shapes, checks and errors come from core/ops/quantize.py."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax

from ...ops.quantize import (DEQUANTIZE, F32_ABS_MASK, F32_INF_BITS, QUANTIZE, UPDATE_DELAYED_SCALING,
                             quantized_layout, validate_quantize_into, validate_record_amax)
from ...quantized_tensor import QuantizedTensor
from ...quantizers import Float8DelayedScalingQuantizer, Quantizer
from .._library import dtype_name, ffi, jax_dtype, meta
from ..partitioning import Rule, factor_sizes, partitioned, plain_dims, quantized_blocks, quantized_dims, shards_locally
from ..sharding import amax_axes, reduce_amax, scale_from_amax


def quantize(x, quantizer: Quantizer, *, scale=None, rng=None) -> QuantizedTensor:
    """Quantizes `x` as `quantizer` describes (jit-, vmap-clean).

    Shapes: x any rank >= 1, flattened to (R, K); output layouts per NUMERICS.md §4–§7.
    Dtypes: x float32 / bfloat16 / float16 (bfloat16 for NVFP4 with_rht and columnwise usage);
        scale (delayed scaling) float32 (1,); rng (NVFP4 stochastic rounding only) the
        [seed, offset] array of shape (2,), uint32 / int32 / int64, low 32 bits used
        (``twinengine.ops.quantize.RNG_DTYPES``): the same state gives the same bytes in both
        frontends, and a new value is a new input, not a recompile.
    Numerics: bit for bit NUMERICS.md; identical bytes to ``twinengine.pytorch.quantize``.
        Under vmap each batch element is quantized on its own.
    Sharded (inside ``shard_map`` under ``twinengine.jax.sharding.amax_reduction(axes)``):
        per-tensor amaxes are ``pmax``-ed over `axes` before the scale is formed, so each
        shard's bytes are the matching part of the unsharded result (NUMERICS.md §12).
    Sharded jit (``twinengine.jax.partitioning``): runs per shard of x, per-tensor amaxes
        ``pmax``-ed over the mesh axes sharding x; the result is the unsharded one byte for
        byte, its arrays sharded like x; NVFP4's global amaxes are pmax-ed and given to the
        kernel (with stochastic rounding NVFP4 gathers x: its bits depend on the global index).
    Raises:
        TypeError / ValueError: from the shared core checks; NVFP4 with stochastic rounding
        under an amax reduction;
        at compile time, a shard boundary of x inside a block / scale tile.
    """
    x = jnp.asarray(x)
    source = x if isinstance(x, jax.core.Tracer) else None  # a concrete x is never differentiated
    x = lax.stop_gradient(x) if source is not None else x
    call = QUANTIZE.cached_plan(meta(x), quantizer, meta(scale), meta(rng))
    static = (quantizer, scale is not None, rng is not None)
    outputs = _quantize_op(_quantize_rule(call, x, quantizer, scale, rng), static,
                           *[a for a in (x, scale, rng) if a is not None])
    qt = QuantizedTensor(**{spec.name: a for spec, a in zip(call.outputs, outputs)}, quantizer=quantizer,
                         shape=tuple(x.shape), dtype=dtype_name(x.dtype))
    if source is not None:
        qt.grad_source = source  # dequantize's straight-through link (not a pytree leaf)
    return qt


def _quantize_rule(call, x, quantizer: Quantizer, scale, rng) -> Rule:
    """x's dimensions shard locally (NVFP4: none); per-tensor amaxes pmax-ed across them."""
    x_dims = plain_dims("x", x.shape)
    inputs = [("x", x_dims)] + [(name, ((),)) for name, a in (("scale", scale), ("rng", rng)) if a is not None]
    local = frozenset(f for d in x_dims for f in d) if shards_locally(quantizer) else frozenset()
    return Rule("quantize", tuple(inputs), tuple(quantized_dims(quantizer, x_dims, s.name) for s in call.outputs),
                factor_sizes([(x_dims, x.shape)]), local=local, amax=local,
                blocks=quantized_blocks(quantizer, x_dims, "x"))


def _quantize_shard(static, sizes, x, *rest):
    """quantize on one shard (or the whole x): the QuantizedTensor fields in kernel order."""
    quantizer, has_scale, has_rng = static
    scale = rest[0] if has_scale else None
    rng = rest[-1] if has_rng else None
    axes = amax_axes()
    if axes and quantizer.scaling_mode in ("fp8_current", "fp8_delayed", "nvfp4"):
        qt = _quantize_reduced(x, quantizer, scale, rng, axes)
    else:
        qt = _quantize_local(x, quantizer, scale, rng)
    return tuple(getattr(qt, spec.name) for spec in QUANTIZE.cached_plan(meta(x), quantizer, meta(scale),
                                                                          meta(rng)).outputs)


_quantize_op = partitioned(_quantize_shard)


def run_fused(run, quantizer: Quantizer | None, scale, rng) -> tuple:
    """The outputs of a kernel with a fused quantization of its first output: ``run(q)`` gives
    the kernel's outputs (its own, then q's fields). Under an amax reduction a per-tensor (or
    NVFP4) quantizer cannot be fused (the kernel forms the shard's amax): the first output is
    quantized after the kernel, as ``quantize`` does it there — the same bytes (NUMERICS.md §11:
    fused == unfused)."""
    if quantizer is None or not amax_axes() or quantizer.scaling_mode not in ("fp8_current", "fp8_delayed", "nvfp4"):
        return tuple(run(quantizer))
    own = tuple(run(None))
    static = (quantizer, scale is not None, rng is not None)
    return own + _quantize_shard(static, None, own[0], *[a for a in (scale, rng) if a is not None])


def _quantize_local(x, quantizer: Quantizer, scale, rng) -> QuantizedTensor:
    call = QUANTIZE.cached_plan(meta(x), quantizer, meta(scale), meta(rng))
    arrays = {"x": x, "scale": scale, "rng": rng}
    outputs = ffi(call, [arrays[name] for name in call.inputs])
    fields = {spec.name: array for spec, array in zip(call.outputs, outputs)}
    return QuantizedTensor(**fields, quantizer=quantizer, shape=tuple(x.shape), dtype=dtype_name(x.dtype))


def _quantize_reduced(x, quantizer: Quantizer, scale, rng, axes) -> QuantizedTensor:
    """Per-tensor quantize of a shard with the amax of the whole (sharded) tensor: delayed
    scaling uses the given scale and only reduces the reported amax; current scaling takes the
    shard's amax from the kernel, reduces it, forms the scale by NUMERICS.md §2 and quantizes
    with that scale (the delayed-scaling kernel: same cast, same 1/s)."""
    if quantizer.scaling_mode == "nvfp4":
        if quantizer.stochastic_rounding:
            raise ValueError("quantize: NVFP4 with stochastic rounding under an amax_reduction is not supported: "
                             "each element's random bits depend on its index in the whole tensor; quantize it "
                             "unsharded")
        # the shard's [rowwise, columnwise (after RHT)] global amaxes, MAX-reduced, given to the
        # kernel in place of its own (NUMERICS.md §7 step 1, §12)
        local = _quantize_local(x, quantizer, None, None)
        zero = jnp.zeros((1,), jnp.float32)
        amax = reduce_amax(jnp.concatenate([zero if local.amax is None else local.amax,
                                            zero if local.columnwise_amax is None else local.columnwise_amax]), axes)
        call = QUANTIZE.cached_plan(meta(x), quantizer, None, None, meta(amax))
        arrays = {"x": x, "amax": amax}
        outputs = ffi(call, [arrays[name] for name in call.inputs])
        return QuantizedTensor(**{spec.name: a for spec, a in zip(call.outputs, outputs)}, quantizer=quantizer,
                               shape=tuple(x.shape), dtype=dtype_name(x.dtype))
    if quantizer.scaling_mode == "fp8_delayed":
        qt = _quantize_local(x, quantizer, scale, rng)
        return dataclasses.replace(qt, amax=reduce_amax(qt.amax, axes))
    amax = reduce_amax(_quantize_local(x, quantizer.with_usage(rowwise=True, columnwise=False), None, None).amax,
                       axes)
    s = scale_from_amax(amax, quantizer)
    delayed = Float8DelayedScalingQuantizer(quantizer.fp8_dtype, rowwise=quantizer.rowwise,
                                            columnwise=quantizer.columnwise)
    qt = _quantize_local(x, delayed, s, None)
    return dataclasses.replace(qt, amax=amax, quantizer=quantizer)


def dequantize(qt: QuantizedTensor, dtype=jnp.float32, *, columnwise: bool = False):
    """Dequantizes the rowwise (or columnwise) copy of `qt` to an array of qt.shape.

    Numerics: as ``twinengine.pytorch.dequantize`` (same kernel, same bytes).
    Gradient: straight through, as ``fake_quantize`` and the torch frontend: when `qt` came
        from ``quantize(x, ...)`` inside the same jax.grad / jvp trace, the result is
        differentiable w.r.t. x (gradient = incoming cotangent cast to x's dtype). The link
        is a Python attribute (``qt.grad_source``), not a pytree leaf: it does not cross a
        jit / scan boundary or ``state_dict``; a columnwise RHT copy has none.
    Raises:
        ValueError: the requested copy is absent (its quantizer lacks that usage).
    """
    call = DEQUANTIZE.plan(qt, dtype_name(dtype), columnwise)
    x_dims = plain_dims("x", qt.shape)
    rule = Rule("dequantize", tuple((name, quantized_dims(qt.quantizer, x_dims, name)) for name in call.inputs),
                (x_dims,), factor_sizes([(x_dims, qt.shape)]),
                local=frozenset(f for d in x_dims for f in d) if shards_locally(qt.quantizer) else frozenset(),
                blocks=quantized_blocks(qt.quantizer, x_dims, "qt"))
    (out,) = _dequantize_op(rule, (qt.quantizer, qt.dtype, dtype_name(dtype), columnwise, call.inputs,
                                   len(qt.shape)),
                            *[getattr(qt, name) for name in call.inputs])
    source = None if columnwise and getattr(qt.quantizer, "with_rht", False) else getattr(qt, "grad_source", None)
    return out if source is None else _straight_through(source, out)


def _dequantize_shard(static, sizes, *arrays):
    """dequantize of one shard of the copy (or the whole copy)."""
    quantizer, qt_dtype, dtype, columnwise, names, rank = static
    shape = tuple(sizes[f"x{i}"] for i in range(rank))
    qt = QuantizedTensor(**dict(zip(names, arrays)), quantizer=quantizer, shape=shape, dtype=qt_dtype)
    return ffi(DEQUANTIZE.plan(qt, dtype, columnwise), list(arrays))


_dequantize_op = partitioned(_dequantize_shard)


def update_delayed_scaling(amax_history, scale, fp8_dtype: str, *, margin: int = 0, amax_compute_algo: str = "max"):
    """Delayed-scaling update (NUMERICS.md §3), functional: returns (new_amax_history, new_scale)."""
    call = UPDATE_DELAYED_SCALING.plan(meta(amax_history), meta(scale), fp8_dtype, margin, amax_compute_algo)
    new_history, new_scale = ffi(call, [amax_history, scale])
    return new_history, new_scale


def fake_quantize(x, quantizer: Quantizer, dtype=None, *, scale=None, rng=None, columnwise: bool = False):
    """dequantize(quantize(x)) with a straight-through gradient (jit-, grad-, vmap-clean).

    Numerics / gradient: as ``twinengine.pytorch.fake_quantize`` — the forward is exactly
    ``dequantize(quantize(x, ...), dtype)``, the gradient of x is the incoming gradient cast to
    x's dtype; no gradient flows to scale or rng.
    Raises:
        TypeError / ValueError: as quantize / dequantize.
    """
    x = jnp.asarray(x)
    out_dtype = x.dtype if dtype is None else dtype
    y = dequantize(quantize(lax.stop_gradient(x), quantizer, scale=scale, rng=rng), out_dtype,
                   columnwise=columnwise)
    return _straight_through(x, y)


@jax.custom_vjp
def _straight_through(x, y):
    return y


def _straight_through_fwd(x, y):
    return y, jnp.zeros((0,), x.dtype)


def _straight_through_bwd(x_tag, g):
    return g.astype(x_tag.dtype), jnp.zeros_like(g)


_straight_through.defvjp(_straight_through_fwd, _straight_through_bwd)


def _order_key(bits):
    return jnp.where(bits >= 0, bits, bits ^ jnp.int32(F32_ABS_MASK))


def record_amax(amax_history, amax):
    """History with row 0 raised to `amax` where it is larger (NUMERICS.md §3 quantize step),
    functional.

    Shapes: amax_history (L,) or (L, N); amax N values (any shape of N elements).
    Numerics: ``twinengine.ops.quantize.RECORD_AMAX_RULE`` — computed on the fp32 bits (XLA's
        CPU threads flush subnormals in float comparisons; integer ones keep them); a NaN amax
        is skipped; identical bytes to ``twinengine.pytorch.record_amax``.
    Raises:
        TypeError / ValueError: non-float32 arrays, or an amax count that is not the slot count.
    """
    amax_history, amax = jnp.asarray(amax_history), jnp.asarray(amax)
    validate_record_amax(meta(amax_history), meta(amax))
    bits = lax.bitcast_convert_type(amax_history, jnp.int32)
    head = bits[:1]
    new = lax.bitcast_convert_type(amax.reshape(head.shape), jnp.int32)
    abs_mask, inf_bits = jnp.int32(F32_ABS_MASK), jnp.int32(F32_INF_BITS)
    take = ((new & abs_mask) <= inf_bits) & ((head & abs_mask) <= inf_bits) & (_order_key(new) > _order_key(head))
    return lax.bitcast_convert_type(bits.at[:1].set(jnp.where(take, new, head)), jnp.float32)


# ---- quantizing into caller-owned buffers -----------------------------------------------

def make_empty(quantizer: Quantizer, shape, dtype=jnp.float32, device=None) -> QuantizedTensor:
    """A zero-filled QuantizedTensor with the arrays ``quantize`` gives for an input of `shape`
    and `dtype` under `quantizer`, on `device` (a jax.Device or Sharding; default: JAX's):
    the buffers ``quantize_into`` reuses.

    Shapes / Dtypes: from the core shape function of quantize (NUMERICS.md §4–§7 layouts).
    Raises:
        TypeError / ValueError: as ``quantize`` for that input.
    """
    name = dtype_name(dtype)
    specs = quantized_layout(quantizer, tuple(shape), name)
    arrays = {spec.name: jnp.zeros(spec.shape, jax_dtype(spec.dtype), device=device) for spec in specs}
    return QuantizedTensor(**arrays, quantizer=quantizer, shape=tuple(shape), dtype=name)


@functools.partial(jax.jit, donate_argnums=0, keep_unused=True)
def _quantize_donating(out: QuantizedTensor, x, scale, rng) -> QuantizedTensor:
    # keep_unused: `out` is only there to be donated; XLA then writes the results into its buffers.
    return quantize(x, out.quantizer, scale=scale, rng=rng)


def quantize_into(out: QuantizedTensor, x, *, scale=None, rng=None) -> QuantizedTensor:
    """``quantize(x, out.quantizer)`` written into the buffers of `out`, functionally: `out` is
    donated (``jax.jit(donate_argnums=0)``) and the result lives in its buffers, so a step
    re-quantizing a weight allocates nothing; `out` is deleted (JAX's donation rule). Inside
    an enclosing jit, donate there (inner donation is ignored) or call ``quantize``.

    Shapes: x of ``out.shape``; out's arrays as ``make_empty(out.quantizer, x.shape, x.dtype)``.
    Dtypes / Numerics: as ``quantize(x, out.quantizer)``, byte for byte.
    Raises:
        TypeError / ValueError: the same checks and text as ``twinengine.pytorch.quantize_``.
    """
    x = jnp.asarray(x)
    validate_quantize_into(out, meta(x), meta(scale), meta(rng))
    return _quantize_donating(out, x, scale, rng)
