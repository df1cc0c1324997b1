"""twinengine's CPU attention vs torch.nn.functional.scaled_dot_product_attention and
jax.nn.dot_product_attention, in one process, CPU.

Contenders (same q, k, v, layout bshd, causal or no mask):
  ours-torch  torch.ops.twinengine.attention_fwd (the blocked exact-order kernel, docs/attention.md)
  ours-jax    the same kernel through XLA FFI (jitted)
  torch-sdpa  torch.nn.functional.scaled_dot_product_attention (on (B, H, S, D) transposes)
  jax-dpa     jax.nn.dot_product_attention (jitted, implementation="xla")
With --backward each contender also runs its backward (ours: attention_bwd from out and lse;
torch: autograd of SDPA; JAX: jax.vjp of dot_product_attention).
They run interleaved in one loop (the order rotates every round), so machine noise hits all
alike; the report is the median over rounds of each per-round time ratio to ours-torch, with
the min–max range. The machine is shared and noisy: read ratios, not absolute times.

    python bench/attention.py [--seqs 512 1024 2048 --heads 8 --kv-heads 8 --head-dim 64
                               --dtype float32 --mask causal --rounds 5 --backward --clock wall|cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import torch
import torch.nn.functional as F

from twinengine.jax._ops import attention as ja
from twinengine.pytorch._ops import attention as ta


def contenders(q, k, v, dout, mask: str, backward: bool) -> dict:
    """name -> zero-argument callable (blocks until its result is ready)."""
    causal = mask == "causal"
    group = q.shape[2] // k.shape[2]
    jq, jk, jv, jdo = (jnp.asarray(t.float().numpy()).astype(jnp.dtype(str(q.dtype).split(".")[1])) for t in
                       (q, k, v, dout))

    def ours_torch():
        out, lse = ta.attention_fwd(q, k, v, mask_type=mask)
        if backward:
            ta.attention_bwd(dout, q, k, v, out, lse, mask_type=mask)

    @jax.jit
    def ours_jax(q, k, v, dout):
        out, lse = ja.attention_fwd(q, k, v, mask_type=mask)
        if backward:
            return ja.attention_bwd(dout, q, k, v, out, lse, mask_type=mask)
        return out

    def sdpa(qt, kt, vt):
        kt = kt.repeat_interleave(group, dim=1) if group > 1 else kt
        vt = vt.repeat_interleave(group, dim=1) if group > 1 else vt
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    dot = dout.transpose(1, 2).contiguous()

    def torch_sdpa():
        if not backward:
            with torch.no_grad():
                sdpa(qt, kt, vt)
            return
        a, b, c = (t.detach().requires_grad_() for t in (qt, kt, vt))
        sdpa(a, b, c).backward(dot)

    def dpa(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="xla")

    @jax.jit
    def jax_dpa(q, k, v, dout):
        if not backward:
            return dpa(q, k, v)
        out, vjp = jax.vjp(dpa, q, k, v)
        return vjp(dout)

    return {
        "ours-torch": ours_torch,
        "ours-jax": lambda: jax.block_until_ready(ours_jax(jq, jk, jv, jdo)),
        "torch-sdpa": torch_sdpa,
        "jax-dpa": lambda: jax.block_until_ready(jax_dpa(jq, jk, jv, jdo)),
    }


def measure(fns: dict, rounds: int, clock) -> dict[str, list[float]]:
    """Per-round seconds of each contender, run interleaved with a rotating order."""
    names = list(fns)
    for name in names:  # warm-up (and compile)
        fns[name]()
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = clock()
            fns[name]()
            times[name].append(clock() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, nargs="+", default=[512, 1024, 2048])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--mask", default="causal", choices=["causal", "no_mask"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backward", action="store_true")
    parser.add_argument("--clock", default="wall", choices=["wall", "cpu"])
    args = parser.parse_args()
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    print(f"CPU, B={args.batch} H={args.heads} H_kv={args.kv_heads} D={args.head_dim} {args.dtype} {args.mask}"
          f"{' fwd+bwd' if args.backward else ' fwd'}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"jax {jax.__version__}, {args.rounds} interleaved rounds, {args.clock} time")
    others = ("ours-jax", "torch-sdpa", "jax-dpa")
    print(f"{'seq':>6}{'ours-torch ms':>15}" + "".join(f"{name + ' / ours':>26}" for name in others))
    for seq in args.seqs:
        q = torch.randn(args.batch, seq, args.heads, args.head_dim).to(dtype)
        k = torch.randn(args.batch, seq, args.kv_heads, args.head_dim).to(dtype)
        v = torch.randn(args.batch, seq, args.kv_heads, args.head_dim).to(dtype)
        dout = torch.randn(args.batch, seq, args.heads, args.head_dim).to(dtype)
        times = measure(contenders(q, k, v, dout, args.mask, args.backward), args.rounds, clock)
        cells = []
        for other in others:
            ratios = [o / f for o, f in zip(times[other], times["ours-torch"])]
            cells.append(f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
        print(f"{seq:>6}{statistics.median(times['ours-torch']) * 1e3:>15.1f}" + "".join(f"{c:>26}" for c in cells))


if __name__ == "__main__":
    main()
