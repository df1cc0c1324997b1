"""python -m demo: train a small decoder-only character language model on the Python standard
library's own source text in PyTorch (torch.compile) and JAX (jax.jit) side by side, through
twinengine's low-precision kernels: a token embedding, TransformerLayer blocks (causal
self-attention with rotary position embeddings, RMSNorm, SwiGLU LayerNormMLP) and a head that is a
Sequential of basic ops (RMSNorm -> Linear). Each position predicts the next character.

The run trains the chosen --recipe and, beside it, the same model in high precision (no recipe):
four runs (2 frameworks x 2 precisions), all from the same NumPy parameters and the same batches.
Every norm, attention, rotary, activation and Linear (forward and backward) runs the same twinengine
kernels in both frameworks, so their losses agree up to the few ops each framework does its own
way (embedding gather/scatter, the residual adds' gradient sums, softmax cross-entropy, Adam).
Prints per-step losses, the largest torch-vs-JAX difference per recipe and the time per step, and
writes a loss-curve PNG and a per-step CSV.

Size constraints: --hidden a multiple of --heads with an even head size (rotary). mxfp8: --hidden,
--ffn and batch x context multiples of 32; fp8-block: multiples of 128 (the vocabulary is padded to
128). nvfp4: stochastic rounding draws different random bits in the two frameworks (torch's [seed,
offset] streams vs Flax's "stochastic_rounding" RNG), so its curves agree statistically, not to the
last bit.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import pathlib
import statistics
import time

import numpy as np
from tqdm import tqdm

from twinengine import recipe as R
from twinengine.quantizers import Float8CurrentScalingQuantizer

from .data import CharData, corpus
from .init import ModelConfig, init_params

RECIPES = {
    "mxfp8": lambda: R.MXFP8BlockScaling(),
    "fp8-current": lambda: R.Float8CurrentScaling(),
    "fp8-delayed": lambda: R.DelayedScaling(amax_history_len=16),
    "fp8-block": lambda: R.Float8BlockScaling(),
    # The model is fp32 and the random Hadamard transform is defined for bf16 input only.
    "nvfp4": lambda: R.NVFP4BlockScaling(disable_rht=True),
    "custom": lambda: R.CustomRecipe(lambda role: Float8CurrentScalingQuantizer(
        "e5m2" if role == "grad_output" else "e4m3", force_pow_2_scales=True)),
    "high-precision": lambda: None,
}
MULTIPLE = {"mxfp8": 32, "fp8-block": 128}
HP = "high-precision"
FP8_ATTENTION = ("fp8-current", "fp8-delayed")


def make_recipe(name: str, fp8_attention: bool = False):
    """The recipe called `name`; with `fp8_attention`, its ``fp8_dpa`` set (FP8 attention)."""
    recipe = RECIPES[name]()
    return dataclasses.replace(recipe, fp8_dpa=True) if fp8_attention and recipe is not None else recipe


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", choices=RECIPES, default="mxfp8", help="quantization recipe (default: mxfp8)")
    p.add_argument("--fp8-attention", action="store_true",
                   help="FP8 attention too (the recipe's fp8_dpa: Q, K, V and the probabilities in E4M3, "
                        "docs/attention.md); fp8-current and fp8-delayed only")
    p.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True,
                   help="also train in high precision, from the same weights and batches (default: on)")
    p.add_argument("--steps", type=int, default=None, help="training steps (default 150; 60 with --distributed)")
    p.add_argument("--batch", type=int, default=16, help="sequences per step (batch x context tokens)")
    p.add_argument("--context", type=int, default=64, help="characters per sequence")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--ffn", type=int, default=256, help="SwiGLU width of each layer's MLP")
    p.add_argument("--heads", type=int, default=4, help="attention heads (head size hidden / heads)")
    p.add_argument("--layers", "--blocks", type=int, default=2, help="TransformerLayer blocks")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=25, help="print the losses every N steps (1: every step)")
    p.add_argument("--torch-backend", default="inductor", help="torch.compile backend")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch intra-op threads (default 1: the model is tiny, the GEMMs run on twinengine's own "
                        "worker threads, and a spinning OpenMP pool beside them only slows both down)")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("demo_out"),
                   help="folder for loss_<recipe>.png and losses_<recipe>.csv")
    p.add_argument("--distributed", action="store_true",
                   help="instead: an MLP character LM trained on one PyTorch device, on 2 PyTorch processes (TP=2 + "
                        "sequence parallel, gloo) and on a 2x2 JAX CPU mesh (dp x tp), losses side by side "
                        "(demo/distributed.py)")
    args = p.parse_args()
    if args.steps is None:
        args.steps = 60 if args.distributed else 150
    if args.fp8_attention and args.recipe not in FP8_ATTENTION:
        p.error(f"--fp8-attention needs --recipe {' or '.join(FP8_ATTENTION)}, got {args.recipe}")
    multiple = MULTIPLE.get(args.recipe)
    if multiple:
        for name, value in (("--hidden", args.hidden), ("--ffn", args.ffn),
                            ("--batch x --context", args.batch * args.context)):
            if value % multiple:
                p.error(f"recipe {args.recipe} needs {name} a multiple of {multiple}, got {value}")
    return args


def plot(path: pathlib.Path, runs: dict, unigram: float, title: str) -> None:
    """Loss curves (both frameworks, each recipe), the recipe's loss minus the high-precision one
    (when both ran) and |torch - JAX| per recipe, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(runs)
    panels = 3 if len(names) == 2 else 2
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.5))
    left, right = axes[0], axes[-1]
    colors = dict(zip(names, ("tab:blue", "tab:orange")))
    for name, (torch_losses, jax_losses) in runs.items():
        steps = np.arange(1, len(torch_losses) + 1)
        left.plot(steps, torch_losses, color=colors[name], linewidth=1.5, label=f"{name}, PyTorch (torch.compile)")
        left.plot(steps, jax_losses, color="black", linewidth=0.8, linestyle="--", alpha=0.7,
                  label="JAX (jax.jit), dashed" if name == names[0] else None)
        right.semilogy(steps, np.maximum(np.abs(np.array(torch_losses) - np.array(jax_losses)), 1e-12),
                       color=colors[name], linewidth=1.0, label=name)
    left.axhline(unigram, color="gray", linewidth=0.8, linestyle=":", label=f"unigram entropy {unigram:.2f}")
    left.set_ylabel("training loss (cross-entropy, nats)")
    left.set_title(title, fontsize=10)
    if panels == 3:
        middle = axes[1]
        (rt, rj), (ht, hj) = runs[names[0]], runs[names[1]]
        steps = np.arange(1, len(rt) + 1)
        middle.plot(steps, np.array(rt) - np.array(ht), color="tab:blue", linewidth=1.2, label="PyTorch")
        middle.plot(steps, np.array(rj) - np.array(hj), color="black", linewidth=0.8, linestyle="--", label="JAX")
        middle.axhline(0.0, color="gray", linewidth=0.8)
        middle.set_ylabel(f"{names[0]} loss - {names[1]} loss")
        middle.set_title(f"{names[0]} vs {names[1]} (same weights, same batches)", fontsize=10)
    right.set_ylabel("|torch loss - JAX loss| (0 drawn at 1e-12)")
    right.set_title("PyTorch vs JAX, per recipe", fontsize=10)
    for ax in axes:
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def per_step_ms(times) -> float:
    return statistics.median(times[1:]) * 1e3 if len(times) > 1 else times[0] * 1e3


def main() -> None:
    args = parse_args()
    if args.distributed:
        # 4 JAX host devices for the 2x2 mesh: set before JAX starts
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4".strip()
        from .distributed import main as distributed_main

        data = CharData(corpus(), args.context)
        distributed_main(args, data.ids, data.vocab)
        return
    data = CharData(corpus(), args.context)
    cfg = ModelConfig(data.vocab, args.context, args.hidden, args.ffn, args.heads, args.layers)
    cfg.check()
    params = init_params(cfg, args.seed)
    names = [args.recipe] + ([HP] if args.baseline and args.recipe != HP else [])
    unigram = data.unigram_entropy()
    attention = "FP8 attention" if args.fp8_attention else "high-precision attention"
    print(f"twinengine demo: recipe(s) {', '.join(names)} ({attention} under the recipe); {len(data.ids)} characters of standard-library source, "
          f"{data.chars} distinct (unigram entropy {unigram:.3f} nats); model {cfg.describe()}; batch "
          f"{args.batch} x {args.context} tokens, {args.steps} steps")

    import torch

    from .jax_lm import JaxTrainer
    from .torch_lm import TorchTrainer

    torch.set_num_threads(args.torch_threads)
    history = 16
    recipes = {name: make_recipe(name, args.fp8_attention) for name in names}
    trainers = {name: (TorchTrainer(params, cfg, recipes[name], history, args.lr, backend=args.torch_backend),
                       JaxTrainer(params, cfg, recipes[name], history, args.lr, seed=args.seed))
                for name in names}
    losses = {name: ([], []) for name in names}
    times = {name: ([], []) for name in names}
    bar = tqdm(data.batches(args.batch, args.steps, args.seed + 1), total=args.steps, unit="step",
               desc="training (1st step compiles)")
    for step, (inputs, targets) in enumerate(bar, start=1):
        for name, trainers_of in trainers.items():
            for trainer, out, spent in zip(trainers_of, losses[name], times[name]):
                start = time.perf_counter()
                out.append(trainer.step(inputs, targets))
                spent.append(time.perf_counter() - start)
        if step == 1:
            bar.set_description("training")
        main_t, main_j = (losses[args.recipe][0][-1], losses[args.recipe][1][-1])
        bar.set_postfix(torch=f"{main_t:.4f}", jax=f"{main_j:.4f}", diff=f"{abs(main_t - main_j):.1e}")
        if step % args.log_every == 0 or step == 1 or step == args.steps:
            bar.write(f"step {step:4d}  " + "  ".join(
                f"{name}: torch {losses[name][0][-1]:.4f} jax {losses[name][1][-1]:.4f} "
                f"|diff| {abs(losses[name][0][-1] - losses[name][1][-1]):.1e}" for name in names))

    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.recipe + ("-fp8-attention" if args.fp8_attention else "")
    png = args.out / f"loss_{stem}.png"
    csv_path = args.out / f"losses_{stem}.csv"
    diffs = {name: np.abs(np.array(losses[name][0]) - np.array(losses[name][1])) for name in names}
    with csv_path.open("w", newline="") as f:
        writer = csv.writer(f)
        columns = ["torch_loss", "jax_loss", "abs_diff", "torch_seconds", "jax_seconds"]
        # The chosen recipe's columns unprefixed, the high-precision run's prefixed "hp_".
        writer.writerow(["step"] + [("" if name == args.recipe else "hp_") + c for name in names for c in columns])
        for i in range(args.steps):
            row = [i + 1]
            for name in names:
                row += [losses[name][0][i], losses[name][1][i], diffs[name][i], times[name][0][i], times[name][1][i]]
            writer.writerow(row)
    title = f"decoder LM ({cfg.layers} TransformerLayers){', FP8 attention' if args.fp8_attention else ''}: recipe vs high precision"
    plot(png, losses, unigram, title)

    tail = min(20, args.steps)
    print(f"\nunigram entropy of the corpus: {unigram:.4f} nats (a model that ignores the context)")
    for name in names:
        (tl, jl), (tt, jt), d = losses[name], times[name], diffs[name]
        worst = int(d.argmax())
        print(f"{name}: loss start torch {tl[0]:.4f} / jax {jl[0]:.4f}, end torch {tl[-1]:.4f} / jax {jl[-1]:.4f} "
              f"(mean of the last {tail} steps {np.mean(tl[-tail:]):.4f} / {np.mean(jl[-tail:]):.4f})")
        print(f"  largest |torch - jax| loss difference {d[worst]:.3e} (step {worst + 1}), mean {d.mean():.3e}")
        print(f"  time per step (median after the first): torch {per_step_ms(tt):.1f} ms, "
              f"jax {per_step_ms(jt):.1f} ms; "
              f"first step (compile) torch {tt[0]:.1f} s, jax {jt[0]:.1f} s")
    if len(names) == 2:
        gap = np.array(losses[args.recipe][0]) - np.array(losses[HP][0])
        print(f"{args.recipe} - high-precision loss (torch, same batches): mean over the last {tail} steps "
              f"{gap[-tail:].mean():+.4f}, largest |gap| {np.abs(gap).max():.4f}")
    print("note: every norm, attention, rotary, activation, Linear GEMM and quantization runs the same twinengine "
          "kernel in both frameworks; the runs differ only through the ops each framework computes its own way "
          "(softmax cross-entropy, embedding gradient, residual gradient sums, Adam), whose last-bit differences "
          "training amplifies over steps")
    print(f"wrote {png} and {csv_path}")


if __name__ == "__main__":
    main()
