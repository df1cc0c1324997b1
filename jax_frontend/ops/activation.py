"""JAX activation basic ops (twinengine.pytorch.ops' twins, NUMERICS.md §11)."""

from __future__ import annotations

from ...fusion.blocks import activation_kind, check_activation_params
from ...fusion.ops import OpDesc, check_input_kind
from ...quantized_tensor import QuantizedTensor
from .._ops.activation import activation_bwd, activation_fwd
from .op import BasicOperation


class _Activation(BasicOperation):
    _abstract_op = True
    activation: str = ""
    display_name: str = ""

    def __init__(self) -> None:
        self.limit = 7.0
        self.alpha = 1.702

    def describe(self) -> OpDesc:
        return OpDesc("activation", self.display_name, activation=self.activation)

    def op_forward_compute(self, x, params, *, quantizer=None, scale=None, rng=None):
        check_input_kind(self.display_name, isinstance(x, QuantizedTensor), False)
        y, qt = activation_fwd(x, self.activation, limit=self.limit, alpha=self.alpha, quantizer=quantizer,
                               scale=scale, rng=rng)
        return (qt if qt is not None else y), (x,)

    def op_backward(self, ctx, dy):
        (x,) = ctx.saved
        return activation_bwd(dy, x, self.activation, limit=self.limit, alpha=self.alpha), ()


def _activation(name: str, kind: str, doc: str) -> type:
    return type(name, (_Activation,), {"activation": kind, "display_name": name, "__doc__": doc,
                                       "__module__": __name__})


GELU = _activation("GELU", "gelu", "GELU, tanh form (TE's).")
GEGLU = _activation("GEGLU", "geglu", "Gated GELU: GELU(a) · b.")
QGELU = _activation("QGELU", "qgelu", "Quick GELU: x · σ(1.702 · x).")
QGEGLU = _activation("QGEGLU", "qgeglu", "Gated quick GELU: QGELU(a) · b.")
ReLU = _activation("ReLU", "relu", "max(x, 0).")
ReGLU = _activation("ReGLU", "reglu", "Gated ReLU: ReLU(a) · b.")
SReLU = _activation("SReLU", "srelu", "Squared ReLU.")
SReGLU = _activation("SReGLU", "sreglu", "Gated squared ReLU.")
SiLU = _activation("SiLU", "silu", "x · σ(x).")
SwiGLU = _activation("SwiGLU", "swiglu", "Gated SiLU: SiLU(a) · b.")


class ClampedSwiGLU(_Activation):
    """a' = min(a, limit), b' = clamp(b, −limit, limit), y = a' · σ(alpha · a') · (b' + 1)."""

    activation = "clamped_swiglu"
    display_name = "ClampedSwiGLU"

    def __init__(self, limit: float = 7.0, alpha: float = 1.702) -> None:
        super().__init__()
        self.limit = float(limit)
        self.alpha = float(alpha)


_BY_KIND = {cls.activation: cls for cls in (GELU, GEGLU, QGELU, QGEGLU, ReLU, ReGLU, SReLU, SReGLU, SiLU, SwiGLU,
                                             ClampedSwiGLU)}


def activation_op(kind: str, **params: float) -> _Activation:
    """The activation op of a kind name ("gelu", "swiglu", ...), as layernorm_mlp's ``activation=``."""
    params = check_activation_params(kind, params)
    cls = _BY_KIND[activation_kind(kind)]
    return cls(**params)
