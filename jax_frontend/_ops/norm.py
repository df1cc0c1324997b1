"""twinengine.jax layernorm / rmsnorm / l2norm forward and backward over XLA FFI calls, with an
optional quantization of y fused into the forward call. Shapes, checks and errors come from
core/ops/norm.py; no custom_vjp here (the layer functions wrap these).

Sharded jit (``twinengine.jax.partitioning``): rows shard locally (per-row statistics, the
unsharded bytes; a fused per-tensor quantization's amax is pmax-ed over them); the normalized
(last) dimension runs gathered, since every row's statistics need the whole row. In the
backward, dx is per shard and dweight / dbias of sharded rows are fp32 partial sums, psum-ed
then rounded (within another summation order's tolerance, NUMERICS.md §12)."""

from __future__ import annotations

import jax.numpy as jnp

from ...ops.norm import (
    L2NORM_BWD,
    L2NORM_FWD,
    LAYERNORM_BWD,
    LAYERNORM_FWD,
    RMSNORM_BWD,
    RMSNORM_FWD,
    quantized_fields,
)
from ...ops.opdef import KernelCall
from ...quantized_tensor import QuantizedTensor
from ...quantizers import Quantizer
from .._library import dtype_name, ffi, meta
from ..partitioning import feature_rule, partitioned
from .quantize import run_fused


_FWD = {"layernorm": LAYERNORM_FWD, "rmsnorm": RMSNORM_FWD, "l2norm": L2NORM_FWD}
_BWD = {"layernorm": LAYERNORM_BWD, "rmsnorm": RMSNORM_BWD, "l2norm": L2NORM_BWD}
_PARAMS = {"layernorm": ("weight", "bias"), "rmsnorm": ("weight",), "l2norm": ()}


def _quantized(call: KernelCall, arrays: list, num_norm_outputs: int, x, quantizer: Quantizer | None
               ) -> QuantizedTensor | None:
    """The QuantizedTensor of y (as twinengine.jax.quantize builds it), or None without a quantizer."""
    if quantizer is None:
        return None
    return QuantizedTensor(**quantized_fields(call, arrays, num_norm_outputs), quantizer=quantizer,
                           shape=tuple(x.shape), dtype=dtype_name(x.dtype))


def _fwd_plan(kind: str, arrays: dict, attrs: tuple, quantizer: Quantizer | None, unfused: bool = False
              ) -> KernelCall:
    """The forward call; `unfused`: the norm alone (its quantization runs after it)."""
    params = [meta(arrays[name]) for name in _PARAMS[kind]]
    q_arrays = [None if unfused else meta(arrays.get(name)) for name in ("scale", "rng")]
    return _FWD[kind].plan(meta(arrays["x"]), *params, *attrs, quantizer, *q_arrays)


def _fwd(kind: str, x, params: dict, attrs: tuple, quantizer, scale, rng) -> tuple[list, KernelCall]:
    x = jnp.asarray(x)
    arrays = {"x": x, **params, "scale": scale, "rng": rng}
    call = _fwd_plan(kind, arrays, attrs, quantizer)
    rule = feature_rule(f"{kind}_fwd", call, x.shape, hidden_local=False, quantizer=quantizer)
    outputs = _fwd_op(rule, (kind, attrs, quantizer, call.inputs), *[arrays[name] for name in call.inputs])
    return list(outputs), call


def _fwd_shard(static, sizes, *arrays):
    kind, attrs, quantizer, names = static
    named = dict(zip(names, arrays))

    def run(q):
        call = _fwd_plan(kind, named, attrs, q, unfused=q is None)
        return ffi(call, [named[name] for name in call.inputs])
    return run_fused(run, quantizer, named.get("scale"), named.get("rng"))


_fwd_op = partitioned(_fwd_shard)


def _bwd(kind: str, arrays: dict, attrs: tuple) -> list:
    call = _BWD[kind].plan(*[meta(a) for a in arrays.values()], *attrs)
    rule = feature_rule(f"{kind}_bwd", call, arrays["x"].shape, hidden_local=False, reduce_rows=kind != "l2norm")
    return list(_bwd_op(rule, (kind, attrs, tuple(arrays)), *arrays.values()))


def _bwd_shard(static, sizes, *arrays):
    kind, attrs, _ = static
    return ffi(_BWD[kind].plan(*[meta(a) for a in arrays], *attrs), list(arrays))


def _bwd_partial(static, sizes, *arrays):
    """dx of the row shard; dweight (, dbias) as fp32 partial sums (weight read in fp32: exact),
    rounded to weight's dtype after the psum."""
    kind, attrs, names = static
    weight = arrays[names.index("weight")]
    wide = [a.astype(jnp.float32) if name == "weight" else a for name, a in zip(names, arrays)]
    outputs = _bwd_shard(static, sizes, *wide)
    return outputs, lambda sums: (sums[0], *[g.astype(weight.dtype) for g in sums[1:]])


_bwd_op = partitioned(_bwd_shard, _bwd_partial)


def layernorm_fwd(x, weight, bias, eps: float, zero_centered_gamma: bool, *, quantizer: Quantizer | None = None,
                  scale=None, rng=None):
    """LayerNorm forward, optionally with y quantized in the same kernel call (jit-, vmap-clean).

    Returns (y, mu, rstd, qt).
    Shapes: x (..., K), K >= 1 (zero rows allowed without a quantizer); weight, bias (K,);
        y x's shape; mu, rstd x.shape[:-1] (one per row).
    Dtypes: x, weight, bias float32 / bfloat16 / float16, independently; y x's dtype; mu, rstd
        float32. scale / rng as ``twinengine.jax.quantize`` takes them.
    Numerics: NUMERICS.md §11; ``qt`` (None without a quantizer) is byte-identical to quantizing y
        with ``twinengine.jax.quantize``; same bytes as ``twinengine.pytorch``. Under vmap each
        batch element is its own call (the numerics are per row, so nothing changes).
    Raises:
        TypeError / ValueError: from the shared core checks (same text as the torch frontend).
    """
    outputs, call = _fwd("layernorm", x, {"weight": weight, "bias": bias}, (eps, zero_centered_gamma), quantizer,
                         scale, rng)
    return outputs[0], outputs[1], outputs[2], _quantized(call, outputs, 3, x, quantizer)


def layernorm_bwd(dy, x, mu, rstd, weight, zero_centered_gamma: bool):
    """LayerNorm backward from the saved mu and rstd: (dx, dweight, dbias).

    Shapes: dy, x (..., K); mu, rstd x.shape[:-1]; weight (K,). dx in x's dtype, dweight and dbias
        (K,) in weight's dtype.
    Numerics: NUMERICS.md §11 backward; dweight = Σc over rows of fl(dy·x̂), dbias = Σc over rows of dy.
    Raises:
        TypeError / ValueError: from the shared core checks.
    """
    dx, dweight, dbias = _bwd("layernorm", {"dy": dy, "x": x, "mu": mu, "rstd": rstd, "weight": weight},
                              (zero_centered_gamma,))
    return dx, dweight, dbias


def rmsnorm_fwd(x, weight, eps: float, zero_centered_gamma: bool, *, quantizer: Quantizer | None = None, scale=None,
                rng=None):
    """RMSNorm forward: (y, rstd, qt). As ``layernorm_fwd`` without bias and mu."""
    outputs, call = _fwd("rmsnorm", x, {"weight": weight}, (eps, zero_centered_gamma), quantizer, scale, rng)
    return outputs[0], outputs[1], _quantized(call, outputs, 2, x, quantizer)


def rmsnorm_bwd(dy, x, rstd, weight, zero_centered_gamma: bool):
    """RMSNorm backward from the saved rstd: (dx, dweight). As ``layernorm_bwd`` without mu and dbias."""
    dx, dweight = _bwd("rmsnorm", {"dy": dy, "x": x, "rstd": rstd, "weight": weight}, (zero_centered_gamma,))
    return dx, dweight


def l2norm_fwd(x, eps: float, *, quantizer: Quantizer | None = None, scale=None, rng=None):
    """L2Normalization forward: (y, rstd, qt), y = fl(x · rstd), rstd = 1/sqrt(Σc x² + ε) per row."""
    outputs, call = _fwd("l2norm", x, {}, (eps,), quantizer, scale, rng)
    return outputs[0], outputs[1], _quantized(call, outputs, 2, x, quantizer)


def l2norm_bwd(dy, x, rstd):
    """L2Normalization backward with y = fl(x · rstd) recomputed in fp32 (NUMERICS.md §11): dx."""
    (dx,) = _bwd("l2norm", {"dy": dy, "x": x, "rstd": rstd}, ())
    return dx
