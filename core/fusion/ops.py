"""Descriptions of the basic operations of a fusible ``Sequential`` (data, not code).

Each frontend's basic op reports an :class:`OpDesc`; the planner (``planner.py``) reads only
these, so the torch and JAX ``Sequential`` of the same op list run the same kernel groups.
Argument checks shared by both frontends' basic ops live here too, so both raise the same text.
"""

from __future__ import annotations

import dataclasses
import math

from ..ops.opdef import fail

NORMS = ("layernorm", "rmsnorm", "l2norm")
"""Normalizations: their kernels can write the next Linear's quantized input (NUMERICS §11)."""

KINDS = NORMS + ("basic_linear", "bias", "activation", "dropout", "quantize", "constant_scale", "identity",
                 "reshape", "add_extra_input", "make_extra_output", "user")
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
    """p rounded to fp32 semantics is checked by the kernel family; here: a float in [0, 1)."""
    if not isinstance(p, (int, float)) or math.isnan(p) or not 0.0 <= p < 1.0:
        fail("Dropout", ValueError, f"p must be a float in [0, 1), got {p!r}")
    return float(p)


def check_features(op: str, **features: int) -> None:
    """Feature counts of a parameterized op are positive ints."""
    for name, value in features.items():
        if type(value) is not int or value < 1:
            fail(op, ValueError, f"{name} must be a positive int, got {value!r}")


def check_eps(op: str, eps: float) -> float:
    if not isinstance(eps, (int, float)) or math.isnan(eps) or eps < 0:
        fail(op, ValueError, f"eps must be a float >= 0, got {eps!r}")
    return float(eps)


def check_param(op: str, name: str, shape: tuple, dtype: str, expect_shape: tuple, dtypes: tuple[str, ...]) -> None:
    """A parameter of the wrong shape or dtype (e.g. a loaded state) is a clear error."""
    if tuple(shape) != tuple(expect_shape):
        fail(op, ValueError, f"parameter {name} must have shape {tuple(expect_shape)}, got {tuple(shape)}")
    if dtype not in dtypes:
        fail(op, TypeError, f"parameter {name} must have dtype {' or '.join(dtypes)}, got {dtype}")


def check_input_kind(op: str, quantized: bool, accepts_quantized: bool) -> None:
    """An op that cannot consume a QuantizedTensor receiving one (and vice versa) is an error."""
    if quantized and not accepts_quantized:
        fail(op, TypeError, "received a QuantizedTensor but needs a high-precision tensor; only BasicLinear (and "
             "Linear) consume quantized input — put a Quantize op only before a Linear")
