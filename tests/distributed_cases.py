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

RECIPES = ("high_precision", "delayed", "fp8_current", "mxfp8", "fp8_block")
LAYOUTS = ("column", "column_sp", "row", "row_sp")
COMPILED = (("fp8_current", "column_sp"), ("delayed", "row"))
SEQ, STEPS = 128, 2
OTHER_CASES = ("amax_reduction_current", "delayed_dp_histories", "sequential_collectives", "fsdp2_training",
               "nvfp4_tp_raises", "bad_arguments")


def _recipe(name):
    from twinengine import recipe as R
    return {"high_precision": None, "delayed": R.DelayedScaling(amax_history_len=4, margin=1),
            "fp8_current": R.Float8CurrentScaling(), "mxfp8": R.MXFP8BlockScaling(),
            "fp8_block": R.Float8BlockScaling(), "nvfp4": R.NVFP4BlockScaling()}[name]


def case_names(world):
    names = [f"{r}-{l}-eager" for r in RECIPES for l in LAYOUTS]
    if world == 2:
        names += [f"{r}-{l}-compiled" for r, l in COMPILED]
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


def _nvfp4_tp_raises(rank, world):
    import twinengine.pytorch as te
    layer = te.Linear(64, 64, tp_group=torch.distributed.group.WORLD, tp_size=world, parallel_mode="column")
    x = torch.randn(32, 64, dtype=torch.bfloat16)

    def run():
        with te.autocast(_recipe("nvfp4")):
            layer.to(torch.bfloat16)(x)
    _expect_error("nvfp4", run, TypeError, "NVFP4's global amax is not reduced")


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
    from twinengine import recipe as R

    def fused_with_group():
        with te.autocast(R.Float8CurrentScaling(), amax_reduction_group=group):
            te.LayerNormLinear(64, 64)(torch.randn(32, 64))
    _expect_error("fusible ops with a group", fused_with_group, TypeError, "not supported by the fusible ops")
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
