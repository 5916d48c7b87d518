"""Preemption: SIGTERM/SIGUSR1 make every rank finish the step, save a checkpoint and exit 0; the rerun
with resume=True ends on the same weights as an uninterrupted run, bit for bit."""
import os
import signal
import subprocess
import sys

import pytest
import torch

from giga_train import launch_from_config
from giga_train.checkpoint import list_checkpoints, read_weights
from tests.distributed import job

MAX = 8


def config(project, ranks, num_workers=0):
    cfg = job(project, "DDP" if ranks > 1 else "NO", ranks=ranks, max_steps=MAX, checkpoint_interval=3, resume=True)
    cfg["runners"] = ["tests.tiny.SignalTrainer"]
    cfg["dataloaders"]["train"]["num_workers"] = num_workers
    return cfg


def final_weights(project):
    step, path = list_checkpoints(os.path.join(str(project), "models"))[-1]
    assert step == MAX
    return read_weights(path)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    runs = {}

    def get(ranks):
        if ranks not in runs:
            project = tmp_path_factory.mktemp(f"full{ranks}")
            launch_from_config(config(project, ranks))
            runs[ranks] = final_weights(project)
        return runs[ranks]
    return get


def preempt_then_resume(tmp_path, ranks, signal_spec, at, num_workers=0):
    cfg = config(tmp_path, ranks, num_workers)
    path = tmp_path / "cfg.py"
    path.write_text(f"config = {cfg!r}\n")
    run = subprocess.run([sys.executable, "-m", "giga_train", "train", str(path)], capture_output=True, text=True,
                         start_new_session=True, env={**os.environ, "GT_SIGNAL": f"{signal_spec}:{at}"})
    assert run.returncode == 0, run.stderr[-3000:]
    checkpoints = list_checkpoints(str(tmp_path / "models"))
    assert [s for s, _ in checkpoints] == [3, at]  # the agreed step, saved once
    assert {f"random_states_{r}.pt" for r in range(ranks)} <= set(os.listdir(checkpoints[-1][1]))
    log = (tmp_path / "logs" / "train.log").read_text()
    assert f"at step {at} of {MAX}: saved {checkpoints[-1][1]}; rerun with train.resume=True" in log
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    resumed = launch_from_config(cfg)
    assert {s: signal.getsignal(s) for s in handlers} == handlers, "handlers must be restored"
    return resumed


@pytest.mark.parametrize("signal_spec", ["SIGTERM:parent", "SIGUSR1:parent"])
def test_two_ranks_preempted_through_the_launcher(tmp_path, uninterrupted, signal_spec):
    """The launcher gets the signal: the agent passes SIGTERM on itself, SIGUSR1 is forwarded by us."""
    result = preempt_then_resume(tmp_path, 2, signal_spec, at=5)
    assert result["step"] == MAX and not result["preempted"]
    got, expected = final_weights(tmp_path), uninterrupted(2)
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_one_process_preempted(tmp_path, uninterrupted):
    trainer = preempt_then_resume(tmp_path, 1, "SIGTERM:self", at=4)
    assert len(trainer.losses) == MAX - 4
    got, expected = final_weights(tmp_path), uninterrupted(1)
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_signal_to_the_whole_job_spares_the_data_workers(tmp_path, uninterrupted):
    """SLURM signals every process of the job: DataLoader workers must not die of it mid-epoch."""
    preempt_then_resume(tmp_path, 1, "SIGTERM:group", at=4, num_workers=2)
    got, expected = final_weights(tmp_path), uninterrupted(1)
    assert all(torch.equal(got[k], expected[k]) for k in expected)
