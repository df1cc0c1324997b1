"""numerics::rope_sincos (the cos / sin of the rotary embedding, docs/attention.md §10) against
libm's double sin / cos rounded to fp32: tests/numerics/rope_sincos_sweep.cc, compiled here from
the header, sweeps every 257th fp32 angle in (-2^24, 2^24) (9.9M angles) and the special angles;
fails if a result is more than 1 ulp from the correctly rounded one or a special is wrong (the full
sweep is the same program with stride 1)."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_rope_sincos_within_one_ulp_of_correctly_rounded(tmp_path):
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    assert compiler, "a C++ compiler is needed to build the sweep (the extension needs one too)"
    exe = tmp_path / "sweep"
    subprocess.run([compiler, "-O2", "-std=c++17", "-ffp-contract=off", "-fno-fast-math", f"-I{ROOT / 'csrc/include'}",
                    str(ROOT / "tests/numerics/rope_sincos_sweep.cc"), "-o", str(exe)], check=True)
    run = subprocess.run([str(exe), "257"], capture_output=True, text=True, timeout=300)
    lines = {line.split()[0]: line for line in run.stdout.splitlines()}
    for name in ("sin", "cos"):
        line = lines[name]
        assert int(re.search(r"checked (\d+)", line).group(1)) > 9_000_000, line
        assert int(re.search(r"max distance from correctly rounded (\d+) ulp", line).group(1)) <= 1, line
    assert "bad specials 0" in run.stdout, run.stdout
    assert run.returncode == 0, run.stdout + run.stderr
