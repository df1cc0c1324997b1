"""twinengine.pytorch.GroupedLinear: G expert Linears over consecutive row blocks of one input."""

from __future__ import annotations

import math
from typing import Sequence

import torch

from ...ops.gemm import check_m_splits
from ...ops.quantize import ArrayMeta
from ...ops.gemm import check_grouped_rng, grouped_quantizers
from .._ops.grouped_linear import grouped_linear, grouped_weight_copies
from .._state import advance_rng, is_recompute, may_be_recomputed, record_call, replayed_call, state_writer
from ..autocast import current_recipe, replay_region


class GroupedLinear(torch.nn.Module):
    """``y = layer(x, m_splits)``: rows [Σ_{j<g} m_splits[j], …+m_splits[g]) of x go through
    expert g, y_g = x_g · weight{g}ᵀ + bias{g} (TE's GroupedLinear and parameter names
    ``weight0 … weight{G-1}``, ``bias0 …``, so TE checkpoints load).

    Shapes: weight{g} (out_features, in_features); bias{g} (out_features,); x (..., in_features);
        m_splits (num_gemms,) int tensor (no host sync, no recompile for a new split) or ints.
    Dtypes: parameters in ``params_dtype`` (fp32 / bf16 / fp16).
    State: DelayedScaling amax histories and scales are buffers, one slot per expert and role
        (``fwd_amax_history`` (L, 2G): the G inputs' slots, then the G weights'; ``fwd_scale``
        (2G,); ``bwd_amax_history`` (L, G); ``bwd_scale`` (G,)), L = ``amax_history_len`` (must
        equal the recipe's); expert g's slots evolve exactly as a ``twinengine.pytorch.Linear``'s
        state on its rows. Other recipes leave them. They are non-persistent (not in the
        state dict, which keeps TE's GroupedLinear keys, so TE checkpoints load unchanged).
    Checkpointing: as ``Linear`` — under ``torch.utils.checkpoint`` (either mode, eager or
        compiled; see ``_state.py``) the recomputed forward replays the original call (recipe,
        scales, rng, cached weights) and updates no buffer.
    RNG: ``rng_state`` int64 (2,) buffer [seed, offset] (seed ``rng_seed``, offset 0,
        non-persistent): under a recipe whose gradient rounds stochastically (NVFP4) each call
        uses [seed, offset] and advances the offset by ``num_gemms``; expert g rounds with
        [seed, offset + g], so ``grouped_linear(..., rng=[seed, offset])`` reproduces a call.
    FP8 weight caching (TE's flag): ``layer(x, m_splits, is_first_microbatch=True)`` quantizes
        the expert weights once and keeps them; ``is_first_microbatch=False`` reuses them for the
        following micro-batches of the same optimizer step (the weights still get their
        gradients) — each expert exactly as ``twinengine.pytorch.Linear``'s caching.
    Numerics / Raises: as ``twinengine.pytorch.grouped_linear`` (each expert's rows give the
        bytes of ``twinengine.pytorch.Linear`` with that expert's parameters).
    """

    def __init__(self, num_gemms: int, in_features: int, out_features: int, bias: bool = True, *,
                 params_dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                 amax_history_len: int = 1024, rng_seed: int = 0) -> None:
        super().__init__()
        self.num_gemms = num_gemms
        self.in_features = in_features
        self.out_features = out_features
        self.use_bias = bias
        for g in range(num_gemms):
            self.register_parameter(f"weight{g}", torch.nn.Parameter(
                torch.empty(out_features, in_features, dtype=params_dtype, device=device)))
            self.register_parameter(f"bias{g}", torch.nn.Parameter(
                torch.empty(out_features, dtype=params_dtype, device=device)) if bias else None)
        g2 = 2 * num_gemms
        self.register_buffer("fwd_amax_history", torch.zeros(amax_history_len, g2, dtype=torch.float32, device=device),
                             persistent=False)
        self.register_buffer("fwd_scale", torch.ones(g2, dtype=torch.float32, device=device), persistent=False)
        self.register_buffer("bwd_amax_history", torch.zeros(amax_history_len, num_gemms, dtype=torch.float32,
                                                             device=device), persistent=False)
        self.register_buffer("bwd_scale", torch.ones(num_gemms, dtype=torch.float32, device=device), persistent=False)
        self.rng_seed = rng_seed
        self.register_buffer("rng_state", torch.empty(2, dtype=torch.int64, device=device), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torch.nn.Linear's initialisation per expert (from torch's global RNG); the delayed-scaling
        state back to histories 0, scales 1; rng_state to [rng_seed, 0]."""
        with torch.no_grad():
            self.rng_state.copy_(torch.tensor([self.rng_seed, 0], dtype=torch.int64))
            self.fwd_amax_history.zero_()
            self.bwd_amax_history.zero_()
            self.fwd_scale.fill_(1.0)
            self.bwd_scale.fill_(1.0)
        bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
        for g in range(self.num_gemms):
            torch.nn.init.kaiming_uniform_(getattr(self, f"weight{g}"), a=math.sqrt(5))
            if self.use_bias:
                torch.nn.init.uniform_(getattr(self, f"bias{g}"), -bound, bound)

    def weights(self) -> list[torch.Tensor]:
        return [getattr(self, f"weight{g}") for g in range(self.num_gemms)]

    def biases(self) -> list[torch.Tensor] | None:
        return [getattr(self, f"bias{g}") for g in range(self.num_gemms)] if self.use_bias else None

    def _weight_cache(self, is_first_microbatch: bool | None):
        """The quantized expert weights this call uses in place of quantizing them (TE's FP8
        weight caching), or None: ``is_first_microbatch=True`` quantizes them (the recipe's
        weight quantizer; DelayedScaling: the current weight scales) and keeps the copies in
        ``fp8_weight_cache``; ``False`` reuses them while they were made by the same quantizer
        (else they are remade); ``None`` (default) neither reads nor writes them."""
        qs = grouped_quantizers(current_recipe())
        if is_first_microbatch is None or qs is None:
            return None
        check_grouped_rng(qs, True, True)
        cache = self.__dict__.get("fp8_weight_cache")
        if is_first_microbatch or cache is None or cache[0] != qs.weight:
            scale = self.fwd_scale[self.num_gemms:] if qs.delayed else None
            cache = (qs.weight, grouped_weight_copies(self.weights(), qs.weight, scale))
            self.__dict__["fp8_weight_cache"] = cache
        return cache[1]

    def forward(self, x: torch.Tensor, m_splits: torch.Tensor | Sequence[int],
                is_first_microbatch: bool | None = None) -> torch.Tensor:
        if isinstance(m_splits, torch.Tensor):
            check_m_splits(ArrayMeta(tuple(m_splits.shape), "int32"), self.num_gemms)
        elif len(m_splits) != self.num_gemms:
            check_m_splits(ArrayMeta((len(m_splits),), "int32"), self.num_gemms)
        inputs = (x, m_splits) if isinstance(m_splits, torch.Tensor) else (x,)
        recipe = current_recipe()
        if not torch.compiler.is_compiling():
            if is_recompute():  # a checkpoint recompute: replay the recorded call, update nothing
                recipe, fwd_scale, rng, cache = replayed_call(self, inputs)
                state = (self.fwd_amax_history.detach().clone(), fwd_scale.clone(), self.bwd_amax_history,
                         self.bwd_scale)
                with replay_region(recipe):
                    return grouped_linear(x, self.weights(), m_splits, self.biases(), delayed_state=state,
                                          weight_cache=cache, rng=rng)
        cache = self._weight_cache(is_first_microbatch)
        rng = None
        if recipe is not None and grouped_quantizers(recipe).needs_rng:
            rng = advance_rng(self, self.num_gemms)  # expert g rounds with [seed, offset + g]
        if not torch.compiler.is_compiling() and may_be_recomputed():
            record_call(self, inputs, (recipe, self.fwd_scale.detach().clone(), rng, cache))
        state = (self.fwd_amax_history, self.fwd_scale, self.bwd_amax_history, self.bwd_scale)
        return grouped_linear(x, self.weights(), m_splits, self.biases(), delayed_state=state, weight_cache=cache,
                              rng=rng, fwd_state_writer=state_writer(self, "fwd_amax_history", "fwd_scale"))
