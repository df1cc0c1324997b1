"""twinengine.jax MoE permutation against the NumPy reference (NUMERICS.md §10), under jax.jit:
forward bytes, custom_vjp gradients, quantized inputs, static sizes and bad inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import NUMPY_DTYPES, assert_bytes_equal
from permute_cases import CASES, build, case_id, make_case, random_array
from reference import permute as ref

import twinengine as te
import twinengine.jax as tej


@pytest.mark.parametrize("with_probs", [False, True])
@pytest.mark.parametrize("params", CASES, ids=case_id)
def test_moe_permute_jit_matches_reference(params, with_probs):
    case = build(params)
    n_out = case.resolved_num_out  # static under jit

    @jax.jit
    def run(x, probs, routing_map, grad_out, grad_pp):
        if with_probs:
            def fn(x, p):
                out, pp, row_id_map = tej.moe_permute_with_probs(x, p, routing_map, n_out, map_type=case.map_type)
                return (out, pp), row_id_map

            (out, pp), vjp, row_id_map = jax.vjp(fn, x, probs, has_aux=True)
            gx, gp = vjp((grad_out, grad_pp))
            return out, pp, row_id_map, gx, gp
        out, vjp, row_id_map = jax.vjp(lambda x: tej.moe_permute(x, routing_map, n_out, map_type=case.map_type), x,
                                       has_aux=True)
        (gx,) = vjp(grad_out)
        return out, None, row_id_map, gx, None

    grad_out = random_array((n_out, case.x.shape[1]), params[4], 1)
    grad_pp = random_array((n_out,), "float32", 2)
    out, pp, row_id_map, gx, gp = run(case.x, case.probs, case.routing_map, grad_out, grad_pp)
    expected_map = case.expected_row_id_map()
    assert_bytes_equal(np.asarray(row_id_map), expected_map, "row_id_map")
    exp_out, exp_pp = ref.permute_ref(case.x, expected_map, case.map_type, n_out, case.probs if with_probs else None)
    assert_bytes_equal(np.asarray(out), exp_out, "output")
    exp_gx, exp_gp = ref.permute_bwd_ref(grad_out, expected_map, case.map_type, case.x.shape[0],
                                         grad_pp if with_probs else None, case.num_slots)
    assert_bytes_equal(np.asarray(gx), exp_gx, "grad inp")
    if with_probs:
        assert_bytes_equal(np.asarray(pp), exp_pp, "permuted_probs")
        assert_bytes_equal(np.asarray(gp), exp_gp, "grad probs")


@pytest.mark.parametrize("with_probs", [False, True])
@pytest.mark.parametrize("params", CASES, ids=case_id)
def test_moe_unpermute_grad_matches_reference(params, with_probs):
    case = build(params, seed=3)
    expected_map = case.expected_row_id_map()
    T, H = case.x.shape
    y = random_array((case.resolved_num_out, H), params[4], 4)
    grad_out = random_array((T, H), params[4], 5)
    probs = case.probs if with_probs else None
    restore_shape = (T, H) if case.map_type == "index" and not with_probs else None

    @jax.jit
    def run(y, probs, row_id_map, grad_out):
        fn = lambda y, p: tej.moe_unpermute(y, row_id_map, merging_probs=p, restore_shape=restore_shape,
                                            map_type=case.map_type)
        out, vjp = jax.vjp(fn, y, probs)
        return out, *vjp(grad_out)

    out, gy, gp = run(y, probs, expected_map, grad_out)
    assert_bytes_equal(np.asarray(out), ref.unpermute_ref(y, expected_map, case.map_type, T, probs), "output")
    exp_gy, exp_gp = ref.unpermute_bwd_ref(grad_out, y, expected_map, case.map_type, probs)
    assert_bytes_equal(np.asarray(gy), exp_gy, "grad inp")
    if with_probs:
        assert_bytes_equal(np.asarray(gp), exp_gp, "grad merging_probs")


def test_moe_permute_eager_default_sizes():
    case = make_case(4, 6, 5, 2, 8, "float32", "mask")
    out, row_id_map = tej.moe_permute(case.x, case.mask)  # concrete: counts the routed pairs
    assert out.shape == (12, 8)
    assert_bytes_equal(np.asarray(row_id_map), ref.row_id_map_mask_ref(case.mask, 12), "row_id_map")
    out, _ = tej.moe_permute(case.x, case.ids, map_type="index")  # T * topK, static
    assert out.shape == (12, 8)


def test_moe_permute_mask_default_size_under_jit_raises():
    case = make_case(4, 6, 5, 2, 8, "float32", "mask")
    with pytest.raises(ValueError, match="twinengine.moe_permute: .*pass num_out_tokens explicitly"):
        jax.jit(lambda x, m: tej.moe_permute(x, m)[0])(case.x, case.mask)


@pytest.mark.parametrize("quantizer", [te.Float8CurrentScalingQuantizer("e4m3", columnwise=False),
                                       te.MXFP8Quantizer("e5m2", columnwise=False),
                                       te.Float8BlockQuantizer("e4m3", columnwise=False),
                                       te.NVFP4Quantizer(columnwise=False)], ids=lambda q: q.scaling_mode)
def test_moe_permute_quantized_jit_matches_permuted_dequantized(quantizer):
    case = make_case(21, 128, 8, 2, 128, "bfloat16", "mask", drop=True)
    n_out = case.resolved_num_out

    @jax.jit
    def run(x, mask):
        qt = tej.quantize(x, quantizer)
        out, _ = tej.moe_permute(qt, mask, n_out)
        return tej.dequantize(out, jnp.float32), tej.dequantize(qt, jnp.float32)

    permuted, dequantized = run(case.x, case.mask)
    exp, _ = ref.permute_ref(np.asarray(dequantized), case.expected_row_id_map(), "mask", n_out)
    assert_bytes_equal(np.asarray(permuted), exp, "dequantized permuted")


def test_moe_sort_chunks_by_index_jit_matches_reference():
    rng = np.random.default_rng(8)
    split = np.array([3, 0, 5, 2, 4], np.int32)
    order = np.array([2, 4, 0, 3, 1], np.int32)
    x = rng.standard_normal((14, 8)).astype(np.float32).astype(NUMPY_DTYPES["bfloat16"])
    p = rng.random(14).astype(np.float32)
    g, gp = random_array((14, 8), "bfloat16", 9), random_array((14,), "float32", 10)

    @jax.jit
    def run(x, p, split, order):
        (out, out_p), vjp = jax.vjp(lambda x, p: tej.moe_sort_chunks_by_index_with_probs(x, p, split, order), x, p)
        return out, out_p, *vjp((g, gp)), tej.moe_sort_chunks_by_index(x, split, order)

    out, out_p, gx, gpp, plain = run(x, p, split, order)
    assert_bytes_equal(np.asarray(out), ref.sort_chunks_ref(x, split, order), "output")
    assert_bytes_equal(np.asarray(plain), ref.sort_chunks_ref(x, split, order), "without probs")
    assert_bytes_equal(np.asarray(out_p), ref.sort_chunks_ref(p, split, order), "permuted_probs")
    dst = ref.chunk_row_id_map_ref(split, order, 14)
    assert_bytes_equal(np.asarray(gx), g[dst], "grad inp")
    assert_bytes_equal(np.asarray(gpp), gp[dst], "grad probs")


def test_moe_permute_jit_drops_out_of_range_ids():
    ids = np.array([[-5, 1], [0, -1]], np.int32)
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    with pytest.raises(ValueError, match="expert ids must be >= 0"):
        tej.moe_permute(x, ids, map_type="index")
    out, row_id_map = jax.jit(lambda x, ids: tej.moe_permute(x, ids, map_type="index"))(x, ids)
    assert np.asarray(row_id_map).tolist() == [-1, 0, 1, -1]
    assert np.asarray(out).tolist() == [[2, 3], [0, 1], [0, 0], [0, 0]]


@pytest.mark.parametrize("call, error, match", [
    (lambda: tej.moe_permute(np.ones((2, 4), np.float32), np.array([[0, 2], [1, 0]], np.int32)),
     ValueError, "must hold only 0 and 1"),
    (lambda: tej.moe_permute(np.ones((3, 4), np.float32), np.ones((2, 3), bool)), ValueError, "must have 2 rows"),
    (lambda: tej.moe_permute_with_probs(np.ones((2, 4), np.float32), np.ones((2, 2), np.float32),
                                        np.ones((2, 3), bool)),
     ValueError, r"probs must have shape \(2, 3\)"),
    (lambda: tej.moe_sort_chunks_by_index(np.ones((5, 2), np.float32), np.array([2, 2]), np.array([1, 0])),
     ValueError, "must sum to the 5 rows"),
    (lambda: tej.moe_permute(tej.quantize(np.ones((32, 32), np.float32), te.MXFP8Quantizer("e4m3")),
                             np.ones((32, 2), bool)), ValueError, "rowwise data only"),
])
def test_moe_ops_reject_bad_arguments(call, error, match):
    with pytest.raises(error, match=f"twinengine.moe_[a-z_]+: .*{match}"):
        call()


def test_moe_permute_vmap_matches_per_example():
    cases = [make_case(seed, 6, 4, 2, 8, "float32", "index") for seed in range(3)]
    xs = np.stack([c.x for c in cases])
    ids = np.stack([c.ids for c in cases])
    probs = np.stack([c.probs for c in cases])

    def round_trip(x, ids, probs):
        out, row_id_map = tej.moe_permute(x, ids, map_type="index")
        return tej.moe_unpermute(out, row_id_map, merging_probs=probs, map_type="index")

    batched = jax.jit(jax.vmap(round_trip))(xs, ids, probs)
    for i, c in enumerate(cases):
        assert_bytes_equal(np.asarray(batched[i]), np.asarray(round_trip(c.x, c.ids, c.probs)), f"example {i}")


def _empty_block(x, probs_mask, probs_index, mask, ids, split_sizes, sorted_index, chunk_probs):
    out_m, pp_m, map_m = tej.moe_permute_with_probs(x, probs_mask, mask, num_out_tokens=0)
    out_i, map_i = tej.moe_permute(x, ids, map_type="index")
    back = tej.moe_unpermute(out_m, map_m, merging_probs=probs_mask, restore_shape=x.shape)
    back_i = tej.moe_unpermute(out_i, map_i, restore_shape=x.shape, map_type="index")
    sorted_x, sorted_p = tej.moe_sort_chunks_by_index_with_probs(x, chunk_probs, split_sizes, sorted_index)
    pp_i = tej.moe_permute_with_probs(x, probs_index, ids, map_type="index")[1]
    return out_m, pp_m, out_i, back, back_i, sorted_x, sorted_p, pp_i


@pytest.mark.parametrize("jitted", [False, True])
def test_moe_ops_zero_tokens_give_empty_outputs_and_gradients(jitted):
    H, E, K = 8, 4, 2
    fixed = (jnp.zeros((0, E), jnp.bool_), jnp.zeros((0, K), jnp.int32), jnp.array([0, 0, 0], jnp.int32),
             jnp.array([2, 0, 1], jnp.int32))

    def block(x, probs_mask, probs_index, chunk_probs):
        mask, ids, split_sizes, sorted_index = fixed
        return _empty_block(x, probs_mask, probs_index, mask, ids, split_sizes, sorted_index, chunk_probs)

    fn = jax.jit(block) if jitted else block
    args = (jnp.zeros((0, H)), jnp.zeros((0, E)), jnp.zeros((0, K)), jnp.zeros((0,)))
    outs = fn(*args)
    assert [o.shape for o in outs] == [(0, H), (0,), (0, H), (0, H), (0, H), (0, H), (0,), (0,)]
    grads = jax.grad(lambda *a: sum(o.sum() for o in fn(*a)), argnums=(0, 1, 2, 3))(*args)
    assert [g.shape for g in grads] == [a.shape for a in args]
