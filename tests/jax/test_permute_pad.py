"""twinengine.jax fused permute-and-pad, token_dispatch / token_combine and block padding
against the NumPy reference, jitted, with gradients and recipe row alignment."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_bytes_equal
from permute_cases import random_array
from reference import permute as ref

import twinengine as te
import twinengine.jax as tej


def _mask(seed, T, E):
    mask = np.random.default_rng(seed).random((T, E)) < 0.45
    mask[:, 1] = False
    return mask


@pytest.mark.parametrize("T, E, align", [(9, 4, 4), (23, 5, 16), (40, 3, 32)])
def test_token_dispatch_and_combine_jit_match_reference(T, E, align):
    mask = _mask(T, T, E)
    n = int(mask.sum())
    x_np = random_array((T, 24), "bfloat16", 1)
    p_np = np.random.default_rng(2).random((T, E)).astype(np.float32)

    @jax.jit
    def dispatch(x, probs, m):
        return tej.token_dispatch(x, m, n, probs=probs, align_size=align)

    out, pp, row_id_map, pad_offsets, target = dispatch(jnp.asarray(x_np), jnp.asarray(p_np), jnp.asarray(mask))
    exp_out, exp_pp, exp_offsets, exp_target = ref.permute_and_pad_ref(x_np, p_np, mask, align)
    for name, got, exp in (("output", out, exp_out), ("permuted_probs", pp, exp_pp),
                           ("pad_offsets", pad_offsets, exp_offsets), ("tokens_per_expert", target, exp_target)):
        assert_bytes_equal(np.asarray(got), exp, name)
    padded_map = ref.pad_row_id_map_ref(ref.row_id_map_mask_ref(mask, n), exp_offsets)

    y_np = random_array(exp_out.shape, "bfloat16", 5)
    combine = jax.jit(lambda y, p: tej.token_combine(y, row_id_map, p, pad_offsets))
    assert_bytes_equal(np.asarray(combine(jnp.asarray(y_np), jnp.asarray(p_np))),
                       ref.unpermute_ref(y_np, padded_map, "mask", T, p_np), "combine")
    grad_back = random_array((T, 24), "bfloat16", 6)
    _, vjp = jax.vjp(combine, jnp.asarray(y_np), jnp.asarray(p_np))
    gy, gp = vjp(jnp.asarray(grad_back))
    exp_gy, exp_gp = ref.unpermute_bwd_ref(grad_back, y_np, padded_map, "mask", p_np)
    assert_bytes_equal(np.asarray(gy), exp_gy, "grad y (padding rows 0)")
    assert_bytes_equal(np.asarray(gp), exp_gp, "grad merging_probs")

    grad_out = random_array(exp_out.shape, "bfloat16", 3)
    _, vjp = jax.vjp(lambda x: dispatch(x, jnp.asarray(p_np), jnp.asarray(mask))[0], jnp.asarray(x_np))
    exp_gx, _ = ref.permute_bwd_ref(grad_out, padded_map, "mask", T, None, E)
    assert_bytes_equal(np.asarray(vjp(jnp.asarray(grad_out))[0]), exp_gx, "grad inp")


def test_token_dispatch_without_padding_counts_tokens():
    mask = _mask(3, 10, 4)
    x = jnp.asarray(random_array((10, 8), "float32", 1))
    out, pp, row_id_map, pad_offsets, counts = tej.token_dispatch(x, mask, int(mask.sum()))
    assert pp is None and pad_offsets is None
    assert_bytes_equal(np.asarray(counts), mask.sum(0).astype(np.int32), "tokens_per_expert")
    assert_bytes_equal(np.asarray(tej.token_combine(out, row_id_map)),
                       ref.unpermute_ref(np.asarray(out), ref.row_id_map_mask_ref(mask, int(mask.sum())), "mask", 10),
                       "round trip")


@pytest.mark.parametrize("splits, align", [([3, 0, 5, 16], 8), ([32, 32], 32)])
def test_moe_pad_splits_jit_matches_reference(splits, align):
    M = sum(splits)
    x_np = random_array((M, 8), "bfloat16", 7)
    padded, padded_splits = jax.jit(lambda x, s: tej.moe_pad_splits(x, s, align))(jnp.asarray(x_np),
                                                                                 jnp.asarray(splits))
    exp, exp_splits = ref.pad_splits_ref(x_np, splits, align)
    assert_bytes_equal(np.asarray(padded), exp, "padded")
    assert_bytes_equal(np.asarray(padded_splits), exp_splits, "padded m_splits")
    back = jax.jit(lambda y, s: tej.moe_unpad_splits(y, s, align, M))(padded, jnp.asarray(splits))
    assert_bytes_equal(np.asarray(back), x_np, "unpadded")


@pytest.mark.parametrize("recipe, alignment", [(te.recipe.Float8CurrentScaling(), 16),
                                               (te.recipe.MXFP8BlockScaling(), 32),
                                               (te.recipe.Float8BlockScaling(), 128)])
def test_align_size_must_be_a_multiple_of_the_recipe_row_alignment(recipe, alignment):
    mask = np.ones((4, 2), bool)
    with tej.autocast(recipe):
        with pytest.raises(ValueError, match=f"moe_permute_and_pad_with_probs: align_size={alignment // 2} is not a "
                                             f"multiple of the row alignment {alignment}"):
            tej.moe_permute_and_pad_with_probs(jnp.ones((4, 8)), jnp.ones((4, 2)), mask, mask.sum(0), alignment // 2)
