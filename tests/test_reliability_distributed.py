"""2 DDP ranks on the CPU: a stopped rank does not hang the job (the collective watchdog), SIGINT is one
line, and an error in the user's code keeps its traceback (once) instead of passing for a config error."""
import os
import signal
import subprocess
import sys
import time

import pytest

from giga_train.checkpoint import list_checkpoints
from giga_train.cli import main
from tests.tiny import TinyTrainer, tiny_config


class StoppingTrainer(TinyTrainer):
    """GT_STOP="RANK:STEP": that rank stops itself (SIGSTOP: a stuck NFS read or a wedged GPU) in that
    step's forward; GT_SIGINT="STEP": rank 0 sends SIGINT to the launcher's process group (Ctrl-C in a
    terminal: the agent passes it on to the ranks);
    GT_RAISE="RANK:STEP": that rank's forward raises a ValueError (a bug in the user's code)."""

    def forward_step(self, batch_dict):
        step = self.step + 1
        rank, _, at = os.environ.get("GT_STOP", ":").partition(":")
        if rank and int(rank) == self.rank and step == int(at):
            os.kill(os.getpid(), signal.SIGSTOP)
        if os.environ.get("GT_SIGINT") and self.rank == 0 and step == int(os.environ["GT_SIGINT"]):
            os.killpg(os.getpgid(os.getppid()), signal.SIGINT)
            time.sleep(30)  # interrupted
        rank, _, at = os.environ.get("GT_RAISE", ":").partition(":")
        if rank and int(rank) == self.rank and step == int(at):
            raise ValueError("boom in forward_step")
        return super().forward_step(batch_dict)


def run_job(tmp_path, env, ranks=2, **train):
    cfg = tiny_config(tmp_path / "run", runner="tests.test_reliability_distributed.StoppingTrainer",
                      **dict(dict(max_steps=6, checkpoint_interval=2), **train))
    cfg["launch"] = dict(distributed_type="DDP" if ranks > 1 else "NO", num_processes=ranks)
    cfg["dataloaders"]["train"]["batch_size_per_gpu"] = 4
    path = tmp_path / "cfg.py"
    path.write_text(f"config = {cfg!r}\n")
    start = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "giga_train", "train", str(path)], capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=240, start_new_session=True)
    return run, time.monotonic() - start


def error_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("giga-train: error:")]


def test_a_stopped_rank_ends_the_job_in_one_line_keeping_the_checkpoints(tmp_path):
    run, seconds = run_job(tmp_path, {"GT_STOP": "1:3", "GIGA_TRAIN_COLLECTIVE_TIMEOUT": "5"})
    assert run.returncode == 1, run.stderr[-3000:]
    lines = error_lines(run.stderr)
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert "rank 0: RuntimeError:" in lines[0] and "another rank stuck, stopped or gone" in lines[0], lines
    assert "is 5 s" in lines[0] and lines[0].endswith("checkpoint_epoch_1_step_2"), lines
    assert [s for s, _ in list_checkpoints(str(tmp_path / "run" / "models"))] == [2]
    # start-up, the 5 s limit, and no 30 s grace of the agent: the healthy rank SIGKILLs the stopped one
    assert seconds < 75, seconds


def test_sigint_to_a_ddp_job_is_one_line(tmp_path):
    run, _ = run_job(tmp_path, {"GT_SIGINT": "3"})
    assert run.returncode == 1, run.stderr[-3000:]
    assert "Traceback" not in run.stderr and "KeyboardInterrupt" not in run.stderr, run.stderr[-3000:]
    lines = error_lines(run.stderr)
    assert lines == [f"giga-train: error: stopped by SIGINT before the ranks saved a checkpoint; the newest complete"
                     f" one is {tmp_path / 'run' / 'models' / 'checkpoint_epoch_1_step_2'}"], run.stderr[-3000:]


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_value_error_in_user_code_keeps_its_traceback(tmp_path, ranks):
    run, _ = run_job(tmp_path, {"GT_RAISE": f"{ranks - 1}:3"}, ranks=ranks)
    assert run.returncode == 1, run.stderr[-3000:]
    assert run.stderr.count("Traceback (most recent call last)") == 1, run.stderr[-5000:]
    assert 'test_reliability_distributed.py", line' in run.stderr and "in forward_step" in run.stderr
    assert "ValueError: boom in forward_step" in run.stderr
    if ranks == 2:  # the launcher's one line, after the rank's own traceback
        assert error_lines(run.stderr) == ["giga-train: error: rank 1 failed with ValueError: boom in forward_step"
                                           " (its traceback is above)"], run.stderr[-3000:]
    else:
        assert not error_lines(run.stderr)  # not reported as a config error (exit 2)


def test_a_value_error_in_process_propagates(tmp_path, monkeypatch):
    monkeypatch.setenv("GT_RAISE", "0:2")
    cfg = tiny_config(tmp_path, runner="tests.test_reliability_distributed.StoppingTrainer", max_steps=3)
    path = tmp_path / "cfg.py"
    path.write_text(f"config = {cfg!r}\n")
    with pytest.raises(ValueError, match="boom in forward_step"):
        main(["train", str(path)])


def test_collective_timeout_sources(monkeypatch):
    from giga_train.config import Config
    from giga_train.distributed.env import collective_timeout
    monkeypatch.delenv("GIGA_TRAIN_COLLECTIVE_TIMEOUT", raising=False)
    assert collective_timeout().total_seconds() == 600  # NCCL's own default; gloo's would be 30 minutes
    monkeypatch.setenv("GIGA_TRAIN_COLLECTIVE_TIMEOUT", "42")
    assert collective_timeout(Config(num_processes=2)).total_seconds() == 42
    assert collective_timeout(Config(collective_timeout=7)).total_seconds() == 7  # the config key wins
