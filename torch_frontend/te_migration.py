"""Loading TransformerEngine checkpoints into twinengine.pytorch modules.

TE's ``Linear`` / ``LayerNormLinear`` / ``LayerNormMLP`` state dicts use the parameter names the
twinengine modules use (``weight``, ``bias``, ``layer_norm_weight``, ``fc1_weight``, ...) plus one
``_extra_state`` entry: a pickled dict whose delayed-scaling tensors (``amax_history_fwd`` (L,
3·GEMMs), ``scale_fwd``, ``amax_history_bwd`` (L, 2·GEMMs), ``scale_bwd``) are the counterpart
of the twinengine modules' delayed-scaling buffers. The rule (installed as a load_state_dict
pre-hook on those modules):

- A state dict with ``_extra_state`` is a TE checkpoint. The entry is removed and read with a
  restricted unpickler (tensors and plain containers only; TE's recipe objects become inert
  placeholders, so TE need not be installed and no checkpoint code runs).
- Delayed-scaling tensors present (TE trained with DelayedScaling): GEMM g's input and weight
  columns (3g, 3g+1) fill the module's ``fwd_amax_history`` / ``fwd_scale``, its grad-output
  column 2g fills ``bwd_amax_history`` / ``bwd_scale`` (g = 0 for Linear / LayerNormLinear /
  FC1, 1 for FC2). The history length must equal the module's ``amax_history_len``.
- Otherwise (an empty extra state, a stateless recipe, a checkpoint saved outside autocast) the
  module's delayed-scaling buffers keep their values.
- ``rng_state`` (twinengine's stochastic-rounding state; TE has none) keeps its value. Everything
  else in the extra state (the recipe, TE's fp8_meta flags) is ignored.
- ``DotProductAttention`` (TE's ``core_attention``): its ``_extra_state`` entries (TE >= 1.11:
  ``core_attention._extra_state``; earlier: ``core_attention.<backend>._extra_state``) hold TE's
  FP8-attention scaling metadata, which twinengine's FP8 attention (current scaling of the
  attention-internal tensors, docs/attention.md §9) has no counterpart for: they are dropped, and
  the attention-dropout ``rng_state`` keeps its value. ``MultiheadAttention`` /
  ``TransformerLayer`` state dicts load through these rules per submodule; a TE
  ``TransformerLayer`` checkpoint keeps the layer's ``hidden_dropout_op.rng_state``.
- TE's ``fuse_qkv_params=False`` (its default) names: a Linear / LayerNormLinear whose state
  dict holds ``query_weight``, ``key_weight``, ``value_weight`` (and ``query_bias``,
  ``key_bias``, ``value_bias``) — TE's ``self_attention.layernorm_qkv.*`` / ``qkv.*`` — gets
  the fused ``weight`` (``bias``) = rows ``[query; key; value]`` (``core/te_migration.py``
  ``fuse_te_qkv``, shared with ``twinengine.jax.params_from_torch``). TE forces
  ``qkv_weight_interleaved=False`` for split parameters, so a ``MultiheadAttention`` /
  ``TransformerLayer`` built with ``qkv_weight_interleaved=True`` refuses such a state dict.
  Our modules themselves keep refusing ``fuse_qkv_params=False`` at construction: they hold the
  fused parameter only, and a checkpoint of either naming loads into them.
Not supported: TE checkpoints of FP8 parameters (``fp8_model_init``, TE tensor subclasses) and of
other ``parameters_split`` layers (cross attention's ``layernorm_query.query_weight``,
``key_value.{key,value}_weight``); strict loading reports their keys.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch

from ..ops.opdef import fail
from ..te_migration import TE_QKV_SPLIT, fuse_te_qkv, te_delayed_columns

_OP = "load_state_dict"
_DELAYED_KEYS = ("scale_fwd", "amax_history_fwd", "scale_bwd", "amax_history_bwd")
_BUFFERS = ("fwd_amax_history", "fwd_scale", "bwd_amax_history", "bwd_scale", "rng_state")


class _TEObject:
    """Inert stand-in for any TransformerEngine object in a pickled extra state (recipes,
    formats): accepts its constructor arguments and state, does nothing."""

    def __new__(cls, *args: Any, **kwargs: Any) -> "_TEObject":
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state


def _load_storage(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=True)


class _ExtraStateUnpickler(pickle.Unpickler):
    """Tensors, plain containers and inert TE placeholders; anything else is refused."""

    _ALLOWED = {("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
                ("torch.storage", "_load_from_bytes"): _load_storage,
                ("collections", "OrderedDict"): __import__("collections").OrderedDict}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            return self._ALLOWED[(module, name)]
        if module == "transformer_engine" or module.startswith("transformer_engine."):
            return _TEObject
        raise pickle.UnpicklingError(f"twinengine.{_OP}: the TE _extra_state refers to {module}.{name}, which a "
                                     "checkpoint of delayed-scaling state never holds; refusing to load it")


def read_te_extra_state(value: Any) -> dict[str, torch.Tensor] | None:
    """The delayed-scaling tensors of a TE ``_extra_state`` (``scale_fwd``, ``amax_history_fwd``,
    ``scale_bwd``, ``amax_history_bwd``), or None when it holds none.

    Raises:
        TypeError: an extra state in a format this reader does not know (TE 1.x's BytesIO).
        pickle.UnpicklingError: the pickle refers to anything but tensors and TE objects.
    """
    if value is None:
        return None
    if not isinstance(value, torch.Tensor):
        fail(_OP, TypeError, f"a TE _extra_state must be a uint8 tensor (TE >= 1.6), got {type(value).__name__}; "
             "re-save the checkpoint with a recent TE")
    if value.numel() == 0:
        return None
    state = _ExtraStateUnpickler(io.BytesIO(value.detach().cpu().contiguous().numpy().tobytes())).load()
    if not isinstance(state, dict) or not all(key in state for key in _DELAYED_KEYS):
        return None
    return {key: state[key] for key in _DELAYED_KEYS}


def _delayed_owners(module: torch.nn.Module) -> list[str]:
    """Prefixes (relative to `module`) of the submodules holding a Linear's delayed-scaling
    buffers, in GEMM order."""
    if hasattr(module, "basic_ops"):
        return [f"basic_ops.{i}." for i, op in enumerate(module.basic_ops) if hasattr(op, "fwd_amax_history")]
    return [""]


def load_te_checkpoint_hook(module: torch.nn.Module, state_dict: dict, prefix: str, local_metadata: Any,
                            strict: bool, missing_keys: list, unexpected_keys: list, error_msgs: list) -> None:
    """load_state_dict pre-hook applying the module docstring's rule to a TE state dict (split
    QKV names fused first)."""
    fuse_te_qkv(state_dict, lambda parts: torch.cat(parts, 0), prefix)
    key = prefix + "_extra_state"
    if key not in state_dict:
        return
    te_state = read_te_extra_state(state_dict.pop(key))
    for gemm, owner_prefix in enumerate(_delayed_owners(module)):
        owner = module.get_submodule(owner_prefix.rstrip(".")) if owner_prefix else module
        target = {name: prefix + owner_prefix + name for name in _BUFFERS}
        if te_state is not None:
            (col_input, col_weight), col_grad = te_delayed_columns(gemm)
            history_fwd, history_bwd = te_state["amax_history_fwd"], te_state["amax_history_bwd"]
            length = owner.fwd_amax_history.shape[0]
            if history_fwd.shape[0] != length or history_bwd.shape[0] != length:
                fail(_OP, ValueError, f"the TE checkpoint's amax history has length {history_fwd.shape[0]}, the "
                     f"module's {length}; create the module with amax_history_len={history_fwd.shape[0]}")
            state_dict[target["fwd_amax_history"]] = history_fwd[:, [col_input, col_weight]]
            state_dict[target["fwd_scale"]] = te_state["scale_fwd"][[col_input, col_weight]]
            state_dict[target["bwd_amax_history"]] = history_bwd[:, [col_grad]]
            state_dict[target["bwd_scale"]] = te_state["scale_bwd"][[col_grad]]
        for name, full in target.items():
            if full not in state_dict:
                state_dict[full] = getattr(owner, name).detach().clone()


def _is_te_state(state_dict: dict, prefix: str) -> bool:
    return any(key.startswith(prefix) and key.endswith("_extra_state") for key in state_dict)


def _keep_buffers(module: torch.nn.Module, state_dict: dict, prefix: str, names: tuple[str, ...]) -> None:
    for name in names:
        if prefix + name not in state_dict:
            state_dict[prefix + name] = module.get_buffer(name).detach().clone()


def load_te_attention_hook(module: torch.nn.Module, state_dict: dict, prefix: str, local_metadata: Any,
                           strict: bool, missing_keys: list, unexpected_keys: list, error_msgs: list) -> None:
    """load_state_dict pre-hook of DotProductAttention: drops TE's FP8-attention ``_extra_state``
    entries (the module's and its backends'), keeps ``rng_state`` (module docstring)."""
    keys = [key for key in state_dict if key.startswith(prefix) and key.endswith("_extra_state")]
    for key in keys:
        state_dict.pop(key)
    if keys:
        _keep_buffers(module, state_dict, prefix, ("rng_state",))


def load_te_transformer_hook(module: torch.nn.Module, state_dict: dict, prefix: str, local_metadata: Any,
                             strict: bool, missing_keys: list, unexpected_keys: list, error_msgs: list) -> None:
    """load_state_dict pre-hook of TransformerLayer: a TE checkpoint (any ``_extra_state`` entry
    under the layer) keeps the hidden-dropout ``rng_state`` (TE has none)."""
    if _is_te_state(state_dict, prefix):
        _keep_buffers(module, state_dict, prefix, ("hidden_dropout_op.rng_state",))


def load_te_mha_hook(module: torch.nn.Module, state_dict: dict, prefix: str, local_metadata: Any,
                     strict: bool, missing_keys: list, unexpected_keys: list, error_msgs: list) -> None:
    """load_state_dict pre-hook of MultiheadAttention: TE's split QKV names (fused by the
    projection's own hook) give rows ``[Q; K; V]``, which a module built with
    ``qkv_weight_interleaved=True`` would read as per-group rows: refused (module docstring)."""
    if not module.qkv_weight_interleaved:
        return
    for sub in ("layernorm_qkv.", "qkv."):
        key = prefix + sub + TE_QKV_SPLIT[0] + "weight"
        if key in state_dict:
            fail(_OP, ValueError, f"{key!r} is a TE fuse_qkv_params=False checkpoint, whose QKV rows are "
                 "[query; key; value] (TE ignores qkv_weight_interleaved for split parameters); build the "
                 "module with qkv_weight_interleaved=False to load it")
