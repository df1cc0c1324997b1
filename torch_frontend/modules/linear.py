"""twinengine.pytorch.Linear: a Linear layer quantized by the enclosing autocast recipe."""

from __future__ import annotations

import math

import torch

from ...distributed import check_sequence_shard, check_tensor_parallel
from ...linear import linear_quantizers
from ...quantized_tensor import QuantizedTensor
from ...recipe import DelayedScaling
from .._library import dtype_name, surface_errors, tensor_fallback
from .._ops.linear import linear
from .._state import (advance_rng, is_recompute, may_be_recomputed, record_call, replayed_call,
                      state_writer)
from ..autocast import current_amax_group, current_recipe, replay_region
from ..distributed import (add_bias, copy_to_group, gather_from_sequence, group_name, quantize_reduced,
                           reduce_from_group, scatter_to_sequence)
from ..te_migration import load_te_checkpoint_hook


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
    Checkpointing: under ``torch.utils.checkpoint`` (either mode, ``autocast`` inside or
        outside) the recomputed forward replays the original call — recipe, scales, rng — and
        updates no buffer, so outputs, gradients and buffers equal the run without it.
    Weight: ``weight`` may be replaced by a twinengine QuantizedTensor holding both copies
        (``del layer.weight; layer.weight = qt``): it is then used as is, without a gradient.
    FP8 weight caching (TE's flag): ``layer(x, is_first_microbatch=True)`` quantizes the weight
        once and keeps it; ``is_first_microbatch=False`` reuses it for the following
        micro-batches of the same optimizer step (the weight still gets its gradient); see
        ``_weight_cache``. Checkpoints: a TE Linear state dict loads (``te_migration.py``).
    Tensor parallelism (TE's arguments and meaning; NUMERICS.md §12): ``tp_group`` (a
        ProcessGroup of ``tp_size`` ranks), ``parallel_mode="column"`` (weight (out/tp, in), bias
        (out/tp,); the output's last dim is this rank's slice; the input gradient is all-reduced)
        or ``"row"`` (weight (out, in/tp); the input is this rank's slice of the features; the
        partial outputs are all-reduced, fp32 sums, then the full bias is added).
        ``sequence_parallel=True``: inputs and outputs outside the layer are sharded along dim 0
        (the sequence); column-parallel all-gathers the input (in high precision, then quantizes
        the gathered tensor — a quantized all-gather is not done yet), row-parallel
        reduce-scatters the output instead of all-reducing it. Every whole-tensor amax (current
        scaling, delayed-scaling histories) is all-reduced with MAX over the tp_group (or over
        the autocast's ``amax_reduction_group``, which must contain it), so the bytes are the
        single-device ones: column-parallel and sequence-parallel outputs are exact slices,
        row-parallel outputs equal within the tolerance of the different fp32 summation order.
        Block formats need their blocks not to straddle shards (the quantize checks reject the
        local shapes otherwise). NVFP4's two global amaxes (rowwise, columnwise after RHT) are
        reduced too (``quantize(..., amax=)``); its stochastically rounded gradients draw bits by
        the element's index in the local tensor, so sharded gradients are not the single-device
        bytes (disable_stochastic_rounding=True makes them so).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 params_dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                 amax_history_len: int = 1024, rng_seed: int = 0, tp_group=None, tp_size: int = 1,
                 parallel_mode: str | None = None, sequence_parallel: bool = False) -> None:
        super().__init__()
        check_tensor_parallel("Linear", in_features, out_features, tp_size=tp_size, parallel_mode=parallel_mode,
                              sequence_parallel=sequence_parallel, has_group=tp_group is not None,
                              group_size=None if tp_group is None else torch.distributed.get_world_size(tp_group))
        self.in_features = in_features
        self.out_features = out_features
        self.parallel_mode = parallel_mode
        self.sequence_parallel = sequence_parallel
        self.tp_size = tp_size
        self._tp_group = group_name(tp_group) if parallel_mode is not None else None
        local_out = out_features // tp_size if parallel_mode == "column" else out_features
        local_in = in_features // tp_size if parallel_mode == "row" else in_features
        self.weight = torch.nn.Parameter(torch.empty(local_out, local_in, dtype=params_dtype, device=device))
        self.bias = torch.nn.Parameter(torch.empty(local_out, dtype=params_dtype, device=device)) if bias else None
        for name, shape in (("fwd_amax_history", (amax_history_len, 2)), ("bwd_amax_history", (amax_history_len, 1))):
            self.register_buffer(name, torch.zeros(shape, dtype=torch.float32, device=device))
        self.register_buffer("fwd_scale", torch.ones(2, dtype=torch.float32, device=device))
        self.register_buffer("bwd_scale", torch.ones(1, dtype=torch.float32, device=device))
        self.register_buffer("rng_state", torch.empty(2, dtype=torch.int64, device=device))
        self.rng_seed = rng_seed
        self.reset_parameters()
        self.register_load_state_dict_pre_hook(load_te_checkpoint_hook)  # TE checkpoints (te_migration.py)

    def reset_parameters(self) -> None:
        """torch.nn.Linear's initialisation (from torch's global RNG) of the parameters, and the
        initial state: histories 0, scales 1, rng_state [rng_seed, 0].

        Deferred initialisation: build on ``device="meta"``, then ``to_empty(device=...)`` and
        call ``reset_parameters()`` (``to_empty`` leaves every tensor uninitialised); the result
        equals a layer built on that device from the same torch RNG state.
        """
        if isinstance(self.weight, torch.nn.Parameter):  # not a pre-quantized QuantizedTensor weight
            torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            torch.nn.init.uniform_(self.bias, -bound, bound)
        with torch.no_grad():
            for name in ("fwd_amax_history", "bwd_amax_history"):
                getattr(self, name).zero_()
            self.fwd_scale.fill_(1.0)
            self.bwd_scale.fill_(1.0)
            self.rng_state.copy_(torch.tensor([self.rng_seed, 0], dtype=torch.int64))

    def forward(self, x: torch.Tensor, is_first_microbatch: bool | None = None) -> torch.Tensor:
        if not torch.compiler.is_compiling():
            if is_recompute():
                return self._recompute(x)  # a forward run by the backward pass: checkpoint recompute
            cache = self._weight_cache(is_first_microbatch)
            if may_be_recomputed():
                self._record(x, cache)  # a forward that activation checkpointing may recompute
            return self._forward(x, self.fwd_amax_history, self.fwd_scale, None, cache)
        return self._forward(x, self.fwd_amax_history, self.fwd_scale, None, self._weight_cache(is_first_microbatch))

    def _weight_cache(self, is_first_microbatch: bool | None) -> QuantizedTensor | None:
        """The quantized weight this call uses in place of quantizing ``weight`` (TE's FP8 weight
        caching), or None. ``is_first_microbatch=True`` quantizes the weight (with the recipe's
        weight quantizer; DelayedScaling: the current weight scale) and keeps it in
        ``fp8_weight_cache``; ``False`` reuses that copy while it was made by the same quantizer
        (else it is remade); ``None`` (default) neither reads nor writes it. High precision and
        NVFP4 weights (pre-quantized NVFP4 operands are not supported) are never cached."""
        recipe = current_recipe()
        if is_first_microbatch is None or recipe is None or isinstance(self.weight, QuantizedTensor):
            return None
        qs = linear_quantizers(recipe, dtype_name(self.weight.dtype))
        if qs.weight.scaling_mode == "nvfp4":
            return None
        cache = self.__dict__.get("fp8_weight_cache")
        if is_first_microbatch or cache is None or cache.quantizer != qs.weight:
            with torch.no_grad():
                cache = quantize_reduced(self.weight, qs.weight, self._amax_group(),
                                         scale=self.fwd_scale[1:2] if qs.delayed else None)
            self.__dict__["fp8_weight_cache"] = cache
        return cache

    @surface_errors(tensor_fallback)
    def _forward(self, x: torch.Tensor, fwd_history: torch.Tensor, fwd_scale: torch.Tensor,
                 rng: torch.Tensor | None, cache: QuantizedTensor | None = None) -> torch.Tensor:
        state = (fwd_history, fwd_scale, self.bwd_amax_history, self.bwd_scale)
        recipe = current_recipe()
        # the forward scale/history update: in place, or rebound inside a compiled checkpoint
        # region (_state.py); a recompute (throwaway state, see _recompute) writes nowhere
        writer = state_writer(self, "fwd_amax_history", "fwd_scale") if fwd_scale is self.fwd_scale else None
        if recipe is None or not linear_quantizers(recipe).needs_rng:
            return self._parallel_linear(x, delayed_state=state, weight_cache=cache, fwd_state_writer=writer)
        if rng is None:
            rng = advance_rng(self)
        return self._parallel_linear(x, rng=rng, delayed_state=state, weight_cache=cache, fwd_state_writer=writer)

    def _amax_group(self) -> str | None:
        """The group whole-tensor amaxes are reduced over: autocast's, else the tp_group."""
        group = current_amax_group()
        return self._tp_group if group is None else group

    def _parallel_linear(self, x: torch.Tensor, **kwargs) -> torch.Tensor:
        """``linear`` with this layer's tensor-parallel collectives around it (see the class doc)."""
        if self.parallel_mode is None:
            return linear(x, self.weight, self.bias, **kwargs)
        tp = self._tp_group
        kwargs["amax_group"] = self._amax_group()
        if self.parallel_mode == "column":
            x = gather_from_sequence(x, tp, self.tp_size) if self.sequence_parallel else copy_to_group(x, tp)
            return linear(x, self.weight, self.bias, **kwargs)
        y = linear(x, self.weight, None, **kwargs)
        if self.sequence_parallel:
            check_sequence_shard("Linear", y.shape[0], self.tp_size)
        y = scatter_to_sequence(y, tp, self.tp_size) if self.sequence_parallel else reduce_from_group(y, tp)
        return y if self.bias is None else add_bias(y, self.bias)

    # ---- activation checkpointing (eager) -------------------------------------------------
    # torch.utils.checkpoint re-runs the forward inside the backward pass (both modes), where
    # no autocast region is active and the state has moved on. A forward that checkpointing may
    # recompute (grad disabled: the reentrant first pass; saved-tensor hooks active: the
    # non-reentrant one) records what it used — the recipe, the forward scales, the rng value —
    # with a hash of the input's bytes (a recompute takes the newest record its input matches);
    # the recompute replays exactly that call without touching the buffers (the grad slot is
    # updated once, by the one backward that runs). Compiled checkpoint regions recompute
    # inside the graph from the same values; state writes there are rebinds (_state.py).

    def _record(self, x: torch.Tensor, cache: QuantizedTensor | None) -> None:
        recipe = current_recipe()
        rng = None
        if recipe is not None and linear_quantizers(recipe).needs_rng:
            rng = self.rng_state.clone()
        record_call(self, (x,), (recipe, self.fwd_scale.detach().clone(), rng, cache))

    def _recompute(self, x: torch.Tensor) -> torch.Tensor:
        recipe, fwd_scale, rng, cache = replayed_call(self, (x,))
        # throwaway forward state: the recompute reads the recorded scales and updates nothing
        with replay_region(recipe):
            return self._forward(x, self.fwd_amax_history.detach().clone(), fwd_scale.clone(), rng, cache)
