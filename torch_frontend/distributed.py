"""Collectives of the distributed layers (NUMERICS.md §12), compile-traceable.

Every collective is a ``torch.ops._c10d_functional`` op (the ops behind
``torch.distributed._functional_collectives``) on a group *name*, followed by its
``wait_tensor``: Dynamo traces them into the graph (no graph break under
``torch.compile(fullgraph=True)``), and eager code gets plain tensors back. Groups are runtime
context, never part of a quantizer spec: layers keep the group's name (a string constant).

Amax reduction: ``global_amax`` is the NaN-skipping amax of a local shard all-reduced with MAX
(``group_amax``: the amax a quantizer takes — that, or NVFP4's two global amaxes);
``quantize_with_amax`` quantizes a per-tensor current-scaling or NVFP4 tensor with that amax
(§2, §7 step 1), byte for byte what ``quantize`` gives for the concatenated tensor.
"""

from __future__ import annotations

import torch

from ..distributed import TRANSPOSED, gathered_shapes, quantized_gather_plan
from ..quantized_tensor import QuantizedTensor
from ..quantizers import Float8CurrentScalingQuantizer, Float8DelayedScalingQuantizer, NVFP4Quantizer, Quantizer
from ._ops.bias import bias_add, bias_grad
from ._ops.quantize import quantize

_FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
_FLT_MAX = torch.finfo(torch.float32).max


def group_name(group) -> str | None:
    """The name the functional collectives take for `group` (None stays None)."""
    return None if group is None else group.group_name


def _wait(t: torch.Tensor) -> torch.Tensor:
    return torch.ops._c10d_functional.wait_tensor(t)


def all_reduce(t: torch.Tensor, op: str, name: str) -> torch.Tensor:
    """``op`` ("sum" / "max") over the group; a new tensor."""
    return _wait(torch.ops._c10d_functional.all_reduce(t.contiguous(), op, name))


def all_gather(t: torch.Tensor, name: str, size: int) -> torch.Tensor:
    """Concatenation of every rank's `t` along dim 0, in rank order (`size`: the group's size)."""
    return _wait(torch.ops._c10d_functional.all_gather_into_tensor(t.contiguous(), size, name))


def reduce_scatter(t: torch.Tensor, name: str, size: int) -> torch.Tensor:
    """This rank's dim-0 chunk of the sum over the group (`size`: the group's size)."""
    return _wait(torch.ops._c10d_functional.reduce_scatter_tensor(t.contiguous(), "sum", size, name))


# ---- amax reduction ---------------------------------------------------------------------

def reduce_amax(amax: torch.Tensor, name: str | None) -> torch.Tensor:
    """MAX over the group (unchanged without one). Amaxes are non-negative or NaN-free by
    construction (NaN-skipping), so the float MAX is the §12 reduction."""
    return amax if name is None else all_reduce(amax, "max", name)


def global_amax(x: torch.Tensor, name: str) -> torch.Tensor:
    """max|x| over every rank's shard, NaN skipped (NUMERICS.md §1), float32 (1,)."""
    # |x|, NaN -> 0 (infinities kept) and the max in x's own dtype: each step is exact, so the
    # fp32 result is that of the fp32 computation, in three passes over x instead of five.
    a = torch.nan_to_num(x.detach().abs(), nan=0.0, posinf=float("inf")).amax().to(torch.float32).reshape(1)
    return reduce_amax(a, name)


def reduces_amax(quantizer: Quantizer) -> bool:
    """Whether `quantizer` forms its scale from a whole-tensor amax that a group must reduce
    before quantizing (current scaling, NVFP4's global amaxes; delayed scaling reduces its
    history instead)."""
    return isinstance(quantizer, (Float8CurrentScalingQuantizer, NVFP4Quantizer))


def group_amax(x: torch.Tensor, quantizer: Quantizer, name: str, rng: torch.Tensor | None = None) -> torch.Tensor:
    """The group-wide amax ``quantize_with_amax`` takes for `quantizer`: current scaling the
    (1,) ``global_amax``; NVFP4 the (2,) [rowwise, columnwise (after RHT)] global amaxes of x's
    copies — the shard's own, from one quantize of it, all-reduced with MAX."""
    if not isinstance(quantizer, NVFP4Quantizer):
        return global_amax(x, name)
    local = quantize(x.detach(), quantizer, rng=rng)
    zero = torch.zeros(1, dtype=torch.float32, device=x.device)
    amax = torch.cat([zero if local.amax is None else local.amax,
                      zero if local.columnwise_amax is None else local.columnwise_amax])
    return reduce_amax(amax, name)


def scale_from_amax(amax: torch.Tensor, quantizer: Float8CurrentScalingQuantizer) -> torch.Tensor:
    """NUMERICS.md §2 for a per-tensor quantizer: fp32 (1,) scale from amax (1,)."""
    a = torch.clamp_min(amax, float(quantizer.amax_epsilon)) if quantizer.amax_epsilon else amax
    a = torch.where(torch.isnan(amax), amax, a)
    s = torch.full_like(a, _FP8_MAX[quantizer.fp8_dtype]) / a
    s = torch.where(torch.isinf(s), torch.full_like(s, _FLT_MAX), s)
    if quantizer.force_pow_2_scales:
        s = (s.view(torch.int32) & ~0x7FFFFF).view(torch.float32)
    degenerate = (a == 0) | torch.isinf(a) | torch.isnan(a)
    return torch.where(degenerate, torch.ones_like(s), s)


def quantize_with_amax(x: torch.Tensor, quantizer: Float8CurrentScalingQuantizer | NVFP4Quantizer,
                       amax: torch.Tensor, rng: torch.Tensor | None = None) -> QuantizedTensor:
    """``quantize(x, quantizer)`` with the scales formed from the given (global) amax instead of
    x's own (``group_amax``'s shape): current scaling the cast ``RNE_sat(fl(x·s))`` and ``1/s``
    of the per-tensor kernel with that scale, carrying `quantizer` and the global amax; NVFP4
    the kernel's given-amax mode (``quantize(..., amax=)``, `rng` for stochastic rounding)."""
    if isinstance(quantizer, NVFP4Quantizer):
        return quantize(x, quantizer, rng=rng, amax=amax)
    given = Float8DelayedScalingQuantizer(fp8_dtype=quantizer.fp8_dtype, rowwise=quantizer.rowwise,
                                          columnwise=quantizer.columnwise)
    qt = quantize(x, given, scale=scale_from_amax(amax, quantizer))
    return QuantizedTensor(rowwise_data=qt.rowwise_data, rowwise_scale_inv=qt.rowwise_scale_inv,
                           columnwise_data=qt.columnwise_data, columnwise_scale_inv=qt.columnwise_scale_inv,
                           amax=amax, quantizer=quantizer, shape=qt.shape, dtype=qt.dtype)


def quantize_reduced(x: torch.Tensor, quantizer: Quantizer, name: str | None, **kwargs) -> QuantizedTensor:
    """``quantize`` whose whole-tensor amax is taken over the group `name` (plain quantize
    without a group or for quantizers that need no reduction)."""
    if name is None or not reduces_amax(quantizer):
        return quantize(x, quantizer, **kwargs)
    rng = kwargs.get("rng")
    return quantize_with_amax(x, quantizer, group_amax(x, quantizer, name, rng), rng)


# ---- quantized all-gather (sequence parallelism) -------------------------------------------

def all_gather_along(t: torch.Tensor, axis: int, name: str, size: int) -> torch.Tensor:
    """The ranks' `t` concatenated along `axis` in rank order (bytes moved as uint8 when 1 byte
    wide: gloo and NCCL gather no float8 dtypes)."""
    raw = t.view(torch.uint8) if t.element_size() == 1 else t
    moved = raw.movedim(axis, 0)
    gathered = all_gather(moved, name, size).movedim(0, axis)
    return gathered.view(t.dtype) if t.element_size() == 1 else gathered


def can_gather_quantized(quantizer: Quantizer, rows: int, cols: int) -> bool:
    """Whether a (rows, cols) shard's quantized copies concatenate into the whole tensor's (see
    ``all_gather_quantized``)."""
    return quantized_gather_plan(quantizer, rows, cols) is not None


def all_gather_quantized(qt: QuantizedTensor, name: str, size: int) -> QuantizedTensor:
    """TE's FP8 all-gather: each rank's quantized (rows, cols) shard — data and scales — gathered
    along the rows, giving byte for byte ``quantize`` of the gathered high-precision tensor
    (NUMERICS.md §12) when ``can_gather_quantized`` holds and per-tensor scales are shared
    (current scaling quantized with the group's amax, ``quantize_with_amax``; delayed scaling
    with the group's scale). Scale padding is stripped before and re-added (zeros) after; a
    per-tensor columnwise copy is the transpose of the gathered rowwise data (1 byte per
    element travels, core ``quantized_gather_plan``).
    The result's amax is the shard's (reduce it for delayed-scaling histories)."""
    rows, cols = qt.shape
    plan = quantized_gather_plan(qt.quantizer, rows, cols)
    whole = gathered_shapes(qt.quantizer, rows, cols, size, qt.dtype)
    fields = {}
    for field, axis, used in plan:
        t = getattr(qt, field)
        if axis == TRANSPOSED:
            rowwise = fields["rowwise_data"]
            t = rowwise.view(torch.uint8).t().contiguous().view(rowwise.dtype)
        elif axis is not None:
            t = all_gather_along(t.narrow(axis, 0, used), axis, name, size)
            pad = [p for g, w in zip(reversed(t.shape), reversed(whole[field])) for p in (0, w - g)]
            if any(pad):
                raw = t.view(torch.uint8) if t.element_size() == 1 else t
                t = torch.nn.functional.pad(raw, pad).view(t.dtype)
        fields[field] = t
    return QuantizedTensor(**fields, amax=qt.amax, quantizer=qt.quantizer, shape=(size * rows, cols), dtype=qt.dtype)


# ---- differentiable collectives of the tensor-parallel layers ------------------------------

class _CopyToGroup(torch.autograd.Function):
    """Forward identity; backward all-reduce SUM (the input of a column-parallel layer)."""

    @staticmethod
    def forward(ctx, x, name):
        ctx.name = name
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        return all_reduce(dy, "sum", ctx.name), None


class _ReduceFromGroup(torch.autograd.Function):
    """Forward all-reduce SUM; backward identity (the output of a row-parallel layer)."""

    @staticmethod
    def forward(ctx, x, name):
        return all_reduce(x, "sum", name)

    @staticmethod
    def backward(ctx, dy):
        return dy, None


class _GatherFromSequence(torch.autograd.Function):
    """Forward all-gather along dim 0; backward reduce-scatter SUM."""

    @staticmethod
    def forward(ctx, x, name, size):
        ctx.group = (name, size)
        return all_gather(x, name, size)

    @staticmethod
    def backward(ctx, dy):
        return reduce_scatter(dy, *ctx.group), None, None


class _ScatterToSequence(torch.autograd.Function):
    """Forward reduce-scatter SUM along dim 0; backward all-gather."""

    @staticmethod
    def forward(ctx, x, name, size):
        ctx.group = (name, size)
        return reduce_scatter(x, name, size)

    @staticmethod
    def backward(ctx, dy):
        return all_gather(dy, *ctx.group), None, None


def copy_to_group(x: torch.Tensor, name: str) -> torch.Tensor:
    return _CopyToGroup.apply(x, name)


def reduce_from_group(x: torch.Tensor, name: str) -> torch.Tensor:
    return _ReduceFromGroup.apply(x, name)


def gather_from_sequence(x: torch.Tensor, name: str, size: int) -> torch.Tensor:
    return _GatherFromSequence.apply(x, name, size)


def scatter_to_sequence(x: torch.Tensor, name: str, size: int) -> torch.Tensor:
    return _ScatterToSequence.apply(x, name, size)


class _BiasAfterReduction(torch.autograd.Function):
    """fl(y + bias) after a row-parallel reduction (the bias family's kernels: the bytes and
    bias gradient Σc of ``linear``'s own bias, NUMERICS.md §11)."""

    @staticmethod
    def forward(ctx, y, bias):
        ctx.bias_dtype = bias.dtype
        return bias_add(y, bias)

    @staticmethod
    def backward(ctx, dy):
        return dy, bias_grad(dy.reshape(-1, dy.shape[-1]), ctx.bias_dtype)


def add_bias(y: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Differentiable ``bias_add`` of a reduced row-parallel output."""
    return _BiasAfterReduction.apply(y, bias)
