"""twinengine.jax.ops: fusible basic operations and Sequential (twins of twinengine.pytorch.ops).

Parameters are explicit (one tuple of arrays per op, torch layout), state and rng too, so a
Sequential is a ``custom_vjp`` usable under ``jax.jit``, ``jax.grad`` and ``jax.vmap``; the
same op list and parameters give the same bytes as in PyTorch.
"""

from .activation import GEGLU, GELU, QGEGLU, QGELU, ClampedSwiGLU, ReGLU, ReLU, SReGLU, SReLU, SiLU, SwiGLU
from .dropout import Dropout
from .grouped_linear import GroupedLinear
from .linear import BasicLinear, Bias, Linear
from .normalization import L2Normalization, LayerNorm, RMSNorm
from .op import BasicOperation, OpContext
from .quantize import Quantize
from .sequential import Sequential, run_ops
from .structural import AddExtraInput, ConstantScale, Identity, MakeExtraOutput, Reshape

__all__ = [
    "AddExtraInput", "BasicLinear", "BasicOperation", "Bias", "ClampedSwiGLU", "ConstantScale", "Dropout", "GEGLU",
    "GELU", "GroupedLinear", "Identity", "L2Normalization", "LayerNorm", "Linear", "MakeExtraOutput", "OpContext",
    "QGEGLU", "QGELU", "Quantize", "RMSNorm", "ReGLU", "ReLU", "Reshape", "SReGLU", "SReLU", "SiLU", "Sequential",
    "SwiGLU", "run_ops",
]
