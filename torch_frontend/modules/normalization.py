"""Modules LayerNorm, RMSNorm, LayerNormLinear and LayerNormMLP, built on the fusible basic ops
(one implementation: each module holds TE-named parameters and runs a basic-op list through
``twinengine.pytorch.ops.run_ops``)."""

from __future__ import annotations

import math
from typing import Any

import torch

from ...distributed import check_tensor_parallel
from ...fusion.blocks import block_layout, mlp_widths, normalization_kind
from ...fusion.ops import normalized_features
from ..ops import BasicLinear, Bias, LayerNorm as _LayerNormOp, MakeExtraOutput, RMSNorm as _RMSNormOp, run_ops
from ..ops.activation import activation_op
from ..ops.distributed import ShardFeatures
from ..te_migration import load_te_checkpoint_hook


def _norm_op(normalization: str, hidden: int, eps: float, zero_centered_gamma: bool):
    cls = _LayerNormOp if normalization_kind(normalization) == "layernorm" else _RMSNormOp
    return cls(hidden, eps, zero_centered_gamma=zero_centered_gamma, own_params=False)


def _norm_params(module: torch.nn.Module, normalization: str, hidden: int, zero_centered_gamma: bool,
                 dtype: torch.dtype, device: Any, prefix: str) -> None:
    init = torch.zeros if zero_centered_gamma else torch.ones
    module.register_parameter(f"{prefix}weight", torch.nn.Parameter(init(hidden, dtype=dtype, device=device)))
    if normalization_kind(normalization) == "layernorm":
        module.register_parameter(f"{prefix}bias", torch.nn.Parameter(torch.zeros(hidden, dtype=dtype, device=device)))


def _linear_weight(out_features: int, in_features: int, dtype: torch.dtype, device: Any) -> torch.nn.Parameter:
    weight = torch.nn.Parameter(torch.empty(out_features, in_features, dtype=dtype, device=device))
    torch.nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    return weight


class LayerNorm(torch.nn.Module):
    """TE's ``te.LayerNorm(normalized_shape, eps)``: parameters ``weight``, ``bias`` (normalized_shape,);
    NUMERICS.md §11."""

    def __init__(self, normalized_shape: Any, eps: float = 1e-5, *, zero_centered_gamma: bool = False,
                 params_dtype: torch.dtype = torch.float32, device: Any = None) -> None:
        super().__init__()
        hidden_size = normalized_features("LayerNorm", normalized_shape)
        self._op = _norm_op("LayerNorm", hidden_size, eps, zero_centered_gamma)
        _norm_params(self, "LayerNorm", hidden_size, zero_centered_gamma, params_dtype, device, "")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return run_ops([self._op], [(self.weight, self.bias)], x)


class RMSNorm(torch.nn.Module):
    """TE's ``te.RMSNorm(normalized_shape, eps)``: parameter ``weight`` (normalized_shape,); NUMERICS.md §11."""

    def __init__(self, normalized_shape: Any, eps: float = 1e-5, *, zero_centered_gamma: bool = False,
                 params_dtype: torch.dtype = torch.float32, device: Any = None) -> None:
        super().__init__()
        hidden_size = normalized_features("RMSNorm", normalized_shape)
        self._op = _norm_op("RMSNorm", hidden_size, eps, zero_centered_gamma)
        _norm_params(self, "RMSNorm", hidden_size, zero_centered_gamma, params_dtype, device, "")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return run_ops([self._op], [(self.weight,)], x)


def _block_ops(layout, normalization: str, eps: float, zero_centered_gamma: bool, widths: list[tuple[int, int]],
               activation: str | None, activation_params: dict | None, device: Any, amax_history_len: int,
               rng_seed: int, parallel: list[tuple[str | None, Any, bool]]) -> list:
    """The basic ops of a block layout (core/fusion/blocks.py, plus ``shard_features`` slots);
    widths: the whole (in, out) per linear; parallel: (mode, tp_group, sequence_parallel) per linear."""
    ops, linear_index = [], 0
    for slot, _ in layout:
        if slot == "norm":
            ops.append(_norm_op(normalization, widths[0][0], eps, zero_centered_gamma))
        elif slot == "extra_output":
            ops.append(MakeExtraOutput())
        elif slot == "shard_features":
            ops.append(ShardFeatures(parallel[linear_index][1]))
        elif slot == "linear":
            fan_in, fan_out = widths[linear_index]
            mode, group, sp = parallel[linear_index]
            ops.append(BasicLinear(fan_in, fan_out, device=device, amax_history_len=amax_history_len,
                                   rng_seed=rng_seed + linear_index, own_params=False, tensor_parallel_mode=mode,
                                   tensor_parallel_group=group, sequence_parallel=sp))
            linear_index += 1
        elif slot == "bias":
            ops.append(Bias(ops[-1].out_features, own_params=False))
        else:
            ops.append(activation_op(activation, **(activation_params or {})))
    return ops


def _tp_group_size(tp_group) -> int | None:
    return None if tp_group is None else torch.distributed.get_world_size(tp_group)


def _local(features: int, tp_size: int, sharded: bool) -> int:
    return features // tp_size if sharded else features


class _NormBlock(torch.nn.Module):
    """Shared forward of LayerNormLinear / LayerNormMLP: run the layout's ops with the module's
    TE-named parameters."""

    def forward(self, x: torch.Tensor) -> Any:
        params = [tuple(getattr(self, name) for name in names) for _, names in self._layout]
        return run_ops(list(self.basic_ops), params, x)


class LayerNormLinear(_NormBlock):
    """TE's ``te.LayerNormLinear``: norm, then y = x̂ · wᵀ + b, quantized by the ``tep.autocast``
    recipe with the norm kernel writing the Linear's quantized input.

    Parameters (TE names): ``layer_norm_weight``, ``layer_norm_bias`` (LayerNorm only),
        ``weight`` (out_features, in_features), ``bias`` (out_features,) when ``bias``.
    Returns: y, or (y, normalized input) with ``return_layernorm_output``.
    Checkpoints: a TE LayerNormLinear state dict loads as is (``_extra_state`` rule in
        ``twinengine.pytorch.te_migration``).
    State: the Linear's delayed-scaling buffers and ``rng_state`` (seed ``rng_seed``) live in its
        BasicLinear op inside ``basic_ops``.
    Tensor parallelism (TE's ``tp_group``, ``tp_size``, ``parallel_mode``, ``sequence_parallel``;
        NUMERICS.md §12; the BasicLinear doc says what each mode communicates): "column" —
        weight (out/tp, in), bias (out/tp,), y this rank's output features; with
        ``sequence_parallel`` x and the norm run on this rank's dim-0 (sequence) shard and the
        normalized input is all-gathered (quantized where the format allows). "row" — the norm
        runs on the whole x (..., in_features), each rank multiplies its slice of the normalized
        features by its weight (out, in/tp) (the slice's gradient is all-gathered, so norm
        gradients are whole), partial outputs are summed (reduce-scattered along dim 0 with
        ``sequence_parallel``), then the whole bias (out,) is added. Column-parallel outputs,
        weight and norm gradients are exact (the column input gradient is a sum over ranks);
        row-parallel outputs are within the fp32 summation-order tolerance.
    Raises:
        ValueError: normalization not "LayerNorm"/"RMSNorm", bad sizes, eps < 0, bad
            tensor-parallel arguments (a feature count tp_size does not divide, tp_size not the
            tp_group's size, parallel_mode or sequence_parallel without a tp_group).
    """

    def __init__(self, in_features: int, out_features: int, eps: float = 1e-5, *, bias: bool = True,
                 normalization: str = "LayerNorm", return_layernorm_output: bool = False,
                 zero_centered_gamma: bool = False, params_dtype: torch.dtype = torch.float32, device: Any = None,
                 amax_history_len: int = 1024, rng_seed: int = 0, tp_group=None, tp_size: int = 1,
                 parallel_mode: str | None = None, sequence_parallel: bool = False) -> None:
        super().__init__()
        check_tensor_parallel("LayerNormLinear", in_features, out_features, tp_size=tp_size,
                              parallel_mode=parallel_mode, sequence_parallel=sequence_parallel,
                              has_group=tp_group is not None, group_size=_tp_group_size(tp_group))
        layout = block_layout(normalization, (("", bias),), None, return_layernorm_output)
        if parallel_mode == "row":
            at = [slot for slot, _ in layout].index("linear")
            layout = layout[:at] + (("shard_features", ()),) + layout[at:]
        self._layout = layout
        self.parallel_mode = parallel_mode
        self.sequence_parallel = sequence_parallel
        self.tp_size = tp_size
        _norm_params(self, normalization, in_features, zero_centered_gamma, params_dtype, device, "layer_norm_")
        self.weight = _linear_weight(_local(out_features, tp_size, parallel_mode == "column"),
                                     _local(in_features, tp_size, parallel_mode == "row"), params_dtype, device)
        if bias:
            self.bias = torch.nn.Parameter(torch.zeros(_local(out_features, tp_size, parallel_mode == "column"),
                                                       dtype=params_dtype, device=device))
        else:
            self.register_parameter("bias", None)
        group = tp_group if parallel_mode is not None else None
        self.basic_ops = torch.nn.ModuleList(_block_ops(self._layout, normalization, eps, zero_centered_gamma,
                                                        [(in_features, out_features)], None, None, device,
                                                        amax_history_len, rng_seed,
                                                        [(parallel_mode, group, sequence_parallel)]))
        self.register_load_state_dict_pre_hook(load_te_checkpoint_hook)  # TE checkpoints (te_migration.py)


class LayerNormMLP(_NormBlock):
    """TE's ``te.LayerNormMLP``: norm → FC1 (+bias) → activation → FC2 (+bias).

    Gated activations (geglu, qgeglu, reglu, sreglu, swiglu, clamped_swiglu) double FC1's width.
    Parameters (TE names): ``layer_norm_weight``, ``layer_norm_bias`` (LayerNorm only),
        ``fc1_weight`` (fc1 width, hidden_size), ``fc1_bias``, ``fc2_weight`` (hidden_size,
        ffn_hidden_size), ``fc2_bias``.
    Returns: y, or (y, normalized input) with ``return_layernorm_output``.
    Checkpoints: a TE LayerNormMLP state dict loads as is (``_extra_state`` rule in
        ``twinengine.pytorch.te_migration``; FC1 is TE's GEMM 0, FC2 its GEMM 1).
    State: FC1's and FC2's delayed-scaling buffers and ``rng_state`` in their BasicLinear ops,
        seeded ``rng_seed`` and ``rng_seed + 1``.
    Tensor parallelism (TE's ``tp_group``, ``tp_size``, ``sequence_parallel``; NUMERICS.md §12):
        with a tp_group FC1 is column-parallel and FC2 row-parallel over ``ffn_hidden_size``:
        ``fc1_weight`` (fc1 width/tp, hidden), ``fc1_bias`` (fc1 width/tp,), ``fc2_weight``
        (hidden, ffn/tp), ``fc2_bias`` (hidden,) whole. A gated activation's shard holds its
        [gate | linear] rows (rows i·F/tp.. of both halves: ``twinengine.jax.parallel.gated_fc1_for_tp``
        orders the whole weight so). ``sequence_parallel``: x is this rank's dim-0 shard, the
        normalized input all-gathered (quantized where the format allows), the output
        reduce-scattered. Outputs equal the single-device ones within the fp32 summation-order
        tolerance of FC2's reduction; FC1's quantized operands have the single-device bytes.
    Raises:
        ValueError: unknown normalization or activation, bad sizes, eps < 0, bad tensor-parallel
            arguments (ffn_hidden_size not divisible by tp_size, tp_size not the tp_group's size,
            sequence_parallel without a tp_group).
    """

    def __init__(self, hidden_size: int, ffn_hidden_size: int, eps: float = 1e-5, *, bias: bool = True,
                 normalization: str = "LayerNorm", activation: str = "gelu", return_layernorm_output: bool = False,
                 zero_centered_gamma: bool = False, activation_params: dict | None = None,
                 params_dtype: torch.dtype = torch.float32, device: Any = None, amax_history_len: int = 1024,
                 rng_seed: int = 0, tp_group=None, tp_size: int = 1, sequence_parallel: bool = False) -> None:
        super().__init__()
        fc1_width = mlp_widths(activation, ffn_hidden_size)
        check_tensor_parallel("LayerNormMLP", hidden_size, ffn_hidden_size, tp_size=tp_size,
                              parallel_mode=None if tp_group is None else "column",
                              sequence_parallel=sequence_parallel, has_group=tp_group is not None,
                              group_size=_tp_group_size(tp_group), out_name="ffn_hidden_size")
        self._layout = block_layout(normalization, (("fc1_", bias), ("fc2_", bias)), activation,
                                    return_layernorm_output)
        sharded = tp_group is not None
        self.sequence_parallel = sequence_parallel
        self.tp_size = tp_size
        _norm_params(self, normalization, hidden_size, zero_centered_gamma, params_dtype, device, "layer_norm_")
        self.fc1_weight = _linear_weight(_local(fc1_width, tp_size, sharded), hidden_size, params_dtype, device)
        self.fc2_weight = _linear_weight(hidden_size, _local(ffn_hidden_size, tp_size, sharded), params_dtype, device)
        if bias:
            self.fc1_bias = torch.nn.Parameter(torch.zeros(_local(fc1_width, tp_size, sharded), dtype=params_dtype,
                                                           device=device))
            self.fc2_bias = torch.nn.Parameter(torch.zeros(hidden_size, dtype=params_dtype, device=device))
        parallel = [("column", tp_group, sequence_parallel), ("row", tp_group, sequence_parallel)] if sharded \
            else [(None, None, False)] * 2
        self.basic_ops = torch.nn.ModuleList(_block_ops(self._layout, normalization, eps, zero_centered_gamma,
                                                        [(hidden_size, fc1_width), (ffn_hidden_size, hidden_size)],
                                                        activation, activation_params, device, amax_history_len,
                                                        rng_seed, parallel))
        self.register_load_state_dict_pre_hook(load_te_checkpoint_hook)  # TE checkpoints (te_migration.py)
