"""What a checkpoint guarantees, on tiny runs and direct calls: newest means last committed in the folder
(never a writer's clock); the best, the keeps, the newest finite checkpoint and a branch point are never
rotated away; non-finite checkpoints are never resumed as good; every reader verifies and stays inside
the folder; every writer cleans up and fails in one line; the lock covers a models/ folder shared through
a symlink."""
import os
import types

import pytest

from giga_train import launch_from_config
from giga_train.checkpoint import list_checkpoints, read_meta
from giga_train.checkpoint import manager as manager_module
from tests.test_reliability_checkpoints import Warnings, cfg_for, steps


# -- 1. newest by the folder's commit count, never by a clock ----------------------------------------------
def test_a_writer_clock_an_hour_ahead_never_pins_resume(tmp_path, monkeypatch):
    import time
    monkeypatch.setattr(manager_module, "time", types.SimpleNamespace(time=lambda: time.time() + 3600))
    launch_from_config(cfg_for(tmp_path, max_steps=2))  # a node whose clock runs an hour ahead
    monkeypatch.undo()
    launch_from_config(cfg_for(tmp_path, max_steps=4, resume=True))
    trainer = launch_from_config(cfg_for(tmp_path, max_steps=6, resume=True))
    assert trainer.step == 6 and len(trainer.losses) == 2  # resumed from step 4: only 5 and 6 trained
    models = tmp_path / "models"
    assert not [n for n in os.listdir(models) if ".superseded_" in n]  # nothing set aside
    metas = {s: read_meta(p) for s, p in list_checkpoints(str(models))}
    assert metas[2]["saved_at"] > metas[6]["saved_at"]  # the clock said step 2 was the newest
    assert [metas[s]["seq"] for s in range(1, 7)] == [1, 2, 3, 4, 5, 6]
    assert trainer.checkpoints.latest().endswith("checkpoint_epoch_1_step_6")
