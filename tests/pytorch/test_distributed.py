"""Tensor / sequence parallel Linear and amax reduction over torch.distributed (gloo, CPU),
NUMERICS.md §12: spawned groups of 2 and 4 processes on 127.0.0.1 run every case inside the
workers (one spawn per world size) and report each case's failure text back.

Forward bytes and gradients are compared with the single-process layer on the whole tensors:
column-parallel and sequence-parallel outputs, weight / bias gradients and row-parallel input
gradients bit for bit (exact slices); reductions of partial GEMM outputs (row-parallel
outputs, column-parallel input gradients) within the tolerance of a different fp32 summation
order.
"""

import pytest

from distributed_cases import case_names, results


@pytest.mark.parametrize("world,case", [(w, c) for w in (2, 4) for c in case_names(w)])
def test_distributed(world, case):
    failures = [f"rank {r}:\n{res[case]}" for r, res in enumerate(results(world)) if res[case] is not None]
    assert not failures, "\n".join(failures)
