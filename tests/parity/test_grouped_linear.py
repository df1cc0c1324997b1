"""Cross-framework parity of grouped GEMMs: tep.grouped_linear (eager and compiled) and
tej.grouped_dense (jitted) give identical outputs and gradients, and the same error text."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from helpers import NUMPY_DTYPES, assert_bytes_equal, from_torch, to_torch

import twinengine as te
import twinengine.jax as tej
import twinengine.pytorch as tep


@pytest.mark.parametrize("recipe_name", [None, "Float8CurrentScaling", "MXFP8BlockScaling"], ids=str)
def test_grouped_linear_torch_and_jax_agree(recipe_name):
    fp8 = recipe_name is not None
    recipe = getattr(te.recipe, recipe_name)() if fp8 else None
    rng = np.random.default_rng(0)
    bf16 = NUMPY_DTYPES["bfloat16"]
    splits = np.array([32, 0, 64, 32], np.int32)
    x = rng.standard_normal((128, 64)).astype(np.float32).astype(bf16)
    w = (rng.standard_normal((4, 32, 64)) * 0.2).astype(np.float32).astype(bf16)
    b = rng.standard_normal((4, 32)).astype(np.float32).astype(bf16)
    dy = rng.standard_normal((128, 32)).astype(np.float32).astype(bf16)
    results = []
    for fn in (tep.grouped_linear, torch.compile(tep.grouped_linear, fullgraph=True)):
        xt = to_torch(x).requires_grad_()
        wt = [to_torch(wg).requires_grad_() for wg in w]
        bt = [to_torch(bg).requires_grad_() for bg in b]
        with tep.autocast(enabled=fp8, recipe=recipe):
            y = fn(xt, wt, torch.from_numpy(splits), bt)
        y.backward(to_torch(dy))
        results.append([from_torch(y), from_torch(xt.grad), np.stack([from_torch(t.grad) for t in wt]),
                        np.stack([from_torch(t.grad) for t in bt])])
    def jax_fn(x, k, s, b):
        with tej.autocast(recipe, enabled=fp8):
            return tej.grouped_dense(x, k, s, b)

    y, vjp = jax.vjp(lambda x, k, b: jax.jit(jax_fn)(x, k, jnp.asarray(splits), b), x, np.transpose(w, (0, 2, 1)), b)
    dx, dk, db = vjp(dy)
    results.append([np.asarray(y), np.asarray(dx), np.transpose(np.asarray(dk), (0, 2, 1)), np.asarray(db)])
    for other in results[1:]:
        for j, (a, e) in enumerate(zip(other, results[0])):
            assert_bytes_equal(a, e, f"result {j}")


def test_grouped_linear_errors_have_the_same_text():
    messages = []
    for call in (lambda: tep.grouped_linear(torch.ones(6, 4), [torch.ones(2, 4)] * 2, torch.tensor([4, 3])),
                 lambda: tej.grouped_dense(jnp.ones((6, 4)), jnp.ones((2, 4, 2)), jnp.asarray([4, 3])),
                 lambda: tep.grouped_linear(torch.ones(6, 4), [torch.ones(2, 4)] * 3, torch.tensor([3, 3])),
                 lambda: tej.grouped_dense(jnp.ones((6, 4)), jnp.ones((3, 4, 2)), jnp.asarray([3, 3]))):
        with pytest.raises(ValueError) as err:
            call()
        messages.append(str(err.value))
    assert messages[0] == messages[1] and messages[2] == messages[3]
