"""The demo (python -m demo) runs end to end: both frameworks train, start from the same loss
(the same parameters, batch and twinengine kernels), and the PNG and CSV are written."""

import csv
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_demo_trains_both_frameworks_from_the_same_loss(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "demo", "--recipe", "mxfp8", "--steps", "3", "--torch-backend", "aot_eager",
         "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "loss_mxfp8.png").stat().st_size > 0
    with (tmp_path / "losses_mxfp8.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3
    # Step 1: identical parameters and batch; only the frameworks' own cross-entropy differs.
    assert abs(float(rows[0]["torch_loss"]) - float(rows[0]["jax_loss"])) < 1e-5
    assert float(rows[-1]["torch_loss"]) < float(rows[0]["torch_loss"])
