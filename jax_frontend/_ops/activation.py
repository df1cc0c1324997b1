"""twinengine.jax activation forward / backward / backward + bias gradient over XLA FFI calls
(no custom_vjp: the fusible ops call them explicitly). Shapes, checks and errors come from
core/ops/activation.py; a fused quantization is the quantize family's.

Sharded jit (``twinengine.jax.partitioning``): elementwise kinds shard every dimension
locally, gated kinds the rows only (their [gate | linear] halves need the whole last
dimension, which runs gathered); the unsharded bytes, a fused per-tensor quantization's amax
pmax-ed over the sharded axes. activation_bwd_dbias's dbias of sharded rows is an fp32
partial sum, psum-ed then rounded (NUMERICS.md §12)."""

from __future__ import annotations

import jax.numpy as jnp

from ...ops.activation import ACTIVATION_BWD, ACTIVATION_BWD_DBIAS, ACTIVATION_FWD, ACTIVATIONS, GATED_ACTIVATIONS
from ...quantized_tensor import QuantizedTensor
from ...quantizers import Quantizer
from .._library import dtype_name, ffi, jax_dtype, meta
from ..partitioning import feature_rule, partitioned
from .quantize import run_fused

__all__ = ["ACTIVATIONS", "GATED_ACTIVATIONS", "activation_fwd", "activation_bwd", "activation_bwd_dbias"]


_PLANS = {"fwd": ACTIVATION_FWD, "bwd": ACTIVATION_BWD, "bwd_dbias": ACTIVATION_BWD_DBIAS}


def _plan(which: str, arrays: dict, attrs: tuple, quantizer: Quantizer | None, unfused: bool = False):
    """The kernel call of activation_<which> with `quantizer` fused (None: none); `unfused`: the
    activation alone (its quantization runs after it)."""
    metas = [meta(arrays[name]) for name in (("x",) if which == "fwd" else ("dy", "x"))]
    if which == "bwd":
        return ACTIVATION_BWD.plan(*metas, *attrs)
    q_arrays = [None if unfused else meta(arrays.get(name)) for name in ("scale", "rng")]
    return _PLANS[which].plan(*metas, *attrs, quantizer, *q_arrays)


def _run(which: str, arrays: dict, attrs: tuple, quantizer: Quantizer | None = None) -> tuple[list, object]:
    """Runs the call through its sharding rule: (outputs, the call)."""
    call = _plan(which, arrays, attrs, quantizer)
    x = arrays["x"]
    rule = feature_rule(f"activation_{which}", call, x.shape, hidden_local=attrs[0] not in GATED_ACTIVATIONS,
                        quantizer=quantizer, reduce_rows=which == "bwd_dbias")
    outputs = _op(rule, (which, attrs, quantizer, call.inputs), *[arrays[name] for name in call.inputs])
    return list(outputs), call


def _shard(static, sizes, *arrays):
    which, attrs, quantizer, names = static
    named = dict(zip(names, arrays))

    def run(q):
        call = _plan(which, named, attrs, q, unfused=q is None)
        return ffi(call, [named[name] for name in call.inputs])
    return run_fused(run, quantizer, named.get("scale"), named.get("rng"))


def _partial(static, sizes, *arrays):
    """activation_bwd_dbias of a row shard with dbias an fp32 partial sum, rounded after the psum."""
    which, attrs, quantizer, names = static
    bias_dtype = attrs[-1]
    outputs = _shard((which, attrs[:-1] + ("float32",), quantizer, names), sizes, *arrays)
    return outputs, lambda sums: (sums[0], sums[1].astype(jax_dtype(bias_dtype)), *sums[2:])


_op = partitioned(_shard, _partial)


def _quantized(specs, arrays, quantizer: Quantizer, shape, dtype: str) -> QuantizedTensor:
    """The QuantizedTensor of a fused call's quantize outputs (as ``quantize`` builds it)."""
    fields = {spec.name: array for spec, array in zip(specs, arrays)}
    return QuantizedTensor(**fields, quantizer=quantizer, shape=tuple(shape), dtype=dtype)


def activation_fwd(x, kind: str, *, limit: float = 7.0, alpha: float = 1.702, quantizer: Quantizer | None = None,
                   scale=None, rng=None):
    """y = act(x), optionally also quantized: returns (y, qt) (jit-, vmap-clean).

    Shapes: x (..., K); y (..., K), or (..., K/2) for the gated kinds (K even). qt has y's shape.
    Dtypes: x float32 / bfloat16 / float16; y x's dtype; scale / rng as ``quantize``.
    Numerics: NUMERICS.md §11; identical bytes to ``twinengine.pytorch``'s activation_fwd;
        qt is byte-identical to ``quantize(y, quantizer, scale=scale, rng=rng)``.
    Raises:
        TypeError / ValueError: from the shared core checks.
    """
    x = jnp.asarray(x)
    (y, *q), call = _run("fwd", {"x": x, "scale": scale, "rng": rng}, (kind, limit, alpha), quantizer)
    if quantizer is None:
        return y, None
    return y, _quantized(call.outputs[1:], q, quantizer, y.shape, dtype_name(x.dtype))


def activation_bwd(dy, x, kind: str, *, limit: float = 7.0, alpha: float = 1.702):
    """dx = act'(x)·dy (gated kinds: da = act'(a)·dy·b, db = dy·act(a)).

    Shapes: dy the activation output's shape; dx x's. Dtypes: dy and dx x's dtype.
    Numerics: as ``twinengine.pytorch``'s activation_bwd (same kernel, same bytes).
    Raises:
        TypeError / ValueError: from the shared core checks.
    """
    (dx,), _ = _run("bwd", {"dy": dy, "x": x}, (kind, limit, alpha))
    return dx


def activation_bwd_dbias(dy, x, kind: str, *, limit: float = 7.0, alpha: float = 1.702, bias_dtype=None,
                         quantizer: Quantizer | None = None, scale=None, rng=None):
    """Activation gradient fused with the bias gradient (+ quantization of the gradient):
    returns (dx, dbias, qt).

    Shapes: dx x's shape; dbias (x.shape[-1],). Dtypes: dx x's; dbias `bias_dtype` (default x's).
    Numerics: dbias = Σc over the rows of the rounded dx; byte-identical to activation_bwd,
        bias_grad and quantize run one after the other, and to ``twinengine.pytorch``.
    Raises:
        TypeError / ValueError: from the shared core checks.
    """
    bias_name = dtype_name(bias_dtype if bias_dtype is not None else x.dtype)
    (dx, dbias, *q), call = _run("bwd_dbias", {"dy": dy, "x": x, "scale": scale, "rng": rng},
                                 (kind, limit, alpha, bias_name), quantizer)
    if quantizer is None:
        return dx, dbias, None
    return dx, dbias, _quantized(call.outputs[2:], q, quantizer, x.shape, dtype_name(x.dtype))
