"""twinengine.pytorch MoE permutation against the NumPy reference (NUMERICS.md §10): forward
bytes, gradients, quantized inputs, dropping, bad inputs, opcheck and torch.compile."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import NUMPY_DTYPES, assert_bytes_equal, from_torch, to_torch
from permute_cases import CASES, build, case_id, make_case, random_array
from reference import permute as ref

import twinengine as te
import twinengine.pytorch as tep


@pytest.mark.parametrize("with_probs", [False, True])
@pytest.mark.parametrize("params", CASES, ids=case_id)
def test_moe_permute_matches_reference(params, with_probs):
    case = build(params)
    x = to_torch(case.x).requires_grad_()
    routing_map = torch.from_numpy(case.routing_map)
    if with_probs:
        probs = to_torch(case.probs).requires_grad_()
        out, permuted_probs, row_id_map = tep.moe_permute_with_probs(x, probs, routing_map, case.num_out_tokens,
                                                                     map_type=case.map_type)
    else:
        out, row_id_map = tep.moe_permute(x, routing_map, case.num_out_tokens, map_type=case.map_type)
    expected_map = case.expected_row_id_map()
    assert_bytes_equal(from_torch(row_id_map), expected_map, "row_id_map")
    n_out = case.resolved_num_out
    exp_out, exp_pp = ref.permute_ref(case.x, expected_map, case.map_type, n_out, case.probs if with_probs else None)
    assert_bytes_equal(from_torch(out), exp_out, "output")

    grad_out = random_array(exp_out.shape, params[4], 1)
    outputs, grads = [out], [to_torch(grad_out)]
    grad_pp = None
    if with_probs:
        assert_bytes_equal(from_torch(permuted_probs), exp_pp, "permuted_probs")
        grad_pp = random_array((n_out,), "float32", 2)
        outputs.append(permuted_probs)
        grads.append(to_torch(grad_pp))
    torch.autograd.backward(outputs, grads)
    exp_gx, exp_gp = ref.permute_bwd_ref(grad_out, expected_map, case.map_type, case.x.shape[0], grad_pp,
                                         case.num_slots)
    assert_bytes_equal(from_torch(x.grad), exp_gx, "grad inp")
    if with_probs:
        assert_bytes_equal(from_torch(probs.grad), exp_gp, "grad probs")


@pytest.mark.parametrize("with_probs", [False, True])
@pytest.mark.parametrize("params", CASES, ids=case_id)
def test_moe_unpermute_matches_reference(params, with_probs):
    case = build(params, seed=3)
    expected_map = case.expected_row_id_map()
    T, H = case.x.shape
    y_np = random_array((case.resolved_num_out, H), params[4], 4)
    y = to_torch(y_np).requires_grad_()
    probs = to_torch(case.probs).requires_grad_() if with_probs else None
    restore_shape = (T, H) if case.map_type == "index" and not with_probs else None
    out = tep.moe_unpermute(y, torch.from_numpy(expected_map), merging_probs=probs, restore_shape=restore_shape,
                            map_type=case.map_type)
    probs_np = case.probs if with_probs else None
    assert_bytes_equal(from_torch(out), ref.unpermute_ref(y_np, expected_map, case.map_type, T, probs_np), "output")

    grad_out = random_array((T, H), params[4], 5)
    out.backward(to_torch(grad_out))
    exp_gy, exp_gp = ref.unpermute_bwd_ref(grad_out, y_np, expected_map, case.map_type, probs_np)
    assert_bytes_equal(from_torch(y.grad), exp_gy, "grad inp")
    if with_probs:
        assert_bytes_equal(from_torch(probs.grad), exp_gp, "grad merging_probs")


@pytest.mark.parametrize("map_type", ["index", "mask"])
def test_moe_unpermute_large_topk_gradients_match_float64(map_type):
    # topK = 32 of 64 experts: the fp32 sums stay within a few ulps of exact float64 math.
    case = make_case(11, 12, 64, 32, 48, "float32", map_type)
    expected_map = case.expected_row_id_map()
    T, H = case.x.shape
    y_np = random_array((case.resolved_num_out, H), "float32", 6)
    y = to_torch(y_np).requires_grad_()
    probs = to_torch(case.probs).requires_grad_()
    out = tep.moe_unpermute(y, torch.from_numpy(expected_map), merging_probs=probs, map_type=map_type)
    grad_out = random_array((T, H), "float32", 7)
    out.backward(to_torch(grad_out))

    exact_out = np.zeros((T, H))
    exact_gy = np.zeros_like(y_np, dtype=np.float64)
    exact_gp = np.zeros(case.probs.shape)
    for t, pairs in enumerate(ref.kept_pairs_ref(expected_map, map_type, T)):
        assert len(pairs) == 32
        for row, col in pairs:
            p = float(case.probs[t, col])
            exact_out[t] += y_np[row].astype(np.float64) * p
            exact_gy[row] = grad_out[t].astype(np.float64) * p
            exact_gp[t, col] = np.dot(grad_out[t].astype(np.float64), y_np[row].astype(np.float64))
    np.testing.assert_allclose(from_torch(out), exact_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(from_torch(y.grad), exact_gy, rtol=1e-6, atol=0)
    np.testing.assert_allclose(from_torch(probs.grad), exact_gp, rtol=1e-5, atol=1e-5)


def test_moe_unpermute_merging_probs_gradient_at_hidden_4096_matches_float64():
    # The merging_probs gradient is a length-H dot product: the canonical 32-lane sum (§11) keeps it
    # within TE's 2e-4 of float64 at H = 4096 (a sequential fp32 sum was off by 3-4e-3).
    case = make_case(13, 16, 8, 2, 4096, "float32", "index")
    expected_map = case.expected_row_id_map()
    T, H = case.x.shape
    y_np = random_array((case.resolved_num_out, H), "float32", 8)
    y = to_torch(y_np)
    probs = to_torch(case.probs).requires_grad_()
    out = tep.moe_unpermute(y, torch.from_numpy(expected_map), merging_probs=probs, map_type="index")
    grad_out = random_array((T, H), "float32", 9)
    out.backward(to_torch(grad_out))
    exact = np.zeros(case.probs.shape)
    for t, pairs in enumerate(ref.kept_pairs_ref(expected_map, "index", T)):
        for row, col in pairs:
            exact[t, col] = np.dot(grad_out[t].astype(np.float64), y_np[row].astype(np.float64))
    np.testing.assert_allclose(from_torch(probs.grad), exact, rtol=0, atol=2e-4)


@pytest.mark.parametrize("map_type", ["index", "mask"])
def test_moe_permute_and_unpermute_keep_low_precision_probs_dtypes(map_type):
    case = make_case(12, 10, 8, 3, 16, "float16", map_type, drop=True, probs_dtype="bfloat16")
    x = to_torch(case.x).requires_grad_()
    probs = to_torch(case.probs).requires_grad_()
    out, permuted_probs, row_id_map = tep.moe_permute_with_probs(x, probs, torch.from_numpy(case.routing_map),
                                                                 case.num_out_tokens, map_type=map_type)
    back = tep.moe_unpermute(out, row_id_map, merging_probs=probs, map_type=map_type)
    assert permuted_probs.dtype == torch.bfloat16 and back.dtype == torch.float16
    expected_map = case.expected_row_id_map()
    exp_out, exp_pp = ref.permute_ref(case.x, expected_map, map_type, case.resolved_num_out, case.probs)
    assert_bytes_equal(from_torch(permuted_probs), exp_pp, "permuted_probs")
    exp_back = ref.unpermute_ref(exp_out, expected_map, map_type, case.x.shape[0], case.probs)
    assert_bytes_equal(from_torch(back), exp_back, "unpermuted")
    grad_back = random_array(case.x.shape, "float16", 13)
    back.backward(to_torch(grad_back))
    exp_gy, exp_gp_unpermute = ref.unpermute_bwd_ref(grad_back, exp_out, expected_map, map_type, case.probs)
    exp_gx, _ = ref.permute_bwd_ref(exp_gy, expected_map, map_type, case.x.shape[0], None, case.num_slots)
    assert_bytes_equal(from_torch(x.grad), exp_gx, "grad inp")
    assert_bytes_equal(from_torch(probs.grad), exp_gp_unpermute, "grad probs (through merging_probs only)")


QUANTIZERS = [
    te.Float8CurrentScalingQuantizer("e4m3", columnwise=False),
    te.Float8DelayedScalingQuantizer("e5m2", columnwise=False),
    te.MXFP8Quantizer("e4m3", columnwise=False),
    te.MXFP8Quantizer("e5m2", columnwise=False),
    te.Float8BlockQuantizer("e4m3", columnwise=False),
    te.NVFP4Quantizer(columnwise=False, with_rht=True),
]


def _scale_padding(qt, n_out):
    """The rowwise scales of rows >= n_out (padding), for formats with per-row scales."""
    scales = from_torch(qt.rowwise_scale_inv)
    if qt.quantizer.scaling_mode == "fp8_block":  # (K/128, roundup(R, 4)), R-minor
        assert scales.shape == (qt.shape[1] // 128, -(-n_out // 4) * 4)
        return scales[:, n_out:]
    assert scales.shape[0] == -(-n_out // 128) * 128
    return scales[n_out:]


@pytest.mark.parametrize("map_type", ["index", "mask"])
@pytest.mark.parametrize("quantizer", QUANTIZERS, ids=lambda q: f"{q.scaling_mode}-{getattr(q, 'fp8_dtype', 'e2m1')}")
def test_moe_permute_quantized_matches_permuted_dequantized(quantizer, map_type):
    hidden = 128 if quantizer.scaling_mode == "fp8_block" else 64
    case = make_case(21, 128, 8, 2, hidden, "bfloat16", map_type, drop=True)  # 256 pairs, 170 kept
    x = to_torch(case.x)
    kwargs = {"scale": torch.tensor([0.75])} if quantizer.scaling_mode == "fp8_delayed" else {}
    qt = tep.quantize(x, quantizer, **kwargs)
    probs = to_torch(case.probs)
    out, permuted_probs, row_id_map = tep.moe_permute_with_probs(qt, probs, torch.from_numpy(case.routing_map),
                                                                 case.num_out_tokens, map_type=map_type)
    n_out = case.resolved_num_out
    assert isinstance(out, te.QuantizedTensor) and out.shape == (n_out, hidden) and out.quantizer == quantizer
    expected_map = case.expected_row_id_map()
    assert_bytes_equal(from_torch(row_id_map), expected_map, "row_id_map")
    dequantized = from_torch(tep.dequantize(qt, torch.float32))
    exp, exp_pp = ref.permute_ref(dequantized, expected_map, map_type, n_out, case.probs)
    assert_bytes_equal(from_torch(tep.dequantize(out, torch.float32)), exp, "dequantized permuted")
    assert_bytes_equal(from_torch(permuted_probs), exp_pp, "permuted_probs")
    data, _ = ref.permute_ref(from_torch(qt.rowwise_data).view(np.uint8), expected_map, map_type, n_out)
    assert_bytes_equal(from_torch(out.rowwise_data).view(np.uint8), data, "rowwise_data")
    if quantizer.scaling_mode in ("fp8_current", "fp8_delayed"):
        assert out.rowwise_scale_inv is qt.rowwise_scale_inv
    else:
        assert not _scale_padding(out, n_out).any()


def test_moe_sort_chunks_by_index_matches_reference():
    rng = np.random.default_rng(8)
    split = np.array([3, 0, 5, 2, 4], np.int64)
    order = np.array([2, 4, 0, 3, 1], np.int64)
    x_np = rng.standard_normal((14, 8)).astype(np.float32).astype(NUMPY_DTYPES["bfloat16"])
    p_np = rng.random(14).astype(np.float32)
    x, probs = to_torch(x_np).requires_grad_(), to_torch(p_np).requires_grad_()
    out, out_probs = tep.moe_sort_chunks_by_index_with_probs(x, probs, torch.from_numpy(split), torch.from_numpy(order))
    assert_bytes_equal(from_torch(out), ref.sort_chunks_ref(x_np, split, order), "output")
    assert_bytes_equal(from_torch(out_probs), ref.sort_chunks_ref(p_np, split, order), "permuted_probs")
    plain = tep.moe_sort_chunks_by_index(x.detach(), torch.from_numpy(split), torch.from_numpy(order))
    assert_bytes_equal(from_torch(plain), from_torch(out), "without probs")
    g, gp = random_array((14, 8), "bfloat16", 9), random_array((14,), "float32", 10)
    torch.autograd.backward([out, out_probs], [to_torch(g), to_torch(gp)])
    dst = ref.chunk_row_id_map_ref(split, order, 14)
    assert_bytes_equal(from_torch(x.grad), g[dst], "grad inp")
    assert_bytes_equal(from_torch(probs.grad), gp[dst], "grad probs")


def test_moe_permute_drops_overflow_highest_experts_first():
    ids = torch.tensor([[3, 0], [1, 3], [0, 2]], dtype=torch.int32)
    x = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    out, row_id_map = tep.moe_permute(x, ids, num_out_tokens=4, map_type="index")
    # sorted (expert, t, k): (0,0,1) (0,2,0) (1,1,0) (2,2,1) | dropped: (3,0,0) (3,1,1)
    assert row_id_map.tolist() == [-1, 2, 1, 0, -1, 3]
    assert out.tolist() == [[0, 1], [4, 5], [2, 3], [4, 5]]
    mask = torch.tensor([[1, 0, 1], [1, 1, 1], [0, 1, 0]], dtype=torch.bool)
    out, row_id_map = tep.moe_permute(x, mask, num_out_tokens=4, map_type="mask")
    # expert-major rows: e0: t0 t1 | e1: t1 t2 | e2: t0 t1 (dropped)
    assert row_id_map.tolist() == [[0, -1, -1, 0, -1, -1, 1], [1, 2, -1, 0, 1, -1, 2], [3, -1, -1, 1, -1, -1, 1]]
    assert out.tolist() == [[0, 1], [2, 3], [2, 3], [4, 5]]
    padded, _ = tep.moe_permute(x, mask, num_out_tokens=9, map_type="mask")
    assert padded[6:].eq(0).all() and padded.shape == (9, 2)


def test_kernels_drop_out_of_range_values_inside_graphs():
    # What a compiled graph runs (no eager value checks): bad entries are dropped, never read out of bounds.
    ids = torch.tensor([[-5, 1], [0, -1]], dtype=torch.int32)
    assert torch.ops.twinengine.moe_row_id_map(ids, 4, "index").tolist() == [-1, 0, 1, -1]
    y = torch.ones(3, 2)
    bad_map = torch.tensor([[0, 7, -1, 0, 1, -1, 2], [2, -1, -1, 9, -1, -1, 5]], dtype=torch.int32)
    out = torch.ops.twinengine.moe_unpermute(y, bad_map, None, 2, "mask")
    assert out.tolist() == [[1, 1], [0, 0]]  # row 7 out of range; expert id 9 out of range; n 5 > E
    split, order = torch.tensor([2, -3, 4], dtype=torch.int32), torch.tensor([2, 7, 2], dtype=torch.int32)
    assert torch.ops.twinengine.moe_chunk_map(split, order, 5).tolist() == [-1, -1, 0, 1, 2]


@pytest.mark.parametrize("call, error, match", [
    (lambda: tep.moe_permute(torch.ones(3, 4), torch.tensor([[0], [-1], [2]], dtype=torch.int32), map_type="index"),
     ValueError, "expert ids must be >= 0"),
    (lambda: tep.moe_permute(torch.ones(2, 4), torch.tensor([[0, 2], [1, 0]], dtype=torch.int32)),
     ValueError, "must hold only 0 and 1"),
    (lambda: tep.moe_permute(torch.ones(2, 4), torch.ones(2, 3), map_type="mask"), TypeError, "routing_map must"),
    (lambda: tep.moe_permute(torch.ones(3, 4), torch.ones(2, 3, dtype=torch.bool)), ValueError, "must have 2 rows"),
    (lambda: tep.moe_permute(torch.ones(2, 4), torch.ones(2, 3, dtype=torch.bool), map_type="sparse"),
     ValueError, "map_type must be"),
    (lambda: tep.moe_permute_with_probs(torch.ones(2, 4), torch.ones(2, 2), torch.ones(2, 3, dtype=torch.bool)),
     ValueError, r"probs must have shape \(2, 3\)"),
    (lambda: tep.moe_unpermute(torch.ones(4, 4), torch.zeros(2, 4, dtype=torch.int32)), ValueError,
     "2 \\* num_experts \\+ 1"),
    (lambda: tep.moe_unpermute(torch.ones(4, 4), torch.zeros(4, dtype=torch.int32), map_type="index",
                               restore_shape=(3, 4)), ValueError, r"shape \(topK \* 3,\)"),
    (lambda: tep.moe_sort_chunks_by_index(torch.ones(5, 2), torch.tensor([2, 2]), torch.tensor([1, 0])),
     ValueError, "must sum to the 5 rows"),
    (lambda: tep.moe_sort_chunks_by_index(torch.ones(4, 2), torch.tensor([2, 2]), torch.tensor([1, 1])),
     ValueError, "permutation"),
    (lambda: tep.moe_permute(tep.quantize(torch.ones(32, 32), te.MXFP8Quantizer("e4m3")),
                             torch.ones(32, 2, dtype=torch.bool)), ValueError, "rowwise data only"),
    (lambda: tep.moe_permute(tep.quantize(torch.ones(32, 32), te.MXFP8Quantizer(columnwise=False,
                                                                                  with_2d_quantization=True)),
                             torch.ones(32, 2, dtype=torch.bool)), TypeError, "scales of single rows"),
    (lambda: tep.moe_unpermute(tep.quantize(torch.ones(4, 32), te.Float8CurrentScalingQuantizer(columnwise=False)),
                               torch.zeros(4, 3, dtype=torch.int32)), TypeError, "dequantize it first"),
])
def test_moe_ops_reject_bad_arguments(call, error, match):
    with pytest.raises(error, match=f"twinengine.moe_[a-z_]+: .*{match}"):
        call()


def test_moe_ops_pass_opcheck():
    case = build(CASES[6])
    x = to_torch(case.x).requires_grad_()
    probs = to_torch(case.probs).requires_grad_()
    mask = torch.from_numpy(case.mask).view(torch.uint8)
    n_out = case.resolved_num_out
    row_id_map = torch.ops.twinengine.moe_row_id_map(mask, n_out, "mask")
    ids = torch.from_numpy(case.ids)
    index_map = torch.ops.twinengine.moe_row_id_map(ids, 0, "index")
    y = torch.randn(n_out, x.shape[1], requires_grad=True)
    samples = [
        (torch.ops.twinengine.moe_row_id_map, (mask, n_out, "mask")),
        (torch.ops.twinengine.moe_row_id_map, (ids, 5, "index")),
        (torch.ops.twinengine.moe_chunk_map, (torch.tensor([4, 5], dtype=torch.int32),
                                               torch.tensor([1, 0], dtype=torch.int32), 9)),
        (torch.ops.twinengine.moe_permute, (x, row_id_map, probs, 9, n_out, "mask", None)),
        (torch.ops.twinengine.moe_permute, (x, index_map, None, 9, 27, "index", None)),
        (torch.ops.twinengine.moe_permute, (torch.randint(0, 255, (128, 4), dtype=torch.uint8), row_id_map, None, 9,
                                            n_out, "mask", 128)),
        (torch.ops.twinengine.moe_permute_bwd, (y.detach(), row_id_map, torch.randn(n_out), 9, "mask", None)),
        (torch.ops.twinengine.moe_unpermute, (y, row_id_map, probs, 9, "mask")),
        (torch.ops.twinengine.moe_unpermute, (y.detach()[:0], index_map, None, 9, "index")),
        (torch.ops.twinengine.moe_unpermute_bwd, (torch.randn(9, x.shape[1]), y.detach(), row_id_map, probs.detach(),
                                                  "mask")),
    ]
    for op, args in samples:
        torch.library.opcheck(op, args)


def _moe_block(x, probs, ids, mask, num_out_tokens: int):
    """Index map with the default size, mask map with an explicit one, then unpermute both."""
    out_i, pp_i, map_i = tep.moe_permute_with_probs(x, probs[:, :2], ids, map_type="index")
    back_i = tep.moe_unpermute(out_i * 2, map_i, merging_probs=probs[:, :2], map_type="index")
    out_m, pp_m, map_m = tep.moe_permute_with_probs(x, probs, mask, num_out_tokens=num_out_tokens)
    back_m = tep.moe_unpermute(out_m, map_m, merging_probs=probs, restore_shape=x.shape)
    return out_i, pp_i, map_i, back_i, out_m, pp_m, map_m, back_m


def test_moe_ops_compile_dynamic_matches_eager():
    compiled = torch.compile(_moe_block, fullgraph=True, backend="inductor", dynamic=True)
    for seed, T in ((0, 6), (1, 11)):
        case = make_case(seed, T, 4, 2, 8, "float32", "mask")
        results = []
        for fn in (_moe_block, compiled):
            x = to_torch(case.x).requires_grad_()
            probs = to_torch(case.probs).requires_grad_()
            outs = fn(x, probs, torch.from_numpy(case.ids), torch.from_numpy(case.mask), T * 2 - 1)
            (outs[3].sum() + outs[7].sum() + outs[1].sum() + outs[5].sum()).backward()
            results.append([from_torch(o) for o in outs] + [from_torch(x.grad), from_torch(probs.grad)])
        for i, (eager, comp) in enumerate(zip(*results)):
            assert_bytes_equal(comp, eager, f"T={T} result {i}")


def test_moe_permute_mask_default_size_under_compile_raises():
    fn = torch.compile(lambda x, m: tep.moe_permute(x, m)[0], fullgraph=True, backend="eager")
    with pytest.raises(Exception, match="pass num_out_tokens explicitly"):
        fn(torch.ones(3, 4), torch.ones(3, 2, dtype=torch.bool))


def test_moe_permute_quantized_compile_matches_eager():
    quantizer = te.MXFP8Quantizer("e4m3", columnwise=False)
    case = make_case(2, 64, 8, 2, 64, "float32", "index")

    def permute_dequantized(x, ids):
        out, _ = tep.moe_permute(tep.quantize(x, quantizer), ids, map_type="index")
        return tep.dequantize(out, torch.float32)

    compiled = torch.compile(permute_dequantized, fullgraph=True, backend="inductor")
    x, ids = to_torch(case.x), torch.from_numpy(case.ids)
    assert_bytes_equal(from_torch(compiled(x, ids)), from_torch(permute_dequantized(x, ids)), "compiled vs eager")


# ---- zero tokens ------------------------------------------------------------------------------

def _empty_block(x, probs_mask, probs_index, mask, ids, split_sizes, sorted_index, chunk_probs):
    out_m, pp_m, map_m = tep.moe_permute_with_probs(x, probs_mask, mask, num_out_tokens=0)
    out_i, map_i = tep.moe_permute(x, ids, map_type="index")
    back = tep.moe_unpermute(out_m, map_m, merging_probs=probs_mask, restore_shape=x.shape)
    back_i = tep.moe_unpermute(out_i, map_i, restore_shape=x.shape, map_type="index")
    sorted_x, sorted_p = tep.moe_sort_chunks_by_index_with_probs(x, chunk_probs, split_sizes, sorted_index)
    sorted_only = tep.moe_sort_chunks_by_index(x, split_sizes, sorted_index)
    pp_i = tep.moe_permute_with_probs(x, probs_index, ids, map_type="index")[1]
    return out_m, pp_m, out_i, back, back_i, sorted_x, sorted_p, sorted_only, pp_i


@pytest.mark.parametrize("compiled", [False, True])
def test_moe_ops_zero_tokens_give_empty_outputs_and_gradients(compiled):
    fn = torch.compile(_empty_block, fullgraph=True, backend="inductor") if compiled else _empty_block
    H, E, K = 8, 4, 2
    x = torch.randn(0, H, requires_grad=True)
    probs_mask = torch.rand(0, E, requires_grad=True)
    probs_index = torch.rand(0, K, requires_grad=True)
    chunk_probs = torch.rand(0, requires_grad=True)
    outs = fn(x, probs_mask, probs_index, torch.zeros(0, E, dtype=torch.bool), torch.zeros(0, K, dtype=torch.int32),
              torch.tensor([0, 0, 0], dtype=torch.int32), torch.tensor([2, 0, 1], dtype=torch.int32), chunk_probs)
    shapes = [(0, H), (0,), (0, H), (0, H), (0, H), (0, H), (0,), (0, H), (0,)]
    assert [tuple(o.shape) for o in outs] == shapes
    sum(o.sum() for o in outs).backward()
    for name, t in (("x", x), ("probs_mask", probs_mask), ("probs_index", probs_index), ("chunk_probs", chunk_probs)):
        assert t.grad is not None and t.grad.shape == t.shape, name
