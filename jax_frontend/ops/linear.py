"""JAX basic ops BasicLinear and Bias, and ops.Linear (BasicLinear + Bias).

The same three pieces and kernels as twinengine.pytorch.ops.BasicLinear / Bias (see there for
the numerics); the weight is in torch layout (out_features, in_features). DelayedScaling state
is functional (``delayed_scaling_state``) and SR draws from an explicit rng per call.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ...fusion.ops import OpDesc, check_features, check_input_kind, check_param_shape
from ...linear import check_delayed_state, check_rng, linear_quantizers
from ...ops.gemm import gemm_operand
from ...quantized_tensor import QuantizedTensor
from .._library import jax_dtype
from .._ops.bias import bias_add, bias_grad
from .._ops.dense import delayed_scaling_state
from .._ops.gemm import gemm
from .._ops.quantize import quantize, record_amax, update_delayed_scaling
from .op import BasicOperation, OpContext


def _rows(x):
    return x.reshape(-1, x.shape[-1])


class BasicLinear(BasicOperation):
    """y = x · wᵀ (no bias), quantized under the recipe (twinengine.pytorch.ops.BasicLinear's twin).

    Params: (weight (out_features, in_features),). State (DelayedScaling): a
    ``delayed_scaling_state(amax_history_len)`` dict. rng (stochastic-rounding recipes): the
    [seed, offset] of this call — the torch op's ``rng_state`` before its call.
    """

    def __init__(self, in_features: int, out_features: int, *, amax_history_len: int = 1024) -> None:
        check_features("BasicLinear", in_features=in_features, out_features=out_features)
        self.in_features = in_features
        self.out_features = out_features
        self.amax_history_len = amax_history_len

    def describe(self) -> OpDesc:
        return OpDesc("basic_linear", "BasicLinear")

    def init_params(self, key, dtype):
        bound = 1.0 / (self.in_features ** 0.5)
        return (jax.random.uniform(key, (self.out_features, self.in_features), dtype, -bound, bound),)

    def init_state(self, recipe=None):
        if recipe is not None and linear_quantizers(recipe).delayed:
            return delayed_scaling_state(self.amax_history_len)
        return None

    def op_call(self, recipe, state, rng, training):
        if recipe is None:
            return {"quantizers": None}, {}
        qs = linear_quantizers(recipe)
        check_rng(qs, rng is not None)
        arrays = {}
        if qs.delayed:
            check_delayed_state(None if state is None else state["fwd_amax_history"].shape[0], qs)
            arrays["state"] = state
        if qs.needs_rng:
            arrays["rng"] = jnp.asarray(rng)
        return {"quantizers": qs}, arrays

    def op_input_quantization(self, static, arrays):
        qs = static["quantizers"]
        if qs is None:
            return None
        return {"quantizer": qs.input, "scale": arrays["state"]["fwd_scale"][0:1] if qs.delayed else None}

    def op_grad_quantization(self, ctx: OpContext):
        qs = ctx.static["quantizers"]
        if qs is None or ctx.saved.get("empty"):
            return None
        s = ctx.saved
        return {"quantizer": qs.grad_output, "scale": s["state"]["bwd_scale"] if qs.delayed else None,
                "rng": s["rng"]}

    def op_forward_state(self, saved):
        return saved.get("state")

    def op_state_cotangent(self, ctx: OpContext):
        return getattr(ctx, "next_state", None)

    def op_forward_compute(self, x, params, *, quantizers=None, state=None, rng=None):
        (weight,) = params
        check_param_shape("BasicLinear", "weight", weight.shape, (self.out_features, self.in_features))
        quantized_input = isinstance(x, QuantizedTensor)
        lead = tuple(x.shape[:-1])
        if quantizers is not None and not quantized_input and x.size == 0:
            # Zero rows, as the torch op: empty output, zero weight gradient, state unchanged.
            return jnp.zeros((*lead, weight.shape[0]), x.dtype), {"x": x, "weight": weight, "state": state,
                                                                    "empty": True}
        if quantizers is None:
            check_input_kind("BasicLinear", quantized_input, False)
            y = gemm(_rows(x), weight, out_dtype=x.dtype).reshape(*lead, weight.shape[0])
            return y, {"x": x, "weight": weight}
        qs = quantizers
        x_dtype = jax_dtype(x.dtype) if quantized_input else x.dtype
        fwd_scale = state["fwd_scale"] if qs.delayed else None
        qx = x if quantized_input else quantize(_rows(x), qs.input, scale=None if fwd_scale is None else fwd_scale[0:1])
        qw = quantize(weight, qs.weight, scale=None if fwd_scale is None else fwd_scale[1:2])
        y = gemm(qx, qw, out_dtype=x_dtype).reshape(*lead, weight.shape[0])
        new_state = None
        if qs.delayed:
            history = record_amax(state["fwd_amax_history"], jnp.concatenate([qx.amax, qw.amax]))
            new_history, new_scale = update_delayed_scaling(history, fwd_scale, qs.fwd_fp8_dtype, margin=qs.margin,
                                                            amax_compute_algo=qs.amax_compute_algo)
            new_state = {**state, "fwd_amax_history": new_history, "fwd_scale": new_scale}
        saved = {"x_col": (qx.columnwise_data, qx.columnwise_scale_inv, qx.columnwise_amax),
                 "w_col": (qw.columnwise_data, qw.columnwise_scale_inv, qw.columnwise_amax),
                 "x_dtype": x_dtype, "w_dtype": weight.dtype, "in_features": weight.shape[1],
                 "state": new_state, "rng": rng}
        return y, saved

    def op_backward(self, ctx: OpContext, dy):
        qs = ctx.static["quantizers"]
        s = ctx.saved
        if qs is None or s.get("empty"):
            if qs is not None and qs.delayed:
                ctx.next_state = s["state"]  # nothing was quantized: the state carries over unchanged
            x, weight = s["x"], s["weight"]
            dy2 = _rows(dy)
            dx = gemm(dy2, weight, b_columnwise=True, out_dtype=x.dtype).reshape(x.shape)
            dw = gemm(dy2, _rows(x), a_columnwise=True, b_columnwise=True, out_dtype=weight.dtype)
            return dx, (dw,)
        lead = tuple(dy.shape[:-1])
        state = s["state"]
        if isinstance(dy, QuantizedTensor):
            qdy = dy
        else:
            qdy = quantize(_rows(dy), qs.grad_output, scale=state["bwd_scale"] if qs.delayed else None, rng=s["rng"])
        if qs.delayed:
            history = record_amax(state["bwd_amax_history"], qdy.amax)
            new_history, new_scale = update_delayed_scaling(history, state["bwd_scale"], qs.bwd_fp8_dtype,
                                                            margin=qs.margin, amax_compute_algo=qs.amax_compute_algo)
            ctx.next_state = {**state, "bwd_amax_history": new_history, "bwd_scale": new_scale}
        qw = gemm_operand(*s["w_col"][:2], qs.weight, True, s["w_col"][2])
        qx = gemm_operand(*s["x_col"][:2], qs.input, True, s["x_col"][2])
        dx = gemm(qdy, qw, b_columnwise=True, out_dtype=s["x_dtype"]).reshape(*lead, s["in_features"])
        dw = gemm(qdy, qx, a_columnwise=True, b_columnwise=True, out_dtype=s["w_dtype"])
        return dx, (dw,)


class Bias(BasicOperation):
    """y = fl(x + b) in x's dtype; db = Σc over rows of dy. Params: (bias (features,),)."""

    def __init__(self, features: int) -> None:
        check_features("Bias", features=features)
        self.features = features

    def describe(self) -> OpDesc:
        return OpDesc("bias", "Bias")

    def init_params(self, key, dtype):
        return (jnp.zeros((self.features,), dtype),)

    def op_forward_compute(self, x, params):
        (bias,) = params
        check_input_kind("Bias", isinstance(x, QuantizedTensor), False)
        return bias_add(x, bias), bias.dtype

    def op_backward(self, ctx, dy):
        return dy, (bias_grad(_rows(dy), ctx.saved),)


class Linear:
    """TE's ``ops.Linear``: BasicLinear then Bias (``bias=True``); a Sequential flattens it."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True, amax_history_len: int = 1024):
        ops: list[BasicOperation] = [BasicLinear(in_features, out_features, amax_history_len=amax_history_len)]
        if bias:
            ops.append(Bias(out_features))
        self.basic_ops = tuple(ops)
