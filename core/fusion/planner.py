"""The fusion planner: a pure function from a list of basic-op descriptions (and the recipe in
force) to the kernel groups a ``Sequential`` runs.

Fusion never changes bytes (NUMERICS.md §11): a group performs exactly the roundings of its
members run one by one. What a group saves is launches and round trips: a norm or an
activation writes the next Linear's quantized input itself (norm+quantize /
activation+quantize kernels), and a Bias followed by an activation runs its backward as one
activation-grad + bias-grad (+ quantize of the gradient for the Linear before it) kernel.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from .ops import NORMS, OpDesc


@dataclasses.dataclass(frozen=True)
class KernelGroup:
    """One group of consecutive basic ops run together.

    Attributes:
        ops: indices of the member ops in the Sequential, consecutive and increasing.
        name: readable forward description, e.g. "RMSNorm+Quantize" or "BasicLinear+Bias+SwiGLU".
        quantize_for: index of the op whose quantized input the group's last member writes with
            its fused kernel — a Quantize op inside the group, or a BasicLinear right after it
            (under a recipe) — else None.
        dact_dbias: position (in ``ops``) of a Bias directly followed by an activation whose
            backward runs as one activation-grad + bias-grad kernel, else None.
        quantize_grad_for: index of a BasicLinear right before that Bias whose grad_output is
            quantized by the same backward kernel (under a recipe), else None.
    """

    ops: tuple[int, ...]
    name: str
    quantize_for: int | None = None
    dact_dbias: int | None = None
    quantize_grad_for: int | None = None

    @property
    def emitter(self) -> int | None:
        """The member whose kernel writes the quantized input of op ``quantize_for`` (the op right
        before it), or None."""
        return None if self.quantize_for is None else self.quantize_for - 1

    def backward_steps(self) -> tuple[tuple[int, ...], ...]:
        """The group's backward in execution order: ``(i,)`` runs op i's ``op_backward``;
        ``(bias_i, act_i)`` runs the fused activation-grad + bias-grad (+ quantize) kernel."""
        members = list(self.ops)
        if self.dact_dbias is None:
            return tuple((i,) for i in reversed(members))
        split = self.dact_dbias
        after = tuple((i,) for i in reversed(members[split + 2:]))
        before = tuple((i,) for i in reversed(members[:split]))
        return after + ((members[split], members[split + 1]),) + before

    def describe(self, descs: Sequence[OpDesc]) -> str:
        """One line: members, hand-off and backward fusion."""
        members = ", ".join(f"{i}:{descs[i].name}" for i in self.ops)
        line = f"[{members}] {self.name}"
        if self.quantize_for is not None and self.quantize_for not in self.ops:
            line += f" -> writes the quantized input of {self.quantize_for}:{descs[self.quantize_for].name}"
        if self.dact_dbias is not None:
            act = descs[self.ops[self.dact_dbias + 1]].name
            line += f"; backward d{act}+dBias"
            if self.quantize_grad_for is not None:
                line += f"+Quantize (grad_output of {self.quantize_grad_for}:{descs[self.quantize_grad_for].name})"
        return line


def _kinds(descs: Sequence[OpDesc], start: int, kinds: Sequence[str | tuple[str, ...]]) -> bool:
    """descs[start:] begins with ops of these kinds (a tuple entry matches any of its kinds)."""
    if start + len(kinds) > len(descs):
        return False
    for offset, kind in enumerate(kinds):
        allowed = kind if isinstance(kind, tuple) else (kind,)
        if descs[start + offset].kind not in allowed:
            return False
    return True


def quantization_source(descs: Sequence[OpDesc], i: int, quantized: bool) -> int:
    """The op whose input quantization op i's quantized output uses: a Quantize op right before a
    BasicLinear under a recipe takes that Linear's (so the bytes equal the Linear quantizing its
    input itself); any other op its own."""
    if descs[i].kind == "quantize" and quantized and i + 1 < len(descs) and descs[i + 1].kind == "basic_linear":
        return i + 1
    return i


_LINEAR_TAILS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("bias", "activation"), "BasicLinear+Bias+{act}"),
    (("bias", "add_extra_input"), "LinearBiasAdd"),
    (("constant_scale", "add_extra_input"), "LinearScaleAdd"),
    (("add_extra_input",), "LinearAdd"),
    (("bias",), "BasicLinear+Bias"),
)
"""Forward tails grouped with a BasicLinear, longest first. The group runs the GEMM and its
members' kernels back to back inside one autograd node (no GEMM epilogue kernel yet); its backward
fuses Bias + activation into one kernel."""


def _group_at(descs: Sequence[OpDesc], i: int, quantized: bool) -> KernelGroup:
    d = descs[i]
    n = len(descs)
    if d.kind == "basic_linear":
        for tail, name in _LINEAR_TAILS:
            if _kinds(descs, i + 1, tail):
                members = tuple(range(i, i + 1 + len(tail)))
                act = descs[members[-1]].name
                group = KernelGroup(members, name.format(act=act))
                if tail[-1] == "activation":
                    group = dataclasses.replace(group, dact_dbias=1, quantize_grad_for=i if quantized else None)
                    return _with_handoff(descs, group, quantized)
                return group
        return KernelGroup((i,), "BasicLinear")
    if d.kind == "add_extra_input" and i + 1 < n and descs[i + 1].kind in NORMS:
        group = KernelGroup((i, i + 1), f"Add{descs[i + 1].name}")
        return _with_handoff(descs, group, quantized)
    if d.kind == "bias" and i + 1 < n and descs[i + 1].kind == "activation":
        group = KernelGroup((i, i + 1), f"Bias+{descs[i + 1].name}", dact_dbias=0)
        return _with_handoff(descs, group, quantized)
    if d.emits_quantized:
        return _with_handoff(descs, KernelGroup((i,), d.name), quantized)
    return KernelGroup((i,), d.name)


def _with_handoff(descs: Sequence[OpDesc], group: KernelGroup, quantized: bool) -> KernelGroup:
    """A group ending in a norm or an activation absorbs a following Quantize op, or (under a
    recipe) writes the quantized input of a following BasicLinear."""
    last = group.ops[-1]
    if not descs[last].emits_quantized or last + 1 >= len(descs):
        return group
    nxt = descs[last + 1]
    if nxt.kind == "quantize":
        return dataclasses.replace(group, ops=group.ops + (last + 1,), name=group.name + "+Quantize",
                                   quantize_for=last + 1)
    if nxt.kind == "basic_linear" and quantized:
        return dataclasses.replace(group, quantize_for=last + 1)
    return group


def plan(descs: Sequence[OpDesc], quantized: bool, fuse: bool = True) -> tuple[KernelGroup, ...]:
    """The kernel groups of a Sequential.

    Args:
        descs: the basic ops' descriptions, in order.
        quantized: a recipe is in force (Linears quantize their inputs), so norms and
            activations before a BasicLinear write its quantized input.
        fuse: False runs every op on its own (no hand-off, no backward fusion).
    Returns:
        Groups covering every op exactly once, in order.
    """
    if not fuse:
        return tuple(KernelGroup((i,), d.name) for i, d in enumerate(descs))
    groups = []
    i = 0
    while i < len(descs):
        group = _group_at(descs, i, quantized)
        groups.append(group)
        i = group.ops[-1] + 1
    return tuple(groups)
