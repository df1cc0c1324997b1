"""FP8 attention (docs/attention.md §9): torch and JAX give the same bytes (one kernel) for every
case, forward and backward, and the same error text for a bad fp8 flag."""

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
def test_attention_fp8_bytes_identical_across_frameworks(case):
    a, kw = case.inputs(seed=3), case.kwargs()
    tkw, jkw = _convert(kw, torch.from_numpy), _convert(kw, jnp.asarray)
    tq, tk, tv, tdo = (to_torch(a[n]) for n in ("q", "k", "v", "dout"))
    jq, jk, jv, jdo = (jnp.asarray(a[n]) for n in ("q", "k", "v", "dout"))
    t_out, t_lse = ta.attention_fwd(tq, tk, tv, **tkw, fp8=True)
    j_out, j_lse = ja.attention_fwd(jq, jk, jv, **jkw, fp8=True)
    t_grads = ta.attention_bwd(tdo, tq, tk, tv, t_out, t_lse, **tkw, fp8=True)
    j_grads = ja.attention_bwd(jdo, jq, jk, jv, j_out, j_lse, **jkw, fp8=True)
    for name, t, j in zip(("out", "lse", "dq", "dk", "dv"), (t_out, t_lse, *t_grads), (j_out, j_lse, *j_grads),
                          strict=True):
        assert_bytes_equal(from_torch(t), np.asarray(j), f"{case.name} {name}: torch vs jax")


def test_attention_fp8_bad_flag_same_error():
    q = np.zeros((2, 5, 2, 8), np.float32)
    errors = []
    for mod, conv in ((ta, torch.from_numpy), (ja, jnp.asarray)):
        with pytest.raises(TypeError) as info:
            mod.attention_fwd(conv(q), conv(q), conv(q), mask_type="causal", fp8="yes")
        errors.append(str(info.value))
    assert errors[0] == errors[1] == "twinengine.attention_fwd: fp8 must be a bool, got 'yes'"
