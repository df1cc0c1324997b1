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

from ...distributed import check_sequence_shard, check_tensor_parallel
from ...fusion.ops import OpDesc, check_features, check_input_kind, check_param_shape
from ...linear import check_delayed_state, linear_quantizers
from ...ops.opdef import fail
from ...ops.gemm import gemm_operand
from ...quantized_tensor import QuantizedTensor
from .._library import torch_dtype
from .._ops.bias import bias_add, bias_grad
from .._ops.gemm import gemm
from .._ops.quantize import record_amax, update_delayed_scaling
from .._state import draw_rng, write_state
from ..autocast import current_amax_group
from ..distributed import (all_gather, all_gather_quantized, all_reduce, can_gather_quantized, group_name,
                           quantize_reduced, reduce_amax, reduce_scatter, reduces_amax)
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

    Shapes: weight (out_features, in_features) — this rank's shard under tensor parallelism;
        x (..., in_features) -> y (..., out_features).
    Dtypes: y in x's dtype; dx in x's dtype, dweight in the weight's dtype.
    State: DelayedScaling buffers ``fwd_amax_history`` (L, 2), ``fwd_scale`` (2,),
        ``bwd_amax_history`` (L, 1), ``bwd_scale`` (1,) and the ``rng_state`` [seed, offset] of
        stochastic rounding, exactly as ``tep.Linear`` keeps them (advanced once per forward).
    Tensor parallelism (TE's ``te.ops.BasicLinear`` arguments; NUMERICS.md §12):
        ``tensor_parallel_mode="column"`` / ``"row"`` over ``tensor_parallel_group``;
        ``in_features`` / ``out_features`` are the whole layer's, the weight is this rank's
        shard ((out/tp, in) column, (out, in/tp) row). Column: x whole; the input gradient is
        all-reduced (SUM); with ``sequence_parallel`` x is this rank's dim-0 shard, all-gathered
        — quantized (data + scales, ``all_gather_quantized``) where the format allows, else in
        high precision and quantized whole — and the input gradient reduce-scattered. Row: x is
        this rank's slice of the input features; fp32 partial outputs are all-reduced (SUM), or
        reduce-scattered along dim 0 with ``sequence_parallel`` (the output gradient is then
        all-gathered), then rounded to x's dtype. Every whole-tensor amax (current scaling,
        NVFP4's global amaxes, delayed-scaling histories) is all-reduced with MAX over the autocast's
        ``amax_reduction_group``, else over the tensor-parallel group, so each rank quantizes
        with the single-device scale: column-parallel and sequence-parallel outputs are exact
        slices of the single-device output, row-parallel outputs equal within the tolerance of
        the fp32 summation order. Norm / activation kernels before this op write its quantized
        input only when no amax needs reducing and the input is not gathered.
    Raises:
        TypeError / ValueError: recipe errors (core/linear.py), a QuantizedTensor input outside
            autocast, bad tensor-parallel arguments (core/distributed.py).
    """

    param_names = ("weight",)
    replay_snapshot = ("fwd_scale", "rng")

    def __init__(self, in_features: int, out_features: int, *, device: Any = None, dtype: torch.dtype = torch.float32,
                 amax_history_len: int = 1024, rng_seed: int = 0, own_params: bool = True,
                 tensor_parallel_mode: str | None = None, tensor_parallel_group=None,
                 sequence_parallel: bool = False) -> None:
        super().__init__()
        check_features("BasicLinear", in_features=in_features, out_features=out_features)
        tp_size = 1 if tensor_parallel_group is None else torch.distributed.get_world_size(tensor_parallel_group)
        check_tensor_parallel("BasicLinear", in_features, out_features, tp_size=tp_size,
                              parallel_mode=tensor_parallel_mode, sequence_parallel=sequence_parallel,
                              has_group=tensor_parallel_group is not None, group_size=tp_size)
        self.tensor_parallel_mode = tensor_parallel_mode
        self.sequence_parallel = bool(sequence_parallel)
        self.tp_size = tp_size
        self._tp_group = group_name(tensor_parallel_group) if tensor_parallel_mode is not None else None
        self.in_features = in_features // tp_size if tensor_parallel_mode == "row" else in_features
        self.out_features = out_features // tp_size if tensor_parallel_mode == "column" else out_features
        if own_params:
            self.weight = torch.nn.Parameter(torch.empty(self.out_features, self.in_features, dtype=dtype,
                                                         device=device))
            torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        for name, shape in (("fwd_amax_history", (amax_history_len, 2)), ("bwd_amax_history", (amax_history_len, 1))):
            self.register_buffer(name, torch.zeros(shape, dtype=torch.float32, device=device))
        self.register_buffer("fwd_scale", torch.ones(2, dtype=torch.float32, device=device))
        self.register_buffer("bwd_scale", torch.ones(1, dtype=torch.float32, device=device))
        self.register_buffer("rng_state", torch.tensor([rng_seed, 0], dtype=torch.int64, device=device))

    def describe(self) -> OpDesc:
        return OpDesc("basic_linear", "BasicLinear")

    def op_call(self, recipe):
        group = current_amax_group() or self._tp_group
        if recipe is None:
            return {"quantizers": None, "amax_group": group}, {}
        qs = linear_quantizers(recipe)
        tensors: dict[str, torch.Tensor] = {}
        if qs.delayed:
            check_delayed_state(self.fwd_amax_history.shape[0], qs)
            tensors.update(fwd_scale=self.fwd_scale, bwd_scale=self.bwd_scale, bwd_amax_history=self.bwd_amax_history)
        if qs.needs_rng:
            tensors["rng"] = draw_rng(self)
        return {"quantizers": qs, "amax_group": group}, tensors

    def _reduces(self, static, quantizer) -> bool:
        return static["amax_group"] is not None and reduces_amax(quantizer)

    def op_input_quantization(self, static, tensors):
        qs = static["quantizers"]
        if qs is None or self._reduces(static, qs.input) or self._gathers_input():
            return None
        return {"quantizer": qs.input, "scale": tensors["fwd_scale"][0:1] if qs.delayed else None}

    def op_grad_quantization(self, ctx: OpContext):
        s = ctx.saved
        if s["qs"] is None or self._reduces(s, s["qs"].grad_output) or self._gathers_grad():
            return None
        return {"quantizer": s["qs"].grad_output, "scale": s["bwd_scale"], "rng": s["rng"]}

    def _gathers_input(self) -> bool:
        return self.sequence_parallel and self.tensor_parallel_mode == "column"

    def _gathers_grad(self) -> bool:
        return self.sequence_parallel and self.tensor_parallel_mode == "row"

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

    def _gathered_input(self, x, qs, group, scale):
        """The whole (all-gathered) input of a sequence-parallel column-parallel op, quantized
        when ``qs`` is given: the shard's quantized copies gathered where the format allows,
        else the gathered high-precision rows quantized."""
        tp = self._tp_group
        if qs is None:
            return all_gather(x, tp, self.tp_size)
        x2 = _rows(x)
        if can_gather_quantized(qs.input, *x2.shape):
            return all_gather_quantized(quantize_reduced(x2, qs.input, group, scale=scale), tp, self.tp_size)
        return quantize_reduced(all_gather(x2, tp, self.tp_size), qs.input, group, scale=scale)

    def _reduced_output(self, y):
        """A row-parallel op's fp32 partial output summed over the group (dim-0 chunk with
        sequence parallelism)."""
        tp = self._tp_group
        if self.sequence_parallel:
            check_sequence_shard("BasicLinear", y.shape[0], self.tp_size)
            return reduce_scatter(y, tp, self.tp_size)
        return all_reduce(y, "sum", tp)

    def op_forward_compute(self, x, params, *, quantizers=None, amax_group=None, fwd_scale=None, bwd_scale=None,
                           bwd_amax_history=None, rng=None):
        (weight,) = params
        check_param_shape("BasicLinear", "weight", weight.shape, (self.out_features, self.in_features))
        mode = self.tensor_parallel_mode
        quantized_input = isinstance(x, QuantizedTensor)
        x_dtype = torch_dtype(x.dtype) if quantized_input else x.dtype
        out_dtype = torch.float32 if mode == "row" else x_dtype  # row: fp32 partials, summed, then rounded
        lead = tuple(x.shape[:-1])
        if self._gathers_input():
            check_input_kind("BasicLinear (sequence_parallel)", quantized_input, False)
            lead = (lead[0] * self.tp_size,) + lead[1:]
            x = self._gathered_input(x, quantizers, amax_group, fwd_scale[0:1] if fwd_scale is not None else None)
            quantized_input = isinstance(x, QuantizedTensor)
        if quantizers is not None and not quantized_input and x.numel() == 0:
            # Zero rows: nothing to quantize or multiply (NUMERICS §3: an all-zero amax leaves the
            # delayed-scaling state unchanged); empty output, zero weight gradient.
            y = torch.empty(*lead, weight.shape[0], dtype=x.dtype, device=x.device)
            amax = torch.zeros(2, dtype=torch.float32, device=x.device) if quantizers.delayed else None
            return y, {"qs": None, "x": x, "weight": weight, "amax": amax, "amax_group": amax_group}
        if quantizers is None:
            check_input_kind("BasicLinear", quantized_input, False)
            y = gemm(_rows(x), weight, out_dtype=out_dtype).reshape(*lead, weight.shape[0])
            saved = {"qs": None, "x": x, "weight": weight, "amax_group": amax_group}
        else:
            qs = quantizers
            qx = x if quantized_input else quantize_reduced(_rows(x), qs.input, amax_group,
                                                          scale=fwd_scale[0:1] if qs.delayed else None)
            qw = quantize_reduced(weight, qs.weight, amax_group, scale=fwd_scale[1:2] if qs.delayed else None)
            y = gemm(qx, qw, out_dtype=out_dtype).reshape(*lead, weight.shape[0])
            amax = reduce_amax(torch.cat([qx.amax, qw.amax]), amax_group) if qs.delayed else None
            saved = {"qs": qs, "x_col": (qx.columnwise_data, qx.columnwise_scale_inv, qx.columnwise_amax),
                     "w_col": (qw.columnwise_data, qw.columnwise_scale_inv, qw.columnwise_amax),
                     "x_dtype": x_dtype, "w_dtype": weight.dtype, "in_features": x.shape[-1],
                     "bwd_scale": bwd_scale, "bwd_amax_history": bwd_amax_history, "rng": rng, "amax": amax,
                     "amax_group": amax_group}
        if mode == "row":
            y = self._reduced_output(y).to(x_dtype)
        return y, saved

    def _input_grad(self, dx):
        """The gradient of this rank's input from its partial dgrad (column-parallel: summed over
        the group, reduce-scattered to the rank's rows with sequence parallelism)."""
        if self.tensor_parallel_mode != "column":
            return dx
        if self.sequence_parallel:
            return reduce_scatter(dx, self._tp_group, self.tp_size)
        return all_reduce(dx, "sum", self._tp_group)

    def op_backward(self, ctx: OpContext, dy):
        s = ctx.saved
        if self._gathers_grad():
            dy = all_gather(dy, self._tp_group, self.tp_size)
        if s["qs"] is None:
            x, weight = s["x"], s["weight"]
            dy2 = _rows(dy)
            dx = _grad_shaped(gemm(dy2, weight, b_columnwise=True, out_dtype=x.dtype), tuple(x.shape))
            dw = _grad_shaped(gemm(dy2, _rows(x), a_columnwise=True, b_columnwise=True, out_dtype=weight.dtype),
                              tuple(weight.shape))
            return self._input_grad(dx), (dw,)
        qs = s["qs"]
        group = s["amax_group"]
        lead = tuple(dy.shape[:-1])
        qdy = dy if isinstance(dy, QuantizedTensor) else quantize_reduced(_rows(dy), qs.grad_output, group,
                                                                        scale=s["bwd_scale"], rng=s["rng"])
        if qs.delayed:
            history, scale = update_delayed_scaling(record_amax(s["bwd_amax_history"], reduce_amax(qdy.amax, group)),
                                                    s["bwd_scale"], qs.bwd_fp8_dtype, margin=qs.margin,
                                                    amax_compute_algo=qs.amax_compute_algo)
            s["bwd_amax_history"].copy_(history)
            s["bwd_scale"].copy_(scale)
        qw = gemm_operand(*s["w_col"][:2], qs.weight, True, s["w_col"][2])
        qx = gemm_operand(*s["x_col"][:2], qs.input, True, s["x_col"][2])
        dx = _grad_shaped(gemm(qdy, qw, b_columnwise=True, out_dtype=s["x_dtype"]), (*lead, s["in_features"]))
        dw = _grad_shaped(gemm(qdy, qx, a_columnwise=True, b_columnwise=True, out_dtype=s["w_dtype"]),
                          (self.out_features, self.in_features))
        return self._input_grad(dx), (dw,)


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
