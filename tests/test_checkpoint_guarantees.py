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
from tests.test_reliability_checkpoints import Warnings, cfg_for


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


# -- 2. the best, the keeps, the newest finite checkpoint and a branch point are never rotated away ---------
def test_the_best_checkpoint_survives_epoch_training_under_total_limit_1(tmp_path, monkeypatch):
    import json

    from tests.tiny_eval import eval_job
    cfg = eval_job(tmp_path, runner="tests.tiny_eval.ScriptedScoreTrainer", max_steps=None, max_epochs=4,
                   checkpoint_interval=1, checkpoint_total_limit=1, checkpoint_keeps=[1],
                   checkpoint_best=dict(metric="val/score", mode="min"))
    cfg["dataloaders"]["train"]["data_or_config"]["max_bytes"] = 280  # 16 windows: 2 steps an epoch
    monkeypatch.setenv("GT_SCORES", "2:3,4:1,6:2,8:5")  # the best: step 4 (epoch 2)
    launch_from_config(cfg)
    models = tmp_path / "models"
    names = sorted(os.path.basename(p) for _, p in list_checkpoints(str(models)))
    # epoch 1: checkpoint_keeps (epochs here); step 4: the best; step 8: the newest
    assert names == ["checkpoint_epoch_1_step_2", "checkpoint_epoch_2_step_4", "checkpoint_epoch_4_step_8"]
    best = json.load(open(models / "best.json"))
    assert best["checkpoint"] == "checkpoint_epoch_2_step_4" and (models / best["checkpoint"]).is_dir()


def test_the_checkpoint_a_run_branched_from_is_kept(tmp_path):
    from giga_train.checkpoint.manager import CheckpointManager
    from tests.test_reliability_checkpoints import fake_checkpoint
    models = str(tmp_path)
    other = CheckpointManager(models)
    for s in (1, 2, 3, 4):
        fake_checkpoint(models, s, other)
    ours = CheckpointManager(models, total_limit=1)
    ours.note_resumed(os.path.join(models, "checkpoint_epoch_0_step_2"))  # an explicit, older checkpoint
    for s in (3, 4, 5):
        fake_checkpoint(models, s, ours)  # the other history's 3 and 4 are set aside, not replaced
    assert [s for s, _ in list_checkpoints(models)] == [2, 5]  # 2: the branch point; 1, 3, 4 rotated
    later = CheckpointManager(models, total_limit=1)  # a later resume=True continues from 5
    later.note_resumed(later.latest())
    fake_checkpoint(models, 6, later)
    assert [s for s, _ in list_checkpoints(models)] == [2, 6]  # still kept: the set-aside 3 descends from it


# -- 3. non-finite checkpoints are never offered or resumed as good ------------------------------------------
def test_non_finite_checkpoints_are_never_called_good_nor_resumed(tmp_path, monkeypatch, capsys):
    from giga_train.cli import main
    from giga_train.errors import TrainingStopped
    monkeypatch.setenv("GT_POISON", "3")  # step 3 makes the weights NaN (its loss is still finite)
    models = tmp_path / "models"
    with pytest.raises(TrainingStopped, match=r"step 4: non-finite loss .* newest good checkpoint: "
                                              r".*checkpoint_epoch_1_step_2$"):
        launch_from_config(cfg_for(tmp_path, runner="tests.test_reliability_checkpoints.PoisonTrainer",
                                   nan_policy="stop"))
    assert read_meta(str(models / "checkpoint_epoch_1_step_3"))["finite"] is False  # saved before the stop
    monkeypatch.delenv("GT_POISON")
    # an explicit path to it: one line, exit 1, nothing loaded
    path = tmp_path / "cfg.py"
    path.write_text(f"config = {cfg_for(tmp_path, max_steps=4, resume=str(models / 'checkpoint_epoch_1_step_3'))!r}\n")
    capsys.readouterr()
    assert main(["train", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "checkpoint_epoch_1_step_3 holds non-finite weights" in err, err
    assert "The newest finite checkpoint is " + str(models / "checkpoint_epoch_1_step_2") in err, err
    # resume=True: the newest finite one, saying in one line what it passed over
    trainer = launch_from_config(cfg_for(tmp_path, max_steps=4, resume=True))
    assert trainer.step == 4 and len(trainer.losses) == 2  # from step 2: steps 3 and 4
    log = (tmp_path / "logs" / "train.log").read_text().splitlines()
    passed = [line.split(" WARNING ", 1)[-1] for line in log if "passing over" in line]
    assert passed == ["resume: passing over 1 checkpoint with non-finite weights (NaN/inf; meta.json finite:"
                      f" false): checkpoint_epoch_1_step_3; resuming {models / 'checkpoint_epoch_1_step_2'}"]
    assert read_meta(str(models / "checkpoint_epoch_1_step_3"))["finite"] is True  # this run's own 3
    assert read_meta(str(models / "checkpoint_epoch_1_step_3.superseded_0"))["finite"] is False  # kept aside


# -- 4. every reader verifies and stays inside the folder; every writer cleans up and fails in one line ------
@pytest.fixture(scope="module")
def one_run(tmp_path_factory):
    """A finished tiny run (checkpoints at steps 2 and 4): copied by each test that damages it."""
    project = tmp_path_factory.mktemp("run")
    launch_from_config(cfg_for(project, max_steps=4, checkpoint_interval=2))
    return project


def copied(one_run, tmp_path):
    import shutil
    shutil.copytree(one_run, tmp_path / "p")
    return tmp_path / "p", tmp_path / "p" / "models" / "checkpoint_epoch_1_step_4"


def one_line_exit(argv, capsys, code=1):
    from giga_train.cli import main
    capsys.readouterr()
    assert main(argv) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_export_convert_and_load_checkpoint_refuse_a_flipped_bit(one_run, tmp_path, capsys):
    from giga_train.checkpoint import CorruptCheckpointError
    from giga_train.tools.offline import offline_trainer
    from tests.test_reliability_checkpoints import flip_bit
    project, newest = copied(one_run, tmp_path)
    weights = newest / "model" / "diffusion_pytorch_model.safetensors"
    flip_bit(str(weights))
    for argv in (["convert", str(newest), "--to", "full"], ["export", str(newest), "--to", "hf"]):
        err = one_line_exit(argv, capsys)
        assert f"{weights}: checksum mismatch" in err and "nothing was read" in err, err
    assert sorted(os.listdir(newest.parent)) == ["checkpoint_epoch_1_step_2", "checkpoint_epoch_1_step_4"]
    trainer = offline_trainer(str(project / "config.json"), device="cpu")
    from giga_train.tools.offline import build_model
    model = build_model(trainer)
    with pytest.raises(CorruptCheckpointError, match=f"{weights}: checksum mismatch.*nothing was loaded"):
        trainer.load_checkpoint(str(newest / "model"), model)
    trainer.load_checkpoint(str(newest.parent / "checkpoint_epoch_1_step_2" / "model"), model)  # intact: loads


def test_a_layout_pointing_outside_the_folder_is_never_followed(one_run, tmp_path, capsys):
    import json

    from giga_train.checkpoint import CorruptCheckpointError, read_weights
    from giga_train.checkpoint.manager import CheckpointManager
    project, newest = copied(one_run, tmp_path)
    meta = json.loads((newest / "meta.json").read_text())
    meta["layout"]["models"] = {"../checkpoint_epoch_1_step_2/model": ""}  # another checkpoint's weights
    meta["layout"]["live"] = ["../checkpoint_epoch_1_step_2/model"]
    (newest / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(CorruptCheckpointError, match="layout entry '../checkpoint_epoch_1_step_2/model' points"
                                                     " outside the checkpoint folder"):
        read_weights(str(newest))
    err = one_line_exit(["convert", str(newest), "--to", "full"], capsys)
    assert "points outside the checkpoint folder" in err, err
    with Warnings() as warned:  # resume=True: the one before it, with one line
        assert CheckpointManager(str(newest.parent)).resume_path(True).endswith("checkpoint_epoch_1_step_2")
    assert len(warned.lines) == 1 and "points outside the checkpoint folder" in warned.lines[0], warned.lines
    # a model folder that is a symlink out of the checkpoint, and a file list naming a file outside: the same
    import shutil

    from giga_train.checkpoint import verify
    step2 = newest.parent / "checkpoint_epoch_1_step_2"
    shutil.copy(one_run / "models" / newest.name / "meta.json", newest / "meta.json")  # the meta.json it wrote
    shutil.rmtree(newest / "model")
    os.symlink(step2 / "model", newest / "model")
    assert "layout entry 'model' points outside the checkpoint folder" in verify(str(newest))
    meta = json.loads((step2 / "meta.json").read_text())
    meta["files"]["../checkpoint_epoch_1_step_4/training_state.pt"] = [1, "0"]
    (step2 / "meta.json").write_text(json.dumps(meta))
    assert verify(str(step2)) == (f"{step2}/../checkpoint_epoch_1_step_4/training_state.pt: outside the checkpoint"
                                  " folder (meta.json is not the one its save wrote)")


LIMITED = """
import resource, signal, sys, tempfile
import torch
from giga_train.cli import main
tempfile.gettempdir()  # found before the limit: finding it writes a probe file
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (BYTES, BYTES))
sys.exit(main(sys.argv[1:]))
"""


def limited(limit, *argv):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-c", LIMITED.replace("BYTES", str(limit)), *argv],
                          capture_output=True, text=True, timeout=300)


def test_convert_after_a_failed_or_interrupted_convert(one_run, tmp_path, capsys):
    project, newest = copied(one_run, tmp_path)
    out = str(newest) + "_full"
    os.makedirs(out + ".tmp")  # an interrupted convert's
    (tmp_path / "p" / "models" / "checkpoint_epoch_1_step_4_full.tmp" / "model.safetensors").write_bytes(b"half")
    size = os.path.getsize(newest / "model" / "diffusion_pytorch_model.safetensors")
    run = limited(size // 2, "convert", str(newest), "--to", "full")  # the weights file does not fit
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr[-3000:]
    last = run.stderr.strip().splitlines()[-1]  # (above it: torch's UserWarning about torch.distributed)
    assert last.startswith("giga-train: error: convert: File too large"), run.stderr
    assert f"nothing was written to {out}" in last
    assert not os.path.exists(out) and not os.path.exists(out + ".tmp")  # nothing left behind
    os.makedirs(out + ".tmp")  # interrupted again (kill -9): the next convert removes it
    from giga_train.cli import main
    assert main(["convert", str(newest), "--to", "full"]) == 0
    assert sorted(os.listdir(out)) == ["model.safetensors", "optimizer.pt"] and not os.path.exists(out + ".tmp")


def test_a_full_disk_at_the_lock_file_is_one_line(tmp_path):
    cfg = cfg_for(tmp_path, max_steps=1)
    path = tmp_path / "cfg.py"
    path.write_text(f"config = {cfg!r}\n")
    (tmp_path / ".giga_train.lock").write_text("")  # there from an earlier run; the disk is full now
    run = limited(0, "train", str(path))
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr[-3000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last == (f"giga-train: error: project_dir {tmp_path}: cannot write its lock file"
                    f" {tmp_path / '.giga_train.lock'} (File too large); nothing was started"), run.stderr
    assert not (tmp_path / "models").exists()


# -- 5. two project_dirs whose models/ are one folder (a symlink) exclude each other -------------------------
def test_the_lock_covers_a_models_folder_shared_through_a_symlink(tmp_path, capsys):
    import signal
    import subprocess
    import sys

    from giga_train.checkpoint import ProjectLockedError
    from giga_train.checkpoint.lock import ProjectLock
    from tests.test_reliability_checkpoints import HOLD
    a, b = tmp_path / "a", tmp_path / "b"
    (a / "models" / ".tmp_checkpoint_epoch_1_step_9").mkdir(parents=True)  # a's save in flight
    b.mkdir()
    os.symlink(a / "models", b / "models")
    with ProjectLock(str(a)):  # in this process
        with pytest.raises(ProjectLockedError, match=f"its models/ is {a / 'models'}, in use by a run in this"):
            ProjectLock(str(b)).acquire()
    with ProjectLock(str(b)):  # either order
        with pytest.raises(ProjectLockedError, match="in use by a run in this process"):
            ProjectLock(str(a)).acquire()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(a)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        path = tmp_path / "cfg.py"
        path.write_text(f"config = {cfg_for(b, max_steps=1)!r}\n")
        err = one_line_exit(["train", str(path)], capsys)
        assert f"project_dir {b} (its models/ is {a / 'models'}): in use by another run (pid {holder.pid} " in err
        assert (a / "models" / ".tmp_checkpoint_epoch_1_step_9").is_dir()  # b's clean-up never ran
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert os.listdir(a / "models") == [".tmp_checkpoint_epoch_1_step_9"]
    from giga_train.checkpoint import lock
    assert not lock._HELD
