"""Nothing lost, nothing silently wrong: rotation by write order and lineage, the newest finite
checkpoint kept, one run per project_dir, per-file checksums verified at resume."""
import json
import logging
import os
import signal
import subprocess
import sys

import pytest
import torch

from giga_train import launch_from_config
from giga_train.checkpoint import CorruptCheckpointError, ProjectLockedError, list_checkpoints, read_meta
from giga_train.checkpoint.lock import ProjectLock
from giga_train.checkpoint.manager import CheckpointManager, verify
from giga_train.cli import main
from tests.tiny import TinyTrainer, tiny_config


class PoisonTrainer(TinyTrainer):
    """From step GT_POISON on, the weights hold a NaN after each step (as max_grad_norm=nan did)."""

    def train_step(self):
        out = super().train_step()
        if self.step + 1 >= int(os.environ.get("GT_POISON", "1000")):
            with torch.no_grad():
                self.unwrapped_model.head.weight[0, 0] = float("nan")
        return out


class Warnings(logging.Handler):
    """The giga_train logger's warning lines (it does not propagate to pytest's caplog once a run set it up)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())

    def __enter__(self):
        logging.getLogger("giga_train").addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("giga_train").removeHandler(self)


RUNNER = "tests.tiny.TinyTrainer"


def steps(project):
    return [s for s, _ in list_checkpoints(os.path.join(str(project), "models"))]


def cfg_for(project, runner=RUNNER, **train):
    cfg = tiny_config(project, runner=runner, **dict(dict(max_steps=6, checkpoint_interval=1, with_ema=False), **train))
    return cfg


def test_resuming_an_older_checkpoint_never_deletes_newer_ones(tmp_path):
    launch_from_config(cfg_for(tmp_path))  # another run: 1..6
    models = tmp_path / "models"
    old_ids = {s: read_meta(p)["save_id"] for s, p in list_checkpoints(str(models))}
    trainer = launch_from_config(cfg_for(tmp_path, max_steps=5, checkpoint_total_limit=1,
                                         resume=str(models / "checkpoint_epoch_1_step_2")))
    assert trainer.step == 5
    # the other run's step 6 is still there, and so are its 3, 4, 5 (set aside, not replaced)
    assert read_meta(str(models / "checkpoint_epoch_1_step_6"))["save_id"] == old_ids[6]
    aside = sorted(n for n in os.listdir(models) if ".superseded_" in n)
    assert aside == [f"checkpoint_epoch_1_step_{s}.superseded_0" for s in (3, 4, 5)]
    assert [read_meta(str(models / n))["save_id"] for n in aside] == [old_ids[s] for s in (3, 4, 5)]
    # this run's own history (5 <- 4 <- 3 <- the resumed 2 <- 1) is rotated to total_limit=1, but for the
    # checkpoint it branched from (the set-aside 3, 4, 5 descend from it too)
    assert steps(tmp_path) == [2, 5, 6]
    assert trainer.checkpoints.latest() == str(models / "checkpoint_epoch_1_step_5")  # newest by write order
    assert read_meta(trainer.checkpoints.latest())["parent"] is not None


def test_plain_resume_still_rotates_the_runs_own_history(tmp_path):
    launch_from_config(cfg_for(tmp_path, max_steps=3, checkpoint_total_limit=2, resume=True))
    assert steps(tmp_path) == [2, 3]
    launch_from_config(cfg_for(tmp_path, max_steps=6, checkpoint_total_limit=2, resume=True))
    assert steps(tmp_path) == [5, 6]


def test_the_newest_finite_checkpoint_is_never_rotated_away(tmp_path, monkeypatch):
    monkeypatch.setenv("GT_POISON", "3")
    launch_from_config(cfg_for(tmp_path, runner="tests.test_reliability_checkpoints.PoisonTrainer",
                               max_steps=5, checkpoint_total_limit=1, nan_policy="off"))
    assert steps(tmp_path) == [2, 5]  # 2: the last finite weights; 5: the newest
    metas = {s: read_meta(p) for s, p in list_checkpoints(str(tmp_path / "models"))}
    assert metas[2]["finite"] is True and metas[5]["finite"] is False
    log = (tmp_path / "logs" / "train.log").read_text()
    assert log.count("holds non-finite weights (NaN/inf); the newest finite checkpoint is kept") == 3  # 3, 4, 5


def fake_checkpoint(models, step, manager, finite=True):
    from giga_train.checkpoint.formats.weights import save_weights
    tmp = manager.begin(0, step)
    save_weights(os.path.join(tmp, "model"), {"w": torch.full((2,), float("nan") if not finite else 1.0)})
    return manager.commit(tmp, {"step": step})


def test_rotation_of_the_managers_own_history(tmp_path):
    models = str(tmp_path)
    other = CheckpointManager(models)
    for s in (1, 2, 9):
        fake_checkpoint(models, s, other)
    ours = CheckpointManager(models, total_limit=2, keeps=[4])
    for s in (3, 4, 5, 6):
        fake_checkpoint(models, s, ours)
    assert [s for s, _ in list_checkpoints(models)] == [1, 2, 4, 5, 6, 9]  # another run's never deleted
    assert ours.latest().endswith("step_6")  # by write order, not by step
    ours = CheckpointManager(models, total_limit=1)
    ours.note_resumed(os.path.join(models, "checkpoint_epoch_0_step_2"))  # fake_checkpoint writes epoch 0
    fake_checkpoint(models, 7, ours, finite=False)
    fake_checkpoint(models, 8, ours, finite=False)
    assert [s for s, _ in list_checkpoints(models)] == [2, 4, 5, 6, 8, 9]  # 2: the newest finite of its history


def test_garbage_in_meta_json_does_not_break_the_next_save(tmp_path):
    launch_from_config(cfg_for(tmp_path, max_steps=4, checkpoint_interval=2))
    (tmp_path / "models" / "checkpoint_epoch_1_step_4" / "meta.json").write_text("{garbage")
    trainer = launch_from_config(cfg_for(tmp_path, max_steps=6, checkpoint_interval=2, resume=True,
                                         checkpoint_total_limit=1))
    assert trainer.step == 6 and steps(tmp_path) == [6]  # resumed from 2; the damaged 4 is set aside
    assert (tmp_path / "models" / "checkpoint_epoch_1_step_4.superseded_0" / "meta.json").read_text() == "{garbage"


# -- checksums ----------------------------------------------------------------------------------------
def flip_bit(path):
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x01
    open(path, "wb").write(bytes(data))


def garbage(path):
    size = os.path.getsize(path)
    open(path, "wb").write(b"\x00garbage" * (size // 8) + b"\x00" * (size % 8))


def truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


DAMAGE = {"model/diffusion_pytorch_model.safetensors": flip_bit, "optimizer_dcp/__0_0.distcp": garbage,
          "random_states_0.pt": os.remove, "training_state.pt": truncate}


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory):
    project = tmp_path_factory.mktemp("sums")
    launch_from_config(cfg_for(project, max_steps=4, checkpoint_interval=2))
    return project


@pytest.mark.parametrize("rel", sorted(DAMAGE))
def test_a_damaged_file_falls_back_or_stops_in_one_line(two_checkpoints, tmp_path, rel, capsys):
    import shutil
    project = tmp_path / "p"
    shutil.copytree(two_checkpoints / "models", project / "models")
    newest = project / "models" / "checkpoint_epoch_1_step_4"
    assert verify(str(newest)) is None
    DAMAGE[rel](str(newest / rel))
    problem = verify(str(newest))
    assert problem.startswith(str(newest / rel) + ": ") and "\n" not in problem, problem

    # resume=True: the newest intact checkpoint, with one warning line naming the file
    manager = CheckpointManager(str(project / "models"))
    with Warnings() as warned:
        assert manager.resume_path(True) == str(project / "models" / "checkpoint_epoch_1_step_2")
    assert len(warned.lines) == 1 and str(newest / rel) in warned.lines[0], warned.lines
    # an explicit path: stops, naming the file
    with pytest.raises(CorruptCheckpointError, match=str(newest / rel).replace(".", r"\.")):
        manager.resume_path(str(newest))

    # end to end: the run resumes from step 2 and trains on; explicitly, one line and exit 1
    if rel == "model/diffusion_pytorch_model.safetensors":
        cfg = cfg_for(tmp_path / "q", max_steps=5, resume=str(newest))
        path = tmp_path / "cfg.py"
        path.write_text(f"config = {cfg!r}\n")
        capsys.readouterr()
        assert main(["train", str(path)]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(newest / rel) in err and "checksum mismatch" in err, err
        trainer = launch_from_config(cfg_for(project, max_steps=5, checkpoint_interval=2, resume=True))
        assert trainer.step == 5 and len(trainer.losses) == 3  # steps 3, 4, 5 after step 2
        assert (project / "models" / "checkpoint_epoch_1_step_4.superseded_0").is_dir()  # the damaged one: kept


# -- the project lock ---------------------------------------------------------------------------------
HOLD = """
import sys, time
from giga_train.checkpoint.lock import ProjectLock
ProjectLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(600)
"""


def test_one_run_per_project_dir_and_stale_locks_after_kill_9(tmp_path, capsys):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        path = tmp_path / "cfg.py"
        path.write_text(f"config = {cfg_for(tmp_path, max_steps=1)!r}\n")
        assert main(["train", str(path)]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"in use by another run (pid {holder.pid} on " in err, err
        assert not (tmp_path / "models").exists()  # nothing was touched
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert main(["train", str(path)]) == 0  # the dead holder's lock is stale: taken over
    assert steps(tmp_path) == [1]
    info = json.loads((tmp_path / ".giga_train.lock").read_text() or "{}")
    assert info == {}  # released at the end


def test_lock_refusals_in_this_process(tmp_path):
    with ProjectLock(str(tmp_path)):
        with pytest.raises(ProjectLockedError, match="already in use by a run in this process"):
            ProjectLock(str(tmp_path)).acquire()
    ProjectLock(str(tmp_path)).acquire().release()  # released: free again
    (tmp_path / "file").write_text("")
    with pytest.raises(ProjectLockedError, match=r"project_dir .*file/x: not a writable folder"):
        ProjectLock(str(tmp_path / "file" / "x")).acquire()
    (tmp_path / "models").mkdir()
    (tmp_path / "models").chmod(0o500)
    try:
        if not os.access(tmp_path / "models", os.W_OK):  # root writes anywhere: nothing to refuse then
            with pytest.raises(ProjectLockedError, match=r"models/ is not a writable folder \(checkpoints go there\)"):
                ProjectLock(str(tmp_path)).acquire()
            ProjectLock(str(tmp_path)).acquire().release()  # the refusal released the lock
    finally:
        (tmp_path / "models").chmod(0o700)
    (tmp_path / "logs").write_text("")  # a file where the logs folder goes
    with pytest.raises(ProjectLockedError, match=r"logs/ is not a writable folder \(logs go there\)"):
        ProjectLock(str(tmp_path)).acquire()
    from giga_train.checkpoint import lock
    assert not lock._HELD  # nothing is held after a refusal


def test_disk_error_reads_torch_checkpoint_exceptions():
    """torch 2.13's CheckpointException holds {rank: (exception, traceback)}; older ones {rank: exception}."""
    import errno

    from torch.distributed.checkpoint.api import CheckpointException

    from giga_train.checkpoint import disk_error
    full = OSError(errno.EFBIG, "File too large")
    assert disk_error(CheckpointException("write", {0: (full, None)})) is full
    assert disk_error(CheckpointException("write", {1: full})) is full
    assert disk_error(CheckpointException("write", {0: (ValueError("x"), None)})) is None


def test_nan_config_values_are_refused():
    """giga_train.schema.values.refuse_nan: the schema's call (validate_config) refuses max_grad_norm=nan."""
    from giga_train.schema.values import refuse_nan
    from giga_train.config import ConfigError, load_config
    cfg = load_config(tiny_config("unused", max_grad_norm=float("nan")))
    with pytest.raises(ConfigError, match=r"^train\.max_grad_norm: nan is not a number"):
        refuse_nan(cfg)
    cfg = load_config(tiny_config("unused", max_grad_norm=float("inf")))
    cfg["optimizers"]["betas"] = (0.9, float("nan"))
    with pytest.raises(ConfigError, match=r"^optimizers\.betas\[1\]: nan"):
        refuse_nan(cfg)
    refuse_nan(load_config(tiny_config("unused", max_grad_norm=float("inf"))))  # inf: no clipping, allowed


def test_check_refuses_a_nan_max_grad_norm(tmp_path, capsys):
    path = tmp_path / "cfg.py"
    text = repr(tiny_config(tmp_path, max_grad_norm="NAN_HERE")).replace("'NAN_HERE'", "float('nan')")
    path.write_text(f"config = {text}\n")
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == "giga-train: error: train.max_grad_norm: nan is not a number this key can take (give a finite value)\n"
