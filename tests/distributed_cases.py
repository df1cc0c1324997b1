"""Worker side of tests/pytorch/test_distributed.py (importable by the spawned processes, as the
other *_cases.py helpers): every case runs inside a gloo group on 127.0.0.1 and reports its
failure text back (None when it passed)."""

import datetime
import os
import socket
import tempfile
import traceback

import torch
import torch.multiprocessing as mp

RECIPES = ("high_precision", "delayed", "fp8_current", "mxfp8", "fp8_block", "nvfp4")
LAYOUTS = ("column", "column_sp", "row", "row_sp")
COMPILED = (("fp8_current", "column_sp"), ("delayed", "row"))
BLOCK_LAYOUTS = {"lnl": LAYOUTS, "mlp": ("tp", "tp_sp")}
BLOCK_COMPILED = (("lnl", "fp8_current", "column_sp"), ("mlp", "mxfp8", "tp_sp"))
SEQ, STEPS = 128, 2
OTHER_CASES = ("amax_reduction_current", "delayed_dp_histories", "sequential_collectives", "fsdp2_training",
               "nvfp4_sr_rht_tp", "bad_arguments", "quantized_gather", "fusible_amax_group", "mlp_swiglu")


def _recipe(name):
    from twinengine import recipe as R
    return {"high_precision": None, "delayed": R.DelayedScaling(amax_history_len=4, margin=1),
            "fp8_current": R.Float8CurrentScaling(), "mxfp8": R.MXFP8BlockScaling(),
            "fp8_block": R.Float8BlockScaling(),
            # fp32 tests: no RHT (bf16 only); no stochastic rounding, whose bits follow an element's
            # index in the (sharded) tensor, so sharded gradients round differently
            "nvfp4": R.NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True)}[name]


def case_names(world):
    names = [f"{r}-{l}-eager" for r in RECIPES for l in LAYOUTS]
    names += [f"{b}-{r}-{l}-eager" for b, layouts in BLOCK_LAYOUTS.items() for r in RECIPES for l in layouts]
    if world == 2:
        names += [f"{r}-{l}-compiled" for r, l in COMPILED]
        names += [f"{b}-{r}-{l}-compiled" for b, r, l in BLOCK_COMPILED]
    return names + list(OTHER_CASES)


# ---- inside the workers --------------------------------------------------------------------

_FAILS = []
"""A case's failed comparisons: collected, not raised, so that every rank runs the same
collectives whatever fails (a raise on one rank would leave the others waiting); the worker
raises them at the end of the case."""


def _exact(name, got, want):
    if not torch.equal(got, want):
        diff = (got.float() - want.float()).abs().max().item()
        _FAILS.append(f"{name}: not bit-identical (max abs diff {diff})")


_exact_slice = _exact
"""A slice of a GEMM output (column-parallel outputs and weight gradients, row-parallel input
and weight gradients): bit-identical by NUMERICS §8's batch invariance of the GEMM."""


def _close(name, got, want, tol=1e-5):
    try:
        torch.testing.assert_close(got, want, rtol=tol, atol=tol, msg=lambda m: f"{name}: {m}")
    except AssertionError as error:
        _FAILS.append(str(error))


def _reference(recipe, w, b, xs, dys):
    """The single-process layer over the whole tensors: per step y, dx, dw, db and the scales."""
    import twinengine.pytorch as te
    layer = te.Linear(w.shape[1], w.shape[0], amax_history_len=4)
    with torch.no_grad():
        layer.weight.copy_(w)
        layer.bias.copy_(b)
    steps = []
    for x, dy in zip(xs, dys):
        x = x.clone().requires_grad_(True)
        layer.zero_grad()
        with te.autocast(recipe, enabled=recipe is not None):
            y = layer(x)
        y.backward(dy)
        steps.append((y.detach(), x.grad, layer.weight.grad.clone(), layer.bias.grad.clone(),
                      layer.fwd_scale.clone(), layer.bwd_scale.clone()))
    return steps


def _tp_case(rank, world, recipe_name, layout, compiled):
    import twinengine.pytorch as te
    group = torch.distributed.group.WORLD
    torch.manual_seed(0)
    recipe = _recipe(recipe_name)
    mode, sp = layout.split("_")[0], layout.endswith("_sp")
    k, n = 256 * world // 2, 256 * world // 2  # a shard of 128 features: whole FP8 blocks
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(n, k, generator=gen) / 16
    b = torch.randn(n, generator=gen)
    xs = [torch.randn(SEQ, k, generator=gen) * (1 + i) for i in range(STEPS)]
    dys = [torch.randn(SEQ, n, generator=gen) * (1 + i) for i in range(STEPS)]
    ref = _reference(recipe, w, b, xs, dys)
    layer = te.Linear(k, n, amax_history_len=4, tp_group=group, tp_size=world, parallel_mode=mode,
                      sequence_parallel=sp)
    feat = slice(rank * n // world, (rank + 1) * n // world) if mode == "column" else slice(
        rank * k // world, (rank + 1) * k // world)
    seq = slice(rank * SEQ // world, (rank + 1) * SEQ // world)
    with torch.no_grad():
        layer.weight.copy_(w[feat] if mode == "column" else w[:, feat])
        layer.bias.copy_(b[feat] if mode == "column" else b)
    run = torch.compile(layer, fullgraph=True) if compiled else layer
    for step, (x, dy, (y_ref, dx_ref, dw_ref, db_ref, fwd_scale, bwd_scale)) in enumerate(zip(xs, dys, ref)):
        tag = f"step {step}"
        if mode == "column":
            x_in = (x[seq] if sp else x).clone().requires_grad_(True)
            dy_in = dy[:, feat]
        else:
            x_in = x[:, feat].clone().requires_grad_(True)
            dy_in = dy[seq] if sp else dy
        layer.zero_grad()
        with te.autocast(recipe, enabled=recipe is not None):
            y = run(x_in)
        y.backward(dy_in)
        if mode == "column":
            _exact_slice(f"{tag} y", y.detach(), y_ref[:, feat])
            _close(f"{tag} dx", x_in.grad, dx_ref[seq] if sp else dx_ref)
            _exact_slice(f"{tag} dw", layer.weight.grad, dw_ref[feat])
            _exact(f"{tag} db", layer.bias.grad, db_ref[feat])
        else:
            _close(f"{tag} y", y.detach(), y_ref[seq] if sp else y_ref)
            _exact_slice(f"{tag} dx", x_in.grad, dx_ref[:, feat])
            _exact_slice(f"{tag} dw", layer.weight.grad, dw_ref[:, feat])
            if sp:  # each rank's bias gradient covers its own rows; their sum is the whole one
                summed = layer.bias.grad.clone()
                torch.distributed.all_reduce(summed, group=group)
                _close(f"{tag} db (summed over ranks)", summed, db_ref)
            else:
                _exact(f"{tag} db", layer.bias.grad, db_ref)
        _exact(f"{tag} fwd_scale", layer.fwd_scale, fwd_scale)
        _exact(f"{tag} bwd_scale", layer.bwd_scale, bwd_scale)


def _randomize(module, gen):
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) / 8 + (1 if name == "layer_norm_weight" else 0))


def _linear_ops(module):
    from twinengine.pytorch.ops import BasicLinear
    return [op for op in module.basic_ops if isinstance(op, BasicLinear)]


def _gated_rows(t, world, rank):
    """This rank's [gate | linear] rows of a gated FC1 weight / bias (jax parallel.gated_fc1_for_tp)."""
    half = t.shape[0] // 2
    step = half // world
    return torch.cat([t[rank * step:(rank + 1) * step], t[half + rank * step:half + (rank + 1) * step]])


def _block_case(rank, world, block, recipe_name, layout, compiled, activation="gelu"):
    """LayerNormLinear (column / row, ± sequence parallel) or LayerNormMLP (FC1 column + FC2 row,
    ± sequence parallel) on `world` ranks against the single-process module on the whole
    tensors: outputs, input / parameter gradients and delayed-scaling scales (see the module
    docstring of tests/pytorch/test_distributed.py for which are exact)."""
    import twinengine.pytorch as te
    group = torch.distributed.group.WORLD
    recipe = _recipe(recipe_name)
    sp = layout.endswith("_sp")
    gen = torch.Generator().manual_seed(17)
    wide = 128 * world  # a shard of 128 features: whole FP8 blocks
    if block == "lnl":
        mode = layout.split("_")[0]
        k, n = wide, wide
        ref = te.LayerNormLinear(k, n, amax_history_len=4)
        tp = te.LayerNormLinear(k, n, amax_history_len=4, tp_group=group, tp_size=world, parallel_mode=mode,
                                sequence_parallel=sp)
        feat = slice(rank * n // world, (rank + 1) * n // world) if mode == "column" else slice(
            rank * k // world, (rank + 1) * k // world)
        shards = {"weight": (lambda t: t[feat]) if mode == "column" else (lambda t: t[:, feat]),
                  "bias": (lambda t: t[feat]) if mode == "column" else (lambda t: t)}
        out_width = n
    else:
        mode = "mlp"
        k, ffn = 128, wide
        ref = te.LayerNormMLP(k, ffn, activation=activation, amax_history_len=4)
        tp = te.LayerNormMLP(k, ffn, activation=activation, amax_history_len=4, tp_group=group, tp_size=world,
                             sequence_parallel=sp)
        feat = slice(rank * ffn // world, (rank + 1) * ffn // world)
        fc1 = (lambda t: _gated_rows(t, world, rank)) if activation == "swiglu" else (lambda t: t[feat])
        shards = {"fc1_weight": fc1, "fc1_bias": fc1, "fc2_weight": lambda t: t[:, feat], "fc2_bias": lambda t: t}
        out_width = k
    _randomize(ref, gen)
    whole = dict(ref.named_parameters())
    with torch.no_grad():
        for name, p in tp.named_parameters():
            p.copy_(shards.get(name, lambda t: t)(whole[name]))
    xs = [torch.randn(SEQ, k, generator=gen) * (1 + i) for i in range(STEPS)]
    dys = [torch.randn(SEQ, out_width, generator=gen) * (1 + i) for i in range(STEPS)]
    seq = slice(rank * SEQ // world, (rank + 1) * SEQ // world)
    run = torch.compile(tp, fullgraph=True) if compiled else tp
    x_sharded = sp and mode != "row"          # the input is this rank's rows
    y_sharded = sp and mode != "column"       # the output is this rank's rows
    y_cols = feat if mode == "column" else slice(None)
    for step, (x, dy) in enumerate(zip(xs, dys)):
        tag = f"step {step}"
        xr = x.clone().requires_grad_(True)
        ref.zero_grad()
        with te.autocast(recipe, enabled=recipe is not None):
            y_ref = ref(xr)
        y_ref.backward(dy)
        x_in = (x[seq] if x_sharded else x).clone().requires_grad_(True)
        tp.zero_grad()
        with te.autocast(recipe, enabled=recipe is not None):
            y = run(x_in)
        y.backward(dy[seq if y_sharded else slice(None)][:, y_cols])
        want_y = y_ref.detach()[seq if y_sharded else slice(None)][:, y_cols]
        (_exact if mode == "column" else _close)(f"{tag} y", y.detach(), want_y)
        want_dx = xr.grad[seq] if x_sharded else xr.grad
        (_exact if mode == "row" else _close)(f"{tag} dx", x_in.grad, want_dx)
        grads = dict(ref.named_parameters())
        for name, p in tp.named_parameters():
            want = shards.get(name, lambda t: t)(grads[name].grad)
            summed = name.startswith("layer_norm") and x_sharded or (name in ("bias", "fc2_bias") and sp
                                                                      and mode != "column")
            if summed:  # a gradient over this rank's rows only: the ranks' sum is the whole one
                got = p.grad.clone()
                torch.distributed.all_reduce(got, group=group)
                _close(f"{tag} d{name} (summed over ranks)", got, want, 1e-4)
            elif name.startswith("layer_norm") and mode != "row":
                _close(f"{tag} d{name}", p.grad, want, 1e-4)  # from the summed input-feature gradient
            else:
                _exact(f"{tag} d{name}", p.grad, want)
        for i, (mine, theirs) in enumerate(zip(_linear_ops(tp), _linear_ops(ref))):
            _exact(f"{tag} linear {i} fwd_scale", mine.fwd_scale, theirs.fwd_scale)
            _exact(f"{tag} linear {i} bwd_scale", mine.bwd_scale, theirs.bwd_scale)


def _mlp_swiglu(rank, world):
    """A gated LayerNormMLP: each rank's FC1 shard holds its [gate | linear] rows."""
    _block_case(rank, world, "mlp", "fp8_current", "tp_sp", False, activation="swiglu")


def _quantized_gather(rank, world):
    """all_gather_quantized of each rank's quantized shard equals quantize of the gathered
    tensor, data and scales (padding included), for every format whose scales allow it."""
    import twinengine.pytorch as te
    from twinengine import recipe as R
    from twinengine.pytorch.distributed import all_gather_quantized, can_gather_quantized, quantize_reduced
    group = torch.distributed.group.WORLD
    name = group.group_name
    gen = torch.Generator().manual_seed(23)
    xs = [torch.randn(128, 256, generator=gen) * (r + 1) for r in range(world)]
    whole_x = torch.cat(xs)
    scale = torch.tensor([3.0])
    for label, q in (("fp8_current", R.Float8CurrentScaling().quantizer("input")),
                     ("fp8_delayed", R.DelayedScaling().quantizer("input")),
                     ("mxfp8", R.MXFP8BlockScaling().quantizer("input")),
                     ("fp8_block", R.Float8BlockScaling().quantizer("input"))):
        kwargs = {"scale": scale} if label == "fp8_delayed" else {}
        if not can_gather_quantized(q, 128, 256):
            _FAILS.append(f"{label}: a 128-row shard should gather quantized")
            continue
        got = all_gather_quantized(quantize_reduced(xs[rank], q, name, **kwargs), name, world)
        want = te.quantize(whole_x, q, **kwargs)
        for field in ("rowwise_data", "rowwise_scale_inv", "columnwise_data", "columnwise_scale_inv"):
            a, b = getattr(got, field), getattr(want, field)
            if (a is None) != (b is None) or a is not None and (a.shape != b.shape or not torch.equal(
                    a.view(torch.uint8) if a.element_size() == 1 else a, b.view(torch.uint8) if b.element_size() == 1
                    else b)):
                _FAILS.append(f"{label} {field}: gathered quantized shards differ from quantize(gathered)")
    for label, q, rows in (("nvfp4", R.NVFP4BlockScaling().quantizer("input"), 128),
                           ("mxfp8 split block", R.MXFP8BlockScaling().quantizer("input"), 48)):
        if can_gather_quantized(q, rows, 256):
            _FAILS.append(f"{label}: must gather in high precision")


def _fusible_amax_group(rank, world):
    """autocast(amax_reduction_group=...) over the fusible ops (data parallel): per-tensor and
    delayed recipes reduce their amaxes, so each rank's output rows equal the single-process
    run over the concatenated batch, and delayed-scaling histories stay identical."""
    import twinengine.pytorch as te
    from twinengine import recipe as R
    group = torch.distributed.group.WORLD
    gen = torch.Generator().manual_seed(29)
    for recipe in (R.Float8CurrentScaling(), R.DelayedScaling(amax_history_len=4)):
        torch.manual_seed(0)  # the same model on every rank
        mods = [te.LayerNormMLP(64, 128, amax_history_len=4) for _ in range(2)]
        mods[1].load_state_dict(mods[0].state_dict())
        rows = slice(rank * 16, (rank + 1) * 16)
        for step in range(2):
            xs = torch.randn(16 * world, 64, generator=gen) * torch.arange(1, 16 * world + 1)[:, None] / 8
            dys = torch.randn(16 * world, 64, generator=gen)
            x = xs[rows].clone().requires_grad_(True)
            with te.autocast(recipe, amax_reduction_group=group):
                y = mods[0](x)
            y.backward(dys[rows])
            xw = xs.clone().requires_grad_(True)
            with te.autocast(recipe):
                y_whole = mods[1](xw)
            y_whole.backward(dys)
            tag = f"{type(recipe).__name__} step {step}"
            _exact(f"{tag} y rows", y.detach(), y_whole.detach()[rows])
            _exact(f"{tag} dx rows", x.grad, xw.grad[rows])
            for i, (mine, theirs) in enumerate(zip(_linear_ops(mods[0]), _linear_ops(mods[1]))):
                for buf in ("fwd_amax_history", "bwd_amax_history", "fwd_scale", "bwd_scale"):
                    _exact(f"{tag} linear {i} {buf}", getattr(mine, buf), getattr(theirs, buf))


def _amax_reduction_current(rank, world):
    """autocast(amax_reduction_group=...): each rank's x quantizes to its rows of the whole
    tensor's quantization (the global scale), and linear's output rows equal the whole run's."""
    import twinengine.pytorch as te
    from twinengine import recipe as R
    from twinengine.pytorch.distributed import quantize_reduced
    group = torch.distributed.group.WORLD
    gen = torch.Generator().manual_seed(3)
    xs = [torch.randn(32, 64, generator=gen) * (r + 1) for r in range(world)]  # a different amax per rank
    q = R.Float8CurrentScaling().quantizer("input")
    whole = te.quantize(torch.cat(xs), q)
    mine = quantize_reduced(xs[rank], q, group.group_name)
    _exact("scale_inv", mine.rowwise_scale_inv, whole.rowwise_scale_inv)
    _exact("amax", mine.amax, whole.amax)
    rows = slice(rank * 32, (rank + 1) * 32)
    _exact("rowwise data", mine.rowwise_data.view(torch.uint8), whole.rowwise_data[rows].view(torch.uint8))
    _exact("columnwise data", mine.columnwise_data.view(torch.uint8),
           whole.columnwise_data[:, rows].view(torch.uint8))
    w = torch.randn(48, 64, generator=gen)
    with te.autocast(R.Float8CurrentScaling(), amax_reduction_group=group):
        y = te.linear(xs[rank], w)
    with te.autocast(R.Float8CurrentScaling()):
        y_whole = te.linear(torch.cat(xs), w)
    _exact_slice("linear output rows", y, y_whole[rows])


def _delayed_dp_histories(rank, world):
    """DelayedScaling with data parallelism: the amax histories and scales stay identical on
    every rank and equal the single-process run over the concatenated batch."""
    import twinengine.pytorch as te
    from twinengine import recipe as R
    group = torch.distributed.group.WORLD
    recipe = R.DelayedScaling(amax_history_len=4)
    gen = torch.Generator().manual_seed(5)
    layers = [te.Linear(64, 32, amax_history_len=4) for _ in range(2)]
    with torch.no_grad():
        layers[1].load_state_dict(layers[0].state_dict())
    for step in range(3):
        xs = [torch.randn(16, 64, generator=gen) * (r + step + 1) for r in range(world)]
        dys = [torch.randn(16, 32, generator=gen) * (world - r) for r in range(world)]
        with te.autocast(recipe, amax_reduction_group=group):
            layers[0](xs[rank]).backward(dys[rank])
        with te.autocast(recipe):
            layers[1](torch.cat(xs)).backward(torch.cat(dys))
    for name in ("fwd_amax_history", "bwd_amax_history", "fwd_scale", "bwd_scale"):
        mine = getattr(layers[0], name)
        gathered = [torch.empty_like(mine) for _ in range(world)]
        torch.distributed.all_gather(gathered, mine, group=group)
        for other in gathered:
            _exact(f"{name} across ranks", other, mine)
        _exact(f"{name} vs the whole batch", mine, getattr(layers[1], name))


def _sequential_collectives(rank, world):
    """ops.AllGather / ReduceScatter / AllReduce inside Sequential: the collective's values
    forward and its adjoint backward; AllGather → BasicLinear is a sequence-parallel
    column-parallel Linear whose output is the exact slice of the single-device one."""
    import twinengine.pytorch as te
    from twinengine import recipe as R
    group = torch.distributed.group.WORLD
    gen = torch.Generator().manual_seed(11)
    xs = [torch.randn(32, 64, generator=gen) for _ in range(world)]
    dys = [torch.randn(32 * world, 64, generator=gen) for _ in range(world)]
    x = xs[rank].clone().requires_grad_(True)
    y = te.ops.Sequential(te.ops.AllGather(group))(x)
    y.backward(dys[rank])
    _exact("AllGather forward", y.detach(), torch.cat(xs))
    rows = slice(rank * 32, (rank + 1) * 32)
    _close("AllGather backward", x.grad, sum(dy[rows] for dy in dys))
    x = dys[rank].clone().requires_grad_(True)
    y = te.ops.Sequential(te.ops.ReduceScatter(group))(x)
    y.backward(xs[rank])
    _close("ReduceScatter forward", y.detach(), sum(dys)[rows])
    _exact("ReduceScatter backward", x.grad, torch.cat(xs))
    x = xs[rank].clone().requires_grad_(True)
    y = te.ops.Sequential(te.ops.AllReduce(group))(x)
    y.backward(xs[0])
    _close("AllReduce forward", y.detach(), sum(xs))
    _exact("AllReduce backward", x.grad, xs[0])
    n = 32 * world
    w = torch.randn(n, 64, generator=gen)
    whole_linear, local_linear = te.ops.BasicLinear(64, n), te.ops.BasicLinear(64, n // world)
    whole = te.ops.Sequential(whole_linear)
    local = te.ops.Sequential(te.ops.AllGather(group), local_linear)
    feat = slice(rank * n // world, (rank + 1) * n // world)
    with torch.no_grad():
        whole_linear.weight.copy_(w)
        local_linear.weight.copy_(w[feat])
    with te.autocast(R.MXFP8BlockScaling()):
        _exact_slice("AllGather → BasicLinear", local(xs[rank]).detach(), whole(torch.cat(xs)).detach()[:, feat])


def _fsdp2_training(rank, world):
    """FSDP2 fully_shard over twinengine Linears (data parallel, Float8CurrentScaling with the
    amax reduced over the group): the losses of a few SGD steps equal the unsharded model's on
    the whole batch within the tolerance of the gradient reduction's summation order."""
    import twinengine.pytorch as te
    from twinengine import recipe as R
    from torch.distributed.fsdp import fully_shard
    group = torch.distributed.group.WORLD
    torch.manual_seed(0)
    make = lambda: torch.nn.Sequential(te.Linear(64, 64), torch.nn.GELU(), te.Linear(64, 32))  # noqa: E731
    model, ref = make(), make()
    ref.load_state_dict(model.state_dict())
    for layer in model:
        if isinstance(layer, te.Linear):
            fully_shard(layer)
    fully_shard(model)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref)]
    gen = torch.Generator().manual_seed(13)
    recipe = R.Float8CurrentScaling()
    for step in range(3):
        xs = [torch.randn(16, 64, generator=gen) for _ in range(world)]
        targets = [torch.randn(16, 32, generator=gen) for _ in range(world)]
        with te.autocast(recipe, amax_reduction_group=group):
            loss = torch.nn.functional.mse_loss(model(xs[rank]), targets[rank])
        loss.backward()
        opts[0].step()
        opts[0].zero_grad()
        with te.autocast(recipe):
            ref_loss = torch.nn.functional.mse_loss(ref(torch.cat(xs)), torch.cat(targets))
        ref_loss.backward()
        opts[1].step()
        opts[1].zero_grad()
        mean = loss.detach().clone()
        torch.distributed.all_reduce(mean, group=group)
        _close(f"step {step} loss", mean / world, ref_loss.detach(), 1e-4)


def _expect_error(name, fn, exc_type, text):
    try:
        fn()
    except exc_type as error:
        if text not in str(error):
            raise AssertionError(f"{name}: error text {str(error)!r} lacks {text!r}") from None
        return
    raise AssertionError(f"{name}: no {exc_type.__name__} raised")


def _nvfp4_sr_rht_tp(rank, world):
    """NVFP4 with RHT and stochastic rounding (bf16) in a column-parallel Linear and
    LayerNormLinear: the global amaxes are reduced over the tp_group, so the forward output is the
    exact slice of the single-process one; the backward runs (stochastic rounding draws per
    element index of the local tensor, so sharded gradients are not the single-device bytes)."""
    import twinengine.pytorch as te
    from twinengine import recipe as R
    group = torch.distributed.group.WORLD
    gen = torch.Generator().manual_seed(31)
    n = 64 * world
    x = torch.randn(32, 64, generator=gen).to(torch.bfloat16)
    w = (torch.randn(n, 64, generator=gen) / 8).to(torch.bfloat16)
    feat = slice(rank * 64, (rank + 1) * 64)
    for make in (lambda **kw: te.Linear(64, n, bias=False, params_dtype=torch.bfloat16, **kw),
                 lambda **kw: te.LayerNormLinear(64, n, bias=False, params_dtype=torch.bfloat16, **kw)):
        whole, part = make(), make(tp_group=group, tp_size=world, parallel_mode="column")
        with torch.no_grad():
            whole.weight.copy_(w)
            part.weight.copy_(w[feat])
        xi = x.clone().requires_grad_(True)
        with te.autocast(R.NVFP4BlockScaling()):
            y = part(xi)
            y_whole = whole(x)
        _exact(f"{type(whole).__name__} y", y.detach(), y_whole.detach()[:, feat])
        y.float().sum().backward()
        if not torch.isfinite(xi.grad.float()).all():
            _FAILS.append(f"{type(whole).__name__}: non-finite input gradient")


def _bad_arguments(rank, world):
    import twinengine.pytorch as te
    group = torch.distributed.group.WORLD
    _expect_error("indivisible", lambda: te.Linear(64, 30 * world + 1, tp_group=group, tp_size=world,
                                                   parallel_mode="column"), ValueError, "out_features=")
    _expect_error("row indivisible", lambda: te.Linear(3, 64, tp_group=group, tp_size=world, parallel_mode="row"),
                  ValueError, "in_features=3 is not divisible by tp_size")
    _expect_error("tp_size", lambda: te.Linear(64, 64, tp_group=group, tp_size=world + 1, parallel_mode="row"),
                  ValueError, f"tp_size={world + 1} does not match the tp_group's size {world}")
    _expect_error("sp without group", lambda: te.Linear(64, 64, parallel_mode="row", sequence_parallel=True),
                  ValueError, "sequence_parallel=True needs a tp_group")
    _expect_error("LayerNormLinear indivisible", lambda: te.LayerNormLinear(64, 30 * world + 1, tp_group=group,
                                                                            tp_size=world, parallel_mode="column"),
                  ValueError, f"out_features={30 * world + 1} is not divisible by tp_size={world}")
    _expect_error("LayerNormLinear row indivisible", lambda: te.LayerNormLinear(
        3, 64, tp_group=group, tp_size=world, parallel_mode="row"), ValueError, "in_features=3 is not divisible")
    _expect_error("LayerNormMLP indivisible", lambda: te.LayerNormMLP(64, 4 * world + 1, tp_group=group,
                                                                      tp_size=world),
                  ValueError, f"ffn_hidden_size={4 * world + 1} is not divisible by tp_size={world}")
    _expect_error("LayerNormMLP tp_size", lambda: te.LayerNormMLP(64, 64, tp_group=group, tp_size=world + 1),
                  ValueError, f"tp_size={world + 1} does not match the tp_group's size {world}")
    _expect_error("LayerNormLinear tp_size", lambda: te.LayerNormLinear(64, 64, tp_group=group, tp_size=2 * world,
                                                                        parallel_mode="column"),
                  ValueError, f"tp_size={2 * world} does not match")
    _expect_error("LayerNormMLP sp without group", lambda: te.LayerNormMLP(64, 64, sequence_parallel=True),
                  ValueError, "sequence_parallel=True needs a tp_group")
    _expect_error("LayerNormLinear sp without group", lambda: te.LayerNormLinear(
        64, 64, parallel_mode="column", sequence_parallel=True), ValueError, "sequence_parallel=True needs a tp_group")
    _expect_error("LayerNormLinear mode", lambda: te.LayerNormLinear(64, 64, tp_group=group, tp_size=world,
                                                                     parallel_mode="col"),
                  ValueError, "parallel_mode must be")
    _expect_error("mode", lambda: te.Linear(64, 64, tp_group=group, tp_size=world, parallel_mode="rows"),
                  ValueError, "parallel_mode must be")
    layer = te.Linear(64, 64, tp_group=group, tp_size=world, parallel_mode="row", sequence_parallel=True)
    _expect_error("sequence", lambda: layer(torch.randn(world * 4 + 1, 64 // world)), ValueError,
                  "sequence dimension")


def _worker(rank, world, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    results = {}
    try:
        chosen = os.environ.get("TWE_DIST_CASES")  # debugging: a comma-separated subset of the cases
        for name in chosen.split(",") if chosen else case_names(world):
            try:
                parts = name.split("-")
                if len(parts) == 3:
                    _tp_case(rank, world, parts[0], parts[1], parts[2] == "compiled")
                elif len(parts) == 4:
                    _block_case(rank, world, parts[0], parts[1], parts[2], parts[3] == "compiled")
                else:
                    globals()[f"_{name}"](rank, world)
                if _FAILS:
                    raise AssertionError("\n".join(_FAILS))
                results[name] = None
            except Exception:  # reported back to the test as the case's failure text
                results[name] = traceback.format_exc(limit=6)
            _FAILS.clear()
            torch.distributed.barrier()
    finally:
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        torch.distributed.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_RESULTS = {}


def results(world):
    """Per rank, {case: failure text or None}, spawning the group of `world` processes once."""
    if world not in _RESULTS:
        with tempfile.TemporaryDirectory() as out_dir:
            mp.spawn(_worker, args=(world, _free_port(), out_dir), nprocs=world, join=True)
            _RESULTS[world] = [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(world)]
    return _RESULTS[world]


# ---- cross-framework parity (tests/parity/test_distributed_parity.py) ----------------------

def parity_mlp_worker(rank, world, port, inputs_path, out_dir):
    """Runs the tensor-parallel LayerNormMLP (FC1 column, FC2 row, SwiGLU) of the npz at
    `inputs_path` on this rank's shards for each recipe; rank 0 saves the outputs."""
    import numpy as np
    import twinengine.pytorch as te
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        data = np.load(inputs_path)
        group = torch.distributed.group.WORLD
        hidden, ffn = data["fc2_weight"].shape
        feat = slice(rank * ffn // world, (rank + 1) * ffn // world)
        shards = {"fc1_weight": lambda t: _gated_rows(t, world, rank), "fc1_bias": lambda t: _gated_rows(t, world, rank),
                  "fc2_weight": lambda t: t[:, feat]}
        outputs = {}
        for name in PARITY_RECIPES:
            mlp = te.LayerNormMLP(hidden, ffn, activation="swiglu", tp_group=group, tp_size=world)
            with torch.no_grad():
                for pname, p in mlp.named_parameters():
                    p.copy_(shards.get(pname, lambda t: t)(torch.from_numpy(data[pname])))
            recipe = _recipe(name)
            with te.autocast(recipe, enabled=recipe is not None):
                outputs[name] = mlp(torch.from_numpy(data["x"])).detach().numpy()
        if rank == 0:
            np.savez(os.path.join(out_dir, "torch.npz"), **outputs)
    finally:
        torch.distributed.destroy_process_group()


PARITY_RECIPES = ("high_precision", "fp8_current", "mxfp8", "fp8_block")


def free_port():
    return _free_port()
