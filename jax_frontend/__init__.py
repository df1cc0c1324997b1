"""twinengine.jax: twinengine ops for JAX as XLA FFI calls, jit- and vmap-clean."""

from . import _library  # noqa: F401  (registers FFI targets and the QuantizedTensor pytree)
from ._library import export_disabled_checks
from . import ops, parallel, partitioning, sharding
from .attention import dot_product_attention
from .rope import RotaryPositionEmbedding, apply_rotary_pos_emb
from .flax_transformer import multi_head_attention, transformer_layer
from .autocast import autocast
from .blocks import layernorm, layernorm_dense, layernorm_mlp, params_from_torch, params_to_torch, rmsnorm
from ._ops.dense import delayed_scaling_state, dense
from ._ops.gemm import gemm
from ._ops.grouped_dense import grouped_delayed_scaling_state, grouped_dense
from .interop import from_torch
from ._ops.permute import (
    moe_pad_splits,
    moe_permute,
    moe_permute_and_pad_with_probs,
    moe_permute_with_probs,
    moe_sort_chunks_by_index,
    moe_sort_chunks_by_index_with_probs,
    moe_unpad_splits,
    moe_unpermute,
    token_combine,
    token_dispatch,
)
from ._ops.quantize import (dequantize, fake_quantize, make_empty, quantize, quantize_into, record_amax,
                           update_delayed_scaling)

__all__ = [
    "RotaryPositionEmbedding",
    "apply_rotary_pos_emb",
    "dot_product_attention",
    "layernorm",
    "layernorm_dense",
    "layernorm_mlp",
    "multi_head_attention",
    "transformer_layer",
    "ops",
    "parallel",
    "partitioning",
    "sharding",
    "params_from_torch",
    "params_to_torch",
    "rmsnorm",
    "autocast",
    "delayed_scaling_state",
    "dense",
    "dequantize",
    "make_empty",
    "from_torch",
    "fake_quantize",
    "export_disabled_checks",
    "gemm",
    "grouped_delayed_scaling_state",
    "grouped_dense",
    "moe_pad_splits",
    "moe_permute",
    "moe_permute_and_pad_with_probs",
    "moe_permute_with_probs",
    "moe_sort_chunks_by_index",
    "moe_sort_chunks_by_index_with_probs",
    "moe_unpad_splits",
    "moe_unpermute",
    "quantize",
    "quantize_into",
    "make_empty",
    "record_amax",
    "token_combine",
    "token_dispatch",
    "update_delayed_scaling",
]
