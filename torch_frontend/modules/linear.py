"""twinengine.pytorch.Linear: a Linear layer quantized by the enclosing autocast recipe."""

from __future__ import annotations

import math

import torch

from ...linear import linear_quantizers
from .._ops.linear import linear
from ..autocast import current_recipe


class Linear(torch.nn.Module):
    """y = x · wᵀ + b; high precision outside ``twinengine.pytorch.autocast``, quantized with the
    innermost region's recipe inside (compile-clean, identical bytes eager and compiled).

    Shapes: weight (out_features, in_features); bias (out_features,); x (..., in_features).
    Dtypes: parameters in ``params_dtype`` (fp32 / bf16 / fp16).
    State: DelayedScaling amax histories and scales are buffers (``fwd_amax_history`` (L, 2)
        for input and weight, ``fwd_scale`` (2,), ``bwd_amax_history`` (L, 1), ``bwd_scale``
        (1,)), L = ``amax_history_len`` (must equal the recipe's). Other recipes leave them.
    RNG: ``rng_state`` int64 (2,) buffer [seed, offset] (seed ``rng_seed``, offset 0): recipes
        whose grad_output rounds stochastically (NVFP4) use it for the call and advance the
        offset by one per forward, the same deterministic sequence ``twinengine.jax.dense``
        reproduces with ``rng=[seed, offset]``; other recipes (and high precision) neither
        read nor advance it, so their forward mutates no buffer (torch.func-friendly).
    Weight: ``weight`` may be replaced by a twinengine QuantizedTensor holding both copies
        (``del layer.weight; layer.weight = qt``): it is then used as is, without a gradient.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 params_dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                 amax_history_len: int = 1024, rng_seed: int = 0) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, dtype=params_dtype, device=device))
        self.bias = torch.nn.Parameter(torch.empty(out_features, dtype=params_dtype, device=device)) if bias else None
        for name, shape in (("fwd_amax_history", (amax_history_len, 2)), ("bwd_amax_history", (amax_history_len, 1))):
            self.register_buffer(name, torch.zeros(shape, dtype=torch.float32, device=device))
        self.register_buffer("fwd_scale", torch.ones(2, dtype=torch.float32, device=device))
        self.register_buffer("bwd_scale", torch.ones(1, dtype=torch.float32, device=device))
        self.register_buffer("rng_state", torch.tensor([rng_seed, 0], dtype=torch.int64, device=device))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torch.nn.Linear's initialisation (from torch's global RNG)."""
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        recipe = current_recipe()
        if recipe is None or not linear_quantizers(recipe).needs_rng:
            return linear(x, self.weight, self.bias, delayed_state=(self.fwd_amax_history, self.fwd_scale,
                                                                     self.bwd_amax_history, self.bwd_scale))
        # Advance first and use a value computed from the advanced state: a plain clone of the
        # buffer may be elided by inductor and then read after the buffer update.
        step = torch.tensor([0, 1], dtype=torch.int64, device=self.rng_state.device)
        advanced = self.rng_state + step
        self.rng_state.copy_(advanced)
        return linear(x, self.weight, self.bias, rng=advanced - step,
                      delayed_state=(self.fwd_amax_history, self.fwd_scale, self.bwd_amax_history, self.bwd_scale))
