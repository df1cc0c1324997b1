"""Quantize vs memcpy, vs the same math in plain PyTorch compiled by inductor, vs jax.jit of it in jnp.

Every case (fp8 current, mxfp8, fp8 block 1x128 / 128x128, nvfp4; rowwise and rowwise+columnwise;
bf16 and fp32 input) times four contenders interleaved in one loop (bench/_timing.py: the order
rotates every round, so load from other processes hits all of them alike) and reports the
median of per-round ratios with the min–max range:
  copy÷ours      time of a ``copy_`` that moves the op's read+write traffic ((input + output
                 bytes)/2 copied) over our time: the fraction of memcpy bandwidth we reach
  ours÷compiled  our time over torch.compile'd plain-PyTorch math of the same format (written
                 here, below; same outputs, not bit-exact where NUMERICS differs in corners)
  ours÷jax       our time over jax.jit of the same math in jnp
Then the 1 → 2 thread speed-up (torch.set_num_threads) of two 4096² quantizes, interleaved too,
and dequantize vs memcpy.

    python bench/quantize.py [--rows 4096 --cols 4096 --dtypes bfloat16,float32 --rounds 7]
    python bench/quantize.py --cases mxfp8 --no-jax          # a subset, no JAX baseline
    python bench/quantize.py --device cuda                   # synchronised timing, no JAX
    python bench/quantize.py --clock cpu --threads 1         # CPU seconds: steady on a shared machine
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import CLOCKS, Contender, interleave, median, ratio  # noqa: E402

import twinengine as te  # noqa: E402
import twinengine.pytorch as tep  # noqa: E402

FLT_MAX = 3.4028234663852886e38

CASES = {  # name -> quantizer; each also runs rowwise only
    "fp8 current": te.Float8CurrentScalingQuantizer("e4m3"),
    "mxfp8": te.MXFP8Quantizer("e4m3"),
    "fp8 block 1x128": te.Float8BlockQuantizer("e4m3", block_scaling_dim=1),
    "fp8 block 128x128": te.Float8BlockQuantizer("e4m3", block_scaling_dim=2),
    "nvfp4": te.NVFP4Quantizer(),
}

DEQUANTIZE = {  # name -> (quantizer, columnwise copy)
    "dequantize fp8 (row)": (te.Float8CurrentScalingQuantizer("e4m3"), False),
    "dequantize mxfp8 (row)": (te.MXFP8Quantizer("e4m3"), False),
    "dequantize mxfp8 (col)": (te.MXFP8Quantizer("e4m3"), True),
    "dequantize fp8 block (col)": (te.Float8BlockQuantizer("e4m3"), True),
    "dequantize nvfp4 (row)": (te.NVFP4Quantizer(), False),
}


# ---- the same math in plain array code (torch or jnp through a small shim) ----------------------

class _TorchShim:
    fp8, f32, i32, u8 = torch.float8_e4m3fn, torch.float32, torch.int32, torch.uint8
    where = staticmethod(torch.where)

    @staticmethod
    def amax(a, axis=None):
        a = a.abs()
        return a.amax() if axis is None else a.amax(dim=axis, keepdim=True)

    @staticmethod
    def bitcast(a, dtype):
        return a.view(dtype)

    @staticmethod
    def cast(a, dtype):
        return a.to(dtype)

    @staticmethod
    def clip(a, lo, hi):
        return a.clamp(lo, hi)

    @staticmethod
    def t(a):
        return a.t().contiguous()


def _jax_shim():
    import jax
    import jax.numpy as jnp

    class _JaxShim:
        fp8, f32, i32, u8 = jnp.float8_e4m3fn, jnp.float32, jnp.int32, jnp.uint8
        where = staticmethod(jnp.where)

        @staticmethod
        def amax(a, axis=None):
            a = jnp.abs(a)
            return a.max() if axis is None else a.max(axis=axis, keepdims=True)

        @staticmethod
        def bitcast(a, dtype):
            return jax.lax.bitcast_convert_type(a, dtype)

        @staticmethod
        def cast(a, dtype):
            return a.astype(dtype)

        @staticmethod
        def clip(a, lo, hi):
            return jnp.clip(a, lo, hi)

        @staticmethod
        def t(a):
            return a.T

    return _JaxShim


def _per_tensor_scale(xp, a, m):
    return xp.where((a > 0) & (a < float("inf")), m / a, 1.0)


def fp8_current_math(xp, x, col):
    """§4: amax, s = 448/amax, q = sat(x·s); the columnwise copy is q transposed."""
    xf = xp.cast(x, xp.f32)
    a = xp.amax(xf)
    s = _per_tensor_scale(xp, a, 448.0)
    q = xp.cast(xp.clip(xf * s, -448.0, 448.0), xp.fp8)
    out = [q, (1.0 / s).reshape(1), a.reshape(1)]
    if col:
        out.append(xp.t(q))
    return out


def _e8m0_encode(xp, blocks, axis):
    """§5: e = exponent of amax/448 rounded up, m = 2^(127-e) from bits, q = sat(x·m)."""
    v = xp.amax(blocks, axis) * (1.0 / 448.0)
    bits = xp.bitcast(v, xp.i32)
    e = ((bits >> 23) & 255) + xp.cast((bits & 0x7FFFFF) != 0, xp.i32)
    e = xp.clip(e, 0, 254)
    m = xp.bitcast(xp.clip(254 - e, 1, 254) << 23, xp.f32)
    return xp.cast(xp.clip(blocks * m, -448.0, 448.0), xp.fp8), xp.cast(e, xp.u8)


def mxfp8_math(xp, x, col):
    r, k = x.shape
    xf = xp.cast(x, xp.f32)
    q, e = _e8m0_encode(xp, xf.reshape(r, k // 32, 32), 2)
    out = [q.reshape(r, k), e.reshape(r, k // 32)]
    if col:
        q, e = _e8m0_encode(xp, xf.reshape(r // 32, 32, k), 1)
        out += [q.reshape(r, k), e.reshape(r // 32, k)]
    return out


def _block_encode(xp, blocks, axis):
    """§6: pow2 s = 2^floor(log2(448/amax)) (exponent bits only), q = sat(x·s), s_inv = 1/s."""
    s = _per_tensor_scale(xp, xp.amax(blocks, axis), 448.0)
    s = xp.bitcast(xp.bitcast(s, xp.i32) & 0x7F800000, xp.f32)
    return xp.cast(xp.clip(blocks * s, -448.0, 448.0), xp.fp8), 1.0 / s


def fp8_block_1d_math(xp, x, col):
    r, k = x.shape
    xf = xp.cast(x, xp.f32)
    q, s_inv = _block_encode(xp, xf.reshape(r, k // 128, 128), 2)
    out = [q.reshape(r, k), xp.t(s_inv.reshape(r, k // 128))]  # scales stored R-minor
    if col:
        q, s_inv = _block_encode(xp, xp.t(xf).reshape(k, r // 128, 128), 2)
        out += [q.reshape(k, r), xp.t(s_inv.reshape(k, r // 128))]
    return out


def fp8_block_2d_math(xp, x, col):
    r, k = x.shape
    xf = xp.cast(x, xp.f32)
    q, s_inv = _block_encode(xp, xf.reshape(r // 128, 128, k // 128, 128), (1, 3))
    q = q.reshape(r, k)
    out = [q, s_inv.reshape(r // 128, k // 128)]
    if col:
        out += [xp.t(q), xp.t(s_inv.reshape(r // 128, k // 128))]
    return out


def _e2m1_encode(xp, rows, k, xm, s_enc, s_dec):
    """§7 steps 3-5: d_b = E4M3(a_b·(S_enc/6)), m_b = 1/(d_b·S_dec), E2M1 RNE by thresholds."""
    b = xm.reshape(rows, k // 16, 16)
    d = xp.cast(xp.clip(xp.amax(b, 2) * (s_enc * (1.0 / 6.0)), 0.0, 448.0), xp.fp8)
    m = xp.clip(1.0 / (xp.cast(d, xp.f32) * s_dec), 0.0, FLT_MAX)
    v = b * m
    a = abs(v)
    code = (xp.cast(a > 0.25, xp.i32) + xp.cast(a >= 0.75, xp.i32) + xp.cast(a > 1.25, xp.i32)
            + xp.cast(a >= 1.75, xp.i32) + xp.cast(a > 2.5, xp.i32) + xp.cast(a >= 3.5, xp.i32)
            + xp.cast(a > 5.0, xp.i32))
    code = (code + xp.cast(v < 0, xp.i32) * 8).reshape(rows, k // 2, 2)
    packed = xp.cast(code[..., 0] + code[..., 1] * 16, xp.u8)
    return packed, xp.bitcast(d, xp.u8).reshape(rows, k // 16)


def nvfp4_math(xp, x, col):
    r, k = x.shape
    xf = xp.cast(x, xp.f32)
    a = xp.amax(xf)
    s_enc = xp.where(a > 0, xp.clip(2688.0 / a, 0.0, FLT_MAX), 1.0)
    s_dec = 1.0 / s_enc
    q, d = _e2m1_encode(xp, r, k, xf, s_enc, s_dec)
    out = [q, d, a.reshape(1)]
    if col:
        q, d = _e2m1_encode(xp, k, r, xp.t(xf), s_enc, s_dec)
        out += [q, d]
    return out


MATH = {"fp8_current": fp8_current_math, "mxfp8": mxfp8_math, "nvfp4": nvfp4_math}


def math_for(q: te.Quantizer):
    if q.scaling_mode == "fp8_block":
        return fp8_block_2d_math if q.block_scaling_dim == 2 else fp8_block_1d_math
    return MATH[q.scaling_mode]


# ---- the benchmark --------------------------------------------------------------------------------

def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of: " + ", ".join(CASES))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-jax", action="store_true")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--no-threads", action="store_true", help="skip the 1 -> 2 thread speed-up")
    parser.add_argument("--no-dequantize", action="store_true")
    parser.add_argument("--clock", default="wall", choices=list(CLOCKS),
                        help="cpu: process CPU seconds (all threads) instead of wall time; with --threads 1 "
                             "the steady measure of work on a machine shared with other jobs")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for the quantize cases")
    args = parser.parse_args()
    clock = CLOCKS[args.clock]
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    use_jax = not (args.no_jax or cuda)
    sync = torch.cuda.synchronize if cuda else None
    if use_jax:
        import jax
        import jax.numpy as jnp
        import numpy as np

        jxp = _jax_shim()
    print(f"{args.device}, input {args.rows}x{args.cols}, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads){', jax ' + jax.__version__ if use_jax else ''}, "
          f"{args.rounds} interleaved rounds, {args.clock} time; ratios: median [min–max] of per-round ratios")
    print(f"{'case':<34}{'ours ms':>9}  {'copy÷ours':<24}{'ours÷compiled':<24}{'ours÷jax':<24}")
    compiled_fns = {}
    torch._dynamo.config.recompile_limit = 64  # one compiled function per (format, usage, dtype)
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        torch.manual_seed(0)
        x = torch.randn(args.rows, args.cols, device=args.device).to(dtype)
        if use_jax:
            xj = jnp.asarray(x.float().cpu().numpy()).astype(dtype_name)
        for case in args.cases.split(","):
            for col in (False, True):
                q = CASES[case].with_usage(columnwise=col)
                name = f"{case} ({'row+col' if col else 'row'}) {dtype_name}"
                qt = tep.quantize(x, q)
                nbytes = tensor_bytes([x, *qt.tree_flatten()[0]])
                src = torch.empty(nbytes // 2, dtype=torch.uint8, device=args.device)
                dst = torch.empty_like(src)
                contenders = {"ours": lambda: tep.quantize(x, q), "copy": lambda: dst.copy_(src)}
                math = math_for(q)
                if not args.no_compile:
                    key = (math, col)
                    if key not in compiled_fns:
                        compiled_fns[key] = torch.compile(lambda t, m=math, c=col: m(_TorchShim, t, c), dynamic=False)
                    contenders["compiled"] = lambda f=compiled_fns[key]: f(x)
                if use_jax:
                    jfn = jax.jit(lambda t, m=math, c=col: m(jxp, t, c))
                    contenders["jax"] = lambda: jax.block_until_ready(jfn(xj))
                times = interleave(contenders, args.rounds, warmup=2, sync=sync, clock=clock)
                cells = [f"{ratio(times['copy'], times['ours']):.3f}"]
                cells.append(f"{ratio(times['ours'], times['compiled']):.2f}" if "compiled" in times else "-")
                cells.append(f"{ratio(times['ours'], times['jax']):.2f}" if "jax" in times else "-")
                print(f"{name:<34}{median(times['ours']) * 1e3:>9.2f}  " + "".join(f"{c:<24}" for c in cells),
                      flush=True)
        del x
    if not args.no_threads and not cuda:
        saved = torch.get_num_threads()
        torch.manual_seed(0)
        x = torch.randn(args.rows, args.cols).to(torch.bfloat16)
        print(f"\n1 -> 2 threads (torch.set_num_threads), {args.rows}x{args.cols} bfloat16: speed-up t(1)/t(2); "
              "a CPU count well below 2 means other processes held the cores (no speed-up possible)")
        for case in ("fp8 current", "mxfp8"):
            for col in (False, True):
                q = CASES[case].with_usage(columnwise=col)
                fn = lambda q=q: tep.quantize(x, q)  # noqa: E731
                times = interleave({"1": Contender(fn, before=lambda: torch.set_num_threads(1)),
                                    "2": Contender(fn, before=lambda: torch.set_num_threads(2))},
                                   args.rounds, warmup=1)
                torch.set_num_threads(2)
                wall, cpu = time.perf_counter(), time.process_time()
                for _ in range(3):
                    fn()
                busy = (time.process_time() - cpu) / (time.perf_counter() - wall)
                label = f"{case} ({'row+col' if col else 'row'})"
                print(f"{label:<34}{median(times['1']) * 1e3:>8.2f} ms -> {median(times['2']) * 1e3:>8.2f} ms  "
                      f"speed-up {ratio(times['1'], times['2']):.2f}  (CPUs the process got at 2 threads: "
                      f"{busy:.2f})", flush=True)
        torch.set_num_threads(saved)
    if not args.no_dequantize:
        torch.manual_seed(0)
        x = torch.randn(args.rows, args.cols, device=args.device).to(torch.bfloat16)
        print(f"\n{'dequantize -> bfloat16':<34}{'ours ms':>9}  copy÷ours")
        for name, (q, columnwise) in DEQUANTIZE.items():
            qt = tep.quantize(x, q)
            prefix = "columnwise" if columnwise else "rowwise"
            out = tep.dequantize(qt, x.dtype, columnwise=columnwise)
            amax = getattr(qt, "columnwise_amax" if columnwise else "amax") if q.scaling_mode == "nvfp4" else None
            nbytes = tensor_bytes([getattr(qt, f"{prefix}_data"), getattr(qt, f"{prefix}_scale_inv"), amax, out])
            src = torch.empty(nbytes // 2, dtype=torch.uint8, device=args.device)
            dst = torch.empty_like(src)
            times = interleave({"ours": lambda: tep.dequantize(qt, x.dtype, columnwise=columnwise),
                                "copy": lambda: dst.copy_(src)}, args.rounds, warmup=1, sync=sync, clock=clock)
            print(f"{name:<34}{median(times['ours']) * 1e3:>9.2f}  {ratio(times['copy'], times['ours']):.3f}",
                  flush=True)


if __name__ == "__main__":
    main()
