"""giga-train tune on the tiny Wan: two candidates (one that trains, one that crashes), each in its own
process; the table, a failed row for the crash, and --set lines that `giga-train check` accepts. No speed
is asserted."""
import shlex

import pytest

pytest.importorskip("diffusers")

from examples.wan.scripts import build_dataset  # noqa: E402
from giga_train.cli import main as cli  # noqa: E402
from giga_train.config import load_config  # noqa: E402
from giga_train.tools.tune import candidates, tune  # noqa: E402

TINY = "examples/wan/configs/tiny_cpu.py"


def test_tune_runs_each_candidate_apart_and_prints_set_lines_that_check_accepts(tmp_path, capsys):
    data = tmp_path / "data"
    assert build_dataset.main(["--synthetic", "8", "--out", str(data), "--latent-shape", "4,1,8,8",
                               "--text-shape", "16,32"]) == 0
    base = [f"dataloaders.train.data_or_config.root={data}", "dataloaders.train.batch_size_per_gpu=2",
            "train.peak_flops=1e12"]  # CPU has no peak in the table: MFU against 1 TFLOP/s
    cfg = load_config(TINY, base)
    names = [name for name, _ in candidates(cfg)]
    assert names[:3] == ["compile, checkpointing=False", "compile, checkpointing='auto'",
                         "compile, checkpointing=True"] and "eager, checkpointing='auto'" in names
    eager = dict(candidates(cfg))["eager, checkpointing='auto'"]
    todo = [("eager, checkpointing='auto'", eager),
            ("crashes", ['train.attention_backend="efficient"'])]  # no such SDPA kernel on CPU
    capsys.readouterr()
    rows, best = tune(TINY, base, budget_s=300, steps=2, todo=todo, grow_micro_batch=False)
    out = capsys.readouterr().out
    print(out)
    assert [r["name"] for r in rows] == ["eager, checkpointing='auto'", "crashes"]
    assert rows[0]["status"] == "ok" and rows[0]["s_per_step"] > 0 and rows[0]["peak_gb"] > 0
    assert rows[0]["mfu"] > 0 and rows[0]["nan_skipped"] == 0  # the tune's FLOP count reached the candidate
    assert rows[1]["status"].startswith("failed: ")
    assert best is not None and best["status"] == "ok"
    assert "s/step" in out and "samples/s" in out and "peak GB" in out and "failed: " in out
    lines = [line for line in out.splitlines() if line.startswith("--set ")]
    assert lines and all(shlex.split(line)[1] in best["sets"] for line in lines)
    assert cli(["check", TINY, *[x for line in lines for x in shlex.split(line)]]) == 0
    assert not list(tmp_path.glob("**/checkpoint_*"))  # candidates write no checkpoint


def test_fastest_takes_the_most_samples_per_second_and_breaks_a_tie_by_the_lower_peak():
    from giga_train.tools.tune import _fastest
    rows = [dict(name="mb1", status="ok", samples_per_sec=2.59, peak_gb=46.1),
            dict(name="mb2", status="ok", samples_per_sec=2.62, peak_gb=62.5),
            dict(name="oom", status="failed: OutOfMemoryError", samples_per_sec=9.0, peak_gb=1.0)]
    assert _fastest(rows)["name"] == "mb1"  # 1% apart: a tie, the lower peak wins
    rows[1]["samples_per_sec"] = 2.80      # 8% faster: no longer a tie
    assert _fastest(rows)["name"] == "mb2"
    assert _fastest(rows[2:]) is None
