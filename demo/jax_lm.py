"""The language model in JAX: twinengine.jax.dense, residual layernorm_mlp(RMSNorm, SwiGLU)
blocks and an ops.Sequential head (RMSNorm -> Linear) under autocast; the whole train step
(loss, gradients, Adam, DelayedScaling state) under one jax.jit."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import twinengine.jax as tj
from twinengine.jax import ops
from twinengine.recipe import DelayedScaling, Recipe

from .init import SEEDS, block_seed

BLOCK_PARAMS = ("layer_norm_weight", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias")


def _head(hidden: int, vocab: int) -> ops.Sequential:
    return ops.Sequential(ops.RMSNorm(hidden), ops.Linear(hidden, vocab))


def _loss(params, states, contexts, targets, offset, recipe, blocks):
    delayed = isinstance(recipe, DelayedScaling)
    new_states = {}

    def rng(seed):
        return jnp.stack([jnp.int32(seed), offset])

    with tj.autocast(recipe, enabled=recipe is not None):
        h = params["embedding"][contexts].reshape(contexts.shape[0], -1)
        out = tj.dense(h, params["proj.weight"].T, params["proj.bias"], state=states["proj"] if delayed else None,
                       rng=rng(SEEDS["proj"]))
        h = out[0] if delayed else out
        for b in range(blocks):
            block_params = {name: params[f"block{b}.{name}"] for name in BLOCK_PARAMS}
            rngs = {"fc1": rng(block_seed(b)), "fc2": rng(block_seed(b) + 1)}
            out = tj.layernorm_mlp(h, block_params, normalization="RMSNorm", activation="swiglu",
                                   state=states[f"block{b}"] if delayed else None, rngs=rngs)
            h = h + (out[0] if delayed else out)
        head = _head(h.shape[-1], params["head.weight"].shape[0])
        head_params = ((params["head.norm_weight"],), (params["head.weight"],), (params["head.bias"],))
        out = head(h, head_params, state=states["head"] if delayed else None, rngs=(None, rng(SEEDS["head"]), None))
        logits = out[0] if delayed else out
    logp = logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    return -jnp.take_along_axis(logp, targets[:, None], axis=-1).mean(), new_states


@functools.partial(jax.jit, static_argnums=(8, 9, 10))
def _train_step(params, moments, states, contexts, targets, offset, c1, c2, recipe, lr, blocks):
    grad_fn = jax.value_and_grad(_loss, argnums=(0, 1), has_aux=True)
    (loss, _), (grads, state_grads) = grad_fn(params, states, contexts, targets, offset, recipe, blocks)
    b1, b2, eps = 0.9, 0.999, 1e-8  # c1, c2: the bias corrections 1 - b^t, float32
    new_params, new_moments = {}, {}
    for name, p in params.items():
        g = grads[name]
        m, v = moments[name]
        m = m * b1 + g * (1 - b1)
        v = v * b2 + g * g * (1 - b2)
        new_params[name] = p - lr * (m / c1) / (jnp.sqrt(v / c2) + eps)
        new_moments[name] = (m, v)
    # DelayedScaling: the gradient of the state is the next state (twinengine.jax.dense / run_ops).
    new_states = state_grads if isinstance(recipe, DelayedScaling) else states
    return new_params, new_moments, new_states, loss


class JaxTrainer:
    """Parameters in torch layout (the NumPy initial values as they are); one jitted step per batch."""

    def __init__(self, params: dict[str, np.ndarray], blocks: int, recipe: Recipe | None, amax_history_len: int,
                 lr: float) -> None:
        self.params = {name: jnp.asarray(value) for name, value in params.items()}
        self.moments = {k: (jnp.zeros_like(v), jnp.zeros_like(v)) for k, v in self.params.items()}
        state = functools.partial(tj.delayed_scaling_state, amax_history_len)
        self.states = {"proj": state(), "head": (None, state(), None)}
        for b in range(blocks):
            self.states[f"block{b}"] = {"fc1": state(), "fc2": state()}
        self.recipe = recipe
        self.blocks = blocks
        self.lr = lr
        self.t = 0

    def step(self, contexts: np.ndarray, targets: np.ndarray) -> float:
        self.t += 1
        c1, c2 = (np.float32(1 - b**self.t) for b in (0.9, 0.999))
        # Stochastic rounding (NVFP4): each torch Linear's rng_state offset, advanced once per forward.
        offset = np.int32(self.t - 1)
        self.params, self.moments, self.states, loss = _train_step(
            self.params, self.moments, self.states, contexts, targets, offset, c1, c2, self.recipe, self.lr,
            self.blocks)
        return float(loss)
