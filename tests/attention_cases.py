"""Shared attention test cases: shapes, masks, windows, padding lengths, dropout and dtypes, and
the NumPy inputs of each (the same arrays go to torch, JAX and the references)."""

from __future__ import annotations

import dataclasses

import numpy as np
from helpers import NUMPY_DTYPES


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    batch: int
    s_q: int
    s_kv: int
    heads: int
    kv_heads: int
    d: int
    mask_type: str
    window_size: tuple[int, int] | None = None
    seqlens: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    dropout_p: float = 0.0
    dtype: str = "float32"
    d_v: int | None = None
    softmax_scale: float | None = None
    qkv_format: str = "bshd"

    def layout(self, x: np.ndarray) -> np.ndarray:
        """A bshd array in this case's layout, or back (sbhd swaps the first two axes both ways)."""
        return np.ascontiguousarray(np.swapaxes(x, 0, 1)) if self.qkv_format == "sbhd" else x

    def ref_kwargs(self) -> dict:
        """kwargs() for the bshd-only references (no qkv_format)."""
        kw = self.kwargs()
        kw.pop("qkv_format")
        return kw

    def inputs(self, seed: int = 0) -> dict:
        rng = np.random.default_rng(seed)
        dt = NUMPY_DTYPES[self.dtype]
        d_v = self.d_v or self.d
        arrays = {
            "q": rng.standard_normal((self.batch, self.s_q, self.heads, self.d)).astype(np.float32).astype(dt),
            "k": rng.standard_normal((self.batch, self.s_kv, self.kv_heads, self.d)).astype(np.float32).astype(dt),
            "v": rng.standard_normal((self.batch, self.s_kv, self.kv_heads, d_v)).astype(np.float32).astype(dt),
            "dout": rng.standard_normal((self.batch, self.s_q, self.heads, d_v)).astype(np.float32).astype(dt),
        }
        return {name: self.layout(x) for name, x in arrays.items()}

    def kwargs(self) -> dict:
        """Keyword arguments with NumPy arrays (seqlens int32, rng int64)."""
        kw = {"mask_type": self.mask_type, "window_size": self.window_size, "softmax_scale": self.softmax_scale,
              "dropout_p": self.dropout_p, "qkv_format": self.qkv_format}
        if self.seqlens is not None:
            kw["seqlens_q"] = np.array(self.seqlens[0], np.int32)
            kw["seqlens_kv"] = np.array(self.seqlens[1], np.int32)
        if self.dropout_p > 0:
            kw["rng"] = np.array([1234, 5], np.int64)
        return kw


CASES = [
    Case("no_mask", 2, 40, 40, 2, 2, 16, "no_mask"),
    Case("causal_gqa", 2, 70, 70, 4, 2, 16, "causal"),
    Case("causal_top_left_sq_gt_skv", 1, 75, 40, 2, 2, 8, "causal"),
    Case("causal_bottom_right_mqa", 2, 30, 90, 4, 1, 16, "causal_bottom_right"),
    Case("padding_zero_lengths", 3, 20, 33, 2, 1, 8, "padding", seqlens=((20, 0, 7), (33, 5, 0))),
    Case("padding_causal", 2, 30, 30, 2, 2, 8, "padding_causal", seqlens=((30, 11), (30, 17))),
    Case("padding_causal_bottom_right", 2, 25, 40, 2, 2, 8, "padding_causal_bottom_right",
         seqlens=((25, 9), (40, 20))),
    Case("sliding_window", 2, 70, 150, 2, 2, 16, "no_mask", window_size=(5, 3)),
    Case("causal_window", 1, 100, 100, 2, 1, 16, "causal", window_size=(20, 0)),
    Case("padding_window", 2, 30, 30, 2, 2, 8, "padding", window_size=(4, 4), seqlens=((30, 12), (25, 30))),
    Case("seq1", 1, 1, 1, 1, 1, 4, "no_mask"),
    Case("seq1_query_long_kv", 2, 1, 129, 2, 1, 32, "causal_bottom_right"),
    Case("dropout", 2, 66, 66, 2, 1, 16, "causal", dropout_p=0.25),
    Case("dv_differs_scale", 1, 40, 40, 2, 2, 16, "no_mask", d_v=24, softmax_scale=0.3),
    Case("bf16", 2, 70, 70, 2, 1, 32, "causal", dtype="bfloat16"),
    Case("sbhd_gqa_padding", 2, 33, 40, 4, 2, 8, "padding_causal_bottom_right", seqlens=((33, 20), (40, 31)),
         qkv_format="sbhd"),
    Case("sbhd_dropout_bf16", 2, 20, 20, 2, 1, 16, "causal", dropout_p=0.5, dtype="bfloat16", qkv_format="sbhd"),
    Case("fp16_padding", 2, 33, 33, 2, 2, 16, "padding_causal", seqlens=((33, 10), (33, 12)), dtype="float16"),
]
CASE_IDS = [c.name for c in CASES]
BY_NAME = {c.name: c for c in CASES}

# Tolerance against the float64 reference: fp32 inputs/outputs carry fp32 rounding of scores,
# exp/log (<= 2 ulp) and sequential sums; bf16/fp16 outputs are rounded to their dtype last.
TOLERANCE = {"float32": 2e-5, "bfloat16": 2e-2, "float16": 4e-3}


@dataclasses.dataclass(frozen=True)
class ThdCase:
    """Packed (thd) sequences: cu_seqlens offsets; tokens past the last offset are unused."""
    name: str
    cu_q: tuple[int, ...]
    cu_kv: tuple[int, ...]
    t_q: int
    t_kv: int
    heads: int
    kv_heads: int
    d: int
    mask_type: str
    window_size: tuple[int, int] | None = None
    dropout_p: float = 0.0

    def inputs(self, seed: int = 0) -> dict:
        rng = np.random.default_rng(seed)
        return {"q": rng.standard_normal((self.t_q, self.heads, self.d)).astype(np.float32),
                "k": rng.standard_normal((self.t_kv, self.kv_heads, self.d)).astype(np.float32),
                "v": rng.standard_normal((self.t_kv, self.kv_heads, self.d)).astype(np.float32),
                "dout": rng.standard_normal((self.t_q, self.heads, self.d)).astype(np.float32)}

    def kwargs(self) -> dict:
        kw = {"mask_type": self.mask_type, "window_size": self.window_size, "dropout_p": self.dropout_p,
              "qkv_format": "thd", "cu_seqlens_q": np.array(self.cu_q, np.int32),
              "cu_seqlens_kv": np.array(self.cu_kv, np.int32)}
        if self.dropout_p > 0:
            kw["rng"] = np.array([99, 1], np.int64)
        return kw


THD_CASES = [
    ThdCase("padding_gqa", (0, 30, 30, 100), (0, 40, 45, 110), 100, 110, 4, 2, 16, "padding"),
    ThdCase("padding_causal_unused_tail", (0, 7, 70), (0, 7, 70), 80, 75, 2, 2, 8, "padding_causal"),
    ThdCase("bottom_right_window_dropout", (0, 20, 90), (0, 50, 100), 90, 100, 2, 1, 8,
            "padding_causal_bottom_right", window_size=(9, 0), dropout_p=0.2),
]
THD_IDS = [c.name for c in THD_CASES]
