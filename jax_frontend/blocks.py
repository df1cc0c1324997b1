"""Layer functions over the fusible basic ops: layernorm, rmsnorm, layernorm_dense and
layernorm_mlp — the JAX twins of twinengine.pytorch's LayerNorm, RMSNorm, LayerNormLinear and
LayerNormMLP (the same op layout, core/fusion/blocks.py; the same bytes forward and backward).

Parameters are dicts with the torch modules' names and layouts (weight (out, in)), so
``params_from_torch`` turns a torch ``state_dict`` into them and ``params_to_torch`` back.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from ..fusion.blocks import block_layout, normalization_kind
from ..te_migration import fuse_te_qkv
from .ops import BasicLinear, Bias, LayerNorm, MakeExtraOutput, RMSNorm, run_ops
from .ops.activation import activation_op


def _norm_op(normalization: str, hidden: int, eps: float, zero_centered_gamma: bool):
    cls = LayerNorm if normalization_kind(normalization) == "layernorm" else RMSNorm
    return cls(hidden, eps, zero_centered_gamma=zero_centered_gamma)


def layernorm(x, weight, bias, eps: float = 1e-5, *, zero_centered_gamma: bool = False):
    """LayerNorm over the last dimension (NUMERICS.md §11), a custom_vjp; same bytes as tep.LayerNorm."""
    return run_ops([LayerNorm(x.shape[-1], eps, zero_centered_gamma=zero_centered_gamma)], [(weight, bias)], x,
                   recipe=None)


def rmsnorm(x, weight, eps: float = 1e-5, *, zero_centered_gamma: bool = False):
    """RMSNorm over the last dimension (NUMERICS.md §11), a custom_vjp; same bytes as tep.RMSNorm."""
    return run_ops([RMSNorm(x.shape[-1], eps, zero_centered_gamma=zero_centered_gamma)], [(weight,)], x,
                   recipe=None)


def _run_block(x, params: Mapping[str, Any], layout, widths, *, normalization: str, eps: float,
               zero_centered_gamma: bool, activation: str | None, activation_params: dict | None,
               state, rngs, recipe, amax_history_len: int):
    ops, op_params, op_states, op_rngs, linear = [], [], [], [], 0
    names = ("fc1", "fc2") if len(widths) == 2 else ("linear",)
    for slot, param_names in layout:
        op_params.append(tuple(params[name] for name in param_names))
        op_state = op_rng = None
        if slot == "norm":
            ops.append(_norm_op(normalization, widths[0][0], eps, zero_centered_gamma))
        elif slot == "extra_output":
            ops.append(MakeExtraOutput())
        elif slot == "linear":
            ops.append(BasicLinear(*widths[linear], amax_history_len=amax_history_len))
            op_state = None if state is None else state[names[linear]]
            op_rng = None if rngs is None else rngs[names[linear]]
            linear += 1
        elif slot == "bias":
            ops.append(Bias(widths[linear - 1][1]))
        else:
            ops.append(activation_op(activation, **(activation_params or {})))
        op_states.append(op_state)
        op_rngs.append(op_rng)
    out = run_ops(ops, op_params, x, state=None if state is None else op_states, rngs=op_rngs, recipe=recipe)
    if state is None:
        return out
    out, new_states = out
    linear_states = [s for (slot, _), s in zip(layout, new_states) if slot == "linear"]
    return out, dict(zip(names, linear_states))


def layernorm_dense(x, params: Mapping[str, Any], *, normalization: str = "LayerNorm", eps: float = 1e-5,
                    zero_centered_gamma: bool = False, return_layernorm_output: bool = False, state=None, rngs=None,
                    recipe=None, amax_history_len: int = 1024):
    """Norm then y = x̂ · weightᵀ (+ bias) — tep.LayerNormLinear's twin (same bytes).

    Params: ``layer_norm_weight``, ``layer_norm_bias`` (LayerNorm), ``weight`` (N, K), ``bias`` (N,) optional.
    State / rngs: ``{"linear": ...}`` (DelayedScaling state; SR [seed, offset], the torch
        module's BasicLinear rng_state before the call). Recipe: the innermost autocast region's
        unless given. Returns: y, or (y, ln_out); with state, (that, new_state).
    """
    has_bias = params.get("bias") is not None
    layout = block_layout(normalization, (("", has_bias),), None, return_layernorm_output)
    weight = params["weight"]
    return _run_block(x, params, layout, [(weight.shape[1], weight.shape[0])], normalization=normalization, eps=eps,
                      zero_centered_gamma=zero_centered_gamma, activation=None, activation_params=None, state=state,
                      rngs=rngs, recipe=recipe, amax_history_len=amax_history_len)


def layernorm_mlp(x, params: Mapping[str, Any], *, normalization: str = "LayerNorm", activation: str = "gelu",
                  eps: float = 1e-5, zero_centered_gamma: bool = False, return_layernorm_output: bool = False,
                  activation_params: dict | None = None, state=None, rngs=None, recipe=None,
                  amax_history_len: int = 1024):
    """Norm → FC1 (+bias) → activation → FC2 (+bias) — tep.LayerNormMLP's twin (same bytes).

    Params: ``layer_norm_weight``, ``layer_norm_bias`` (LayerNorm), ``fc1_weight``, ``fc1_bias``,
        ``fc2_weight``, ``fc2_bias`` (torch layout; biases optional together).
    State / rngs: ``{"fc1": ..., "fc2": ...}`` (the torch module's fc1 / fc2 BasicLinear state and
        rng_state before the call). Returns: y, or (y, ln_out); with state, (that, new_state).
    """
    has_bias = params.get("fc1_bias") is not None
    layout = block_layout(normalization, (("fc1_", has_bias), ("fc2_", has_bias)), activation,
                          return_layernorm_output)
    fc1, fc2 = params["fc1_weight"], params["fc2_weight"]
    widths = [(fc1.shape[1], fc1.shape[0]), (fc2.shape[1], fc2.shape[0])]
    return _run_block(x, params, layout, widths, normalization=normalization, eps=eps,
                      zero_centered_gamma=zero_centered_gamma, activation=activation,
                      activation_params=activation_params, state=state, rngs=rngs, recipe=recipe,
                      amax_history_len=amax_history_len)


# Buffers of the torch Linears (delayed-scaling state, rng_state) and TE's _extra_state: JAX keeps
# state explicitly, so a nested module's buffers are left out of its parameter tree.
_BUFFER_NAMES = frozenset({"fwd_amax_history", "bwd_amax_history", "fwd_scale", "bwd_scale", "rng_state",
                           "_extra_state"})


def params_from_torch(state_dict: Mapping[str, Any]) -> dict:
    """A torch module's ``state_dict`` -> a JAX parameter dict with the same names, layouts and
    bytes (bf16 kept). Buffers (delayed-scaling state, rng_state, anything under ``basic_ops.``)
    and a TransformerEngine checkpoint's ``_extra_state`` are left out: JAX keeps state
    explicitly. A TE ``Linear`` / ``LayerNormLinear`` / ``LayerNormMLP`` state dict converts
    directly (same parameter names). Submodules become nested dicts: the state dict of a
    TransformerLayer gives ``{"self_attention": {"layernorm_qkv": {...}, "proj": {...}},
    "layernorm_mlp": {...}}`` — the ``"params"`` of the Flax TransformerLayer (dotted names split
    at the dots; a name with a ``basic_ops`` component or a buffer name is left out). TE's
    ``fuse_qkv_params=False`` names (``{query,key,value}_{weight,bias}`` of ``layernorm_qkv`` /
    ``qkv``) become the fused ``weight`` / ``bias``, rows [Q; K; V] (core/te_migration.py
    ``fuse_te_qkv``, the torch load hooks' conversion), as the Flax modules hold them."""
    state = dict(state_dict)
    fuse_te_qkv(state, lambda parts: jnp.concatenate([_torch_to_jax(p) for p in parts], axis=0))
    out: dict = {}
    for name, tensor in state.items():
        if tensor is None or name == "_extra_state":
            continue
        if "." not in name:
            out[name] = _torch_to_jax(tensor)
            continue
        parts = name.split(".")
        if "basic_ops" in parts or parts[-1] in _BUFFER_NAMES:
            continue
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = _torch_to_jax(tensor)
    return out


def params_to_torch(params: Mapping[str, Any]) -> dict:
    """The inverse of ``params_from_torch``: a dict of torch tensors (bytes kept; nested dicts
    become dotted names) for ``module.load_state_dict(..., strict=False)``."""
    import torch

    out = {}
    for name, array in params.items():
        if isinstance(array, Mapping):
            for sub, tensor in params_to_torch(array).items():
                out[f"{name}.{sub}"] = tensor
            continue
        a = np.asarray(array)
        if a.dtype == jnp.bfloat16:
            out[name] = torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
        else:
            out[name] = torch.from_numpy(a.copy())
    return out


def _torch_to_jax(tensor: Any):
    import torch

    if isinstance(tensor, jax.Array):  # already converted (fuse_te_qkv's concatenation)
        return tensor
    t = tensor.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return jnp.asarray(t.view(torch.int16).numpy().view(jnp.bfloat16))
    return jnp.asarray(t.numpy())
