"""twinengine.pytorch fused permute-and-pad and block padding (Fp8Padding / Fp8Unpadding)
against the NumPy reference: padded bytes, pad offsets, zero padding rows and gradients,
recipe row alignment, quantized inputs and torch.compile."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import NUMPY_DTYPES, assert_bytes_equal, from_torch, to_torch
from permute_cases import random_array
from reference import permute as ref

import twinengine as te
import twinengine.pytorch as tep


def _routing(seed: int, T: int, E: int, empty_expert: bool = True):
    rng = np.random.default_rng(seed)
    mask = rng.random((T, E)) < 0.45
    if empty_expert:
        mask[:, 1] = False
    return mask


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("T, E, align", [(9, 4, 4), (23, 5, 16), (40, 3, 32), (1, 2, 16)])
def test_moe_permute_and_pad_matches_reference(T, E, align, dtype):
    mask = _routing(T, T, E)
    x_np = random_array((T, 24), dtype, 1)
    p_np = np.random.default_rng(2).random((T, E)).astype(np.float32)
    x = to_torch(x_np).requires_grad_()
    probs = to_torch(p_np).requires_grad_()
    routing_map = torch.from_numpy(mask)
    out, pp, row_id_map, pad_offsets, target = tep.moe_permute_and_pad_with_probs(
        x, probs, routing_map, routing_map.sum(0), align)
    exp_out, exp_pp, exp_offsets, exp_target = ref.permute_and_pad_ref(x_np, p_np, mask, align)
    assert_bytes_equal(from_torch(out), exp_out, "output")
    assert_bytes_equal(from_torch(pp), exp_pp, "permuted_probs")
    assert_bytes_equal(from_torch(pad_offsets), exp_offsets, "pad_offsets")
    assert_bytes_equal(from_torch(target), exp_target, "target_tokens_per_expert")
    unpadded_map = ref.row_id_map_mask_ref(mask, int(mask.sum()))
    assert_bytes_equal(from_torch(row_id_map), unpadded_map, "row_id_map")
    assert all(int(b) % align == 0 for b in exp_target) and int(exp_target.sum()) <= exp_out.shape[0]

    padded_map = ref.pad_row_id_map_ref(unpadded_map, exp_offsets)
    grad_out = random_array(exp_out.shape, dtype, 3)
    grad_pp = random_array(exp_pp.shape, "float32", 4)
    torch.autograd.backward([out, pp], [to_torch(grad_out), to_torch(grad_pp)])
    exp_gx, exp_gp = ref.permute_bwd_ref(grad_out, padded_map, "mask", T, grad_pp, E)
    assert_bytes_equal(from_torch(x.grad), exp_gx, "grad inp")
    assert_bytes_equal(from_torch(probs.grad), exp_gp, "grad probs")

    y_np = random_array(exp_out.shape, dtype, 5)
    y = to_torch(y_np).requires_grad_()
    merge = to_torch(p_np).requires_grad_()
    back = tep.moe_unpermute(y, row_id_map, merge, pad_offsets=pad_offsets)
    assert_bytes_equal(from_torch(back), ref.unpermute_ref(y_np, padded_map, "mask", T, p_np), "unpermute")
    grad_back = random_array((T, 24), dtype, 6)
    back.backward(to_torch(grad_back))
    exp_gy, exp_gm = ref.unpermute_bwd_ref(grad_back, y_np, padded_map, "mask", p_np)
    assert_bytes_equal(from_torch(y.grad), exp_gy, "grad y")
    assert_bytes_equal(from_torch(merge.grad), exp_gm, "grad merging_probs")
    real_rows = {int(r) for row in padded_map for r in row[:E] if r >= 0}
    pad_rows = [r for r in range(exp_out.shape[0]) if r not in real_rows]
    assert not from_torch(y.grad)[pad_rows].astype(np.float32).any(), "padding rows got a gradient"


@pytest.mark.parametrize("splits, align", [([3, 0, 5, 16], 8), ([0, 0, 7], 16), ([32, 32], 32), ([1], 16)])
def test_moe_pad_splits_and_unpad_match_reference(splits, align):
    M = sum(splits)
    x_np = random_array((M, 8), "bfloat16", 7)
    x = to_torch(x_np).requires_grad_()
    padded, padded_splits = tep.moe_pad_splits(x, torch.tensor(splits), align)
    exp, exp_splits = ref.pad_splits_ref(x_np, splits, align)
    assert_bytes_equal(from_torch(padded), exp, "padded")
    assert_bytes_equal(from_torch(padded_splits), exp_splits, "padded m_splits")
    back = tep.Fp8Unpadding(len(splits), align)(padded, torch.tensor(splits), M)
    assert_bytes_equal(from_torch(back), x_np, "unpadded")
    grad = random_array(exp.shape, "bfloat16", 8)
    padded.backward(to_torch(grad))
    starts = np.cumsum([0, *exp_splits[:-1]])
    exp_grad = np.concatenate([grad[o:o + s] for o, s in zip(starts, splits)])
    assert_bytes_equal(from_torch(x.grad), exp_grad.reshape(M, 8), "grad of padding")
    y = torch.from_numpy(exp.astype(np.float32)).requires_grad_()
    tep.moe_unpad_splits(y, splits, align, M).sum().backward()
    kept = np.zeros(exp.shape, np.float32)
    for o, s in zip(starts, splits):
        kept[o:o + s] = 1
    assert_bytes_equal(from_torch(y.grad), kept, "grad of unpadding (padding rows 0)")


RECIPES = [(te.recipe.Float8CurrentScaling(), 16), (te.recipe.MXFP8BlockScaling(), 32),
           (te.recipe.Float8BlockScaling(), 128)]


@pytest.mark.parametrize("recipe, alignment", RECIPES, ids=lambda r: type(r).__name__ if not isinstance(r, int) else "")
def test_align_size_must_be_a_multiple_of_the_recipe_row_alignment(recipe, alignment):
    x, probs = torch.randn(4, 8), torch.rand(4, 2)
    mask = torch.ones(4, 2, dtype=torch.bool)
    with tep.autocast(recipe=recipe):
        with pytest.raises(ValueError, match=f"moe_permute_and_pad_with_probs: align_size={alignment // 2} is not a "
                                             f"multiple of the row alignment {alignment}"):
            tep.moe_permute_and_pad_with_probs(x, probs, mask, mask.sum(0), alignment // 2)
        out = tep.moe_permute_and_pad_with_probs(x, probs, mask, mask.sum(0), alignment)[0]
        assert out.shape[0] % alignment == 0
        padded, splits = tep.Fp8Padding(2)(x, torch.tensor([1, 3]))
        assert int(splits[0]) == alignment and padded.shape[0] % alignment == 0


@pytest.mark.parametrize("call, error, match", [
    (lambda: tep.moe_permute_and_pad_with_probs(torch.ones(2, 4), torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool),
                                                torch.tensor([2, 2, 2]), 0), ValueError, "align_size must be >= 1"),
    (lambda: tep.moe_permute_and_pad_with_probs(torch.ones(2, 4), torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool),
                                                torch.tensor([2, 2]), 4), ValueError, "tokens_per_expert must have"),
    (lambda: tep.moe_pad_splits(torch.ones(3, 4), torch.tensor([2, 2]), 4), ValueError,
     "must sum to at most the 3 rows"),
    (lambda: tep.moe_pad_splits(torch.ones(4, 4), torch.tensor([6, -2]), 4), ValueError, "m_splits must be >= 0"),
    (lambda: tep.moe_unpad_splits(torch.ones(8, 4), torch.tensor([2, 2]), 4, None), ValueError, "num_rows"),
    (lambda: tep.moe_unpermute(torch.ones(4, 4), torch.zeros(4, dtype=torch.int32), map_type="index",
                               pad_offsets=torch.zeros(1, dtype=torch.int32)), ValueError, "padding needs map_type"),
])
def test_padding_rejects_bad_arguments(call, error, match):
    with pytest.raises(error, match=f"twinengine.moe_[a-z_]+: .*{match}"):
        call()


def _pad_block(x, probs, mask, counts, splits):
    out, pp, row_id_map, pad_offsets, target = tep.moe_permute_and_pad_with_probs(x, probs, mask, counts, 16,
                                                                                num_out_tokens=17)
    back = tep.moe_unpermute(out * 2, row_id_map, probs, pad_offsets=pad_offsets)
    padded, padded_splits = tep.moe_pad_splits(x, splits, 16)
    unpadded = tep.moe_unpad_splits(padded * 3, splits, 16, x.shape[0])
    return out, pp, back, target, padded, padded_splits, unpadded


def test_padding_compiled_matches_eager():
    compiled = torch.compile(_pad_block, fullgraph=True, backend="inductor")
    mask = np.zeros((11, 4), bool)
    mask[np.arange(11), np.arange(11) % 4] = True
    mask[np.arange(6), 3] = True
    results = []
    for fn in (_pad_block, compiled):
        x = to_torch(random_array((11, 16), "bfloat16", 9)).requires_grad_()
        probs = torch.from_numpy(np.random.default_rng(1).random((11, 4)).astype(np.float32)).requires_grad_()
        m = torch.from_numpy(mask)
        outs = fn(x, probs, m, m.sum(0), torch.tensor([5, 0, 6]))
        sum(o.float().sum() for o in outs if o.is_floating_point()).backward()
        results.append([from_torch(o) for o in outs] + [from_torch(x.grad), from_torch(probs.grad)])
    for i, (eager, comp) in enumerate(zip(*results)):
        assert_bytes_equal(comp, eager, f"result {i}")


def test_moe_permute_and_pad_quantized_rows_keep_their_scales():
    quantizer = te.MXFP8Quantizer("e4m3", columnwise=False)
    mask = _routing(3, 64, 4, empty_expert=False)
    x = to_torch(random_array((64, 64), "float32", 10))
    probs = torch.rand(64, 4)
    counts = torch.from_numpy(mask).sum(0)
    qt = tep.quantize(x, quantizer)
    out_q = tep.moe_permute_and_pad_with_probs(qt, probs, torch.from_numpy(mask), counts, 32)[0]
    out_x = tep.moe_permute_and_pad_with_probs(tep.dequantize(qt, torch.float32), probs, torch.from_numpy(mask),
                                               counts, 32)[0]
    assert_bytes_equal(from_torch(tep.dequantize(out_q, torch.float32)), from_torch(out_x), "dequantized rows")
