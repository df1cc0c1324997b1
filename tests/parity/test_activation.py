"""Activation family: the same NumPy input through both frontends gives identical bytes (NaNs
included: the same kernel runs); and identical error text for the bad inputs of the activation,
dropout and bias families."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from elementwise_cases import DTYPES, FUSED_QUANTIZERS, SPECIAL_VALUES, quantize_extras, sweep_input
from helpers import assert_bytes_equal, assert_quantized_equal, fields_as_numpy, from_torch, to_torch
from quantize_cases import case_id
from reference import activation as ref_act

from twinengine.jax._ops import activation as JA
from twinengine.jax._ops import bias as JB
from twinengine.jax._ops import dropout as JD
from twinengine.pytorch._ops import activation as TA
from twinengine.pytorch._ops import bias as TB
from twinengine.pytorch._ops import dropout as TD

TORCH = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
JNP = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def _same(t, j, what: str) -> None:
    assert_bytes_equal(from_torch(t), np.asarray(j), what)


def _input(kind: str, dtype: str) -> np.ndarray:
    x = sweep_input(64 * 64, dtype, seed=21).reshape(64, 64)
    x[0, : SPECIAL_VALUES.size] = ref_act.round_output(SPECIAL_VALUES, dtype)
    x[1, -SPECIAL_VALUES.size:] = ref_act.round_output(SPECIAL_VALUES, dtype)
    return x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", TA.ACTIVATIONS)
def test_activation_bytes_identical_across_frameworks(kind, dtype):
    x = _input(kind, dtype)
    dy = ref_act.round_output(np.random.default_rng(1).standard_normal(
        (64, 32 if kind in ref_act.GATED else 64)).astype(np.float32), dtype)
    params = {"limit": 3.0, "alpha": 1.5} if kind == "clamped_swiglu" else {}
    _same(TA.activation_fwd(to_torch(x), kind, **params)[0], JA.activation_fwd(jnp.asarray(x), kind, **params)[0], "y")
    _same(TA.activation_bwd(to_torch(dy), to_torch(x), kind, **params),
          JA.activation_bwd(jnp.asarray(dy), jnp.asarray(x), kind, **params), "dx")
    t = TA.activation_bwd_dbias(to_torch(dy), to_torch(x), kind, bias_dtype=torch.bfloat16, **params)
    j = JA.activation_bwd_dbias(jnp.asarray(dy), jnp.asarray(x), kind, bias_dtype=jnp.bfloat16, **params)
    _same(t[0], j[0], "dbias dx")
    _same(t[1], j[1], "dbias")


@pytest.mark.parametrize("q", FUSED_QUANTIZERS, ids=case_id)
def test_activation_fused_quantize_identical_across_frameworks(q):
    x = ref_act.round_output(np.random.default_rng(4).standard_normal((128, 256)).astype(np.float32), "bfloat16")
    extras = quantize_extras(q)
    te_ = {k: None if v is None else to_torch(v) for k, v in extras.items()}
    je = {k: None if v is None else jnp.asarray(v) for k, v in extras.items()}
    _, qt_t = TA.activation_fwd(to_torch(x), "gelu", quantizer=q, **te_)
    _, qt_j = JA.activation_fwd(jnp.asarray(x), "gelu", quantizer=q, **je)
    assert_quantized_equal(fields_as_numpy(qt_t), fields_as_numpy(qt_j), "fused forward")
    dy = ref_act.round_output(np.random.default_rng(5).standard_normal((128, 256)).astype(np.float32), "bfloat16")
    *_, qd_t = TA.activation_bwd_dbias(to_torch(dy), to_torch(x), "gelu", quantizer=q, **te_)
    *_, qd_j = JA.activation_bwd_dbias(jnp.asarray(dy), jnp.asarray(x), "gelu", quantizer=q, **je)
    assert_quantized_equal(fields_as_numpy(qd_t), fields_as_numpy(qd_j), "fused backward")


def _message(fn) -> str:
    with pytest.raises((TypeError, ValueError)) as info:
        fn()
    return str(info.value)


@pytest.mark.parametrize("case", [
    ("odd gated", lambda m: m[0].activation_fwd(m[1]((4, 7)), "reglu")),
    ("unknown kind", lambda m: m[0].activation_fwd(m[1]((4, 8)), "tanh")),
    ("dy shape", lambda m: m[0].activation_bwd(m[1]((4, 8)), m[1]((4, 8)), "swiglu")),
    ("p range", lambda m: m[2].dropout_fwd(m[1]((4, 8)), 1.5, m[4])),
    ("missing rng", lambda m: m[2].dropout_fwd(m[1]((4, 8)), 0.5, None)),
    ("mask size", lambda m: m[2].dropout_bwd(m[1]((4, 8)), m[5], 0.5)),
    ("bias length", lambda m: m[3].bias_add(m[1]((4, 8)), m[1]((9,)))),
    ("add shapes", lambda m: m[3].add(m[1]((4, 8)), m[1]((8, 4)))),
], ids=lambda c: c[0])
def test_errors_identical_across_frameworks(case):
    _, fn = case
    torch_mods = (TA, lambda s: torch.ones(s), TD, TB, torch.tensor([1, 2]), torch.zeros(3, dtype=torch.uint8))
    jax_mods = (JA, lambda s: jnp.ones(s), JD, JB, jnp.asarray([1, 2]), jnp.zeros(3, jnp.uint8))
    assert _message(lambda: fn(torch_mods)) == _message(lambda: fn(jax_mods))
