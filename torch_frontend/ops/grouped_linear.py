"""Basic op GroupedLinear: G expert Linears over consecutive row blocks of the input, with
``m_splits`` arriving as the op's extra input (``Sequential(..., GroupedLinear(...), ...)(x,
m_splits)``; one extra input per GroupedLinear, in op order), one grouped kernel per GEMM phase."""

from __future__ import annotations

import math
from typing import Any

import torch

from ...fusion.ops import OpDesc, check_features
from ...linear import for_input_dtype
from ...ops.gemm import block_2d, check_grouped_weights, grouped_quantizers
from .._library import dtype_name
from .._ops.grouped_linear import fp8_backward, grouped_backward, grouped_fprop, prepare_m_splits
from .._state import advance_rng
from .op import BasicOperation, OpContext


class GroupedLinear(BasicOperation):
    """y[rows_g] = x[rows_g] · weight{g}ᵀ (+ bias{g}) for the G row blocks of the extra input
    ``m_splits`` (a (G,) int tensor: no host sync, no recompile for a new split).

    Shapes: weight{g} (out_features, in_features), bias{g} (out_features,) (TE's names);
        x (..., in_features) -> y (..., out_features).
    Numerics: exactly ``twinengine.pytorch.GroupedLinear`` (each group the bytes of a Linear on
        its rows, in high precision or under a recipe without per-expert state, i.e. all but
        DelayedScaling); m_splits gets no gradient.
    RNG: ``rng_state`` int64 (2,) buffer [seed, offset] (non-persistent: the state dict keeps
        TE's names), advanced by ``num_gemms`` per call under a recipe whose gradient rounds
        stochastically (NVFP4), as ``twinengine.pytorch.GroupedLinear``'s.
    Raises:
        TypeError: inside autocast with another recipe; ValueError / TypeError: core m_splits
            and weight checks (eagerly on CPU also Σ m_splits != rows, negative splits; the
            CPU kernel for traced ones).
    """

    num_extra_inputs = 1

    def __init__(self, num_gemms: int, in_features: int, out_features: int, *, bias: bool = True, device: Any = None,
                 dtype: torch.dtype = torch.float32, rng_seed: int = 0) -> None:
        super().__init__()
        check_features("GroupedLinear", in_features=in_features, out_features=out_features)
        self.num_gemms = num_gemms
        self.in_features, self.out_features, self.use_bias = in_features, out_features, bias
        names = [f"weight{g}" for g in range(num_gemms)] + ([f"bias{g}" for g in range(num_gemms)] if bias else [])
        self.param_names = tuple(names)
        bound = 1 / math.sqrt(in_features)
        for g in range(num_gemms):
            weight = torch.nn.Parameter(torch.empty(out_features, in_features, dtype=dtype, device=device))
            torch.nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
            self.register_parameter(f"weight{g}", weight)
            if bias:
                b = torch.nn.Parameter(torch.empty(out_features, dtype=dtype, device=device))
                torch.nn.init.uniform_(b, -bound, bound)
                self.register_parameter(f"bias{g}", b)
        check_grouped_weights(num_gemms, [getattr(self, f"weight{g}") for g in range(num_gemms)],
                              [getattr(self, f"bias{g}") for g in range(num_gemms)] if bias else None)
        self.register_buffer("rng_state", torch.tensor([rng_seed, 0], dtype=torch.int64, device=device),
                             persistent=False)

    def describe(self) -> OpDesc:
        return OpDesc("user", "GroupedLinear")

    def op_call(self, recipe):
        qs = grouped_quantizers(recipe, delayed_ok=False)
        tensors = {"rng": advance_rng(self, self.num_gemms)} if qs is not None and qs.needs_rng else {}
        return {"quantizers": qs}, tensors

    def op_forward_compute(self, x, params, *, quantizers=None, extra_inputs=(), rng=None):
        (m_splits,) = extra_inputs
        g = self.num_gemms
        weight = torch.stack(params[:g])
        bias = torch.stack(params[g:]) if self.use_bias else None
        x2 = x.reshape(-1, x.shape[-1])
        splits = prepare_m_splits("grouped_linear", m_splits, g, x2.shape[0], x.device)
        saved = {"lead": tuple(x.shape[:-1]), "bias_dtype": None if bias is None else bias.dtype, "qs": quantizers}
        if quantizers is None:
            y = grouped_fprop(x2, weight, splits, bias)
            saved.update(x=x2, weight=weight, m_splits=splits)
        else:
            qs = for_input_dtype(quantizers, dtype_name(x.dtype))  # NVFP4: RHT for bf16 only
            saved["qs"] = qs
            y, *copies, _ = torch.ops.twinengine.grouped_linear_fp8(x2, weight, splits, bias, qs.input, qs.weight,
                                                                    qs.grad_output, None, None, None, 0, "max",
                                                                    None, None, None, None, rng)
            saved.update(copies=(*copies, splits), shape=tuple(weight.shape),
                         dtypes=(x.dtype, weight.dtype, saved["bias_dtype"]), rng=rng)
        return y.reshape(*x.shape[:-1], self.out_features), saved

    def op_backward(self, ctx: OpContext, dy):
        s = ctx.saved
        dy2 = dy.reshape(-1, dy.shape[-1])
        if s["qs"] is None:
            dx, dw, db = grouped_backward(dy2, s["x"], s["weight"], s["m_splits"], s["bias_dtype"])
        else:
            qs = s["qs"]
            dx, dw, db = fp8_backward(dy2, s["copies"], qs.grad_output, s["shape"], s["dtypes"],
                                      two_d=(block_2d(qs.input), block_2d(qs.weight)), rng=s["rng"])
        dparams = tuple(dw.unbind(0)) + (tuple(db.unbind(0)) if db is not None else ())
        return (dx.reshape(*s["lead"], self.in_features), (None,)), dparams
