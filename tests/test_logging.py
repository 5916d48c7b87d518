"""TensorBoard event files read back, the text log, and the end-of-run summary."""
import os

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from giga_train import launch_from_config
from tests.tiny import tiny_config


def test_tensorboard_scalars_and_text_log(tmp_path, capsys):
    cfg = tiny_config(tmp_path, max_steps=12, log_interval=4, log_with="tensorboard", max_grad_norm=1.0,
                      runner="tests.tiny.DictLossTrainer")
    trainer = launch_from_config(cfg)
    events = EventAccumulator(str(tmp_path / "logs"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert tags == {f"train/{n}" for n in ("total_loss", "lm", "aux", "lr", "grad_norm", "step_time", "samples_per_sec",
                                                      "nan_skipped", "peak_rss_gb")}
    assert [e.value for e in events.Scalars("train/nan_skipped")] == [0, 0, 0]  # the NaN guard's count
    assert [e.step for e in events.Scalars("train/total_loss")] == [4, 8, 12]
    lm = [e.value for e in events.Scalars("train/lm")]
    assert abs(lm[-1] - sum(trainer.losses[-4:]) / 4) < 1e-5  # the mean over the interval
    assert events.Scalars("train/samples_per_sec")[0].value > 0
    text = (tmp_path / "logs" / "train.log").read_text()
    assert "step 12 | aux" in text and "saved" in text and "done at step 12, final loss" in text
    err = capsys.readouterr().err
    assert str(tmp_path / "models" / "checkpoint_epoch_1_step_12") in err and "tensorboard --logdir" in err


def test_resumed_run_appends_to_the_same_logs(tmp_path):
    cfg = tiny_config(tmp_path, max_steps=8, log_interval=4, log_with="tensorboard", checkpoint_interval=4,
                      resume=True)
    launch_from_config(cfg)
    cfg["train"]["max_steps"] = 12
    launch_from_config(cfg)
    events = EventAccumulator(str(tmp_path / "logs"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/total_loss")] == [4, 8, 12]
    assert len([f for f in os.listdir(tmp_path / "logs") if f.startswith("events")]) == 2
    text = (tmp_path / "logs" / "train.log").read_text()
    assert text.count("starting from step 0") == 1, text  # said once, by the checkpoint manager
    # the epoch as the checkpoint folder names it (step 8 is in the first epoch of ~300 steps)
    assert f"resumed from {tmp_path / 'models' / 'checkpoint_epoch_1_step_8'} at step 8 (epoch 1)" in text
