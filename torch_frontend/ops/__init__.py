"""twinengine.pytorch.ops: fusible basic operations and Sequential (TE's ``te.ops`` names).

Build a block as ``Sequential(RMSNorm(...), BasicLinear(...), Bias(...), SwiGLU(), ...)``; the
core planner fuses norm+quantize, activation+quantize and bias+activation backward, with the
same bytes as running the ops one by one (``fuse=False``). Write your own op by subclassing
``BasicOperation`` with ``op_forward_compute``, ``op_forward_save_ctx`` and ``op_backward``;
ops with state that each forward advances write it with ``write_state`` / ``draw_rng`` so
activation checkpointing replays the call exactly (eager and compiled).
"""

from .activation import GEGLU, GELU, QGEGLU, QGELU, ClampedSwiGLU, ReGLU, ReLU, SReGLU, SReLU, SiLU, SwiGLU
from .distributed import AllGather, AllReduce, ReduceScatter
from .dropout import Dropout
from .grouped_linear import GroupedLinear
from .linear import BasicLinear, Bias, Linear
from .normalization import L2Normalization, LayerNorm, RMSNorm
from .op import BasicOperation, OpContext
from .quantize import Quantize
from .sequential import Sequential, run_ops
from .._state import draw_rng, write_state
from .structural import AddExtraInput, ConstantScale, Identity, MakeExtraOutput, Reshape

__all__ = [
    "AddExtraInput", "AllGather", "AllReduce", "ReduceScatter", "BasicLinear", "BasicOperation", "Bias", "ClampedSwiGLU", "ConstantScale", "Dropout", "GEGLU",
    "GELU", "GroupedLinear", "Identity", "L2Normalization", "LayerNorm", "Linear", "MakeExtraOutput", "OpContext", "QGEGLU", "QGELU",
    "Quantize", "RMSNorm", "ReGLU", "ReLU", "Reshape", "SReGLU", "SReLU", "SiLU", "Sequential", "SwiGLU",
    "draw_rng", "run_ops", "write_state",
]
