"""NaN/Inf guard: a non-finite step is skipped on every rank (or stops the run without saving), and a
skipping run equals one that never saw those batches."""
import os
import subprocess
import sys

import pytest
import torch

from giga_train import ConfigError, launch_from_config
from giga_train.checkpoint import list_checkpoints, load_weights
from giga_train.trainers.nan_guard import TrainingStopped
from tests.distributed import job
from tests.tiny import tiny_config


def weights(project, step, member="model"):
    path = dict(list_checkpoints(os.path.join(str(project), "models")))[step]
    return load_weights(os.path.join(path, member))


def assert_equal(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def config(project, runner, **train):
    cfg = tiny_config(project, runner=f"tests.tiny.{runner}", **dict(dict(
        max_steps=8, checkpoint_interval=1, max_grad_norm=1.0, with_ema=True, ema_decay=0.9, log_interval=1,
        log_with="none"), **train))
    cfg["models"]["dropout"] = 0.0  # a skipped forward must not shift the RNG of the later ones
    return cfg


def test_skip_equals_a_run_without_those_batches(tmp_path, monkeypatch):
    monkeypatch.setenv("GT_NAN", "3,4")
    nan_run = launch_from_config(config(tmp_path / "nan", "NanTrainer"))
    assert nan_run.step == 8
    for member in ("model", "model_ema"):  # the skipped steps left weights and EMA as they were
        assert_equal(weights(tmp_path / "nan", 2, member), weights(tmp_path / "nan", 4, member))
    assert not torch.equal(weights(tmp_path / "nan", 4)["head.weight"], weights(tmp_path / "nan", 5)["head.weight"])
    dropped = launch_from_config(config(tmp_path / "dropped", "BatchDroppingTrainer", max_steps=6))
    for member in ("model", "model_ema"):  # optimizer state and lr schedule untouched by the skips
        assert_equal(weights(tmp_path / "nan", 8, member), weights(tmp_path / "dropped", 6, member))
    assert nan_run.scheduler.last_epoch == dropped.scheduler.last_epoch == 6
    text = (tmp_path / "nan" / "logs" / "train.log").read_text()
    assert "step 3: non-finite loss and grad_norm; skipped the update (1 in a row" in text
    assert "step 4 | loss nan" not in text and "nan_skipped 1" in text


def test_stop_policy_and_max_nan_steps_stop_without_saving(tmp_path, monkeypatch):
    monkeypatch.setenv("GT_NAN", "5")
    cfg = config(tmp_path / "stop", "NanTrainer", checkpoint_interval=2, nan_policy="stop")
    with pytest.raises(TrainingStopped, match=r"^step 5: non-finite loss and grad_norm \(train.nan_policy='stop'\);"
                       r" stopped, nothing saved; newest good checkpoint: .*checkpoint_epoch_0_step_4$"):
        launch_from_config(cfg)
    assert [s for s, _ in list_checkpoints(str(tmp_path / "stop" / "models"))] == [2, 4]
    assert not [n for n in os.listdir(tmp_path / "stop" / "models") if n.startswith(".tmp")]
    assert all(torch.isfinite(v).all() for v in weights(tmp_path / "stop", 4).values())

    monkeypatch.setenv("GT_NAN", "3,4,5,6")
    cfg = config(tmp_path / "row", "NanTrainer", checkpoint_interval=2, max_nan_steps=3)
    with pytest.raises(TrainingStopped, match=r"step 5: .* for 3 steps in a row \(train.max_nan_steps=3\)"):
        launch_from_config(cfg)
    assert [s for s, _ in list_checkpoints(str(tmp_path / "row" / "models"))] == [2, 4]  # 4: a good (skipped) state


def test_nan_policy_is_validated(tmp_path):
    with pytest.raises(ConfigError, match=r"train.nan_policy: 'skp' is not one of .*did you mean 'skip'"):
        launch_from_config(tiny_config(tmp_path, nan_policy="skp"))


def test_two_ranks_one_sees_nan_both_skip_then_stop_is_one_line_exit_1(tmp_path):
    env = {**os.environ, "GT_NAN": "3", "GT_NAN_RANK": "1"}
    cfg = job(tmp_path / "skip", "DDP", ranks=2, checkpoint_interval=1, max_steps=4)
    cfg["runners"] = ["tests.tiny.NanTrainer"]
    cfg_file = tmp_path / "skip.py"
    cfg_file.write_text(f"config = {cfg!r}\n")
    run = subprocess.run([sys.executable, "-m", "giga_train", "train", str(cfg_file)], env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert_equal(weights(tmp_path / "skip", 2), weights(tmp_path / "skip", 3))  # rank 0 skipped too
    assert not torch.equal(weights(tmp_path / "skip", 3)["head.weight"], weights(tmp_path / "skip", 4)["head.weight"])

    cfg = job(tmp_path / "stop", "DDP", ranks=2, checkpoint_interval=2, max_steps=4, nan_policy="stop",
              launch=dict(max_restarts=2))
    cfg["runners"] = ["tests.tiny.NanTrainer"]
    cfg_file = tmp_path / "stop.py"
    cfg_file.write_text(f"config = {cfg!r}\n")
    run = subprocess.run([sys.executable, "-m", "giga_train", "train", str(cfg_file)], env=env,
                         capture_output=True, text=True)
    assert run.returncode == 1, run.stderr[-3000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("giga-train: error: step 3: non-finite loss") and last.endswith("step_2"), last
    log = (tmp_path / "stop" / "logs" / "train.log").read_text()
    assert log.count("training CharLM from step") == 1, "a stop must not be retried by the agent"
    assert [s for s, _ in list_checkpoints(str(tmp_path / "stop" / "models"))] == [2]


@pytest.mark.parametrize("stage", [2, 0])
def test_deepspeed_skips_where_the_engine_can_else_stops(tmp_path, monkeypatch, stage):
    """ZeRO-1/2/3 skip a non-finite gradient norm themselves (read back through was_step_applied);
    ZeRO-0 in fp32 applies it, so the run stops before saving the NaN state."""
    monkeypatch.setenv("GT_NAN", "3")
    cfg = job(tmp_path, "DEEPSPEED", ranks=2, max_steps=4, checkpoint_interval=1,
              launch=dict(deepspeed_config=dict(deepspeed_config_file=f"zero{stage}.json")))
    cfg["runners"] = ["tests.tiny.NanTrainer"]
    if stage == 0:
        with pytest.raises(TrainingStopped, match="step 3: non-finite loss, and the engine had already applied"):
            launch_from_config(cfg)
        assert [s for s, _ in list_checkpoints(str(tmp_path / "models"))] == [1, 2]
        return
    assert launch_from_config(cfg)["step"] == 4
    assert_equal(weights(tmp_path, 2), weights(tmp_path, 3))
