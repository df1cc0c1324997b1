"""Communication basic ops: AllGather, AllReduce, ReduceScatter (TE's ``te.ops`` names), usable
inside ``Sequential`` (eager and torch.compile(fullgraph=True): functional collectives).

Each works on dim 0 (the sequence dimension of sequence parallelism) over ``process_group``:
AllGather concatenates the ranks' inputs (backward: reduce-scatter of the sum), ReduceScatter
gives each rank its chunk of the sum (backward: all-gather), AllReduce sums (backward: the
identity, TE's convention for a row-parallel output). Sums are fp32 (or the input dtype's)
sums across ranks in the backend's order: equal to a single-device sum within the tolerance of
a different summation order (NUMERICS.md §12); gathers move bytes unchanged.
"""

from __future__ import annotations

import torch

from ...fusion.ops import OpDesc, check_input_kind
from ..distributed import all_gather, all_gather_along, all_reduce, group_name, reduce_scatter
from .op import BasicOperation


class _Collective:
    """The group and description shared by the three ops (a mixin: not itself a basic op)."""

    kind = ""
    label = ""

    def __init__(self, process_group) -> None:
        super().__init__()
        self.process_group = group_name(process_group)
        self.group_size = torch.distributed.get_world_size(process_group)

    def describe(self) -> OpDesc:
        return OpDesc(self.kind, self.label)

    def _check(self, x) -> None:
        check_input_kind(self.label, not isinstance(x, torch.Tensor), False)


class AllGather(_Collective, BasicOperation):
    """y = the ranks' inputs concatenated along dim 0 in rank order; dx = this rank's dim-0
    chunk of the sum of the ranks' dy."""

    kind, label = "all_gather", "AllGather"

    def op_forward_compute(self, x, params):
        self._check(x)
        return all_gather(x, self.process_group, self.group_size), None

    def op_backward(self, ctx, dy):
        return reduce_scatter(dy, self.process_group, self.group_size), ()


class AllReduce(_Collective, BasicOperation):
    """y = the sum of the ranks' inputs; dx = dy."""

    kind, label = "all_reduce", "AllReduce"

    def op_forward_compute(self, x, params):
        self._check(x)
        return all_reduce(x, "sum", self.process_group), None

    def op_backward(self, ctx, dy):
        return dy, ()


class ReduceScatter(_Collective, BasicOperation):
    """y = this rank's dim-0 chunk of the sum of the ranks' inputs; dx = the ranks' dy
    concatenated along dim 0."""

    kind, label = "reduce_scatter", "ReduceScatter"

    def op_forward_compute(self, x, params):
        self._check(x)
        return reduce_scatter(x, self.process_group, self.group_size), None

    def op_backward(self, ctx, dy):
        return all_gather(dy, self.process_group, self.group_size), ()


class ShardFeatures(_Collective, BasicOperation):
    """y = this rank's slice of the last dimension (the input features of a row-parallel
    BasicLinear after a norm over the whole features); dx = the ranks' dy concatenated along
    the last dimension (exact: every rank gets the whole gradient)."""

    kind, label = "shard_features", "ShardFeatures"

    def __init__(self, process_group) -> None:
        super().__init__(process_group)
        self.rank = torch.distributed.get_rank(process_group)

    def op_forward_compute(self, x, params):
        self._check(x)
        width = x.shape[-1] // self.group_size
        return x[..., self.rank * width:(self.rank + 1) * width], None

    def op_backward(self, ctx, dy):
        return all_gather_along(dy, -1, self.process_group, self.group_size), ()
