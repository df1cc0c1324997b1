"""twinengine.pytorch: twinengine ops for PyTorch, compile-clean (torch.compile(fullgraph=True)).

Ops are ``torch.ops.twinengine.*`` custom ops with fake impls from the shared core shape
functions; quantizers are opaque value types baked into FX graphs.
"""

from . import _library  # noqa: F401  (registers opaque quantizer types and the QuantizedTensor pytree)
from .autocast import autocast
from . import ops
from .modules.attention import DotProductAttention, MultiheadAttention
from .modules.grouped_linear import GroupedLinear
from .modules.linear import Linear
from .modules.normalization import LayerNorm, LayerNormLinear, LayerNormMLP, RMSNorm
from .modules.padding import Fp8Padding, Fp8Unpadding
from .modules.rope import RotaryPositionEmbedding
from .modules.transformer import TransformerLayer
from ._ops.gemm import gemm
from ._ops.grouped_linear import grouped_linear
from .interop import from_jax
from ._ops.linear import linear
from ._ops.permute import (
    moe_pad_splits,
    moe_permute,
    moe_permute_and_pad_with_probs,
    moe_permute_with_probs,
    moe_sort_chunks_by_index,
    moe_sort_chunks_by_index_with_probs,
    moe_unpad_splits,
    moe_unpermute,
)
from ._ops.rope import apply_rotary_pos_emb
from ._ops.quantize import (dequantize, fake_quantize, make_empty, quantize, quantize_, record_amax,
                           update_delayed_scaling)

__all__ = [
    "DotProductAttention",
    "Fp8Padding",
    "Fp8Unpadding",
    "GroupedLinear",
    "LayerNorm",
    "LayerNormLinear",
    "LayerNormMLP",
    "Linear",
    "MultiheadAttention",
    "RMSNorm",
    "RotaryPositionEmbedding",
    "apply_rotary_pos_emb",
    "TransformerLayer",
    "ops",
    "autocast",
    "dequantize",
    "make_empty",
    "from_jax",
    "fake_quantize",
    "gemm",
    "grouped_linear",
    "linear",
    "moe_pad_splits",
    "moe_permute",
    "moe_permute_and_pad_with_probs",
    "moe_permute_with_probs",
    "moe_sort_chunks_by_index",
    "moe_sort_chunks_by_index_with_probs",
    "moe_unpad_splits",
    "moe_unpermute",
    "quantize",
    "quantize_",
    "make_empty",
    "record_amax",
    "update_delayed_scaling",
]
