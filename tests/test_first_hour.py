"""The usual first-hour mistakes answered in one line, and what a first project reaches for: a Tester-only
config, runner classes given from Python, did-you-mean for constructor arguments and runner names."""
import json

import pytest

from giga_train import launch_from_config
from giga_train.cli import main
from tests import gigatrain_client
from tests.tiny import tiny_config


def check(tmp_path, cfg, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    code = main(["check", str(path)])
    return code, capsys.readouterr()


def test_a_tester_only_config_runs(tmp_path):
    cfg = dict(runners=["tests.gigatrain_client.IndexTester"], project_dir=str(tmp_path),
               dataloaders=dict(test=dict(data_or_config=dict(_class_name="CountingDataset", size=7),
                                          batch_size_per_gpu=3)), models=dict(dim=4))
    launch_from_config(cfg)
    assert sorted(json.load(open(tmp_path / "tested_0.json"))["seen"]) == list(range(7))


def test_runner_classes_from_python(tmp_path):
    cfg = tiny_config(tmp_path, max_steps=2)
    cfg["runners"] = [gigatrain_client.HookTrainer]
    cfg["models"] = dict(dim=4)
    cfg["dataloaders"]["train"] = dict(data_or_config=dict(_class_name="CountingDataset", size=8), batch_size_per_gpu=4)
    trainer = launch_from_config(cfg)
    assert type(trainer) is gigatrain_client.HookTrainer and trainer.step == 2
    saved = json.load(open(tmp_path / "config.json"))
    assert saved["runners"] == ["tests.gigatrain_client.HookTrainer"]  # importable back: written as its path


@pytest.mark.parametrize("edit, message", [
    (dict(runners=["tests.tiny.tinytrainer"]), "did you mean 'TinyTrainer'?"),
    (dict(optimizers=dict(type="AdamW", learning_rate=1e-3)),
     "optimizers: optimizer 'AdamW' takes no argument 'learning_rate'; did you mean 'lr'?"),
    (dict(schedulers=dict(type="WarmupCosineScheduler", warmup=5)), "did you mean 'warmup_steps'?"),
])
def test_did_you_mean(tmp_path, capsys, edit, message):
    cfg = tiny_config(tmp_path / "run")
    cfg.update(edit)
    code, out = check(tmp_path, cfg, capsys)
    assert code == 2 and message in out.err, out.err
    assert len(out.err.strip().splitlines()) == 1
