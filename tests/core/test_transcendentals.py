"""The portable fp32 exp / tanh of csrc/include/twinengine/numerics.h against libm's double
exp / tanh: tests/numerics/transcendentals_sweep.cc, compiled here from the header, sweeps every
257th fp32 bit pattern (16.7M inputs: normal, subnormal, overflow / underflow ranges, ±0, ±inf,
NaN) plus the range-end edge values, and fails if a result is more than 2 ulps from the
correctly rounded one or a special value is wrong (docs/numerics_transcendentals.md; the full
2^32 sweep is the same program with stride 1)."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
BOUND_ULPS = 2


def test_exp_tanh_within_two_ulps_of_correctly_rounded(tmp_path):
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    assert compiler, "a C++ compiler is needed to build the sweep (the extension needs one too)"
    exe = tmp_path / "sweep"
    subprocess.run([compiler, "-O2", "-std=c++17", "-ffp-contract=off", "-fno-fast-math", f"-I{ROOT / 'csrc/include'}",
                    str(ROOT / "tests/numerics/transcendentals_sweep.cc"), "-o", str(exe)], check=True)
    run = subprocess.run([str(exe), "257"], capture_output=True, text=True, timeout=300)
    lines = {line.split()[0]: line for line in run.stdout.splitlines()}
    for name in ("exp", "tanh"):
        line = lines[name]
        checked = int(re.search(r"checked (\d+)", line).group(1))
        distance = int(re.search(r"max distance from correctly rounded (\d+) ulp", line).group(1))
        bad = int(re.search(r"bad specials (\d+)", line).group(1))
        assert checked > 16_000_000, line
        assert distance <= BOUND_ULPS and bad == 0, line
    assert run.returncode == 0, run.stdout + run.stderr
