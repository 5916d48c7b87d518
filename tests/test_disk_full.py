"""A checkpoint that the disk cannot hold stops the run with one line and loses nothing: the previous
complete checkpoint stays the newest, and no half-written folder is left. The full disk is real: the
writing process runs under a file-size limit (RLIMIT_FSIZE), so its writes fail with EFBIG."""
import os
import subprocess
import sys

from giga_train import launch_from_config
from giga_train.checkpoint import list_checkpoints
from tests.tiny import tiny_config

LIMITED = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (32_000, 32_000))
from giga_train.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_full_disk_at_a_save_keeps_the_previous_checkpoint(tmp_path):
    cfg = tiny_config(tmp_path, max_steps=2, checkpoint_interval=2, resume=True, with_ema=False)
    launch_from_config(cfg)
    before = list_checkpoints(str(tmp_path / "models"))
    assert [s for s, _ in before] == [2]
    run = subprocess.run([sys.executable, "-c", LIMITED, "train", "tests/tiny_disk_full.py",
                          "--set", f"project_dir={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stderr[-2000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("giga-train: error: checkpoint at step 4: File too large writing"), last
    assert "nothing of it was kept, the newest complete checkpoint is" in last and before[0][1] in last
    assert list_checkpoints(str(tmp_path / "models")) == before
    assert not [n for n in os.listdir(tmp_path / "models") if n.startswith(".")]  # no half-written folder


def test_full_disk_in_the_optimizer_write_is_one_line_too(tmp_path):
    """The weights fit, torch.distributed.checkpoint's optimizer file does not: torch 2.13 wraps the
    error in a CheckpointException of (exception, traceback) pairs; still the one line, nothing left."""
    cfg = tiny_config(tmp_path, max_steps=2, checkpoint_interval=2, resume=True, with_ema=False)
    launch_from_config(cfg)
    before = list_checkpoints(str(tmp_path / "models"))
    model = os.path.getsize(os.path.join(before[0][1], "model", "diffusion_pytorch_model.safetensors"))
    optimizer = os.path.getsize(os.path.join(before[0][1], "optimizer_dcp", "__0_0.distcp"))
    limit = (model + optimizer) // 2
    assert model < limit < optimizer
    run = subprocess.run([sys.executable, "-c", LIMITED.replace("32_000", str(limit)), "train",
                          "tests/tiny_disk_full.py", "--set", f"project_dir={tmp_path}"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stderr[-2000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("giga-train: error: checkpoint at step 4: File too large writing"), last
    assert "nothing of it was kept" in last and before[0][1] in last, last
    assert list_checkpoints(str(tmp_path / "models")) == before
    assert not [n for n in os.listdir(tmp_path / "models") if n.startswith(".")]  # no .tmp_ left
