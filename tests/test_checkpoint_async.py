"""train.checkpoint_async: the same files as a synchronous save, exact resume, the rolling limit, a kill -9
while a write is in flight, and a writer's error surfacing on the training thread in one line."""
import copy
import os
import subprocess
import sys
import time

import pytest
import torch

from giga_train import launch_from_config
from giga_train.checkpoint import list_checkpoints, read_weights
from giga_train.tools.convert import read_state
from tests.distributed import job
from tests.test_disk_full import LIMITED
from tests.tiny import TinyTrainer, tiny_config

FSDP2 = dict(fsdp_config=dict(fsdp_version=2, fsdp_transformer_layer_cls_to_wrap="Block"))


# -- one launch, three runs (each in project_dir/<name>): sync 0->4; async 0->4 with a writer that starts
# only once the loop has moved on; async resumed 2->4 from the async checkpoint 2 -------------------------
def _variant(config, name, **train):
    config = copy.deepcopy(config)
    config["project_dir"] = os.path.join(config["project_dir"], name)
    config["train"].update(train)
    return config


RUNS = ("sync", "async", "async_resumed")


class SyncRun(TinyTrainer):
    @classmethod
    def load(cls, config):
        return super().load(_variant(config, "sync"))


class AsyncRun(TinyTrainer):
    """Each background write waits until the loop has finished the next step (or waits for the write):
    what it writes must still be the state taken at the save."""

    waiting = False

    @classmethod
    def load(cls, config):
        return super().load(_variant(config, "async", checkpoint_async=True))

    def save_checkpoint(self):
        saved, write_model = self.step, type(self.checkpoints).write_model.__get__(self.checkpoints)

        def lagging_write_model(*args, **kwargs):
            while self.step == saved and not self.waiting:
                time.sleep(0.005)
            write_model(*args, **kwargs)
        self.checkpoints.write_model = lagging_write_model
        return super().save_checkpoint()

    def wait_for_checkpoint(self, raise_errors=True):
        self.waiting = True
        try:
            return super().wait_for_checkpoint(raise_errors)
        finally:
            self.waiting = False


class AsyncResumed(TinyTrainer):
    @classmethod
    def load(cls, config):
        half = os.path.join(config["project_dir"], "async", "models", "checkpoint_epoch_1_step_2")
        return super().load(_variant(config, "async_resumed", checkpoint_async=True, resume=half))


def files(folder):
    return sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, names in os.walk(folder) for f in names)


def assert_same(a, b, where="state"):
    """Equal to the bit, and of the same types (a tuple stays a tuple)."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        same = a.dtype == b.dtype and torch.equal(a, b)
        assert same, where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def assert_same_checkpoint(a, b):
    """Two checkpoint folders with the same files and the same content, to the bit."""
    assert files(a) == files(b)
    assert_same(read_state(a), read_state(b), "weights, optimizer")
    assert_same(read_weights(a, ema=True), read_weights(b, ema=True), "ema")
    for name in [f for f in files(a) if f.endswith(".pt")]:  # training state, RNG states, precision
        assert_same(*(torch.load(os.path.join(path, name), weights_only=True) for path in (a, b)), name)


@pytest.mark.parametrize("distributed_type, ranks, launch", [("NO", 1, {}), ("DDP", 2, {}), ("FSDP", 2, FSDP2)],
                         ids=["NO", "DDP", "FSDP2"])
def test_async_checkpoints_equal_sync_ones_and_resume_exactly(tmp_path, distributed_type, ranks, launch):
    cfg = job(tmp_path, distributed_type, ranks=ranks, launch=launch, with_ema=True, ema_decay=0.9)
    cfg["runners"] = [f"{__name__}.{c.__name__}" for c in (SyncRun, AsyncRun, AsyncResumed)]
    launch_from_config(cfg)
    sync, run, resumed = (list_checkpoints(str(tmp_path / name / "models")) for name in RUNS)
    assert [s for s, _ in sync] == [s for s, _ in run] == [2, 4] and [s for s, _ in resumed] == [4]
    for (_, a), (_, b) in zip(sync, run):
        assert_same_checkpoint(a, b)
    assert_same_checkpoint(sync[-1][1], resumed[-1][1])  # resumed from an async checkpoint: exact
    for name in RUNS:
        assert not [n for n in os.listdir(tmp_path / name / "models") if n.startswith(".")], "a half-written folder"


def test_rolling_limit_and_keeps_with_async(tmp_path):
    cfg = tiny_config(tmp_path, max_steps=12, checkpoint_interval=2, checkpoint_total_limit=2, checkpoint_keeps=[4],
                      checkpoint_async=True)
    launch_from_config(cfg)
    assert [s for s, _ in list_checkpoints(str(tmp_path / "models"))] == [4, 10, 12]
    assert not [n for n in os.listdir(tmp_path / "models") if n.startswith(".")]


def test_kill_9_while_an_async_write_is_in_flight_resumes_from_the_previous_checkpoint(tmp_path):
    cfg = tiny_config(tmp_path / "killed", max_steps=8, checkpoint_interval=2, resume=True, with_ema=True,
                      ema_decay=0.9, gradient_accumulation_steps=2, checkpoint_async=True)
    reference = launch_from_config(_variant(cfg, "../reference", checkpoint_async=False))
    cfg["runners"] = ["tests.tiny.KillingTrainer"]
    path = tmp_path / "cfg.py"
    path.write_text(f"config = {cfg!r}\n")
    run = subprocess.run([sys.executable, "-m", "giga_train", "train", str(path)], capture_output=True, text=True,
                         env={**os.environ, "GT_KILL": "inflight:4"}, timeout=600)
    assert run.returncode == -9, run.stderr[-2000:]
    models = tmp_path / "killed" / "models"
    assert [s for s, _ in list_checkpoints(str(models))] == [2]  # 4 was in flight: never renamed into place
    assert (models / ".tmp_checkpoint_epoch_1_step_4" / "optimizer_dcp").is_dir()
    resumed = launch_from_config(cfg)
    assert resumed.losses == reference.losses[2 * 2:]
    for ema in (False, True):
        final = [read_weights(p, ema=ema) for p in (reference.checkpoints.latest(), resumed.checkpoints.latest())]
        assert_same(final[0], final[1], "ema" if ema else "weights")
    assert not [n for n in os.listdir(models) if n.startswith(".")], "the half-written one is swept"


class FailingWriterTrainer(TinyTrainer):
    """The background write of checkpoint 4 fails (not the disk): the loop goes on until its next wait."""

    def save_checkpoint(self):
        if self.step == 4:
            def write_model(*args):
                raise RuntimeError("the storage went away\nsecond line")
            self.checkpoints.write_model = write_model
        elif self.step > 4:
            self.checkpoints.__dict__.pop("write_model", None)
        return super().save_checkpoint()


def test_a_writer_error_surfaces_at_the_next_wait_point_as_one_line(tmp_path):
    cfg = tiny_config(tmp_path, max_steps=8, checkpoint_interval=2, checkpoint_async=True,
                      runner=f"{__name__}.FailingWriterTrainer")
    with pytest.raises(RuntimeError) as error:
        launch_from_config(cfg)
    newest = str(tmp_path / "models" / "checkpoint_epoch_1_step_2")
    assert str(error.value) == ("checkpoint at step 4: writing it in the background failed: RuntimeError: the storage"
                                f" went away; the newest complete checkpoint is {newest}")
    assert "the storage went away" in str(error.value.__cause__)  # the writer's own traceback comes along
    assert "step 5 | total_loss" in (tmp_path / "logs" / "train.log").read_text(), "the loop went on meanwhile"
    assert [s for s, _ in list_checkpoints(str(tmp_path / "models"))] == [2]
    assert not [n for n in os.listdir(tmp_path / "models") if n.startswith(".")]


def test_a_full_disk_in_the_writer_stops_with_the_one_line_and_keeps_the_previous_checkpoint(tmp_path):
    launch_from_config(tiny_config(tmp_path, max_steps=2, checkpoint_interval=2, with_ema=False))
    before = list_checkpoints(str(tmp_path / "models"))
    run = subprocess.run([sys.executable, "-c", LIMITED, "train", "tests/tiny_disk_full.py", "--set",
                          f"project_dir={tmp_path}", "--set", "train.checkpoint_async=True"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stderr[-2000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("giga-train: error: checkpoint at step 4: File too large writing"), last
    assert f"nothing of it was kept, the newest complete checkpoint is {before[0][1]}" in last
    assert list_checkpoints(str(tmp_path / "models")) == before
    assert not [n for n in os.listdir(tmp_path / "models") if n.startswith(".")]
