"""The fusion planner and the shared basic-op checks (core/fusion)."""

import pytest

from twinengine.fusion import OpDesc, check_op_api, check_sequential, plan
from twinengine.fusion.blocks import activation_kind, block_layout, mlp_widths, normalization_kind


def _descs(*kinds):
    return [OpDesc(kind, kind if kind != "activation" else "GELU", activation="gelu" if kind == "activation" else None)
            for kind in kinds]


def _groups(descs, quantized=True, fuse=True):
    return [(g.ops, g.quantize_for, g.dact_dbias, g.quantize_grad_for) for g in plan(descs, quantized, fuse)]


def test_plan_norm_hands_quantized_input_to_linear_under_a_recipe():
    d = _descs("rmsnorm", "basic_linear")
    assert _groups(d) == [((0,), 1, None, None), ((1,), None, None, None)]
    assert _groups(d, quantized=False) == [((0,), None, None, None), ((1,), None, None, None)]


def test_plan_norm_absorbs_quantize_op():
    d = _descs("layernorm", "quantize", "basic_linear")
    assert _groups(d, quantized=False)[0] == ((0, 1), 1, None, None)


def test_plan_linear_bias_activation_fuses_backward_with_grad_quantize():
    d = _descs("basic_linear", "bias", "activation", "basic_linear")
    assert _groups(d) == [((0, 1, 2), 3, 1, 0), ((3,), None, None, None)]
    assert _groups(d, quantized=False) == [((0, 1, 2), None, 1, None), ((3,), None, None, None)]


def test_plan_linear_tails_and_add_norm():
    assert _groups(_descs("basic_linear", "bias", "add_extra_input"))[0][0] == (0, 1, 2)
    assert _groups(_descs("basic_linear", "constant_scale", "add_extra_input"))[0][0] == (0, 1, 2)
    assert _groups(_descs("basic_linear", "add_extra_input"))[0][0] == (0, 1)
    assert _groups(_descs("add_extra_input", "rmsnorm", "basic_linear"))[0] == ((0, 1), 2, None, None)
    assert _groups(_descs("bias", "activation"))[0] == ((0, 1), None, 0, None)


def test_plan_unfused_runs_every_op_alone_and_covers_every_op_once():
    d = _descs("rmsnorm", "basic_linear", "bias", "activation", "basic_linear", "bias", "dropout", "user")
    assert _groups(d, fuse=False) == [((i,), None, None, None) for i in range(len(d))]
    covered = [i for g in plan(d, True) for i in g.ops]
    assert covered == list(range(len(d)))


def test_plan_describe_is_readable():
    d = _descs("rmsnorm", "basic_linear", "bias", "activation")
    lines = [g.describe(d) for g in plan(d, True)]
    assert lines[0] == "[0:rmsnorm] rmsnorm -> writes the quantized input of 1:basic_linear"
    assert "backward dGELU+dBias+Quantize" in lines[1]


def test_op_api_check_texts():
    with pytest.raises(TypeError, match="defines both op_forward and op_forward_compute"):
        check_op_api("MyOp", True, True, True)
    with pytest.raises(TypeError, match="defines neither op_forward nor"):
        check_op_api("MyOp", False, False, True)
    with pytest.raises(TypeError, match="defines no op_backward"):
        check_op_api("MyOp", False, True, False)
    with pytest.raises(ValueError, match="needs at least one basic operation"):
        check_sequential(0)
    with pytest.raises(ValueError, match="unknown"):
        OpDesc("unknown", "x")


def test_block_arguments():
    assert normalization_kind("RMSNorm") == "rmsnorm"
    with pytest.raises(ValueError, match="normalization must be 'LayerNorm' or 'RMSNorm'"):
        normalization_kind("BatchNorm")
    assert activation_kind("SwiGLU") == "swiglu"
    with pytest.raises(ValueError, match="activation must be one of"):
        activation_kind("tanh")
    assert mlp_widths("swiglu", 64) == 128 and mlp_widths("gelu", 64) == 64
    assert block_layout("RMSNorm", (("fc1_", True), ("fc2_", False)), "gelu", True) == (
        ("norm", ("layer_norm_weight",)), ("extra_output", ()), ("linear", ("fc1_weight",)), ("bias", ("fc1_bias",)),
        ("activation", ()), ("linear", ("fc2_weight",)))


def test_group_backward_steps_and_emitter():
    d = _descs("basic_linear", "bias", "activation", "dropout")
    (group, *_) = plan(d[:3], True)
    assert group.backward_steps() == ((1, 2), (0,))
    assert plan(d, True, fuse=False)[0].backward_steps() == ((0,),)
    groups = plan(_descs("layernorm", "quantize", "basic_linear"), True)
    assert groups[0].emitter == 0 and groups[1].emitter is None
