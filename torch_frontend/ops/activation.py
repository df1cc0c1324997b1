"""Activation basic ops (NUMERICS.md §11), TE's names: GELU, GEGLU, QGELU, QGEGLU, ReLU, ReGLU,
SReLU, SReGLU, SiLU, SwiGLU, ClampedSwiGLU.

Gated forms split the last dimension into [a | b] and give act(a) · b, so they halve it. An
activation's kernel can also write the quantized input of the op after it (same bytes as
activation-then-quantize); after a Bias its backward can run as one activation-grad +
bias-grad (+ quantize) kernel (core/fusion/planner.py).
"""

from __future__ import annotations

import torch

from ...fusion.ops import OpDesc, check_input_kind
from .._ops.activation import activation_bwd, activation_fwd
from .op import BasicOperation


class _Activation(BasicOperation):
    """Base of the activation ops: ``activation`` names the kernel's kind."""

    _abstract_op = True
    activation: str = ""
    display_name: str = ""

    def __init__(self) -> None:
        super().__init__()
        self.limit = 7.0
        self.alpha = 1.702

    def describe(self) -> OpDesc:
        return OpDesc("activation", self.display_name, activation=self.activation)

    def op_forward_compute(self, x, params, *, quantizer=None, scale=None, rng=None):
        check_input_kind(self.display_name, not isinstance(x, torch.Tensor), False)
        y, qt = activation_fwd(x, self.activation, limit=self.limit, alpha=self.alpha, quantizer=quantizer,
                               scale=scale, rng=rng)
        return (qt if qt is not None else y), (x,)

    def op_backward(self, ctx, dy):
        (x,) = ctx.saved
        return activation_bwd(dy, x, self.activation, limit=self.limit, alpha=self.alpha), ()


def _activation(name: str, kind: str, doc: str) -> type:
    cls = type(name, (_Activation,), {"activation": kind, "display_name": name, "__doc__": doc,
                                      "__module__": __name__})
    return cls


GELU = _activation("GELU", "gelu", "GELU, tanh form (TE's): 0.5·x·(1 + tanh(0.7978845608·x·(1 + 0.044715·x²))).")
GEGLU = _activation("GEGLU", "geglu", "Gated GELU: GELU(a) · b over the halves [a | b] of the last dimension.")
QGELU = _activation("QGELU", "qgelu", "Quick GELU: x · σ(1.702 · x).")
QGEGLU = _activation("QGEGLU", "qgeglu", "Gated quick GELU: QGELU(a) · b.")
ReLU = _activation("ReLU", "relu", "max(x, 0); gradient 0 at x = 0.")
ReGLU = _activation("ReGLU", "reglu", "Gated ReLU: ReLU(a) · b.")
SReLU = _activation("SReLU", "srelu", "Squared ReLU: ReLU(x)².")
SReGLU = _activation("SReGLU", "sreglu", "Gated squared ReLU: SReLU(a) · b.")
SiLU = _activation("SiLU", "silu", "x · σ(x).")
SwiGLU = _activation("SwiGLU", "swiglu", "Gated SiLU: SiLU(a) · b.")


class ClampedSwiGLU(_Activation):
    """a' = min(a, limit), b' = clamp(b, −limit, limit), y = a' · σ(alpha · a') · (b' + 1) (gated)."""

    activation = "clamped_swiglu"
    display_name = "ClampedSwiGLU"

    def __init__(self, limit: float = 7.0, alpha: float = 1.702) -> None:
        super().__init__()
        self.limit = float(limit)
        self.alpha = float(alpha)


_BY_KIND = {cls.activation: cls for cls in (GELU, GEGLU, QGELU, QGEGLU, ReLU, ReGLU, SReLU, SReGLU, SiLU, SwiGLU,
                                             ClampedSwiGLU)}


def activation_op(kind: str, **params: float) -> _Activation:
    """The activation op of a kind name ("gelu", "swiglu", ...; core/ops/activation.py), as
    LayerNormMLP's ``activation=`` takes it; ``params`` (limit, alpha) for clamped_swiglu only."""
    from ...fusion.blocks import activation_kind, check_activation_params

    params = check_activation_params(kind, params)
    cls = _BY_KIND[activation_kind(kind)]
    return cls(**params)
