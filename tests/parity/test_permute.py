"""Cross-framework parity of MoE permutation: the same NumPy inputs through torch eager,
torch.compile(fullgraph=True, inductor) and jax.jit give identical outputs, row_id_maps and
gradients (same kernels, same order)."""

from __future__ import annotations

import jax
import numpy as np
import torch
from helpers import NUMPY_DTYPES, assert_bytes_equal, from_torch, to_torch
from permute_cases import make_case

import twinengine.jax as tej
import twinengine.pytorch as tep

SPLIT = np.array([4, 1, 0, 3, 4], np.int32)
ORDER = np.array([3, 0, 4, 2, 1], np.int32)


def _block(lib, num_out_tokens, ids, mask, split, order, x1, p1, q1, x2, p2, q2, x3, p3):
    """Index map (default size) and mask map (explicit size, dropping) round trips, and chunk sorting.
    Returns (differentiated outputs, row_id_maps)."""
    out_i, pp_i, map_i = lib.moe_permute_with_probs(x1, p1, ids, map_type="index")
    back_i = lib.moe_unpermute(out_i, map_i, merging_probs=q1, map_type="index")
    out_m, pp_m, map_m = lib.moe_permute_with_probs(x2, p2, mask, num_out_tokens)
    back_m = lib.moe_unpermute(out_m, map_m, merging_probs=q2)
    sorted_x, sorted_p = lib.moe_sort_chunks_by_index_with_probs(x3, p3, split, order)
    return (out_i, pp_i, back_i, out_m, pp_m, back_m, sorted_x, sorted_p), (map_i, map_m)


def _inputs():
    case = make_case(5, 12, 6, 3, 16, "bfloat16", "mask", skew=True)
    rng = np.random.default_rng(6)
    bf16, f32 = NUMPY_DTYPES["bfloat16"], np.float32
    leaves = [case.x, rng.random((12, 3)).astype(f32), rng.random((12, 3)).astype(f32),
              case.x[::-1].copy(), case.probs, rng.random((12, 6)).astype(f32),
              rng.standard_normal((12, 16)).astype(f32).astype(bf16), rng.random(12).astype(f32)]
    num_out = int(case.mask.sum()) - 5
    cotangents = [rng.standard_normal(shape).astype(f32).astype(dtype) for shape, dtype in (
        ((36, 16), bf16), ((36,), f32), ((12, 16), bf16), ((num_out, 16), bf16), ((num_out,), f32),
        ((12, 16), bf16), ((12, 16), bf16), ((12,), f32))]
    return case, num_out, leaves, cotangents


def _torch_run(fn, case, num_out, leaves, cotangents):
    tensors = [to_torch(leaf).requires_grad_() for leaf in leaves]
    outs, maps = fn(num_out, torch.from_numpy(case.ids), torch.from_numpy(case.mask), torch.from_numpy(SPLIT),
                    torch.from_numpy(ORDER), *tensors)
    torch.autograd.backward(list(outs), [to_torch(c) for c in cotangents])
    return [from_torch(t) for t in outs + maps] + [from_torch(t.grad) for t in tensors]


def test_moe_permute_torch_eager_compiled_and_jax_jit_agree():
    case, num_out, leaves, cotangents = _inputs()
    eager = _torch_run(lambda *a: _block(tep, *a), case, num_out, leaves, cotangents)
    compiled_block = torch.compile(lambda *a: _block(tep, *a), fullgraph=True, backend="inductor")
    compiled = _torch_run(compiled_block, case, num_out, leaves, cotangents)

    @jax.jit
    def jax_run(ids, mask, split, order, leaves, cotangents):
        outs, vjp, maps = jax.vjp(lambda *xs: _block(tej, num_out, ids, mask, split, order, *xs), *leaves,
                                  has_aux=True)
        return list(outs) + list(maps) + list(vjp(tuple(cotangents)))

    jitted = [np.asarray(a) for a in jax_run(case.ids, case.mask, SPLIT, ORDER, leaves, cotangents)]
    names = ["out_i", "pp_i", "back_i", "out_m", "pp_m", "back_m", "sorted_x", "sorted_p", "map_i", "map_m",
             "grad x1", "grad p1", "grad q1", "grad x2", "grad p2", "grad q2", "grad x3", "grad p3"]
    assert len(eager) == len(compiled) == len(jitted) == len(names)
    for name, e, c, j in zip(names, eager, compiled, jitted):
        assert_bytes_equal(c, e, f"compiled vs eager: {name}")
        assert_bytes_equal(j, e, f"jax.jit vs torch eager: {name}")


def _pad_block(lib, x, probs, mask, counts, splits):
    out, pp, row_id_map, pad_offsets, target = lib.moe_permute_and_pad_with_probs(x, probs, mask, counts, 16,
                                                                                num_out_tokens=17)
    back = lib.moe_unpermute(out, row_id_map, probs, pad_offsets=pad_offsets)
    padded, padded_splits = lib.moe_pad_splits(x, splits, 16)
    return out, pp, back, target, padded, padded_splits


def test_moe_permute_and_pad_torch_and_jax_agree():
    mask = np.zeros((11, 4), bool)
    mask[np.arange(11), np.arange(11) % 4] = True
    mask[np.arange(6), 3] = True
    rng = np.random.default_rng(3)
    x = rng.standard_normal((11, 16)).astype(np.float32).astype(NUMPY_DTYPES["bfloat16"])
    probs = rng.random((11, 4)).astype(np.float32)
    splits = np.array([5, 0, 6], np.int32)
    torch_out = _pad_block(tep, to_torch(x), to_torch(probs), torch.from_numpy(mask), torch.from_numpy(mask.sum(0)),
                           torch.from_numpy(splits))
    jax_out = jax.jit(lambda *a: _pad_block(tej, *a))(x, probs, mask, mask.sum(0).astype(np.int32), splits)
    for i, (t, j) in enumerate(zip(torch_out, jax_out)):
        assert_bytes_equal(np.asarray(j), from_torch(t), f"result {i}")


def test_padding_errors_have_the_same_text():
    import pytest

    import twinengine as te
    messages = []
    for lib, x in ((tep, torch.ones(4, 8)), (tej, np.ones((4, 8), np.float32))):
        with lib.autocast(recipe=te.recipe.MXFP8BlockScaling()):
            with pytest.raises(ValueError) as err:
                lib.moe_pad_splits(x, np.array([1, 3]) if lib is tej else torch.tensor([1, 3]), 16)
        messages.append(str(err.value))
        with pytest.raises(ValueError) as err:
            lib.moe_pad_splits(x, np.array([2, 3]) if lib is tej else torch.tensor([2, 3]), 16)
        messages.append(str(err.value))
    assert messages[0] == messages[2] and messages[1] == messages[3] and "row alignment 32" in messages[0]
