"""Core of the permute family: planned shapes, size resolution, shared error texts, quantized
layouts, and hand-worked checks of the NumPy reference (no framework involved)."""

from __future__ import annotations

import numpy as np
import pytest
from reference import permute as ref

import twinengine as te
from twinengine.ops.opdef import round_up
from twinengine.ops.permute import (
    CHUNK_MAP,
    PERMUTE,
    PERMUTE_BWD,
    ROW_ID_MAP,
    UNPERMUTE,
    UNPERMUTE_BWD,
    check_chunk_values,
    check_quantized_input,
    check_routing_values,
    quantized_row_fields,
    resolve_num_out_tokens,
    unpermute_num_tokens,
)
from twinengine.ops.quantize import ArrayMeta as A


def _shapes(call):
    return [(spec.name, spec.shape, spec.dtype) for spec in call.outputs]


def test_row_id_map_plan_shapes():
    index = ROW_ID_MAP.plan(A((5, 3), "int32"), 15, "index")
    assert index.op == "permute_row_id_map_index"
    assert _shapes(index) == [("row_id_map", (15,), "int32"), ("workspace", (30,), "int64")]
    mask = ROW_ID_MAP.plan(A((5, 8), "uint8"), 7, "mask")
    assert _shapes(mask) == [("row_id_map", (5, 17), "int32"), ("workspace", (8,), "int64")]
    assert mask.attr_dict() == {"map_type": 1, "num_tokens": 5, "num_slots": 8, "num_out_tokens": 7}


def test_permute_and_unpermute_plan_shapes():
    call = PERMUTE.plan(A((5, 16), "bfloat16"), A((5, 17), "int32"), A((5, 8), "float32"), 5, 9, "mask")
    assert _shapes(call) == [("output", (9, 16), "bfloat16"), ("permuted_probs", (9,), "float32")]
    assert call.inputs == ("inp", "row_id_map", "probs")
    scale_rows = PERMUTE.plan(A((128, 4), "uint8"), A((15,), "int32"), None, 5, 9, "index", 128)
    assert _shapes(scale_rows) == [("output", (128, 4), "uint8")] and scale_rows.attr_dict()["num_slots"] == 3
    bwd = PERMUTE_BWD.plan(A((9, 16), "float32"), A((15,), "int32"), A((9,), "float16"), 5, "index")
    assert _shapes(bwd) == [("grad_inp", (5, 16), "float32"), ("grad_probs", (5, 3), "float16")]
    un = UNPERMUTE.plan(A((9, 16), "float16"), A((5, 17), "int32"), None, 5, "mask")
    assert _shapes(un) == [("output", (5, 16), "float16")] and un.attr_dict()["num_out_tokens"] == 9
    un_bwd = UNPERMUTE_BWD.plan(A((5, 16), "float16"), A((9, 16), "float16"), A((5, 17), "int32"),
                                A((5, 8), "bfloat16"), "mask")
    assert _shapes(un_bwd) == [("grad_y", (9, 16), "float16"), ("grad_merging_probs", (5, 8), "bfloat16")]
    chunks = CHUNK_MAP.plan(A((4,), "int32"), A((4,), "int32"), 11)
    assert _shapes(chunks) == [("row_id_map", (11,), "int32")]


def test_resolve_num_out_tokens():
    op = "moe_permute"
    assert resolve_num_out_tokens(op, "index", A((6, 4), "int32"), -1) == 24
    assert resolve_num_out_tokens(op, "index", A((6, 4), "int32"), 0) == 24
    assert resolve_num_out_tokens(op, "mask", A((6, 4), "uint8"), 5) == 5
    assert resolve_num_out_tokens(op, "mask", A((6, 4), "uint8"), -1, count_routed=lambda: 13) == 13
    assert resolve_num_out_tokens(op, "mask", A((6, 4), "uint8"), 4, count_routed=lambda: 1 / 0) == 4
    with pytest.raises(ValueError, match="twinengine.moe_permute: .*pass num_out_tokens explicitly"):
        resolve_num_out_tokens(op, "mask", A((6, 4), "uint8"), -1)
    with pytest.raises(TypeError, match="num_out_tokens must be an int"):
        resolve_num_out_tokens(op, "mask", A((6, 4), "uint8"), None, count_routed=lambda: 13)


def test_unpermute_num_tokens():
    op = "moe_unpermute"
    y = A((12, 8), "float32")
    assert unpermute_num_tokens(op, "mask", y, A((4, 7), "int32"), None, None) == 4
    assert unpermute_num_tokens(op, "index", y, A((12,), "int32"), None, (2, 3, 8)) == 6
    assert unpermute_num_tokens(op, "index", y, A((12,), "int32"), A((4, 3), "float32"), None) == 4
    assert unpermute_num_tokens(op, "index", y, A((12,), "int32"), None, None) == 12
    with pytest.raises(ValueError, match="must end in the hidden size 8"):
        unpermute_num_tokens(op, "index", y, A((12,), "int32"), None, (4, 3))
    with pytest.raises(ValueError, match="does not hold the 4 tokens"):
        unpermute_num_tokens(op, "mask", y, A((4, 7), "int32"), None, (5, 8))


@pytest.mark.parametrize("plan, error, match", [
    (lambda: ROW_ID_MAP.plan(A((5, 3), "int64"), 15, "index"), TypeError, "index routing_map must have dtype int32"),
    (lambda: ROW_ID_MAP.plan(A((5,), "int32"), 15, "index"), ValueError, "routing_map must be 2-D"),
    (lambda: ROW_ID_MAP.plan(A((5, 0), "int32"), 15, "index"), ValueError, "at least one slot"),
    (lambda: ROW_ID_MAP.plan(A((5, 3), "int32"), 2**31, "index"), ValueError, "int32"),
    (lambda: ROW_ID_MAP.plan(A((5, 3), "int32"), 4, "dense"), ValueError, "map_type must be"),
    (lambda: PERMUTE.plan(A((5, 16), "float32"), A((5, 16), "int32"), None, 5, 9, "mask"), ValueError,
     "2 \\* num_experts \\+ 1"),
    (lambda: PERMUTE.plan(A((5, 16), "float32"), A((5, 17), "int64"), None, 5, 9, "mask"), TypeError,
     "row_id_map must be int32"),
    (lambda: PERMUTE.plan(A((5, 16), "float32"), A((15,), "int32"), A((5, 4), "float32"), 5, 9, "index"),
     ValueError, r"probs must have shape \(5, 3\) = \(num_tokens, topK\)"),
    (lambda: PERMUTE.plan(A((5, 16), "float32"), A((15,), "int32"), A((5, 3), "int32"), 5, 9, "index"),
     TypeError, "probs must be float32"),
    (lambda: UNPERMUTE.plan(A((9, 16), "uint8"), A((15,), "int32"), None, 5, "index"), TypeError,
     "inp must be float32"),
    (lambda: UNPERMUTE_BWD.plan(A((5, 16), "float32"), A((9, 16), "bfloat16"), A((15,), "int32"), None, "index"),
     ValueError, "grad_out must be bfloat16"),
    (lambda: CHUNK_MAP.plan(A((4,), "int32"), A((3,), "int32"), 11), ValueError, "same length"),
    (lambda: check_routing_values("moe_permute", "index", -2, 5), ValueError, "expert id -2"),
    (lambda: check_routing_values("moe_permute", "mask", 0, 3), ValueError, "found 3"),
    (lambda: check_chunk_values("moe_sort_chunks_by_index", [2, -1, 3], [0, 1, 2], 4), ValueError, ">= 0"),
])
def test_permute_ops_reject_bad_arguments(plan, error, match):
    with pytest.raises(error, match=f"twinengine.moe_[a-z_]+: .*{match}"):
        plan()


def test_quantized_inputs_move_row_scales_only():
    mx = te.QuantizedTensor(rowwise_data=1, rowwise_scale_inv=2, quantizer=te.MXFP8Quantizer(columnwise=False),
                            shape=(64, 64))
    check_quantized_input("moe_permute", mx)
    assert quantized_row_fields(mx, 85) == (("rowwise_data", 85, False),
                                            ("rowwise_scale_inv", round_up(85, 128), False))
    fp8 = te.QuantizedTensor(rowwise_data=1, rowwise_scale_inv=2, amax=3,
                             quantizer=te.Float8CurrentScalingQuantizer(columnwise=False), shape=(64, 64))
    assert quantized_row_fields(fp8, 85) == (("rowwise_data", 85, False),)
    block = te.QuantizedTensor(rowwise_data=1, rowwise_scale_inv=2, quantizer=te.Float8BlockQuantizer(columnwise=False),
                               shape=(128, 128))
    check_quantized_input("moe_permute", block)
    assert quantized_row_fields(block, 85) == (("rowwise_data", 85, False), ("rowwise_scale_inv", 88, True))
    nvfp4 = te.QuantizedTensor(rowwise_data=1, rowwise_scale_inv=2, amax=3,
                               quantizer=te.NVFP4Quantizer(columnwise=False), shape=(64, 64))
    check_quantized_input("moe_permute", nvfp4)
    assert quantized_row_fields(nvfp4, 85) == (("rowwise_data", 85, False), ("rowwise_scale_inv", 128, False))
    for quantizer, error in ((te.Float8BlockQuantizer(columnwise=False, block_scaling_dim=2), TypeError),
                             (te.NVFP4Quantizer(columnwise=False, with_2d_quantization=True), TypeError),
                             (te.MXFP8Quantizer(), ValueError)):
        qt = te.QuantizedTensor(rowwise_data=1, rowwise_scale_inv=2, quantizer=quantizer, shape=(64, 64))
        with pytest.raises(error, match="twinengine.moe_permute: "):
            check_quantized_input("moe_permute", qt)


def test_reference_row_id_maps_by_hand():
    ids = np.array([[3, 0], [1, 3], [0, 2]])
    # stable (expert, t, k) order: (0,0,1) (0,2,0) (1,1,0) (2,2,1) (3,0,0) (3,1,1)
    assert ref.row_id_map_index_ref(ids, 6).tolist() == [4, 2, 1, 0, 5, 3]
    assert ref.row_id_map_index_ref(ids, 4).tolist() == [-1, 2, 1, 0, -1, 3]
    mask = np.array([[1, 0, 1], [1, 1, 1], [0, 1, 0]])
    assert ref.row_id_map_mask_ref(mask, 6).tolist() == [[0, 4, -1, 0, 2, -1, 2], [1, 2, 5, 0, 1, 2, 3],
                                                          [3, -1, -1, 1, -1, -1, 1]]
    assert ref.chunk_row_id_map_ref([2, 1, 2], [2, 0, 1], 5).tolist() == [2, 3, 4, 0, 1]
    x = np.arange(10).reshape(5, 2)
    assert ref.sort_chunks_ref(x, [2, 1, 2], [2, 0, 1]).tolist() == [[6, 7], [8, 9], [0, 1], [2, 3], [4, 5]]


def test_reference_unpermute_by_hand():
    y = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)
    row_id_map = np.array([0, 2, 1, -1], np.int32)  # T = 2, topK = 2: t0 -> rows 0, 1; t1 -> row 2
    probs = np.array([[0.5, 2.0], [4.0, 8.0]], np.float32)
    assert ref.unpermute_ref(y, row_id_map, "index", 2, probs).tolist() == [[6.5, 9.0], [20.0, 24.0]]
    grad_y, grad_p = ref.unpermute_bwd_ref(np.ones((2, 2), np.float32), y, row_id_map, "index", probs)
    assert grad_y.tolist() == [[0.5, 0.5], [2.0, 2.0], [4.0, 4.0]]
    assert grad_p.tolist() == [[3.0, 7.0], [11.0, 0.0]]


# ---- padding helpers ------------------------------------------------------------------------------

def test_padded_rows_is_the_static_worst_case():
    from twinengine.ops.permute import padded_rows
    assert padded_rows(0, 8, 16) == 0
    assert padded_rows(11, 4, 4) == 20          # (11 + 4·3) // 4 · 4
    assert padded_rows(3, 8, 16) == 48          # at most 3 nonempty blocks
    for counts in ([1, 0, 0, 2], [5, 5, 1, 0], [16, 16, 16, 16]):
        need = sum(-(-c // 16) * 16 for c in counts)
        assert need <= padded_rows(sum(counts), len(counts), 16)


@pytest.mark.parametrize("recipe, good, bad", [
    (None, 3, 0),
    ("Float8CurrentScaling", 32, 8),
    ("MXFP8BlockScaling", 64, 16),
    ("Float8BlockScaling", 256, 64),
])
def test_check_align_size_follows_the_recipe_row_alignment(recipe, good, bad):
    import twinengine as te
    from twinengine.ops.permute import check_align_size
    r = None if recipe is None else getattr(te.recipe, recipe)()
    check_align_size("op", good, r)
    with pytest.raises(ValueError, match="twinengine.op: align_size"):
        check_align_size("op", bad, r)
    with pytest.raises(TypeError, match="align_size must be an int"):
        check_align_size("op", 16.0, r)


def test_check_split_values():
    from twinengine.ops.permute import check_split_values
    check_split_values("op", [2, 0, 3], 5)
    check_split_values("op", [2, 0, 3], 9)
    with pytest.raises(ValueError, match="at most the 4 rows"):
        check_split_values("op", [2, 0, 3], 4)
    with pytest.raises(ValueError, match="must be >= 0"):
        check_split_values("op", [6, -1], 5)
