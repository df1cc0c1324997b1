"""Quantize / dequantize throughput of every quantizer kind vs a copy of the same bytes, same process.

Effective bandwidth = (bytes read + bytes written) / time, counting the input once. The
baseline copies a buffer of the same total size with torch's copy_ (read + write). Prints
GB/s and the ratio to the copy.

    python bench/quantize.py [--rows 4096 --cols 4096 --dtype bfloat16 --repeat 5]
    python bench/quantize.py --device cuda [--rows 8192 --cols 8192]

On CUDA each measurement is a CUDA graph of --iters back-to-back calls (no Python launch
overhead in the timing), timed with CUDA events; the copy is timed the same way. Current
scaling and NVFP4 read their input more than once (global amax pass(es) before the casts), so
their ratios are bounded well below 1.
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
    "mxfp8 (col)": te.MXFP8Quantizer("e4m3", rowwise=False),
    "mxfp8 2d (row+col)": te.MXFP8Quantizer("e4m3", with_2d_quantization=True),
    "fp8 block 1x128 (row+col)": te.Float8BlockQuantizer("e4m3", block_scaling_dim=1),
    "fp8 block 128x128 (row+col)": te.Float8BlockQuantizer("e4m3", block_scaling_dim=2),
    "nvfp4 (row+col)": te.NVFP4Quantizer(),
    "nvfp4 2d (row+col)": te.NVFP4Quantizer(with_2d_quantization=True),
    "nvfp4 rht+sr (row+col)": te.NVFP4Quantizer(with_rht=True, stochastic_rounding=True),
}

DEQUANTIZE = {  # name -> (quantizer, columnwise copy)
    "dequantize fp8 (row)": (te.Float8CurrentScalingQuantizer("e4m3"), False),
    "dequantize fp8 (col)": (te.Float8CurrentScalingQuantizer("e4m3"), True),
    "dequantize mxfp8 (row)": (te.MXFP8Quantizer("e4m3"), False),
    "dequantize mxfp8 (col)": (te.MXFP8Quantizer("e4m3"), True),
    "dequantize fp8 block (row)": (te.Float8BlockQuantizer("e4m3"), False),
    "dequantize fp8 block (col)": (te.Float8BlockQuantizer("e4m3"), True),
    "dequantize nvfp4 (row)": (te.NVFP4Quantizer(), False),
    "dequantize nvfp4 (col)": (te.NVFP4Quantizer(), True),
}


def best_time_cpu(fn, repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def best_time_cuda(fn, repeat: int, iters: int) -> float:
    """Seconds per call: best of `repeat` replays of a CUDA graph holding `iters` calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn()
    graph.replay()  # first replay uploads the graph
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(repeat):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3 / iters)
    del graph
    torch.cuda.empty_cache()
    return best


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--rows", type=int, help="default 4096 on CPU, 8192 on CUDA")
    parser.add_argument("--cols", type=int, help="default 4096 on CPU, 8192 on CUDA")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--iters", type=int, default=10, help="calls per timed CUDA graph (CUDA only)")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    rows = args.rows or (8192 if cuda else 4096)
    cols = args.cols or (8192 if cuda else 4096)

    def timed(fn) -> float:
        return best_time_cuda(fn, args.repeat, args.iters) if cuda else best_time_cpu(fn, args.repeat)

    torch.manual_seed(0)
    x = torch.randn(rows, cols).to(getattr(torch, args.dtype)).to(args.device)
    scale = torch.tensor([0.5], device=args.device)
    rng = torch.tensor([0, 0], device=args.device)  # [seed, offset] for stochastic rounding
    if cuda:
        print(f"CUDA {torch.cuda.get_device_name()}, input {rows}x{cols} {args.dtype}, torch {torch.__version__}, "
              f"CUDA graphs of {args.iters} calls")
    else:
        print(f"CPU, input {rows}x{cols} {args.dtype}, torch {torch.__version__}, "
              f"{torch.get_num_threads()} torch threads")

    def row(name: str, nbytes: int, fn) -> None:
        seconds = timed(fn)
        src = torch.empty(nbytes // 2, dtype=torch.uint8, device=args.device)
        dst = torch.empty_like(src)
        copy_seconds = timed(lambda: dst.copy_(src))
        gbps, copy_gbps = nbytes / seconds / 1e9, nbytes / copy_seconds / 1e9
        print(f"{name:<30}{seconds * 1e3:>9.3f}{gbps:>10.1f}{copy_gbps:>11.1f}{gbps / copy_gbps:>8.3f}")

    print(f"{'kernel':<30}{'ms':>9}{'GB/s':>10}{'copy GB/s':>11}{'ratio':>8}")
    for name, q in QUANTIZERS.items():
        if getattr(q, "with_rht", False) and args.dtype != "bfloat16":
            print(f"{name:<30}  skipped: the RHT needs bfloat16 input")
            continue
        kwargs = {"scale": scale} if q.scaling_mode == "fp8_delayed" else {}
        if getattr(q, "stochastic_rounding", False):
            kwargs["rng"] = rng
        qt = tep.quantize(x, q, **kwargs)
        nbytes = tensor_bytes([x, *qt.tree_flatten()[0]])
        row(name, nbytes, lambda: tep.quantize(x, q, **kwargs))
    for name, (q, columnwise) in DEQUANTIZE.items():
        qt = tep.quantize(x, q)
        prefix = "columnwise" if columnwise else "rowwise"
        out = tep.dequantize(qt, x.dtype, columnwise=columnwise)
        amax = getattr(qt, "columnwise_amax" if columnwise else "amax") if q.scaling_mode == "nvfp4" else None
        nbytes = tensor_bytes([getattr(qt, f"{prefix}_data"), getattr(qt, f"{prefix}_scale_inv"), amax, out])
        row(name, nbytes, lambda: tep.dequantize(qt, x.dtype, columnwise=columnwise))


if __name__ == "__main__":
    main()
