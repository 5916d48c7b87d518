"""train.early_stopping: the run stops at the validation that exhausts the patience, with its checkpoint
written and kept out of the rolling limit; a resume of the stopped run stops again, a raised patience goes on."""
import re

import pytest

from giga_train import launch_from_config
from giga_train.checkpoint import list_checkpoints
from giga_train.config import Config
from giga_train.errors import ConfigError
from giga_train.schema import validate_config
from tests.tiny_eval import eval_job


def test_stops_at_the_patience_keeps_its_checkpoint_and_resumes_stopped(tmp_path, monkeypatch):
    log = lambda: (tmp_path / "logs" / "train.log").read_text()
    models = str(tmp_path / "models")
    stopping = dict(metric="val/score", mode="min", patience=2, min_delta=0.25)
    cfg = eval_job(tmp_path, runner="tests.tiny_eval.ScriptedScoreTrainer", max_steps=14, checkpoint_interval=3,
                   checkpoint_total_limit=1, early_stopping=stopping, resume=True)
    # best 1.0 at 4; 6's 0.9 is within min_delta (no improvement), 8's 5 neither: stops at 8 of 14
    monkeypatch.setenv("GT_SCORES", "2:3,4:1,6:0.9,8:5,10:1.5,12:0.5,14:0.4")
    trainer = launch_from_config(cfg)
    assert trainer.step == 8 and trainer.checkpointing.early_stopping.stopped_at == 8
    assert [s for s, _ in list_checkpoints(models)] == [6, 8]  # 8 kept, out of the rolling limit (as a best is)
    assert "early stopping at step 8: val/score has not improved on 1.0 (step 4)" in log()
    trainer = launch_from_config(cfg)  # resumed at the stop: stops again, nothing trained nor written
    assert trainer.step == 8 and [s for s, _ in list_checkpoints(models)] == [6, 8]
    assert "this run stopped early at step 8" in log()
    cfg["train"]["early_stopping"] = dict(stopping, patience=4)  # raised: 10 bad (3), 12 improves, 14 not (1)
    trainer = launch_from_config(cfg)
    assert trainer.step == 14 and trainer.checkpointing.early_stopping.stopped_at is None
    assert [s for s, _ in list_checkpoints(models)] == [8, 14]  # the stop's checkpoint outlives the limit of 1


def test_every_rank_stops_at_the_same_step_under_ddp(tmp_path, monkeypatch):
    monkeypatch.setenv("GT_SCORES", "2:3,4:1,6:2,8:5,10:1.5,12:0.5")
    cfg = eval_job(tmp_path, "DDP", 2, runner="tests.tiny_eval.ScriptedScoreTrainer", max_steps=12,
                   checkpoint_interval=3, early_stopping=dict(metric="val/score", patience=2))
    launch_from_config(cfg)  # a rank going on alone would hang in the next step's collectives
    assert [s for s, _ in list_checkpoints(str(tmp_path / "models"))] == [3, 6, 8]
    assert "early stopping at step 8" in (tmp_path / "logs" / "train.log").read_text()


@pytest.mark.parametrize("stopping, message", [
    (dict(metric="loss"), "train.early_stopping: metric: name a validation result"),
    (dict(metric="val/loss", patience=0), "train.early_stopping: patience: validations without improvement"),
    (dict(metric="val/loss", min_delta=-1), "train.early_stopping: min_delta: the least change"),
    (dict(metric="val/loss", patiense=2), "unknown key 'patiense'; did you mean 'patience'?"),
])
def test_bad_early_stopping_is_one_line(tmp_path, stopping, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate_config(Config(eval_job(tmp_path, early_stopping=stopping)))
    with pytest.raises(ConfigError, match="train.early_stopping: set train.eval_interval too"):
        validate_config(Config(eval_job(tmp_path, early_stopping=dict(metric="val/loss"), eval_interval=None)))
