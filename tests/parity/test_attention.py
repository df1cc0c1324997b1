"""Attention: torch and JAX give the same bytes (one kernel) for every case, and the same error
text (from core) for bad input."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from attention_cases import CASE_IDS, CASES, THD_CASES, THD_IDS
from helpers import assert_bytes_equal, from_torch, to_torch

from twinengine.jax._ops import attention as ja
from twinengine.pytorch._ops import attention as ta


def _convert(kw: dict, convert) -> dict:
    return {name: (convert(value) if isinstance(value, np.ndarray) else value) for name, value in kw.items()}


@pytest.mark.parametrize("case", CASES + THD_CASES, ids=CASE_IDS + THD_IDS)
def test_attention_bytes_identical_across_frameworks(case):
    a, kw = case.inputs(seed=3), case.kwargs()
    tkw, jkw = _convert(kw, torch.from_numpy), _convert(kw, jnp.asarray)
    tq, tk, tv, tdo = (to_torch(a[n]) for n in ("q", "k", "v", "dout"))
    jq, jk, jv, jdo = (jnp.asarray(a[n]) for n in ("q", "k", "v", "dout"))
    t_out, t_lse = ta.attention_fwd(tq, tk, tv, **tkw)
    j_out, j_lse = ja.attention_fwd(jq, jk, jv, **jkw)
    t_grads = ta.attention_bwd(tdo, tq, tk, tv, t_out, t_lse, **tkw)
    j_grads = ja.attention_bwd(jdo, jq, jk, jv, j_out, j_lse, **jkw)
    for name, t, j in zip(("out", "lse", "dq", "dk", "dv"), (t_out, t_lse, *t_grads), (j_out, j_lse, *j_grads),
                          strict=True):
        assert_bytes_equal(from_torch(t), np.asarray(j), f"{case.name} {name}: torch vs jax")


def _f32(*shape):
    return np.zeros(shape, np.float32)


_QKV = (_f32(2, 5, 4, 8), _f32(2, 6, 2, 8), _f32(2, 6, 2, 8))
_THD = (_f32(5, 4, 8), _f32(6, 2, 8), _f32(6, 2, 8))
_CU = {"cu_seqlens_q": np.array([0, 5], np.int32), "cu_seqlens_kv": np.array([0, 6], np.int32)}
BAD_CALLS = {
    # name: (op, arrays, kwargs, message fragment)
    "gqa_not_divisible": ("attention_fwd", (_f32(2, 5, 3, 8), _f32(2, 6, 2, 8), _f32(2, 6, 2, 8)),
                          {"mask_type": "causal"}, "must be divisible by the number of kv heads"),
    "mask_type_unknown": ("attention_fwd", _QKV, {"mask_type": "arbitrary"}, "mask_type must be one of"),
    "window_contradicts_causal": ("attention_fwd", _QKV, {"mask_type": "causal", "window_size": (4, 2)},
                                  "contradicts mask_type 'causal'"),
    "window_too_small": ("attention_fwd", _QKV, {"mask_type": "no_mask", "window_size": (-2, 0)}, "must be >= -1"),
    "window_not_pair": ("attention_fwd", _QKV, {"mask_type": "no_mask", "window_size": (3,)}, "pair of ints"),
    "seqlens_without_padding": ("attention_fwd", _QKV, {"mask_type": "causal",
                                "seqlens_q": np.array([5, 5], np.int32)}, "only used with a padding mask type"),
    "seqlens_wrong_shape": ("attention_fwd", _QKV, {"mask_type": "padding", "seqlens_kv": np.array([5], np.int32)},
                            "seqlens_kv must have shape (batch,)"),
    "seqlens_wrong_dtype": ("attention_fwd", _QKV, {"mask_type": "padding", "seqlens_kv": _f32(2)},
                            "seqlens_kv must have dtype int32"),
    "thd_without_cu_seqlens": ("attention_fwd", _THD, {"mask_type": "padding", "qkv_format": "thd"},
                               "qkv_format 'thd' needs cu_seqlens_q and cu_seqlens_kv"),
    "thd_not_padding": ("attention_fwd", _THD, {"mask_type": "causal", "qkv_format": "thd", **_CU},
                        "qkv_format 'thd' needs a padding mask type"),
    "thd_with_seqlens": ("attention_fwd", _THD, {"mask_type": "padding", "qkv_format": "thd", **_CU,
                         "seqlens_q": np.array([3], np.int32)}, "not used with qkv_format 'thd'"),
    "thd_cu_shapes_differ": ("attention_fwd", _THD, {"mask_type": "padding", "qkv_format": "thd",
                             "cu_seqlens_q": np.array([0, 5], np.int32),
                             "cu_seqlens_kv": np.array([0, 3, 6], np.int32)}, "must have one shape"),
    "thd_rank4": ("attention_fwd", _QKV, {"mask_type": "padding", "qkv_format": "thd", **_CU},
                  "3-D (tokens, heads, head_dim)"),
    "cu_seqlens_with_bshd": ("attention_fwd", _QKV, {"mask_type": "padding", **_CU}, "only used with qkv_format 'thd'"),
    "format_unknown": ("attention_fwd", _QKV, {"mask_type": "padding", "qkv_format": "bhsd"},
                       "qkv_format must be 'bshd', 'sbhd' or 'thd'"),
    "sbhd_batch_mismatch": ("attention_fwd", (_f32(5, 2, 4, 8), _f32(6, 3, 2, 8), _f32(6, 3, 2, 8)),
                            {"mask_type": "no_mask", "qkv_format": "sbhd"}, "one batch size"),
    "rank3": ("attention_fwd", (_f32(5, 4, 8), _f32(6, 2, 8), _f32(6, 2, 8)), {"mask_type": "no_mask"}, "4-D"),
    "dtype_mix": ("attention_fwd", (_QKV[0], _QKV[1], np.zeros((2, 6, 2, 8), np.float16)), {"mask_type": "no_mask"},
                  "one dtype"),
    "head_dim_mismatch": ("attention_fwd", (_f32(2, 5, 4, 8), _f32(2, 6, 2, 4), _f32(2, 6, 2, 8)),
                          {"mask_type": "no_mask"}, "same head_dim"),
    "dropout_without_rng": ("attention_fwd", _QKV, {"mask_type": "no_mask", "dropout_p": 0.1}, "needs rng="),
    "dropout_p_one": ("attention_fwd", _QKV, {"mask_type": "no_mask", "dropout_p": 1.0, "rng": np.zeros(2, np.int32)},
                      "dropout_p must be in [0, 1)"),
    "lse_shape": ("attention_bwd", (_f32(2, 5, 4, 8), *_QKV, _f32(2, 5, 4, 8), _f32(2, 5, 4)),
                  {"mask_type": "no_mask"}, "lse must have the forward's shape"),
    "dout_shape": ("attention_bwd", (_f32(2, 5, 4, 7), *_QKV, _f32(2, 5, 4, 8), _f32(2, 4, 5)),
                   {"mask_type": "no_mask"}, "dout must have the forward output's shape"),
}


def _error(fn):
    with pytest.raises((TypeError, ValueError)) as info:
        fn()
    return info.type, str(info.value)


@pytest.mark.parametrize("name", sorted(BAD_CALLS))
def test_attention_bad_input_same_error_in_both_frameworks(name):
    op, arrays, kwargs, fragment = BAD_CALLS[name]
    torch_error = _error(lambda: getattr(ta, op)(*(torch.from_numpy(a) for a in arrays),
                                                 **_convert(kwargs, torch.from_numpy)))
    jax_error = _error(lambda: getattr(ja, op)(*(jnp.asarray(a) for a in arrays), **_convert(kwargs, jnp.asarray)))
    assert torch_error == jax_error
    assert fragment in torch_error[1], torch_error[1]
    assert torch_error[1].startswith(f"twinengine.{op}: "), torch_error[1]
