"""Basic ops BasicLinear and Bias, and ops.Linear (BasicLinear + Bias), TE's names.

BasicLinear computes y = x · wᵀ with no bias: high precision outside autocast; inside, x and w
are quantized with the recipe's input / weight quantizers (or x arrives already quantized from
a fused norm / activation / Quantize op) and dy with its grad_output quantizer (NUMERICS.md §8,
§9). The GEMM output is rounded to x's dtype; Bias then adds fl(y + b) (§11 "Fusion never
changes bytes"), and its gradient is the canonical column sum Σc of dy.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ...fusion.ops import OpDesc, check_features, check_input_kind, check_param_shape
from ...linear import check_delayed_state, linear_quantizers
from ...ops.opdef import fail
from ...ops.gemm import gemm_operand
from ...quantized_tensor import QuantizedTensor
from .._library import torch_dtype
from .._ops.bias import bias_add, bias_grad
from .._ops.gemm import gemm
from .._ops.quantize import quantize, record_amax, update_delayed_scaling
from .._state import draw_rng, write_state
from ..autocast import current_amax_group
from ..distributed import reduces_amax
from .op import BasicOperation, OpContext


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])


def _grad_shaped(grad: torch.Tensor, shape: tuple) -> torch.Tensor:
    """`grad` (rows, width) reshaped to `shape`. The widths disagree only while torch.compile
    traces a call whose forward failed (an input of the wrong width: its compiled forward raises
    our error first, so this backward never runs); the gradient is then a zero stand-in of the
    right shape, so AOT autograd can finish tracing and the user sees our error."""
    if not torch.compiler.is_compiling() or grad.shape[-1] == shape[-1]:
        return grad.reshape(shape)
    return grad.new_zeros(shape) + grad.sum() * 0


class BasicLinear(BasicOperation):
    """y = x · wᵀ (no bias), quantized by the innermost ``tep.autocast`` recipe.

    Shapes: weight (out_features, in_features); x (..., in_features) -> y (..., out_features).
    Dtypes: y in x's dtype; dx in x's dtype, dweight in the weight's dtype.
    State: DelayedScaling buffers ``fwd_amax_history`` (L, 2), ``fwd_scale`` (2,),
        ``bwd_amax_history`` (L, 1), ``bwd_scale`` (1,) and the ``rng_state`` [seed, offset] of
        stochastic rounding, exactly as ``tep.Linear`` keeps them (advanced once per forward).
    Raises:
        TypeError / ValueError: recipe errors (core/linear.py), a QuantizedTensor input outside
            autocast.
    """

    param_names = ("weight",)
    replay_snapshot = ("fwd_scale", "rng")

    def __init__(self, in_features: int, out_features: int, *, device: Any = None, dtype: torch.dtype = torch.float32,
                 amax_history_len: int = 1024, rng_seed: int = 0, own_params: bool = True) -> None:
        super().__init__()
        check_features("BasicLinear", in_features=in_features, out_features=out_features)
        self.in_features = in_features
        self.out_features = out_features
        if own_params:
            self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, dtype=dtype, device=device))
            torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        for name, shape in (("fwd_amax_history", (amax_history_len, 2)), ("bwd_amax_history", (amax_history_len, 1))):
            self.register_buffer(name, torch.zeros(shape, dtype=torch.float32, device=device))
        self.register_buffer("fwd_scale", torch.ones(2, dtype=torch.float32, device=device))
        self.register_buffer("bwd_scale", torch.ones(1, dtype=torch.float32, device=device))
        self.register_buffer("rng_state", torch.tensor([rng_seed, 0], dtype=torch.int64, device=device))

    def describe(self) -> OpDesc:
        return OpDesc("basic_linear", "BasicLinear")

    def op_call(self, recipe):
        if recipe is None:
            return {"quantizers": None}, {}
        qs = linear_quantizers(recipe)
        per_tensor = qs.delayed or reduces_amax(qs.input) or qs.input.scaling_mode == "nvfp4"
        if per_tensor and current_amax_group() is not None:
            fail("BasicLinear", TypeError, "autocast(amax_reduction_group=...) is not supported by the fusible ops "
                 "(Sequential, LayerNormLinear, LayerNormMLP) with per-tensor or NVFP4 recipes yet: their "
                 "whole-tensor amaxes would stay local; use twinengine.pytorch.Linear")
        tensors: dict[str, torch.Tensor] = {}
        if qs.delayed:
            check_delayed_state(self.fwd_amax_history.shape[0], qs)
            tensors.update(fwd_scale=self.fwd_scale, bwd_scale=self.bwd_scale, bwd_amax_history=self.bwd_amax_history)
        if qs.needs_rng:
            tensors["rng"] = draw_rng(self)
        return {"quantizers": qs}, tensors

    def op_input_quantization(self, static, tensors):
        qs = static["quantizers"]
        if qs is None:
            return None
        return {"quantizer": qs.input, "scale": tensors["fwd_scale"][0:1] if qs.delayed else None}

    def op_grad_quantization(self, ctx: OpContext):
        s = ctx.saved
        if s["qs"] is None:
            return None
        return {"quantizer": s["qs"].grad_output, "scale": s["bwd_scale"], "rng": s["rng"]}

    def op_state_count(self, static) -> int:
        qs = static["quantizers"]
        return 1 if qs is not None and qs.delayed else 0

    def op_forward_state(self, saved):
        return (saved["amax"],) if saved.get("amax") is not None else ()

    def op_update_state(self, static, values):
        qs = static["quantizers"]
        (amax,) = values
        history, scale = update_delayed_scaling(record_amax(self.fwd_amax_history, amax), self.fwd_scale,
                                                qs.fwd_fp8_dtype, margin=qs.margin,
                                                amax_compute_algo=qs.amax_compute_algo)
        write_state(self, "fwd_amax_history", history)
        write_state(self, "fwd_scale", scale)

    def op_forward_compute(self, x, params, *, quantizers=None, fwd_scale=None, bwd_scale=None,
                           bwd_amax_history=None, rng=None):
        (weight,) = params
        check_param_shape("BasicLinear", "weight", weight.shape, (self.out_features, self.in_features))
        quantized_input = isinstance(x, QuantizedTensor)
        lead = tuple(x.shape[:-1])
        if quantizers is not None and not quantized_input and x.numel() == 0:
            # Zero rows: nothing to quantize or multiply (NUMERICS §3: an all-zero amax leaves the
            # delayed-scaling state unchanged); empty output, zero weight gradient.
            y = torch.empty(*lead, weight.shape[0], dtype=x.dtype, device=x.device)
            amax = torch.zeros(2, dtype=torch.float32, device=x.device) if quantizers.delayed else None
            return y, {"qs": None, "x": x, "weight": weight, "amax": amax}
        if quantizers is None:
            check_input_kind("BasicLinear", quantized_input, False)
            y = gemm(_rows(x), weight, out_dtype=x.dtype).reshape(*lead, weight.shape[0])
            return y, {"qs": None, "x": x, "weight": weight}
        qs = quantizers
        x_dtype = torch_dtype(x.dtype) if quantized_input else x.dtype
        qx = x if quantized_input else quantize(_rows(x), qs.input, scale=fwd_scale[0:1] if qs.delayed else None)
        qw = quantize(weight, qs.weight, scale=fwd_scale[1:2] if qs.delayed else None)
        y = gemm(qx, qw, out_dtype=x_dtype).reshape(*lead, weight.shape[0])
        amax = torch.cat([qx.amax, qw.amax]) if qs.delayed else None
        saved = {"qs": qs, "x_col": (qx.columnwise_data, qx.columnwise_scale_inv, qx.columnwise_amax),
                 "w_col": (qw.columnwise_data, qw.columnwise_scale_inv, qw.columnwise_amax),
                 "x_dtype": x_dtype, "w_dtype": weight.dtype, "in_features": x.shape[-1],
                 "bwd_scale": bwd_scale, "bwd_amax_history": bwd_amax_history, "rng": rng, "amax": amax}
        return y, saved

    def op_backward(self, ctx: OpContext, dy):
        s = ctx.saved
        if s["qs"] is None:
            x, weight = s["x"], s["weight"]
            dy2 = _rows(dy)
            dx = _grad_shaped(gemm(dy2, weight, b_columnwise=True, out_dtype=x.dtype), tuple(x.shape))
            dw = _grad_shaped(gemm(dy2, _rows(x), a_columnwise=True, b_columnwise=True, out_dtype=weight.dtype),
                              tuple(weight.shape))
            return dx, (dw,)
        qs = s["qs"]
        lead = tuple(dy.shape[:-1])
        qdy = dy if isinstance(dy, QuantizedTensor) else quantize(_rows(dy), qs.grad_output, scale=s["bwd_scale"],
                                                                   rng=s["rng"])
        if qs.delayed:
            history, scale = update_delayed_scaling(record_amax(s["bwd_amax_history"], qdy.amax), s["bwd_scale"],
                                                    qs.bwd_fp8_dtype, margin=qs.margin,
                                                    amax_compute_algo=qs.amax_compute_algo)
            s["bwd_amax_history"].copy_(history)
            s["bwd_scale"].copy_(scale)
        qw = gemm_operand(*s["w_col"][:2], qs.weight, True, s["w_col"][2])
        qx = gemm_operand(*s["x_col"][:2], qs.input, True, s["x_col"][2])
        dx = _grad_shaped(gemm(qdy, qw, b_columnwise=True, out_dtype=s["x_dtype"]), (*lead, s["in_features"]))
        dw = _grad_shaped(gemm(qdy, qx, a_columnwise=True, b_columnwise=True, out_dtype=s["w_dtype"]),
                          (self.out_features, self.in_features))
        return dx, (dw,)


class Bias(BasicOperation):
    """y = fl(x + b) rounded to x's dtype; db = Σc over rows of dy (NUMERICS.md §11).

    Shapes: bias (features,); x (..., features).
    """

    param_names = ("bias",)

    def __init__(self, features: int, *, device: Any = None, dtype: torch.dtype = torch.float32,
                 own_params: bool = True) -> None:
        super().__init__()
        check_features("Bias", features=features)
        self.features = features
        if own_params:
            self.bias = torch.nn.Parameter(torch.zeros(features, dtype=dtype, device=device))

    def describe(self) -> OpDesc:
        return OpDesc("bias", "Bias")

    def op_forward_compute(self, x, params):
        (bias,) = params
        check_input_kind("Bias", isinstance(x, QuantizedTensor), False)
        return bias_add(x, bias), bias.dtype

    def op_backward(self, ctx, dy):
        return dy, (bias_grad(_rows(dy), ctx.saved),)


class Linear(torch.nn.Module):
    """TE's ``ops.Linear``: BasicLinear followed by Bias (when ``bias=True``); a Sequential
    flattens it into those two basic ops. Alone it runs as a two-op Sequential."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True, device: Any = None,
                 dtype: torch.dtype = torch.float32, amax_history_len: int = 1024, rng_seed: int = 0) -> None:
        super().__init__()
        ops = [BasicLinear(in_features, out_features, device=device, dtype=dtype, amax_history_len=amax_history_len,
                           rng_seed=rng_seed)]
        if bias:
            bound = 1 / math.sqrt(in_features)
            b = Bias(out_features, device=device, dtype=dtype)
            torch.nn.init.uniform_(b.bias, -bound, bound)
            ops.append(b)
        self.basic_ops = torch.nn.ModuleList(ops)

    @property
    def weight(self) -> torch.nn.Parameter:
        return self.basic_ops[0].weight

    @property
    def bias(self) -> torch.nn.Parameter | None:
        return self.basic_ops[1].bias if len(self.basic_ops) > 1 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from .sequential import run_ops

        ops = list(self.basic_ops)
        return run_ops(ops, [op.op_params() for op in ops], x)
