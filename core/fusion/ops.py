"""Descriptions of the basic operations of a fusible ``Sequential`` (data, not code).

Each frontend's basic op reports an :class:`OpDesc`; the planner (``planner.py``) reads only
these, so the torch and JAX ``Sequential`` of the same op list run the same kernel groups.
Argument checks shared by both frontends' basic ops live here too, so both raise the same text.
"""

from __future__ import annotations

import dataclasses
import math
import struct

from ..ops.opdef import fail

NORMS = ("layernorm", "rmsnorm", "l2norm")
"""Normalizations: their kernels can write the next Linear's quantized input (NUMERICS §11)."""

KINDS = NORMS + ("basic_linear", "bias", "activation", "dropout", "quantize", "constant_scale", "identity",
                 "reshape", "add_extra_input", "make_extra_output", "all_gather", "all_reduce", "reduce_scatter",
                 "shard_features", "user")
"""Every kind of basic op the planner knows; user-defined ops are "user" (never fused)."""


@dataclasses.dataclass(frozen=True)
class OpDesc:
    """What the planner knows of one basic op.

    Attributes:
        kind: one of KINDS.
        name: display name in ``Sequential.plan()`` (e.g. "RMSNorm", "SwiGLU").
        activation: the activation kind (core/ops/activation.py names) for kind "activation".
    """

    kind: str
    name: str
    activation: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"OpDesc.kind must be one of {KINDS}, got {self.kind!r}")

    @property
    def emits_quantized(self) -> bool:
        """Its kernel can quantize its own output for the next op (norms and activations)."""
        return self.kind in NORMS or self.kind == "activation"


_OP = "ops"


def check_op_api(cls_name: str, has_legacy: bool, has_split: bool, has_backward: bool) -> None:
    """A basic op defines exactly one forward API: ``op_forward`` (legacy) or the split pair
    ``op_forward_compute`` + ``op_forward_save_ctx``, and ``op_backward``.

    Raises:
        TypeError: neither or both forward APIs, or no op_backward.
    """
    if has_legacy and has_split:
        fail(_OP, TypeError, f"{cls_name} defines both op_forward and op_forward_compute/op_forward_save_ctx; "
             "define exactly one forward API")
    if not (has_legacy or has_split):
        fail(_OP, TypeError, f"{cls_name} defines neither op_forward nor op_forward_compute + op_forward_save_ctx; "
             "a basic op needs exactly one forward API")
    if not has_backward:
        fail(_OP, TypeError, f"{cls_name} defines no op_backward")


def check_sequential(num_ops: int) -> None:
    """Raises ValueError for an empty Sequential."""
    if num_ops == 0:
        fail("Sequential", ValueError, "needs at least one basic operation, got none")


def check_dropout_p(p: float) -> float:
    """p is a real number in [0, 1) after rounding to fp32 (NUMERICS §11: the kernels use the fp32 value)."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or math.isnan(p) or not 0.0 <= _fp32(p) < 1.0:
        fail("Dropout", ValueError, f"p must be a float in [0, 1) (after rounding to float32), got {p!r}")
    return float(p)


def _fp32(value: float) -> float:
    return struct.unpack("<f", struct.pack("<f", float(value)))[0]


def check_quantize_op_quantizer(quantizer) -> None:
    """The Quantize basic op takes a twinengine Quantizer of a current-scaling kind, or None."""
    from ..quantizers import Quantizer

    if quantizer is not None and not isinstance(quantizer, Quantizer):
        fail("Quantize", TypeError, f"quantizer must be a twinengine Quantizer, got {type(quantizer).__name__}")
    if quantizer is not None and quantizer.scaling_mode == "fp8_delayed":
        fail("Quantize", TypeError, "a Float8DelayedScalingQuantizer needs a Linear's delayed-scaling state; place "
             "Quantize before a BasicLinear under a DelayedScaling autocast instead")


def check_extra_inputs(expected: int, given: int) -> None:
    if expected != given:
        fail("Sequential", ValueError, f"the ops take {expected} extra input(s) (AddExtraInput), got {given}")


def reject_member(kind: str) -> None:
    fail("Sequential", TypeError, f"ops must be twinengine basic operations (or Sequential / ops.Linear of them), "
         f"got {kind}; modules such as LayerNormMLP hold their own parameters — call them, do not nest them")


def reject_quantized_output() -> None:
    fail("Sequential", TypeError, "the last op returns a QuantizedTensor (a Quantize op at the end); quantized data "
         "carries no gradient, so keep the Linear that consumes it in the same Sequential")


def check_features(op: str, **features: int) -> None:
    """Feature counts of a parameterized op are positive ints."""
    for name, value in features.items():
        if type(value) is not int or value < 1:
            fail(op, ValueError, f"{name} must be a positive int, got {value!r}")


def normalized_features(op: str, normalized_shape) -> int:
    """The normalized size of a norm op: an int, or a one-element sequence (the last dimension only)."""
    if isinstance(normalized_shape, (tuple, list)):
        if len(normalized_shape) != 1:
            fail(op, ValueError, f"normalized_shape must have one dimension (the last), got {tuple(normalized_shape)}")
        normalized_shape = normalized_shape[0]
    check_features(op, normalized_shape=normalized_shape)
    return int(normalized_shape)


def check_eps(op: str, eps: float) -> float:
    if not isinstance(eps, (int, float)) or math.isnan(eps) or eps < 0:
        fail(op, ValueError, f"eps must be a float >= 0, got {eps!r}")
    return float(eps)


def check_param_shape(op: str, name: str, shape: tuple, expect_shape: tuple) -> None:
    """A parameter of the wrong shape (e.g. from a loaded state dict) is a clear error before any kernel."""
    if tuple(shape) != tuple(expect_shape):
        fail(op, ValueError, f"parameter {name} must have shape {tuple(expect_shape)} (the op's configured size), "
             f"got {tuple(shape)}")


def check_input_kind(op: str, quantized: bool, accepts_quantized: bool) -> None:
    """An op that cannot consume a QuantizedTensor receiving one (and vice versa) is an error."""
    if quantized and not accepts_quantized:
        fail(op, TypeError, "received a QuantizedTensor but needs a high-precision tensor; only BasicLinear (and "
             "Linear) consume quantized input, under an autocast recipe — put a Quantize op only before a Linear")
