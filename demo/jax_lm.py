"""The MLP language model in JAX: twinengine.jax.dense layers under autocast, the whole train
step (loss, gradients, Adam, DelayedScaling state) under one jax.jit."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import twinengine.jax as tj
from twinengine.recipe import DelayedScaling, Recipe

LAYERS = ("fc1", "fc2", "head")


def _loss(params, states, contexts, targets, rng, recipe):
    delayed = isinstance(recipe, DelayedScaling)
    new_states = {}

    def dense(name, h):
        out = tj.dense(h, params[f"{name}.kernel"], params[f"{name}.bias"], state=states[name] if delayed else None,
                       rng=rng)
        if delayed:
            out, new_states[name] = out
        return out

    with tj.autocast(recipe, enabled=recipe is not None):
        h = params["embedding"][contexts].reshape(contexts.shape[0], -1)
        h = jax.nn.relu(dense("fc1", h))
        h = jax.nn.relu(dense("fc2", h))
        logits = dense("head", h)
    logp = logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    return -jnp.take_along_axis(logp, targets[:, None], axis=-1).mean(), new_states


@functools.partial(jax.jit, static_argnums=(8, 9))
def _train_step(params, moments, states, contexts, targets, rng, c1, c2, recipe, lr):
    grad_fn = jax.value_and_grad(_loss, argnums=(0, 1), has_aux=True)
    (loss, _), (grads, state_grads) = grad_fn(params, states, contexts, targets, rng, recipe)
    b1, b2, eps = 0.9, 0.999, 1e-8  # c1, c2: the bias corrections 1 - b^t, float32
    new_params, new_moments = {}, {}
    for name, p in params.items():
        g = grads[name]
        m, v = moments[name]
        m = m * b1 + g * (1 - b1)
        v = v * b2 + g * g * (1 - b2)
        new_params[name] = p - lr * (m / c1) / (jnp.sqrt(v / c2) + eps)
        new_moments[name] = (m, v)
    # DelayedScaling: the gradient of the state is the next state (twinengine.jax.dense).
    new_states = state_grads if isinstance(recipe, DelayedScaling) else states
    return new_params, new_moments, new_states, loss


class JaxTrainer:
    """Parameters in Flax layout (kernel (in, out)); one jitted step per batch."""

    def __init__(self, params: dict[str, np.ndarray], recipe: Recipe | None, amax_history_len: int, lr: float) -> None:
        self.params = {"embedding": jnp.asarray(params["embedding"])}
        for name in LAYERS:
            self.params[f"{name}.kernel"] = jnp.asarray(params[f"{name}.weight"].T)
            self.params[f"{name}.bias"] = jnp.asarray(params[f"{name}.bias"])
        self.moments = {k: (jnp.zeros_like(v), jnp.zeros_like(v)) for k, v in self.params.items()}
        self.states = {name: tj.delayed_scaling_state(amax_history_len) for name in LAYERS}
        self.recipe = recipe
        self.lr = lr
        self.t = 0

    def step(self, contexts: np.ndarray, targets: np.ndarray) -> float:
        self.t += 1
        c1, c2 = (np.float32(1 - b**self.t) for b in (0.9, 0.999))
        # Stochastic rounding (NVFP4): [seed, offset] as the torch Linears' rng_state, one offset per step.
        rng = np.array([0, self.t - 1], np.int32)
        self.params, self.moments, self.states, loss = _train_step(
            self.params, self.moments, self.states, contexts, targets, rng, c1, c2, self.recipe, self.lr)
        return float(loss)
