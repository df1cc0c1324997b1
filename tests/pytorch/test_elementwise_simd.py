"""The CPU norm and activation kernels give the same bytes on every instruction set: the
AVX-512 and AVX2 row loops (csrc/internal/simd_lanes.h, picked at run time) against the scalar
loops, forced per process with TWE_ELEMENTWISE_ISA (a variant the CPU lacks falls back to a
narrower one, which must agree just the same). Inputs cover every bf16 / fp16 bit pattern,
random fp32 bit patterns, the exp / tanh range ends, subnormals, ±inf and NaN, widths that are
not multiples of the vector or of the 32 canonical lanes, and the fused norm + quantize and
activation + quantize and activation-gradient + bias-gradient paths."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

_SCRIPT = r"""
import sys
import numpy as np
import torch
import twinengine as te
from twinengine.pytorch._ops import activation as A
from twinengine.pytorch._ops import norm as tn
from elementwise_cases import SPECIAL_VALUES

out = {}
def put(name, t):  # floats as their bit patterns (bf16: uint16, suffix "|bf16"), the rest as bytes
    if t is None:
        return
    t = t.detach().contiguous().reshape(-1)
    if t.dtype == torch.bfloat16:
        out[name + "|bf16"] = t.view(torch.int16).numpy().view(np.uint16).copy()
    elif t.dtype in (torch.float32, torch.float16):
        out[name] = t.numpy().copy()
    else:
        out[name] = t.view(torch.uint8).numpy().copy()

rng = np.random.default_rng(0)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
COLS = 258  # gated half 129: whole vectors and a tail

def act_input(dtype):
    if dtype == "float32":
        bits = rng.integers(0, 2**32, size=40000, dtype=np.uint64).astype(np.uint32).view(np.float32)
        grid = np.linspace(-110.0, 110.0, 20000, dtype=np.float32)
        x = np.concatenate([bits, grid, SPECIAL_VALUES])
        t = torch.from_numpy(x)
    else:
        pattern = torch.from_numpy(rng.permutation(65536).astype(np.int32)).to(torch.int16)
        t = torch.cat([pattern.view(DTYPES[dtype]).float(), torch.from_numpy(SPECIAL_VALUES)])
    n = -(-t.numel() // COLS) * COLS
    t = torch.cat([t, torch.from_numpy(rng.standard_normal(n - t.numel()).astype(np.float32) * 4)])
    return t.reshape(-1, COLS).to(DTYPES[dtype])

for dtype in DTYPES:
    x = act_input(dtype)
    for kind in A.ACTIVATIONS:
        gated = kind in ("geglu", "qgeglu", "reglu", "sreglu", "swiglu", "clamped_swiglu")
        y = A.activation_fwd(x, kind)[0]
        put(f"{kind}/{dtype}/fwd", y)
        dy = torch.from_numpy(rng.standard_normal(tuple(y.shape)).astype(np.float32) * 3).to(x.dtype)
        dy.view(-1)[:SPECIAL_VALUES.size] = torch.from_numpy(SPECIAL_VALUES).to(x.dtype)
        put(f"{kind}/{dtype}/bwd", A.activation_bwd(dy, x, kind))
        dx, dbias, _ = A.activation_bwd_dbias(dy, x, kind, bias_dtype=torch.float32)
        put(f"{kind}/{dtype}/bwd_dbias/dx", dx)
        put(f"{kind}/{dtype}/bwd_dbias/dbias", dbias)

def norm_input(rows, k, dtype):
    x = rng.standard_normal((rows, k)).astype(np.float32) * np.exp2(rng.integers(-8, 8, (rows, 1)))
    x[1] = 3.0                                  # a row of constants
    x[2, 0] = np.inf
    x[3, -1] = np.nan
    x[4] = x[4] * np.float32(1e-39)             # subnormal row
    x[5] = x[5] * np.float32(1e18)              # squares overflow
    return torch.from_numpy(x).to(DTYPES[dtype])

for dtype in DTYPES:
    for k in (1, 5, 16, 47, 128, 1000):
        rows = 70
        x = norm_input(rows, k, dtype)
        w = torch.from_numpy(rng.standard_normal(k).astype(np.float32)).to(x.dtype)
        b = torch.from_numpy(rng.standard_normal(k).astype(np.float32)).to(x.dtype)
        dy = torch.from_numpy(rng.standard_normal((rows, k)).astype(np.float32)).to(x.dtype)
        tag = f"{dtype}/{k}"
        for zcg in (False, True):
            y, mu, rstd, _ = tn.layernorm_fwd(x, w, b, 1e-5, zcg)
            for i, t in enumerate((y, mu, rstd) + tuple(tn.layernorm_bwd(dy, x, mu, rstd, w, zcg))):
                put(f"layernorm/{tag}/{zcg}/{i}", t)
            y, rstd, _ = tn.rmsnorm_fwd(x, w, 1e-5, zcg)
            for i, t in enumerate((y, rstd) + tuple(tn.rmsnorm_bwd(dy, x, rstd, w, zcg))):
                put(f"rmsnorm/{tag}/{zcg}/{i}", t)
        y, rstd, _ = tn.l2norm_fwd(x, 1e-6)
        for i, t in enumerate((y, rstd, tn.l2norm_bwd(dy, x, rstd))):
            put(f"l2norm/{tag}/{i}", t)

x = norm_input(96, 160, "bfloat16")
w = torch.from_numpy(rng.standard_normal(160).astype(np.float32)).to(x.dtype)
b = torch.from_numpy(rng.standard_normal(160).astype(np.float32)).to(x.dtype)
x[2, 0] = 1.0  # finite: the per-tensor scale is a real one
for qname, q in (("mxfp8", te.MXFP8Quantizer("e4m3")), ("fp8", te.Float8CurrentScalingQuantizer("e4m3"))):
    y, mu, rstd, qt = tn.layernorm_fwd(x, w, b, 1e-5, False, quantizer=q)
    put(f"layernorm+{qname}/y", y)
    for field in ("rowwise_data", "rowwise_scale_inv", "columnwise_data", "columnwise_scale_inv"):
        put(f"layernorm+{qname}/{field}", getattr(qt, field, None))
    y, rstd, qt = tn.rmsnorm_fwd(x, w, 1e-5, True, quantizer=q)
    put(f"rmsnorm+{qname}/y", y)
    for field in ("rowwise_data", "rowwise_scale_inv", "columnwise_data", "columnwise_scale_inv"):
        put(f"rmsnorm+{qname}/{field}", getattr(qt, field, None))

xa = act_input("bfloat16")[:224, :256].contiguous()
for qname, q in (("mxfp8", te.MXFP8Quantizer("e4m3")), ("fp8", te.Float8CurrentScalingQuantizer("e5m2"))):
    for kind in ("gelu", "swiglu"):
        y, qt = A.activation_fwd(xa, kind, quantizer=q)
        put(f"{kind}+{qname}/y", y)
        for field in ("rowwise_data", "rowwise_scale_inv", "columnwise_data", "columnwise_scale_inv"):
            put(f"{kind}+{qname}/{field}", getattr(qt, field, None))

np.savez(sys.argv[1], **{k.replace("/", "|"): v for k, v in out.items()})
"""


def test_elementwise_kernels_give_identical_bytes_on_every_isa(tmp_path):
    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    results = {}
    for isa in ("scalar", "avx2", "avx512"):
        path = tmp_path / f"{isa}.npz"
        env = dict(os.environ, TWE_ELEMENTWISE_ISA=isa,
                   PYTHONPATH=os.pathsep.join([tests_dir, os.environ.get("PYTHONPATH", "")]))
        subprocess.run([sys.executable, "-c", _SCRIPT, str(path)], env=env, check=True)
        with np.load(path) as f:
            results[isa] = {k: f[k] for k in f.files}
    scalar = results["scalar"]
    assert len(scalar) > 300
    for isa in ("avx2", "avx512"):
        assert results[isa].keys() == scalar.keys()
        for name, want in scalar.items():
            got = results[isa][name]
            differ = got.view(np.uint8).reshape(got.size, -1) != want.view(np.uint8).reshape(want.size, -1)
            differ = differ.any(axis=1) & ~(_is_nan(got, name) & _is_nan(want, name))
            bad = np.flatnonzero(differ)
            assert bad.size == 0, (f"{isa} {name.replace('|', '/')}: {bad.size} elements differ, first at {bad[0]}: "
                                   f"{got[bad[0]]!r} vs scalar {want[bad[0]]!r}")


def _is_nan(a: np.ndarray, name: str) -> np.ndarray:
    """NaN elements of a saved output. Their payloads may differ only where several NaNs meet in a
    sum (an x86 add keeps one operand's payload and compilers order commutative operands freely;
    NUMERICS fixes no NaN payload): every other element must match bit for bit."""
    if name.endswith("|bf16"):
        return (a & 0x7FFF) > 0x7F80
    if a.dtype.kind == "f":
        return np.isnan(a)
    return np.zeros(a.shape, bool)

