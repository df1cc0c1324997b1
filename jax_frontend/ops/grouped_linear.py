"""JAX basic op GroupedLinear: G expert Linears over consecutive row blocks of the input, with
``m_splits`` arriving as the op's extra input (``Sequential(..., GroupedLinear(...), ...)(x,
params, m_splits)``; one extra input per GroupedLinear, in op order), one grouped kernel per
GEMM phase — twinengine.pytorch.ops.GroupedLinear's twin (same kernels, same bytes)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ...fusion.ops import OpDesc, check_features, check_input_kind, check_param_shape
from ...linear import check_rng, for_input_dtype
from ...ops.gemm import check_grouped_weights, check_m_split_values, check_m_splits, grouped_quantizers
from ...ops.quantize import ArrayMeta
from ...quantized_tensor import QuantizedTensor
from .._library import dtype_name
from .._ops.grouped_dense import _grouped_bwd, _grouped_fp8_bwd, _grouped_fp8_fwd, _grouped_fwd
from .op import BasicOperation, OpContext


class GroupedLinear(BasicOperation):
    """y[rows_g] = x[rows_g] · weight{g}ᵀ (+ bias{g}) for the G row blocks of the extra input
    ``m_splits`` (a (G,) int array, traced under jit: a new split does not recompile).

    Params: (weight0, …, weight{G-1}[, bias0, …, bias{G-1}]), weights (out_features,
        in_features), biases (out_features,) — the torch op's parameters in its order.
    Numerics: exactly ``twinengine.pytorch.ops.GroupedLinear`` (each group the bytes of a
        Linear on its rows), in high precision or under a recipe without per-expert state
        (all but DelayedScaling); m_splits gets no gradient. rng (stochastic-rounding recipes:
        NVFP4): the [seed, offset] of this call — the torch op's ``rng_state`` before its call;
        expert g rounds with [seed, offset + g].
    Raises:
        TypeError: non-array input, a QuantizedTensor input, DelayedScaling (per-expert state:
            use ``twinengine.jax.grouped_dense(..., state=)``) or a recipe without a grouped
            path; ValueError / TypeError: the core m_splits and weight checks (for concrete CPU
            splits also Σ m_splits != rows, negative splits; the CPU kernel for traced ones).
    """

    num_extra_inputs = 1

    def __init__(self, num_gemms: int, in_features: int, out_features: int, *, bias: bool = True) -> None:
        check_features("GroupedLinear", in_features=in_features, out_features=out_features)
        weights = [ArrayMeta((out_features, in_features), "float32")] * num_gemms
        check_grouped_weights(num_gemms, weights, [ArrayMeta((out_features,), "float32")] * num_gemms if bias else None)
        self.num_gemms = num_gemms
        self.in_features, self.out_features, self.use_bias = in_features, out_features, bias

    def describe(self) -> OpDesc:
        return OpDesc("user", "GroupedLinear")

    def init_params(self, key, dtype):
        """torch.nn.Linear's bounds per expert: weights U(±1/√in) (kaiming_uniform(a=√5)), biases too."""
        bound = 1.0 / (self.in_features ** 0.5)
        keys = jax.random.split(key, 2 * self.num_gemms)
        weights = tuple(jax.random.uniform(keys[g], (self.out_features, self.in_features), dtype, -bound, bound)
                        for g in range(self.num_gemms))
        biases = tuple(jax.random.uniform(keys[self.num_gemms + g], (self.out_features,), dtype, -bound, bound)
                       for g in range(self.num_gemms)) if self.use_bias else ()
        return weights + biases

    def op_call(self, recipe, state, rng, training):
        qs = grouped_quantizers(recipe, delayed_ok=False)
        arrays = {}
        if qs is not None:
            check_rng(qs, rng is not None)
            if qs.needs_rng:
                arrays["rng"] = jnp.asarray(rng)
        return {"quantizers": qs}, arrays

    def op_forward_compute(self, x, params, *, quantizers=None, extra_inputs=(), rng=None):
        (m_splits,) = extra_inputs
        check_input_kind("GroupedLinear", isinstance(x, QuantizedTensor), False)
        g = self.num_gemms
        for p in params[:g]:
            check_param_shape("GroupedLinear", "weight", p.shape, (self.out_features, self.in_features))
        weight = jnp.stack(params[:g])
        bias = jnp.stack(params[g:]) if self.use_bias else None
        x2 = x.reshape(-1, x.shape[-1])
        splits = jnp.asarray(m_splits)
        check_m_splits(ArrayMeta(tuple(splits.shape), "int32"), g)
        splits = splits.astype(jnp.int32)
        if not isinstance(splits, jax.core.Tracer) and all(d.platform == "cpu" for d in splits.devices()):
            check_m_split_values(np.asarray(splits).tolist(), x2.shape[0])
        lead = tuple(x.shape[:-1])
        if quantizers is None:
            y, res = _grouped_fwd(x2, weight, splits, bias)
        else:
            quantizers = for_input_dtype(quantizers, dtype_name(x.dtype))  # NVFP4: RHT for bf16 only
            (y, _), res = _grouped_fp8_fwd(x2, weight, splits, bias, None, rng, quantizers)
        return y.reshape(*lead, self.out_features), {"res": res, "lead": lead, "splits_shape": tuple(splits.shape),
                                                     "qs": quantizers}

    def op_backward(self, ctx: OpContext, dy):
        s = ctx.saved
        qs = s["qs"]
        dy2 = dy.reshape(-1, dy.shape[-1])
        if qs is None:
            dx, dw, _, db = _grouped_bwd(s["res"], dy2)
        else:
            dx, dw, _, db, _, _ = _grouped_fp8_bwd(qs, s["res"], (dy2, None))
        dparams = tuple(dw[i] for i in range(self.num_gemms))
        if db is not None:
            dparams += tuple(db[i] for i in range(self.num_gemms))
        d_splits = np.zeros(s["splits_shape"], jax.dtypes.float0)
        return (dx.reshape(*s["lead"], self.in_features), (d_splits,)), dparams
