"""Routing cases shared by the permute tests: NumPy inputs plus the reference's expected outputs
(tests/reference/permute.py, which never sees twinengine)."""

from __future__ import annotations

import dataclasses

import numpy as np
from helpers import NUMPY_DTYPES
from reference import permute as ref


@dataclasses.dataclass
class RoutingCase:
    """One routing problem: T tokens of hidden size H routed to topK of E experts."""

    x: np.ndarray            # (T, H)
    ids: np.ndarray          # int32 (T, topK) expert ids
    mask: np.ndarray         # bool (T, E)
    probs: np.ndarray        # (T, E) for the mask map, (T, topK) for the index map
    map_type: str
    num_out_tokens: int      # as passed to moe_permute (<= 0: all routed)

    @property
    def routing_map(self) -> np.ndarray:
        return self.ids if self.map_type == "index" else self.mask

    @property
    def resolved_num_out(self) -> int:
        if self.num_out_tokens > 0:
            return self.num_out_tokens
        return self.ids.size if self.map_type == "index" else int(self.mask.sum())

    @property
    def num_slots(self) -> int:
        return self.ids.shape[1] if self.map_type == "index" else self.mask.shape[1]

    def expected_row_id_map(self) -> np.ndarray:
        if self.map_type == "index":
            return ref.row_id_map_index_ref(self.ids, self.resolved_num_out)
        return ref.row_id_map_mask_ref(self.mask, self.resolved_num_out)


def random_array(shape, dtype: str, seed: int) -> np.ndarray:
    """Standard-normal values of `dtype` (gradients, unpermute inputs)."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(np.float32).astype(NUMPY_DTYPES[dtype])


def make_case(seed: int, T: int, E: int, topK: int, H: int, dtype: str, map_type: str, drop: bool = False,
              probs_dtype: str = "float32", skew: bool = False) -> RoutingCase:
    """Random distinct experts per token (``skew`` routes mostly to low experts, leaving high
    experts empty); ``drop`` sets num_out_tokens to ~2/3 of the routed pairs."""
    rng = np.random.default_rng(seed)
    weights = np.exp(-np.arange(E) / 2.0) if skew else np.ones(E)
    ids = np.stack([rng.choice(E, size=topK, replace=False, p=weights / weights.sum()) for _ in range(T)])
    ids = ids.astype(np.int32)
    mask = np.zeros((T, E), dtype=bool)
    np.put_along_axis(mask, ids.astype(np.int64), True, axis=1)
    x = rng.standard_normal((T, H)).astype(np.float32).astype(NUMPY_DTYPES[dtype])
    width = topK if map_type == "index" else E
    probs = rng.random((T, width)).astype(np.float32).astype(NUMPY_DTYPES[probs_dtype])
    num_out = max(1, (2 * T * topK) // 3) if drop else -1
    return RoutingCase(x, ids, mask, probs, map_type, num_out)


CASES = [
    # (T, E, topK, H, dtype, map_type, drop, skew)
    (7, 8, 1, 16, "float32", "index", False, False),
    (7, 8, 2, 16, "bfloat16", "index", False, False),
    (9, 16, 3, 32, "float32", "index", True, True),
    (5, 8, 8, 8, "bfloat16", "index", False, False),
    (7, 8, 1, 16, "float32", "mask", False, False),
    (7, 8, 2, 16, "bfloat16", "mask", False, True),
    (9, 16, 3, 32, "float32", "mask", True, False),
    (5, 8, 8, 8, "bfloat16", "mask", True, False),
    (1, 4, 2, 8, "float32", "mask", False, False),
    (1, 4, 2, 8, "float16", "index", False, False),
]
"""topK 1…8, both map types, with and without dropping, empty experts (skew, E > T·topK), a
single token, bf16 / fp16 / fp32."""


def case_id(params) -> str:
    T, E, topK, H, dtype, map_type, drop, skew = params
    return f"{map_type}-T{T}-E{E}-k{topK}-H{H}-{dtype}" + ("-drop" if drop else "") + ("-skew" if skew else "")


def build(params, seed: int = 0) -> RoutingCase:
    T, E, topK, H, dtype, map_type, drop, skew = params
    return make_case(seed, T, E, topK, H, dtype, map_type, drop=drop, skew=skew)
