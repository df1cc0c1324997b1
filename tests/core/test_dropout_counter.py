"""Dropout's Philox counter layout at element indices beyond any test tensor (up to 2^62, across
the 2^32 and 2^34 boundaries where the counter's first word wraps and its second word starts):
tests/numerics/dropout_counter_check.cc, compiled here from the numerics header, compares
numerics::dropout_mask_byte with the NUMERICS.md §11 formula written out independently."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_dropout_counter_layout_at_large_indices(tmp_path):
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    assert compiler, "a C++ compiler is needed to build the check (the extension needs one too)"
    exe = tmp_path / "check"
    subprocess.run([compiler, "-O2", "-std=c++17", "-ffp-contract=off", f"-I{ROOT / 'csrc/include'}",
                    str(ROOT / "tests/numerics/dropout_counter_check.cc"), "-o", str(exe)], check=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "0 failures" in run.stdout, run.stdout + run.stderr
