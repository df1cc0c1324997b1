"""python -m demo --distributed: a character LM trained tensor/sequence-parallel and data-parallel.

The model is the MLP language model (no attention: twinengine has no tensor-parallel attention
yet): the embeddings of CONTEXT characters, concatenated -> Linear -> `--layers` residual
RMSNorm -> LayerNormMLP(SwiGLU, `--ffn`) blocks -> RMSNorm -> Linear to the vocabulary, predicting
the next character. Three runs from the same NumPy parameters and batches:

- PyTorch on one device (torch.compile(fullgraph=True));
- PyTorch, 2 processes (gloo, 127.0.0.1), TP=2 with sequence parallelism: each block is a
  ``tep.LayerNormMLP(tp_group=, tp_size=2, sequence_parallel=True)`` (FC1 column, FC2 row; the
  normalized input all-gathered quantized where the recipe allows, NUMERICS §12); the rest of
  the model runs on each rank's half of the batch rows (the "sequence"), and the gradients of
  the replicated parameters are summed over the ranks (Megatron's rule for sequence-parallel
  parameters). Compiled with torch.compile(fullgraph=True);
- JAX on a 2x2 CPU mesh (dp=2, tp=2; ``XLA_FLAGS=--xla_force_host_platform_device_count=4``):
  the batch sharded over dp, each block ``twinengine.jax.parallel.layernorm_mlp`` over tp
  inside ``jax.shard_map``, per-tensor amaxes reduced over both axes.

The losses agree up to the row-parallel fp32 summation order and the frameworks' own ops
(cross-entropy, Adam), amplified over steps by a low-precision recipe. Prints the three losses
every ``--log-every`` steps and plots them.
"""

from __future__ import annotations

import datetime
import os
import socket
import tempfile
import time

import numpy as np

WORLD = 2
CONTEXT, EMBED, ROWS = 8, 16, 256
"""Characters of context per example, embedding width, examples per batch (the "sequence" the
tensor-parallel group shards: 128 rows a rank, whole FP8 blocks)."""
RECIPES = ("mxfp8", "fp8-current", "fp8-block", "high-precision")
"""Recipes of the distributed demo: the JAX tensor-parallel block keeps no DelayedScaling state,
and JAX refuses NVFP4's stochastically rounded gradients under an amax reduction (their bits
follow each element's index in the whole tensor)."""

_BLOCK = ("layer_norm_weight", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias")


def init_params(vocab: int, hidden: int, ffn: int, layers: int, seed: int) -> dict[str, np.ndarray]:
    """Flat NumPy float32 parameters (torch layout, weights (out, in)): embedding (vocab, EMBED);
    proj.{weight (hidden, CONTEXT·EMBED), bias}; block{b}.{layer_norm_weight, fc1_weight
    (2·ffn, hidden), fc1_bias, fc2_weight (hidden, ffn), fc2_bias}; head.{norm_weight, weight
    (vocab, hidden), bias}. Linears U(±1/√fan_in), FC2 halved, biases 0, norms 1."""
    rng = np.random.default_rng(seed)

    def linear(fan_in, fan_out, scale=1.0):
        bound = scale / np.sqrt(fan_in)
        return rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32), np.zeros(fan_out, np.float32)

    params = {"embedding": rng.standard_normal((vocab, EMBED)).astype(np.float32) * 0.5}
    params["proj.weight"], params["proj.bias"] = linear(CONTEXT * EMBED, hidden)
    for b in range(layers):
        params[f"block{b}.layer_norm_weight"] = np.ones(hidden, np.float32)
        params[f"block{b}.fc1_weight"], params[f"block{b}.fc1_bias"] = linear(hidden, 2 * ffn)
        params[f"block{b}.fc2_weight"], params[f"block{b}.fc2_bias"] = linear(ffn, hidden, 0.5)
    params["head.norm_weight"] = np.ones(hidden, np.float32)
    params["head.weight"], params["head.bias"] = linear(hidden, vocab)
    return params


def batches(ids: np.ndarray, steps: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """`steps` batches of (contexts (ROWS, CONTEXT), next characters (ROWS,)), int64."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        pos = rng.integers(0, len(ids) - CONTEXT, size=ROWS)
        window = ids[pos[:, None] + np.arange(CONTEXT + 1)]
        out.append((window[:, :-1], window[:, -1]))
    return out


def _gated_rows(t: np.ndarray, rank: int) -> np.ndarray:
    """This rank's [gate | linear] rows of the gated FC1 (jax parallel.gated_fc1_for_tp's order)."""
    half = t.shape[0] // 2
    step = half // WORLD
    return np.concatenate([t[rank * step:(rank + 1) * step], t[half + rank * step:half + (rank + 1) * step]])


def _torch_train(args, params: dict, data: list, rank: int | None) -> list[float]:
    """Trains the PyTorch model: on one device (rank None), or as `rank` of the TP=2 +
    sequence-parallel group (the process group already initialised). Returns the losses."""
    import torch
    import torch.nn.functional as F

    import twinengine.pytorch as te
    from twinengine.pytorch import ops

    from .__main__ import make_recipe

    recipe = make_recipe(args.recipe)
    group = None if rank is None else torch.distributed.group.WORLD
    rows = slice(None) if rank is None else slice(rank * ROWS // WORLD, (rank + 1) * ROWS // WORLD)
    tp = {} if rank is None else {"tp_group": group, "tp_size": WORLD, "sequence_parallel": True}

    class LM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = torch.nn.Parameter(torch.zeros(params["embedding"].shape))
            hidden, fan_in = params["proj.weight"].shape
            self.proj = te.Linear(fan_in, hidden)
            self.blocks = torch.nn.ModuleList(
                te.LayerNormMLP(hidden, args.ffn, normalization="RMSNorm", activation="swiglu", **tp)
                for _ in range(args.layers))
            self.head = ops.Sequential(ops.RMSNorm(hidden), ops.Linear(hidden, params["head.weight"].shape[0]))

        def forward(self, contexts, targets):
            with te.autocast(enabled=recipe is not None, recipe=recipe):
                h = self.proj(self.embedding[contexts].reshape(contexts.shape[0], -1))
                for block in self.blocks:
                    h = h + block(h)
                logits = self.head(h)
            return F.cross_entropy(logits, targets, reduction="sum") / ROWS  # this rank's share of the mean

    model = LM()
    feat = slice(None) if rank is None else slice(rank * args.ffn // WORLD, (rank + 1) * args.ffn // WORLD)
    shard = {} if rank is None else {"fc1_weight": lambda t: _gated_rows(t, rank),
                                     "fc1_bias": lambda t: _gated_rows(t, rank), "fc2_weight": lambda t: t[:, feat]}
    sources = {"head.basic_ops.0.weight": "head.norm_weight", "head.basic_ops.1.weight": "head.weight",
               "head.basic_ops.2.bias": "head.bias"}
    replicated = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("blocks."):
                _, b, pname = name.split(".")
                value = shard.get(pname, lambda t: t)(params[f"block{b}.{pname}"])
                sharded = pname in shard
            else:
                value, sharded = params[sources.get(name, name)], False
            if not sharded:
                replicated.append(p)
            p.copy_(torch.from_numpy(np.ascontiguousarray(value)))
    loss_fn = torch.compile(model, fullgraph=True, backend=args.torch_backend)
    moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in model.parameters()]
    losses = []
    for t, (contexts, targets) in enumerate(data, start=1):
        model.zero_grad(set_to_none=True)
        loss = loss_fn(torch.from_numpy(contexts[rows]), torch.from_numpy(targets[rows]))
        loss.backward()
        total = loss.detach().clone()
        if group is not None:
            for p in replicated:  # computed from this rank's rows only
                torch.distributed.all_reduce(p.grad, group=group)
            torch.distributed.all_reduce(total, group=group)
        b1, b2, eps = 0.9, 0.999, 1e-8
        c1, c2 = (torch.tensor(1 - b**t, dtype=torch.float32) for b in (b1, b2))
        with torch.no_grad():
            for p, (m, v) in zip(model.parameters(), moments):
                m.copy_(m * b1 + p.grad * (1 - b1))
                v.copy_(v * b2 + p.grad * p.grad * (1 - b2))
                p.copy_(p - args.lr * (m / c1) / ((v / c2).sqrt() + eps))
        losses.append(float(total))
    return losses


def _torch_worker(rank: int, port: int, args, params: dict, data: list, out_dir: str) -> None:
    import torch

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(minutes=10))
    try:
        losses = _torch_train(args, params, data, rank)
        if rank == 0:
            np.save(os.path.join(out_dir, "torch_tp.npy"), np.array(losses))
    finally:
        torch.distributed.destroy_process_group()


def _jax_train(args, params: dict, data: list) -> list[float]:
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    import twinengine.jax as tj
    from twinengine.jax import ops, parallel
    from twinengine.jax.sharding import amax_reduction

    from .__main__ import make_recipe

    recipe = make_recipe(args.recipe)
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("dp", "tp"))
    p0 = {k: jnp.asarray(v) for k, v in params.items()}
    specs = {k: P() for k in p0}
    for b in range(args.layers):
        for k in ("fc1_weight", "fc1_bias"):
            p0[f"block{b}.{k}"] = parallel.gated_fc1_for_tp(p0[f"block{b}.{k}"], 2)
        specs.update({f"block{b}.fc1_weight": P("tp", None), f"block{b}.fc1_bias": P("tp"),
                      f"block{b}.fc2_weight": P(None, "tp")})
    hidden, vocab = params["proj.weight"].shape[0], params["head.weight"].shape[0]

    def local(p, contexts):
        with amax_reduction(("dp", "tp")), tj.autocast(recipe, enabled=recipe is not None):
            h = p["embedding"][contexts].reshape(contexts.shape[0], -1)
            h = tj.dense(h, p["proj.weight"].T, p["proj.bias"])
            for b in range(args.layers):
                block = {k: p[f"block{b}.{k}"] for k in _BLOCK}
                h = h + parallel.layernorm_mlp(h, block, tp_axis="tp", normalization="RMSNorm", activation="swiglu",
                                               recipe=recipe)
            head = ops.Sequential(ops.RMSNorm(hidden), ops.Linear(hidden, vocab))
            return head(h, ((p["head.norm_weight"],), (p["head.weight"],), (p["head.bias"],)))

    def loss(p, contexts, targets):
        logits = jax.shard_map(local, mesh=mesh, in_specs=(specs, P("dp")), out_specs=P("dp"),
                               check_vma=False)(p, contexts)
        logp = logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True)
        return -jnp.take_along_axis(logp, targets[:, None], axis=-1).mean()

    @jax.jit
    def step(p, moments, contexts, targets, c1, c2):
        value, grads = jax.value_and_grad(loss)(p, contexts, targets)
        b1, b2, eps = 0.9, 0.999, 1e-8
        new_p, new_m = {}, {}
        for k, v in p.items():
            m, s = moments[k]
            m = m * b1 + grads[k] * (1 - b1)
            s = s * b2 + grads[k] * grads[k] * (1 - b2)
            new_p[k] = v - args.lr * (m / c1) / (jnp.sqrt(s / c2) + eps)
            new_m[k] = (m, s)
        return new_p, new_m, value

    p, moments = p0, {k: (jnp.zeros_like(v), jnp.zeros_like(v)) for k, v in p0.items()}
    losses = []
    for t, (contexts, targets) in enumerate(data, start=1):
        c1, c2 = (np.float32(1 - b**t) for b in (0.9, 0.999))
        p, moments, value = step(p, moments, contexts.astype(np.int32), targets.astype(np.int32), c1, c2)
        losses.append(float(value))
    return losses


def _plot(path, curves: dict, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for (label, losses), style in zip(curves.items(), ("-", "--", ":")):
        ax.plot(np.arange(1, len(losses) + 1), losses, style, label=label, linewidth=1.3)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (cross-entropy, nats)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(args, ids: np.ndarray, vocab: int) -> None:
    """Runs the three trainings on the same batches and prints / plots their losses."""
    import torch
    import torch.multiprocessing as mp

    if args.recipe not in RECIPES:
        raise SystemExit(f"--distributed runs the recipes {', '.join(RECIPES)} (got {args.recipe}): the JAX "
                         "tensor-parallel block keeps no DelayedScaling state, and NVFP4's stochastically rounded "
                         "gradients are refused under JAX's amax reduction")
    if args.ffn % (WORLD * 128) and args.recipe == "fp8-block" or args.ffn % WORLD:
        raise SystemExit(f"--distributed needs --ffn divisible by {WORLD} (by {WORLD * 128} for fp8-block)")
    params = init_params(vocab, args.hidden, args.ffn, args.layers, args.seed)
    data = batches(ids, args.steps, args.seed + 1)
    print(f"distributed demo: MLP LM ({CONTEXT} characters x {EMBED} -> Linear {args.hidden} -> {args.layers} x "
          f"[RMSNorm -> LayerNormMLP(SwiGLU, {args.ffn})] -> RMSNorm -> Linear {vocab}), {ROWS} examples a step, "
          f"{args.steps} steps, recipe {args.recipe}: one PyTorch device, PyTorch {WORLD} processes (TP={WORLD} + "
          f"sequence parallel, gloo), JAX 2x2 mesh (dp=2, tp=2)")
    walls = {}
    torch.set_num_threads(args.torch_threads)
    start = time.perf_counter()
    single = _torch_train(args, params, data, None)
    walls["torch 1 device"] = time.perf_counter() - start
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out_dir:
        start = time.perf_counter()
        mp.spawn(_torch_worker, args=(port, args, params, data, out_dir), nprocs=WORLD, join=True)
        tp_losses = list(np.load(os.path.join(out_dir, "torch_tp.npy")))
        walls[f"torch TP={WORLD}+SP"] = time.perf_counter() - start
    start = time.perf_counter()
    jax_losses = _jax_train(args, params, data)
    walls["jax 2x2"] = time.perf_counter() - start
    for step in range(args.steps):
        if (step + 1) % args.log_every == 0 or step == 0 or step + 1 == args.steps:
            print(f"step {step + 1:4d}  loss: torch 1 device {single[step]:.6f}  torch TP={WORLD}+SP "
                  f"{tp_losses[step]:.6f}  jax dp=2 x tp=2 {jax_losses[step]:.6f}")
    tp_diff = np.abs(np.array(tp_losses) - np.array(single))
    jax_diff = np.abs(np.array(jax_losses) - np.array(single))
    print(f"step 1 |loss - 1 device|: torch TP {tp_diff[0]:.2e}, jax {jax_diff[0]:.2e}; largest over the run: "
          f"torch TP {tp_diff.max():.2e}, jax {jax_diff.max():.2e}")
    print("wall time (compiles included): " + ", ".join(f"{k} {v:.1f} s" for k, v in walls.items()))
    args.out.mkdir(parents=True, exist_ok=True)
    png = args.out / f"loss_distributed_{args.recipe}.png"
    _plot(png, {"PyTorch, 1 device": single, f"PyTorch, TP={WORLD} + sequence parallel (gloo)": tp_losses,
                "JAX, dp=2 x tp=2 mesh": jax_losses},
          f"twinengine MLP char LM, recipe {args.recipe}: 1 device vs distributed")
    print(f"wrote {png}")
