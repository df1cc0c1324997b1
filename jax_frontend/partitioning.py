"""twinengine.jax.partitioning: the sharding rules of the twinengine FFI ops under a sharded
``jax.jit`` (``in_shardings`` / ``NamedSharding`` inputs, no ``shard_map``), as TE-JAX gives its
custom calls: ``jax.experimental.custom_partitioning`` with a Shardy ``sharding_rule``.

Each op states one ``Rule``: the factors (named dimensions) of every array it takes and
returns, which factors its shards compute independently (``local``), which give partial sums
(``reduce``: the outputs are ``psum``-ed over the axes sharding them), across which per-tensor
amaxes are ``pmax``-ed (``amax``: the bytes stay the unsharded ones, NUMERICS.md §12), and
which shard extents a block format needs (``Block``). ``partitioned`` turns a shard-local
function and its rule into the op:

- Every other factor runs replicated: XLA gathers the operand along it before the call
  (norms over a sharded hidden dimension, NVFP4 whose kernel forms its own global amax, ...).
- A factor whose size the mesh axes do not divide, or a shard boundary inside a quantization
  block / scale tile, raises ValueError naming the op and the argument when the program is
  compiled (the partitioner's callback; JAX reports it wrapped in its runtime error).
- Inside ``jax.shard_map`` and on one device the rule is not consulted (the op is the
  shard-local function itself); under ``vmap`` the op is the plain function, so a vmapped op
  is not partitioned (JAX gives custom partitioning no batching rule: an op traced unbatched
  and batched later, as in ``vmap(jit(f))``, is batched here as its plain function).
- ``without_rules()``: ops traced inside take no rule (XLA gathers their operands, the same
  bytes): what ``jax.export`` of a multi-device program needs, since custom partitioning runs
  Python callbacks that cannot be serialized.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Sequence

import jax
from jax import lax
from jax.experimental.custom_partitioning import custom_partitioning
from jax._src import core as _core  # jaxpr_as_fun: the plain function of a custom_partitioning call
from jax._src import custom_partitioning as _cp  # its primitive, which JAX gives no batching rule
from jax._src.interpreters import batching  # BatchTracer; the batching rule registered below
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .sharding import amax_axes, amax_reduction

_RULES_OFF = jax.make_user_context(False)


class without_rules:
    """Context manager: twinengine ops traced inside carry no partitioning rule (under a sharded
    jit XLA gathers their operands; bytes unchanged). Part of the trace cache key, like
    ``sharding.amax_reduction``. Use it around ``jax.export`` of a multi-device program."""

    def __init__(self):
        self._cm = None

    def __enter__(self):
        self._cm = _RULES_OFF(True)
        self._cm.__enter__()
        return self

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


Dims = tuple[tuple[str, ...], ...]
"""The factors of each dimension of one array, major first; () for a dimension never sharded.
A dimension whose size is not the product of its factors' sizes (a padded scale, packed FP4
data) is sharded with its factors when the op's blocks make its shards tile it."""


@dataclasses.dataclass(frozen=True)
class Block:
    """Shards of the flattened dimension `factors` (major first) of argument `arg` must hold
    whole multiples of `size` elements (a quantization block or a padded scale tile, `what`)."""

    arg: str
    factors: tuple[str, ...]
    size: int
    what: str


@dataclasses.dataclass(frozen=True)
class Rule:
    """The sharding rule of one op call (see the module docstring).

    Attributes:
        op: the op name errors start with.
        inputs: (argument name, dims) of each array input, in call order.
        outputs: dims of each output, in order.
        sizes: (factor, size) of every factor.
        local / reduce / amax: factor names (see the module docstring); amax ⊆ local. A
            factor may be both local and reduce (rows of a norm backward: dx per shard, dweight
            a partial sum).
        partial: indices of the outputs that are partial sums when a reduce factor is sharded.
        blocks: the shard extents block formats need.
    """

    op: str
    inputs: tuple[tuple[str, Dims], ...]
    outputs: tuple[Dims, ...]
    sizes: tuple[tuple[str, int], ...]
    local: frozenset[str] = frozenset()
    reduce: frozenset[str] = frozenset()
    amax: frozenset[str] = frozenset()
    blocks: tuple[Block, ...] = ()
    partial: tuple[int, ...] = ()

    def size(self, factor: str) -> int:
        return dict(self.sizes)[factor]


def plain_dims(prefix: str, shape: Sequence[int]) -> Dims:
    """One factor per dimension, named prefix0, prefix1, ..."""
    return tuple((f"{prefix}{i}",) for i in range(len(shape)))


def factor_sizes(named: Sequence[tuple[Dims, Sequence[int]]]) -> tuple[tuple[str, int], ...]:
    """(factor, size) of every factor that names a whole dimension of one of the (dims, shape)
    pairs; factors seen only inside compound dimensions must be sized by the caller."""
    sizes: dict[str, int] = {}
    for dims, shape in named:
        for d, n in zip(dims, shape):
            if len(d) == 1:
                sizes.setdefault(d[0], int(n))
    return tuple(sizes.items())


# ---- the Shardy rule --------------------------------------------------------------------

def _shardy_rule(rule: Rule, operand_shapes, result_shapes):
    sizes = dict(rule.sizes)
    whole = set()
    fresh: list[str] = []
    replicated = {f for f in sizes if f not in rule.local and f not in rule.reduce}

    def dim_text(d: tuple[str, ...], n: int) -> str:
        if d and math.prod(sizes[f] for f in d) == n:
            if len(d) == 1:
                whole.add(d[0])
                return d[0]
            return "(" + " ".join(d) + ")"
        fresh.append(f"pad{len(fresh)}")  # padded / packed: sharded by partition(), not propagated
        return fresh[-1]

    def array_text(dims: Dims, shape) -> str:
        return " ".join(dim_text(d, n) for d, n in zip(dims, shape))

    operands = ", ".join(array_text(dims, s) for (_, dims), s in zip(rule.inputs, operand_shapes))
    results = ", ".join(array_text(dims, s) for dims, s in zip(rule.outputs, result_shapes))
    used = whole | {f for dims in (*[d for _, d in rule.inputs], *rule.outputs) for d in dims if len(d) > 1 for f in d}
    compound_sizes = {f: sizes[f] for f in used - whole}
    text = f"{operands} -> {results}"
    order = list(dict.fromkeys(_tokens(text)))
    in_results = set(_tokens(results))
    options = {"need_replication_factors": tuple(f for f in order if f in (replicated & used) | set(fresh)),
               "reduction_factors": tuple(f for f in order if f in rule.reduce and f not in in_results),
               **compound_sizes}
    return text, {k: v for k, v in options.items() if v != ()}


def _tokens(text: str) -> list[str]:
    return text.replace("(", " ").replace(")", " ").replace(",", " ").replace("->", " ").split()


def _ir_shape(t) -> tuple[int, ...]:
    from jax._src.interpreters import mlir  # noqa: PLC0415 - the ir types the rule callback gets
    return tuple(mlir.ir.RankedTensorType(t).shape)


# ---- the partition callback -------------------------------------------------------------

def _axes(entry) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def _assign(rule: Rule, mesh, arg_shapes) -> dict[str, tuple[str, ...]]:
    """The mesh axes each shardable factor runs sharded over: taken from the first operand
    dimension that carries the factor as its major factor; an axis serves one factor."""
    shardable = rule.local | rule.reduce
    assign: dict[str, tuple[str, ...]] = {}
    used: set[str] = set()
    for (_, dims), shape in zip(rule.inputs, arg_shapes):
        sharding = getattr(shape, "sharding", None)
        if not isinstance(sharding, NamedSharding):  # not yet known (GSPMD propagation): replicated
            continue
        spec = tuple(sharding.spec) + (None,) * (len(dims) - len(tuple(sharding.spec)))
        for d, entry in zip(dims, spec):
            axes = tuple(a for a in _axes(entry) if mesh.shape[a] > 1)
            if not axes or not d or d[0] in assign or d[0] not in shardable or used & set(axes):
                continue
            assign[d[0]] = axes
            used |= set(axes)
    # A compound dimension (a flattened (R, K) row index) tiles only when its one sharded
    # factor is preceded by factors of size 1; the others run replicated.
    for dims in (*[d for _, d in rule.inputs], *rule.outputs):
        for d in dims:
            for i, f in enumerate(d[1:], 1):
                if f in assign and any(g in assign or rule.size(g) > 1 for g in d[:i]):
                    del assign[f]
    return assign


def _parts(mesh, axes: tuple[str, ...]) -> int:
    return math.prod(mesh.shape[a] for a in axes)


def _check(rule: Rule, mesh, assign: dict[str, tuple[str, ...]]) -> None:
    for f, axes in assign.items():
        parts = _parts(mesh, axes)
        if rule.size(f) % parts:
            arg = next(name for name, dims in rule.inputs if any(f in d for d in dims))
            raise ValueError(f"{rule.op}: {arg} cannot be sharded: a dimension of size {rule.size(f)} is not "
                             f"divisible by the mesh axes {axes} of size {parts}")
    for block in rule.blocks:
        for i, f in enumerate(block.factors):
            if f not in assign:
                continue
            parts = _parts(mesh, assign[f])
            stride = rule.size(f) // parts * math.prod(rule.size(g) for g in block.factors[i + 1:])
            if stride % block.size:
                raise ValueError(f"{rule.op}: a shard boundary of {block.arg} falls inside a {block.what}: sharding "
                                 f"over {assign[f]} ({parts} shards) puts boundaries every {stride} elements, not a "
                                 f"multiple of {block.size}; shard so that each shard holds whole blocks")


def _sharding(mesh, dims: Dims, assign) -> NamedSharding:
    entries = []
    for d in dims:
        axes = tuple(a for f in d if f in assign for a in assign[f])
        entries.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return NamedSharding(mesh, P(*entries))


def _reduced_axes(factors: frozenset[str], assign) -> tuple[str, ...]:
    return tuple(a for f in sorted(factors) if f in assign for a in assign[f])


def _batched(arrays) -> bool:
    return any(isinstance(a, batching.BatchTracer) for a in jax.tree_util.tree_leaves(arrays))


def partitioned(local: Callable, partial_sum: Callable | None = None):
    """Decorator: ``local(static, sizes, *arrays) -> tuple of arrays`` (the op on one shard, or
    on the whole arrays; `sizes` maps each factor of the rule to its extent there) becomes
    ``op(rule, static, *arrays)``, partitioned by `rule` under a sharded jit. `static` is
    hashable. ``partial_sum(static, sizes, *arrays)``, required when the rule has reduce
    factors, returns ``(outputs, finish)``: the shard's outputs, those of ``rule.partial`` as
    partial sums (``psum``-ed over the axes of the sharded reduce factors), and
    ``finish(summed outputs)`` the op's outputs."""

    def body(rule: Rule, static, *arrays):
        return tuple(local(static, dict(rule.sizes), *arrays))

    op = custom_partitioning(body, static_argnums=(0, 1))

    def sharding_rule(rule: Rule, static, mesh, operand_types, result_types):
        del static, mesh
        return _shardy_rule(rule, [_ir_shape(t) for t in operand_types], [_ir_shape(t) for t in result_types])

    def partition(rule: Rule, static, mesh, arg_shapes, result_shape):
        assign = _assign(rule, mesh, arg_shapes)
        _check(rule, mesh, assign)
        amax = _reduced_axes(rule.amax, assign)
        psum = _reduced_axes(rule.reduce, assign)
        partial_outputs = [i in rule.partial for i in range(len(rule.outputs))]

        sizes = {f: n // _parts(mesh, assign[f]) if f in assign else n for f, n in rule.sizes}

        def lower(*arrays):
            with amax_reduction(amax):
                if not psum:
                    return tuple(local(static, sizes, *arrays))
                partials, finish = partial_sum(static, sizes, *arrays)
                return tuple(finish(tuple(lax.psum(p, psum) if summed else p
                                          for p, summed in zip(partials, partial_outputs))))

        args = tuple(_sharding(mesh, dims, assign) for _, dims in rule.inputs)
        outs = tuple(_sharding(mesh, dims, assign) for dims in rule.outputs)
        return mesh, lower, outs, args

    def infer_sharding_from_operands(rule: Rule, static, mesh, arg_shapes, result_shape):
        """The output shardings partition() gives (read by the GSPMD partitioner; Shardy uses
        the sharding rule)."""
        assign = _assign(rule, mesh, arg_shapes)
        return tuple(_sharding(mesh, dims, assign) for dims in rule.outputs)

    partition.twinengine_op = True  # what _batch_unpartitioned recognizes
    op.def_partition(partition, infer_sharding_from_operands=infer_sharding_from_operands,
                     propagate_user_sharding=None, sharding_rule=sharding_rule)

    @functools.wraps(local)
    def call(rule: Rule, static, *arrays):
        traced = any(isinstance(a, jax.core.Tracer) for a in arrays)
        if not traced or _batched(arrays) or amax_axes() or _RULES_OFF.value:
            return tuple(local(static, dict(rule.sizes), *arrays))
        return op(rule, static, *arrays)

    return call


def _batch_unpartitioned(args, dims, *, call, partition, **params):
    """Batching rule of twinengine's custom_partitioning ops: vmap of the op's plain function
    (its FFI calls batch sequentially, as outside jit). Other libraries' custom partitionings
    keep JAX's missing-rule error."""
    if not getattr(partition, "twinengine_op", False):
        raise NotImplementedError("Batching rule for 'custom_partitioning' not implemented")
    outs = jax.vmap(_core.jaxpr_as_fun(call), in_axes=list(dims))(*args)
    return outs, [0] * len(outs)


if _cp.custom_partitioning_p not in batching.fancy_primitive_batchers:
    batching.primitive_batchers[_cp.custom_partitioning_p] = _batch_unpartitioned


# ---- quantized tensors ------------------------------------------------------------------

_PER_TENSOR = ("fp8_current", "fp8_delayed")


def quantized_dims(quantizer, x_dims: Dims, name: str) -> Dims:
    """The dims of the QuantizedTensor field `name` of a tensor with dims `x_dims`, whose
    flattened (R, K) layout has the row factors of x_dims[:-1] (NUMERICS.md §4–§7 layouts)."""
    mode = quantizer.scaling_mode
    rows, k = tuple(f for d in x_dims[:-1] for f in d), x_dims[-1]
    two_d = mode == "fp8_block" and quantizer.block_scaling_dim == 2
    if name in ("amax", "columnwise_amax") or (mode in _PER_TENSOR and name.endswith("scale_inv")):
        return ((),)
    if name == "rowwise_data":
        return x_dims
    if name == "columnwise_data":
        return x_dims if mode == "mxfp8" else (k, rows)
    if name == "rowwise_scale_inv":
        return (k, rows) if mode == "fp8_block" and not two_d else (rows, k)
    return (k, rows) if mode == "nvfp4" or two_d else (rows, k)


def quantized_blocks(quantizer, x_dims: Dims, arg: str) -> tuple[Block, ...]:
    """The shard extents (along the flattened rows and along K) under which every copy of a
    block-format quantize is shard-local and its padded scales tile: MXFP8 128 and 128 (32
    blocks, scales padded to 128 x 4); NVFP4 128 along a dimension its copy's scales pad to 128
    rows, else 64 (16 blocks, 4 scale columns); FP8 block 1D 128 along its blocks, 4 across
    them (2D: 128 and 512); none for the per-tensor formats."""
    mode = quantizer.scaling_mode
    if mode == "mxfp8":
        row, col = 128, 128
    elif mode == "nvfp4":  # 16 blocks, E4M3 scales padded to 128 x 4
        row, col = 128 if quantizer.rowwise else 64, 128 if quantizer.columnwise else 64
    elif mode == "fp8_block":
        two_d = quantizer.block_scaling_dim == 2
        row, col = 1, 1
        if quantizer.rowwise:
            row, col = math.lcm(row, 128 if two_d else 4), math.lcm(col, 512 if two_d else 128)
        if quantizer.columnwise:
            row, col = math.lcm(row, 512 if two_d else 128), math.lcm(col, 128 if two_d else 4)
    else:
        return ()
    what = f"{type(quantizer).__name__} block or scale tile"
    rows = tuple(f for d in x_dims[:-1] for f in d)
    return (Block(arg, rows, row, what + " (flattened rows)"), Block(arg, x_dims[-1], col, what + " (last dimension)"))


def shards_locally(quantizer) -> bool:
    """Whether a quantize under `quantizer` runs per shard: every format but NVFP4 with
    stochastic rounding, whose random bits depend on each element's index in the whole tensor
    (it gathers its input). NVFP4's global amaxes are pmax-ed like a per-tensor amax."""
    return not (quantizer.scaling_mode == "nvfp4" and quantizer.stochastic_rounding)


# ---- ops over rows of features (norms, activations, dropout) ----------------------------

def feature_rule(op: str, call, x_shape: Sequence[int], *, hidden_local: bool, quantizer=None,
                 reduce_rows: bool = False, rows_local: bool = True) -> Rule:
    """The rule of an op over the rows of x's last dimension (the features), from its kernel
    call's array names: x-shaped arrays (x, y, dy, dx) carry x's factors, per-feature ones
    (weight, bias, dweight, dbias) the last, per-row ones (mu, rstd) the rows, the dropout
    mask the flattened elements (8 a byte), a fused quantization's fields the layout of
    quantizing y. Rows shard locally (``rows_local``, not with a quantizer that gathers); the
    features too when ``hidden_local``; with ``reduce_rows`` the per-feature outputs (dweight,
    dbias) of sharded rows are partial sums; per-tensor amaxes are reduced across rows (and
    features)."""
    x_dims = plain_dims("x", x_shape)
    rows, k = x_dims[:-1], x_dims[-1]
    named = {"mu": rows, "rstd": rows, "scale": ((),), "rng": ((),),
             "mask": (tuple(f for d in x_dims for f in d),)}
    named.update({name: x_dims for name in ("x", "y", "dy", "dx")})
    named.update({name: (k,) for name in ("weight", "bias", "dweight", "dbias")})

    def dims(name: str) -> Dims:
        return named[name] if name in named else quantized_dims(quantizer, x_dims, name)

    local = set()
    if rows_local and (quantizer is None or shards_locally(quantizer)):
        local |= {f for d in rows for f in d}
        if hidden_local:
            local |= set(k)
    outputs = tuple(spec.name for spec in call.outputs)
    blocks = quantized_blocks(quantizer, x_dims, "x") if quantizer is not None else ()
    if "mask" in outputs or "mask" in call.inputs:
        blocks += (Block("mask", named["mask"][0], 8, "dropout mask byte (8 elements)"),)
    rows_set = frozenset(f for d in rows for f in d) & frozenset(local)
    return Rule(op, tuple((name, dims(name)) for name in call.inputs), tuple(dims(name) for name in outputs),
                factor_sizes([(x_dims, x_shape)]), local=frozenset(local),
                reduce=rows_set if reduce_rows else frozenset(), amax=frozenset(local), blocks=blocks,
                partial=tuple(i for i, name in enumerate(outputs) if name in ("dweight", "dbias")) if reduce_rows
                else ())
