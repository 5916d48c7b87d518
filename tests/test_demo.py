"""The README's demo command, shortened: trains, says where things are, and resumes."""
import subprocess
import sys


def run(project, steps):
    return subprocess.run([sys.executable, "-m", "giga_train", "train", "examples/char_lm/configs/cpu.py",
                           "--set", f"project_dir={project}", "--set", f"train.max_steps={steps}",
                           "--set", "train.log_interval=2", "--set", "train.checkpoint_interval=4"],
                          capture_output=True, text=True, timeout=300)


def test_demo_trains_reports_and_resumes(tmp_path):
    first = run(tmp_path, 4)  # the demo's model and batch, a few steps
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"checkpoint: {tmp_path}/models/checkpoint_epoch_1_step_4" in first.stderr
    assert f"tensorboard --logdir {tmp_path}/logs" in first.stderr and "final loss" in first.stderr
    second = run(tmp_path, 6)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stderr and "step_4" in second.stderr
    assert "done at step 6" in second.stderr
