"""LayerNormMLP training step (forward + backward) on CPU: the fused plan vs the same ops unfused
(``fuse=False``) vs the same block in plain PyTorch under torch.compile, every recipe.

All three run interleaved in one loop (one call of each per round), and the script prints the
median over rounds of the per-round time ratios, with their min–max, so machine noise hits
every variant alike.

    python bench/mlp.py [--rows 2048 --hidden 1024 --ffn 2048 --rounds 10 --recipes mxfp8,fp8-current]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import twinengine.pytorch as tep
from twinengine import recipe as R
from twinengine.pytorch import ops

RECIPES = {
    "high-precision": None,
    "fp8-current": R.Float8CurrentScaling(),
    "fp8-delayed": R.DelayedScaling(amax_history_len=16),
    "mxfp8": R.MXFP8BlockScaling(),
    "fp8-block": R.Float8BlockScaling(),
    "nvfp4": R.NVFP4BlockScaling(),
}


def plain_block(x, ln_w, ln_b, w1, b1, w2, b2):
    """The same block in plain PyTorch (LayerNorm -> Linear -> SwiGLU -> Linear)."""
    h = F.layer_norm(x, (x.shape[-1],), ln_w, ln_b, eps=1e-5)
    a, g = F.linear(h, w1, b1).chunk(2, dim=-1)
    return F.linear(F.silu(a) * g, w2, b2)


CLOCK = time.perf_counter


def timed(fn) -> float:
    start = CLOCK()
    fn()
    return CLOCK() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--ffn", type=int, default=2048)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--recipes", default=",".join(RECIPES))
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch intra-op threads (default 1: inductor's spinning OpenMP workers and twinengine's own "
                        "kernel threads otherwise contend for the same cores and every ratio swings 10x)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: process CPU time (all threads), steadier than wall time on a loaded machine")
    args = p.parse_args()
    torch.set_num_threads(args.torch_threads)
    torch._dynamo.config.recompile_limit = 64  # one step function, compiled per recipe and variant
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.manual_seed(0)
    module = tep.LayerNormMLP(args.hidden, args.ffn, activation="swiglu", amax_history_len=16)
    unfused = ops.Sequential(ops.LayerNorm(args.hidden), ops.Linear(args.hidden, 2 * args.ffn, amax_history_len=16),
                             ops.SwiGLU(), ops.Linear(args.ffn, args.hidden, amax_history_len=16), fuse=False)
    with torch.no_grad():
        for src, dst in zip(module.parameters(), (unfused.basic_ops[0].weight, unfused.basic_ops[0].bias,
                                                   unfused.basic_ops[1].weight, unfused.basic_ops[4].weight,
                                                   unfused.basic_ops[2].bias, unfused.basic_ops[5].bias)):
            dst.copy_(src)
    plain_params = [p.detach().clone().requires_grad_(True) for p in (
        module.layer_norm_weight, module.layer_norm_bias, module.fc1_weight, module.fc1_bias, module.fc2_weight,
        module.fc2_bias)]
    plain = torch.compile(plain_block, fullgraph=True)
    print(f"LayerNormMLP(SwiGLU) step, rows {args.rows}, hidden {args.hidden}, ffn {args.ffn}, CPU, "
          f"{torch.get_num_threads()} torch threads; ratios = time / time of plain PyTorch compiled (fp32), "
          f"median of {args.rounds} interleaved rounds [min-max]")
    for name in args.recipes.split(","):
        recipe = RECIPES[name]
        dtype = torch.bfloat16 if name == "nvfp4" else torch.float32

        def make_step(block):
            def step(x):
                with tep.autocast(enabled=recipe is not None, recipe=recipe):
                    return block(x)
            return torch.compile(step, fullgraph=True)

        fused_step, unfused_step = make_step(module.to(dtype)), make_step(unfused.to(dtype))
        x = torch.randn(args.rows, args.hidden, dtype=dtype)
        dy = torch.randn(args.rows, args.hidden, dtype=dtype)
        xp = x.float()

        def run(step):
            xs = x.clone().requires_grad_(True)
            step(xs).backward(dy)

        def run_plain():
            xs = xp.clone().requires_grad_(True)
            plain(xs, *plain_params).backward(dy.float())

        for fn in (lambda: run(fused_step), lambda: run(unfused_step), run_plain):
            fn()  # compile and warm up
        ratios = {"fused": [], "unfused": [], "fused/unfused": []}
        base_times = []
        for _ in range(args.rounds):
            t_fused, t_unfused, t_plain = timed(lambda: run(fused_step)), timed(lambda: run(unfused_step)), \
                timed(run_plain)
            ratios["fused"].append(t_fused / t_plain)
            ratios["unfused"].append(t_unfused / t_plain)
            ratios["fused/unfused"].append(t_fused / t_unfused)
            base_times.append(t_plain)
        parts = [f"{k} {statistics.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]" for k, v in ratios.items()]
        print(f"{name:15s} plain {statistics.median(base_times) * 1e3:7.1f} ms | " + " | ".join(parts))
        module.float()
        unfused.float()


if __name__ == "__main__":
    main()
