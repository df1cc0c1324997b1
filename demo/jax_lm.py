"""The language model in JAX: token embedding, Flax ``TransformerLayer`` blocks (twinengine.jax.flax:
causal self-attention with rotary embeddings, RMSNorm, SwiGLU LayerNormMLP) applied to the shared
parameter tree, and an ``ops.Sequential`` head (RMSNorm -> Linear), under ``autocast``; the whole
train step (loss, gradients, Adam, DelayedScaling state) under one ``jax.jit``."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import twinengine.jax as tj
from twinengine.jax import ops
from twinengine.jax.flax import TransformerLayer
from twinengine.recipe import DelayedScaling, Recipe

from .init import HEAD_SEED, ModelConfig


def transformer_layer(cfg: ModelConfig) -> TransformerLayer:
    """One block, configured as demo.torch_lm's ``tep.TransformerLayer`` (no dropout, causal, bshd)."""
    return TransformerLayer(hidden_size=cfg.hidden, ffn_hidden_size=cfg.ffn, num_attention_heads=cfg.heads,
                            hidden_dropout=0.0, attention_dropout=0.0, self_attn_mask_type="causal",
                            normalization="RMSNorm", activation="swiglu", attn_input_format="bshd", use_bias=True)


def _head(cfg: ModelConfig) -> ops.Sequential:
    return ops.Sequential(ops.RMSNorm(cfg.hidden), ops.Linear(cfg.hidden, cfg.vocab))


def _loss(params, fp8_meta, inputs, targets, freqs, offset, key, recipe, cfg):
    delayed = isinstance(recipe, DelayedScaling)
    layer = transformer_layer(cfg)
    with tj.autocast(recipe, enabled=recipe is not None):
        h = params["embedding"][inputs]  # (batch, context, hidden), "bshd"
        for i in range(cfg.layers):
            variables = {"params": params["layers"][str(i)]}
            if delayed:
                variables["fp8_meta"] = fp8_meta["layers"][str(i)]
            # NVFP4's stochastic rounding draws its bits from Flax's "stochastic_rounding" stream.
            h = layer.apply(variables, h, rotary_pos_emb=freqs,
                            rngs={"stochastic_rounding": jax.random.fold_in(key, i)})
        head_params = ((params["head"]["norm_weight"],), (params["head"]["weight"],), (params["head"]["bias"],))
        rng = jnp.stack([jnp.int32(HEAD_SEED), offset])
        out = _head(cfg)(h.reshape(-1, cfg.hidden), head_params, state=fp8_meta["head"] if delayed else None,
                         rngs=(None, rng, None))
        logits = out[0] if delayed else out
    logp = logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    return -jnp.take_along_axis(logp, targets.reshape(-1, 1), axis=-1).mean()


@functools.partial(jax.jit, static_argnums=(9, 10, 11))
def _train_step(params, moments, fp8_meta, inputs, targets, freqs, offset, key, c12, recipe, lr, cfg):
    loss, (grads, meta_grads) = jax.value_and_grad(_loss, argnums=(0, 1))(
        params, fp8_meta, inputs, targets, freqs, offset, key, recipe, cfg)
    b1, b2, eps = 0.9, 0.999, 1e-8
    c1, c2 = c12  # the bias corrections 1 - b^t, float32 (as torch_lm)
    m = jax.tree.map(lambda m, g: m * b1 + g * (1 - b1), moments[0], grads)
    v = jax.tree.map(lambda v, g: v * b2 + g * g * (1 - b2), moments[1], grads)
    params = jax.tree.map(lambda p, m, v: p - lr * (m / c1) / (jnp.sqrt(v / c2) + eps), params, m, v)
    # DelayedScaling: the gradient of the state is the next state (twinengine.jax.flax contract).
    fp8_meta = meta_grads if isinstance(recipe, DelayedScaling) else fp8_meta
    return params, (m, v), fp8_meta, loss


def _initial_fp8_meta(cfg: ModelConfig, recipe: DelayedScaling, freqs) -> dict:
    """A TransformerLayer's "fp8_meta" collection before any step (tj.delayed_scaling_state per
    Linear: histories zero, scales one) — the structure from an abstract ``init``; its values are
    not taken from it, since ``init`` runs a forward that already moves the state."""
    x = jax.ShapeDtypeStruct((1, cfg.context, cfg.hidden), jnp.float32)

    def init(x):
        with tj.autocast(recipe):
            return transformer_layer(cfg).init(jax.random.key(0), x, rotary_pos_emb=freqs)["fp8_meta"]

    def fresh(path, leaf):
        name = path[-1].key
        if name.endswith("_scale"):
            return jnp.ones(leaf.shape, leaf.dtype)
        if name.endswith("_amax_history"):
            return jnp.zeros(leaf.shape, leaf.dtype)
        raise ValueError(f"unexpected DelayedScaling state entry {jax.tree_util.keystr(path)}")

    return jax.tree_util.tree_map_with_path(fresh, jax.eval_shape(init, x))


class JaxTrainer:
    """Starts from the NumPy parameter tree as it is; one jitted step per batch."""

    def __init__(self, params: dict, cfg: ModelConfig, recipe: Recipe | None, amax_history_len: int,
                 lr: float, seed: int = 0) -> None:
        self.params = jax.tree.map(jnp.asarray, params)
        zeros = jax.tree.map(jnp.zeros_like, self.params)
        self.moments = (zeros, zeros)
        self.freqs = tj.RotaryPositionEmbedding(cfg.head_dim)(cfg.context)
        self.fp8_meta = {}
        if isinstance(recipe, DelayedScaling):
            state = functools.partial(tj.delayed_scaling_state, amax_history_len)
            self.fp8_meta = {"layers": {str(i): _initial_fp8_meta(cfg, recipe, self.freqs) for i in range(cfg.layers)},
                             "head": (None, state(), None)}
        self.key = jax.random.key(seed)
        self.recipe = recipe
        self.cfg = cfg
        self.lr = lr
        self.t = 0

    def step(self, inputs: np.ndarray, targets: np.ndarray) -> float:
        self.t += 1
        c12 = tuple(np.float32(1 - b**self.t) for b in (0.9, 0.999))
        # Stochastic rounding (NVFP4): the head Linear's torch rng offset, advanced once per forward.
        offset = np.int32(self.t - 1)
        self.params, self.moments, self.fp8_meta, loss = _train_step(
            self.params, self.moments, self.fp8_meta, inputs.astype(np.int32), targets.astype(np.int32), self.freqs,
            offset, jax.random.fold_in(self.key, self.t), c12, self.recipe, self.lr, self.cfg)
        return float(loss)
