"""python -m demo: train a small character language model on the Python standard library's own
source text in PyTorch (torch.compile) and JAX (jax.jit) side by side, through twinengine's
low-precision kernels: a Linear over the context embeddings, residual RMSNorm -> LayerNormMLP
(SwiGLU) blocks, and a head that is a Sequential of basic ops (RMSNorm -> Linear).

Both frameworks start from the same NumPy parameters and see the same batches; every norm,
activation and Linear (forward and backward) runs the same twinengine kernels, so the losses
agree up to the few ops each framework does its own way (embedding gather/scatter, the
residual add's gradient accumulation, softmax cross-entropy, Adam). Prints per-step losses, their largest difference and the time per
step, and writes a loss-curve PNG and a per-step CSV.
"""

from __future__ import annotations

import argparse
import csv
import pathlib
import statistics
import time

import numpy as np
from tqdm import tqdm

from twinengine import recipe as R
from twinengine.quantizers import Float8CurrentScalingQuantizer

from .data import CharData, corpus
from .init import init_params

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


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", choices=RECIPES, default="mxfp8", help="quantization recipe (default: mxfp8)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=128, help="a multiple of 128 for fp8-block, of 32 for mxfp8")
    p.add_argument("--context", type=int, default=8, help="characters of context")
    p.add_argument("--embed", type=int, default=16)
    p.add_argument("--hidden", type=int, default=256, help="a multiple of 128 for fp8-block")
    p.add_argument("--ffn", type=int, default=256, help="SwiGLU width of each block (a multiple of 128 for fp8-block)")
    p.add_argument("--blocks", type=int, default=2, help="residual RMSNorm -> LayerNormMLP blocks")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=25, help="print both losses every N steps (1: every step)")
    p.add_argument("--torch-backend", default="inductor", help="torch.compile backend")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch intra-op threads (default 1: the model is tiny, the GEMMs run on twinengine's own "
                        "worker threads, and a spinning OpenMP pool beside them only slows both down)")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("demo_out"),
                   help="folder for loss_<recipe>.png and losses_<recipe>.csv")
    return p.parse_args()


def plot(path: pathlib.Path, torch_losses, jax_losses, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    steps = np.arange(1, len(torch_losses) + 1)
    top.plot(steps, torch_losses, label="PyTorch (torch.compile)", linewidth=1.5)
    top.plot(steps, jax_losses, label="JAX (jax.jit)", linewidth=1.0, linestyle="--")
    top.set_ylabel("training loss (cross-entropy)")
    top.set_title(title)
    top.legend()
    bottom.semilogy(steps, np.maximum(np.abs(np.array(torch_losses) - np.array(jax_losses)), 1e-12))
    bottom.set_ylabel("|Δ loss| (0 at 1e-12)")
    bottom.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    args = parse_args()
    recipe = RECIPES[args.recipe]()
    data = CharData(corpus(), args.context)
    params = init_params(data.vocab, args.embed, args.context, args.hidden, args.ffn, args.blocks, args.seed)
    print(f"twinengine demo: recipe {args.recipe} ({type(recipe).__name__ if recipe else 'none'}), "
          f"{len(data.ids)} characters of standard-library source, vocabulary {data.vocab}, model "
          f"{args.context}x{args.embed} -> Linear {args.hidden} -> {args.blocks} x [RMSNorm -> LayerNormMLP(SwiGLU, "
          f"{args.ffn})] -> RMSNorm -> Linear {data.vocab}, batch {args.batch}, {args.steps} steps")

    import torch

    from .jax_lm import JaxTrainer
    from .torch_lm import TorchTrainer

    torch.set_num_threads(args.torch_threads)
    history = 16
    torch_trainer = TorchTrainer(params, args.blocks, recipe, history, args.lr, backend=args.torch_backend)
    jax_trainer = JaxTrainer(params, args.blocks, recipe, history, args.lr)
    torch_losses, jax_losses, torch_times, jax_times = [], [], [], []
    bar = tqdm(data.batches(args.batch, args.steps, args.seed + 1), total=args.steps, unit="step",
               desc="training (1st step compiles)")
    for step, (contexts, targets) in enumerate(bar, start=1):
        start = time.perf_counter()
        torch_losses.append(torch_trainer.step(contexts, targets))
        torch_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        jax_losses.append(jax_trainer.step(contexts.astype(np.int32), targets.astype(np.int32)))
        jax_times.append(time.perf_counter() - start)
        diff = abs(torch_losses[-1] - jax_losses[-1])
        if step == 1:
            bar.set_description("training")
        bar.set_postfix(torch=f"{torch_losses[-1]:.4f}", jax=f"{jax_losses[-1]:.4f}", diff=f"{diff:.1e}")
        if step % args.log_every == 0 or step == 1 or step == args.steps:
            bar.write(f"step {step:4d}  loss torch {torch_losses[-1]:.6f}  jax {jax_losses[-1]:.6f}  "
                      f"|diff| {diff:.2e}")

    diffs = np.abs(np.array(torch_losses) - np.array(jax_losses))
    worst = int(diffs.argmax())
    args.out.mkdir(parents=True, exist_ok=True)
    png = args.out / f"loss_{args.recipe}.png"
    csv_path = args.out / f"losses_{args.recipe}.csv"
    with csv_path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", "torch_loss", "jax_loss", "abs_diff", "torch_seconds", "jax_seconds"])
        for i, row in enumerate(zip(torch_losses, jax_losses, diffs, torch_times, jax_times), start=1):
            writer.writerow([i, *row])
    plot(png, torch_losses, jax_losses, f"twinengine char LM (LayerNormMLP blocks), recipe {args.recipe}: PyTorch vs JAX")

    def per_step(times):
        return statistics.median(times[1:]) * 1e3 if len(times) > 1 else times[0] * 1e3

    print(f"\nloss: start torch {torch_losses[0]:.4f} / jax {jax_losses[0]:.4f}, "
          f"end torch {torch_losses[-1]:.4f} / jax {jax_losses[-1]:.4f}")
    print(f"largest |torch - jax| loss difference: {diffs[worst]:.3e} (step {worst + 1}); "
          f"mean {diffs.mean():.3e}")
    print(f"time per step (median after the first): torch {per_step(torch_times):.1f} ms, "
          f"jax {per_step(jax_times):.1f} ms; first step (compile) torch {torch_times[0]:.1f} s, "
          f"jax {jax_times[0]:.1f} s")
    print("note: every norm, activation, Linear GEMM and quantization runs the same twinengine kernel in both "
          "frameworks; the two runs differ only through the ops each framework computes its own way (softmax "
          "cross-entropy, embedding gradient, residual gradient sums, Adam), whose last-bit differences a "
          "low-precision recipe can amplify over steps")
    print(f"wrote {png} and {csv_path}")


if __name__ == "__main__":
    main()
