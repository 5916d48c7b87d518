"""Exact resume: 20 + 20 steps equal 40, bit for bit, also after a kill -9 mid-step or mid-save."""
import os
import subprocess
import sys

import pytest
import torch

from giga_train import launch_from_config
from giga_train.checkpoint import list_checkpoints, read_meta, read_weights
from tests.tiny import tiny_config

MAX = 40


def config(project, **train):
    cfg = tiny_config(project, **dict(dict(max_steps=MAX, checkpoint_interval=10, resume=True,
                                           gradient_accumulation_steps=2, max_grad_norm=1.0, with_ema=True,
                                           ema_decay=0.9), **train))
    cfg["dataloaders"]["train"]["transform"] = dict(type="RandomShift", max_shift=4)  # uses the RNG
    return cfg


def final_weights(project):
    step, path = list_checkpoints(os.path.join(project, "models"))[-1]
    return step, read_weights(path), read_weights(path, ema=True)


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """One 40-step run per num_workers setting, shared by the tests below."""
    runs = {}

    def get(num_workers):
        if num_workers not in runs:
            project = tmp_path_factory.mktemp(f"full{num_workers}")
            cfg = config(project)
            cfg["dataloaders"]["train"]["num_workers"] = num_workers
            trainer = launch_from_config(cfg)
            runs[num_workers] = (trainer.losses, final_weights(str(project)))
        return runs[num_workers]
    return get


@pytest.mark.parametrize("num_workers", [0, 2])
def test_20_then_40_equals_40(tmp_path, uninterrupted, num_workers):
    losses, (step, weights, ema) = uninterrupted(num_workers)
    cfg = config(tmp_path)
    cfg["dataloaders"]["train"]["num_workers"] = num_workers
    cfg["train"]["max_steps"] = 20
    first = launch_from_config(cfg)
    cfg["train"]["max_steps"] = MAX
    second = launch_from_config(cfg)
    assert len(first.losses) == 40 and len(second.losses) == 40
    assert first.losses + second.losses == losses  # python floats of every micro-batch: bitwise
    step2, weights2, ema2 = final_weights(str(tmp_path))
    assert step == step2 == MAX
    assert_same_weights(weights, weights2)
    assert_same_weights(ema, ema2)
    assert not all(torch.equal(weights[k], ema[k]) for k in weights), "EMA must differ from the weights"


@pytest.mark.parametrize("kill", ["step:15", "save:20", "step:31"])
def test_kill_9_then_resume_equals_uninterrupted(tmp_path, uninterrupted, kill):
    losses, (_, weights, ema) = uninterrupted(0)
    cfg = config(tmp_path)
    cfg["runners"] = ["tests.tiny.KillingTrainer"]
    path = tmp_path / "cfg.py"
    path.write_text(f"config = {cfg!r}\n")
    run = subprocess.run([sys.executable, "-m", "giga_train", "train", str(path)], env={**os.environ, "GT_KILL": kill},
                         capture_output=True, text=True, cwd=os.getcwd())
    assert run.returncode == -9, run.stderr[-2000:]
    models = tmp_path / "models"
    newest_step = list_checkpoints(str(models))[-1][0]
    assert newest_step == {"step:15": 10, "save:20": 10, "step:31": 30}[kill]
    if kill.startswith("save"):
        assert (models / ".tmp_checkpoint_epoch_1_step_20" / "model_ema").is_dir()  # the half-written one
    resumed = launch_from_config(cfg)
    assert resumed.losses == losses[newest_step * 2:]
    _, weights2, ema2 = final_weights(str(tmp_path))
    assert_same_weights(weights, weights2)
    assert_same_weights(ema, ema2)
    assert not any(name.startswith(".tmp_") for name in os.listdir(models)), "leftovers are swept"


def test_total_limit_keeps_and_metadata(tmp_path):
    cfg = tiny_config(tmp_path, max_steps=30, checkpoint_interval=5, checkpoint_total_limit=2, checkpoint_keeps=[10])
    launch_from_config(cfg)
    steps = [s for s, _ in list_checkpoints(str(tmp_path / "models"))]
    assert steps == [10, 25, 30]
    meta = read_meta(str(tmp_path / "models" / "checkpoint_epoch_1_step_30"))
    assert meta["step"] == 30 and meta["samples_seen"] == 30 * 8 and meta["world_size"] == 1
    folder = tmp_path / "models" / "checkpoint_epoch_1_step_30"
    assert sorted(os.listdir(folder)) == ["meta.json", "model", "optimizer_dcp", "precision.pt",
                                          "random_states_0.pt", "training_state.pt"]
    assert os.listdir(folder / "model") == ["diffusion_pytorch_model.safetensors"]  # GigaTrain's name, safetensors
    # training state loads without unpickling code
    torch.load(folder / "training_state.pt", weights_only=True)
    torch.load(folder / "precision.pt", weights_only=True)


def test_resume_from_a_named_checkpoint_and_pickle_weights(tmp_path):
    cfg = tiny_config(tmp_path, max_steps=10, checkpoint_interval=5, checkpoint_safe_serialization=False)
    launch_from_config(cfg)
    folder = tmp_path / "models" / "checkpoint_epoch_1_step_5"
    assert os.listdir(folder / "model") == ["diffusion_pytorch_model.bin"]
    cfg["train"].update(resume=str(folder), max_steps=12)
    trainer = launch_from_config(cfg)
    assert len(trainer.losses) == 7 and trainer.step == 12
    cfg["train"]["resume"] = str(tmp_path / "models" / "nope")
    with pytest.raises(Exception, match="is not a complete checkpoint folder"):
        launch_from_config(cfg)
