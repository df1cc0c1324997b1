"""The demo (python -m demo) runs end to end: a small decoder (TransformerLayer blocks) trains in
both frameworks under a recipe and in high precision, every run starts from the same loss (the
same parameters, batch and twinengine kernels), and the PNG and CSV are written."""

import csv
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_demo_trains_both_frameworks_from_the_same_loss(tmp_path):
    # DelayedScaling with FP8 attention: the recipe whose state both frameworks must start equal
    # (step 1 differs only by the frameworks' cross-entropy). One small layer keeps the four
    # compiles (2 frameworks x 2 precisions) short.
    result = subprocess.run(
        [sys.executable, "-m", "demo", "--recipe", "fp8-delayed", "--fp8-attention", "--steps", "3", "--torch-backend", "aot_eager",
         "--layers", "1", "--hidden", "64", "--heads", "2", "--ffn", "64", "--context", "16", "--batch", "8",
         "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "loss_fp8-delayed-fp8-attention.png").stat().st_size > 0
    with (tmp_path / "losses_fp8-delayed-fp8-attention.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3
    for prefix in ("", "hp_"):
        # Step 1: identical parameters and batch; only the frameworks' own cross-entropy differs.
        assert abs(float(rows[0][prefix + "torch_loss"]) - float(rows[0][prefix + "jax_loss"])) < 1e-5
        assert float(rows[-1][prefix + "torch_loss"]) < float(rows[0][prefix + "torch_loss"])
        assert float(rows[-1][prefix + "jax_loss"]) < float(rows[0][prefix + "jax_loss"])
    # The recipe quantizes: its first loss is not the high-precision one.
    assert rows[0]["torch_loss"] != rows[0]["hp_torch_loss"]


def test_demo_rejects_sizes_the_recipe_cannot_tile():
    result = subprocess.run([sys.executable, "-m", "demo", "--recipe", "fp8-block", "--hidden", "96"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "recipe fp8-block needs --hidden a multiple of 128, got 96" in result.stderr


def test_demo_fp8_attention_needs_a_per_tensor_fp8_recipe():
    result = subprocess.run([sys.executable, "-m", "demo", "--recipe", "mxfp8", "--fp8-attention"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "--fp8-attention needs --recipe fp8-current or fp8-delayed, got mxfp8" in result.stderr
