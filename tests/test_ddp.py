"""DDP at 2 ranks (gloo) equals one process with the same global batch; resume; max_restarts."""
import os

import pytest

from giga_train import launch_from_config
from giga_train.checkpoint import list_checkpoints
from tests.distributed import assert_same_weights, final_weights, job, reference, shared_run

CACHE = {}
VARIANTS = {"plain": {}, "accum2_ckpt": dict(gradient_accumulation_steps=2, activation_checkpointing=True,
                                             activation_class_names=["Block"])}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_ddp_equals_one_process(tmp_path_factory, variant):
    train = VARIANTS[variant]
    project, result = shared_run(tmp_path_factory, "DDP", 2, **train)  # tests/test_cross_resume.py's source too
    assert result["step"] == 4 and result["metrics"]["total_loss"] > 0
    assert_same_weights(final_weights(project), reference(tmp_path_factory, CACHE, **train))


def test_ddp_resume_and_restart_after_a_killed_worker(tmp_path, tmp_path_factory, monkeypatch):
    """Rank processes die by SIGKILL mid-step 3 on the first attempt; the agent restarts them and they
    resume from the step-2 checkpoint, ending where an uninterrupted run ends."""
    cfg = job(tmp_path, "DDP", ranks=2, launch=dict(max_restarts=1), resume=True)
    cfg["runners"] = ["tests.tiny.KillingTrainer"]
    monkeypatch.setenv("GT_KILL", "step:3")
    monkeypatch.setenv("GT_KILL_ONLY_FIRST_ATTEMPT", "1")
    result = launch_from_config(cfg)
    assert result["step"] == 4
    assert [s for s, _ in list_checkpoints(os.path.join(tmp_path, "models"))] == [2, 4]
    assert_same_weights(final_weights(tmp_path), reference(tmp_path_factory, CACHE, resume=True))
    assert "resumed from" in (tmp_path / "logs" / "train.log").read_text()


def test_ddp_and_fsdp2_run_at_world_size_one(tmp_path, tmp_path_factory):
    """One process under DDP or FSDP makes its own one-rank group and matches the NO strategy."""
    for name, launch in (("DDP", {}), ("FSDP", dict(fsdp_config=dict(fsdp_transformer_layer_cls_to_wrap="Block")))):
        project = tmp_path / name
        launch_from_config(job(project, name, ranks=1, launch=launch))
        assert_same_weights(final_weights(project), reference(tmp_path_factory, CACHE))
