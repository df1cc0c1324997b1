"""Quantize throughput of every quantizer kind vs a memcpy of the same bytes, same process.

Effective bandwidth = (bytes read + bytes written) / time. The baseline copies a buffer of the
same total size with torch's copy_ (read + write). Prints GB/s and the ratio to the copy.

    python bench/quantize.py [--rows 4096 --cols 4096 --dtype bfloat16 --repeat 5]
"""

from __future__ import annotations

import argparse
import time

import torch

import twinengine as te
import twinengine.pytorch as tep

QUANTIZERS = {
    "fp8 current (row+col)": te.Float8CurrentScalingQuantizer("e4m3"),
    "fp8 current (row)": te.Float8CurrentScalingQuantizer("e4m3", columnwise=False),
    "fp8 delayed (row+col)": te.Float8DelayedScalingQuantizer("e4m3"),
    "mxfp8 (row+col)": te.MXFP8Quantizer("e4m3"),
    "mxfp8 (row)": te.MXFP8Quantizer("e4m3", columnwise=False),
    "mxfp8 2d (row+col)": te.MXFP8Quantizer("e4m3", with_2d_quantization=True),
    "fp8 block 1x128 (row+col)": te.Float8BlockQuantizer("e4m3", block_scaling_dim=1),
    "fp8 block 128x128 (row+col)": te.Float8BlockQuantizer("e4m3", block_scaling_dim=2),
    "nvfp4 (row+col)": te.NVFP4Quantizer(),
    "nvfp4 2d (row+col)": te.NVFP4Quantizer(with_2d_quantization=True),
    "nvfp4 rht+sr (row+col)": te.NVFP4Quantizer(with_rht=True, stochastic_rounding=True),
}


def best_time(fn, repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def moved_bytes(x: torch.Tensor, qt: te.QuantizedTensor) -> int:
    out = sum(t.numel() * t.element_size() for t in qt.tree_flatten()[0] if t is not None)
    return x.numel() * x.element_size() + out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    torch.manual_seed(0)
    x = torch.randn(args.rows, args.cols).to(getattr(torch, args.dtype))
    scale = torch.tensor([0.5])
    rng = torch.tensor([0, 0])  # [seed, offset] for stochastic rounding
    print(f"CPU, input {args.rows}x{args.cols} {args.dtype}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} torch threads (twinengine CPU kernels are single-threaded)")
    print(f"{'quantizer':<28}{'ms':>9}{'GB/s':>9}{'copy GB/s':>11}{'ratio':>8}")
    for name, q in QUANTIZERS.items():
        if getattr(q, "with_rht", False) and args.dtype != "bfloat16":
            print(f"{name:<28}  skipped: the RHT needs bfloat16 input")
            continue
        kwargs = {"scale": scale} if q.scaling_mode == "fp8_delayed" else {}
        if getattr(q, "stochastic_rounding", False):
            kwargs["rng"] = rng
        qt = tep.quantize(x, q, **kwargs)
        nbytes = moved_bytes(x, qt)
        seconds = best_time(lambda: tep.quantize(x, q, **kwargs), args.repeat)
        src = torch.empty(nbytes // 2, dtype=torch.uint8)
        dst = torch.empty_like(src)
        copy_seconds = best_time(lambda: dst.copy_(src), args.repeat)
        gbps, copy_gbps = nbytes / seconds / 1e9, nbytes / copy_seconds / 1e9
        print(f"{name:<28}{seconds * 1e3:>9.2f}{gbps:>9.2f}{copy_gbps:>11.2f}{gbps / copy_gbps:>8.3f}")


if __name__ == "__main__":
    main()
