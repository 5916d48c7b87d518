"""bench/wan.py's two sides on the tiny architecture on CPU: the same job through the real GigaTrain 1.1.0
(bench/wan_gigatrain.py, in the reference interpreter) and through ours, reported side by side."""
import json
import math
import os
import subprocess
import sys

from tests.ref_compare import reference_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_bench(tmp_path, *args):
    out = tmp_path / "wan.json"
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "bench/wan.py", "--tiny", "--device", "cpu", "--steps", "2",
                           "--out", str(out), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out) as f:
        return json.load(f), proc.stdout


def test_the_same_job_runs_through_gigatrain_and_through_ours(tmp_path):
    doc, table = run_bench(tmp_path, "--gigatrain-python", reference_python(),
                           "--rows", "gigatrain:NO:CAME8Bit", "NO:CAME8Bit")
    theirs, ours = doc["rows"]
    assert (theirs["path"], ours["path"]) == ("gigatrain", "giga-train")
    for row in (theirs, ours):
        assert row["status"] == "ok", row
        assert row["step_s"] > 0 and row["peak_gib"] > 0 and math.isfinite(row["loss"])
    assert theirs["params"] == ours["params"] > 0  # the same architecture on both sides
    assert theirs["latents"] == ours["latents"]
    (pair,) = doc["giga_train_vs_gigatrain"]
    assert pair["step_rate_ratio"] == theirs["step_s"] / ours["step_s"]
    assert "| NO | CAME8Bit |" in table.split("giga-train step rate / GigaTrain's")[1]


def test_a_gigatrain_row_refuses_to_run_on_our_package(tmp_path):
    """Without GigaTrain on its path, its row would import ours: the row says so instead of timing us twice."""
    doc, _ = run_bench(tmp_path, "--gigatrain-python", sys.executable, "--rows", "gigatrain:NO:CAME8Bit")
    (row,) = doc["rows"]
    assert row["status"] == "error" and "needs the real GigaTrain 1.1.0" in row["error"]
