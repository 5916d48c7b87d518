"""A tracker never kills a run: when the disk under the logging dir is full (the tracker's open file
descriptor is pointed at /dev/full, whose writes fail with ENOSPC, as a full disk's do), the tracker is
turned off with one warning line, and training and checkpointing go on to the end, exit 0."""
import logging
import os

import pytest

from giga_train.checkpoint import list_checkpoints
from giga_train.cli import main
from tests.tiny import TinyTrainer

TRACKER_FILES = ("metrics.jsonl", "events.out.tfevents.")


class FullLogDiskTrainer(TinyTrainer):
    """From step GT_FULL_AT on, the trackers' files are on a full disk: the open JSONL file's descriptor now
    leads to /dev/full, and TensorBoard's event file (which its writer reopens by name) is a link to it."""

    def forward_step(self, batch_dict):
        if self.step + 1 == int(os.environ["GT_FULL_AT"]) and not getattr(self, "filled", False):
            self.filled = True
            full = os.open("/dev/full", os.O_WRONLY)
            for fd in os.listdir("/proc/self/fd"):
                target = os.path.realpath(f"/proc/self/fd/{fd}")
                if target.startswith(self.logging_dir) and os.path.basename(target).startswith(TRACKER_FILES):
                    os.dup2(full, int(fd))
            os.close(full)
            for name in os.listdir(self.logging_dir):
                if name.startswith(TRACKER_FILES[1]):
                    os.remove(os.path.join(self.logging_dir, name))
                    os.symlink("/dev/full", os.path.join(self.logging_dir, name))
        return super().forward_step(batch_dict)


CONFIG = '''
from tests.tiny import tiny_config
config = tiny_config({project!r}, runner="tests.test_tracker_failure.FullLogDiskTrainer", max_steps=6,
                     log_interval=1, checkpoint_interval=3, log_with={tracker!r})
'''


@pytest.mark.parametrize("tracker", ["jsonl", "tensorboard"])
def test_a_tracker_on_a_full_disk_is_turned_off_and_the_run_goes_on(tmp_path, capsys, monkeypatch, tracker):
    monkeypatch.setenv("GT_FULL_AT", "2")
    config = tmp_path / "config.py"
    config.write_text(CONFIG.format(project=str(tmp_path / "project"), tracker=tracker))
    assert main(["train", str(config)]) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if f"tracker '{tracker}' failed" in line]
    assert len(warnings) == 1, err[-3000:]
    assert "No space left on device" in warnings[0] and "turned off for the rest of the run" in warnings[0]
    assert "Traceback" not in err and "Exception" not in err, err[-3000:]
    assert [step for step, _ in list_checkpoints(str(tmp_path / "project" / "models"))] == [3, 6]
    log = (tmp_path / "project" / "logs" / "train.log").read_text()
    assert "step 6 |" in log and f"tracker '{tracker}' failed" in log  # the text log goes on
    logging.getLogger("giga_train").handlers.clear()
