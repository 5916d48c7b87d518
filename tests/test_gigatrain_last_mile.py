"""What a GigaTrain project meets on giga-train, made GigaTrain's: its TensorBoard tags (train.log_tags=
'gigatrain'), its Trainer attributes (self.mixed_precision as the config gives it), the step its NaN limit
stops at, and the line for a LeRobot dataset without lerobot."""
import os

import pytest

from giga_train import launch_from_config
from giga_train.errors import ConfigError, TrainingStopped
from giga_train.schema.classes import check_data
from tests.tiny import TinyTrainer, tiny_config


def scalar_tags(logging_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    tags = set()
    for root, _, files in os.walk(logging_dir):
        if any(f.startswith("events.out.tfevents") for f in files):
            acc = EventAccumulator(root)
            acc.Reload()
            tags |= set(acc.Tags()["scalars"])
    return tags


@pytest.mark.parametrize("log_tags, expected", [("gigatrain", "total_loss"), ("grouped", "train/total_loss")])
def test_log_tags(tmp_path, log_tags, expected):
    trainer = launch_from_config(tiny_config(tmp_path, max_steps=2, log_interval=1, log_with="tensorboard",
                                             log_tags=log_tags))
    tags = scalar_tags(trainer.logging_dir)
    assert expected in tags and ("train/total_loss" in tags) == (log_tags == "grouped")


def test_gigatrain_trainer_attributes(tmp_path):
    trainer = launch_from_config(tiny_config(tmp_path, max_steps=1, log_interval=3, with_ema=True, seed=11,
                                             checkpoint_interval=1, checkpoint_total_limit=4))
    assert (trainer.log_interval, trainer.with_ema, trainer.seed, trainer.checkpoint_total_limit) == (3, True, 11, 4)
    assert trainer.checkpoint_strict is True and trainer.activation_checkpointing is False
    trainer.log_interval = 7  # GigaTrain's are plain attributes: a project may set one
    assert trainer.log_interval == 7


def test_mixed_precision_attribute_is_the_configs_value_and_no_trains_as_unset(tmp_path):
    """GigaTrain's Trainer keeps its mixed_precision argument: None when the config leaves it unset or None,
    'no' when it says 'no' (checked on GigaTrain 1.1.0: None -> None, 'no' -> 'no'; dtype float32 for both).
    Under 'no' the run is the unset run: the same losses to the bit."""
    runs = {}
    for name, given in (("unset", {}), ("none", dict(mixed_precision=None)), ("no", dict(mixed_precision="no"))):
        trainer = launch_from_config(tiny_config(tmp_path / name, max_steps=2, **given))
        runs[name] = (trainer.mixed_precision, str(trainer.dtype), trainer.losses)
    assert runs["unset"][:2] == runs["none"][:2] == (None, "torch.float32")
    assert runs["no"][:2] == ("no", "torch.float32")
    assert runs["no"][2] == runs["unset"][2] == runs["none"][2] and len(runs["no"][2]) == 2


class NanTrainer(TinyTrainer):
    def forward_step(self, batch_dict):
        self.losses.append(self.cur_step)
        return self.model(batch_dict["tokens"], batch_dict["targets"]) * float("nan")


def test_loss_nan_total_limit_stops_where_gigatrains_does(tmp_path):
    """GigaTrain 1.1 with loss_nan_total_limit=2 runs forward steps 1, 2, 3 and exits in the third (its
    count > limit); ours skips steps 1-3 and stops after the third."""
    cfg = tiny_config(tmp_path, runner="tests.test_gigatrain_last_mile.NanTrainer", max_steps=8,
                      loss_nan_total_limit=2)
    with pytest.raises(TrainingStopped, match="step 3: .* 3 steps in a row"):
        launch_from_config(cfg)


def test_lerobot_dataset_without_lerobot_names_the_package():
    with pytest.raises(ConfigError, match="registered only when the lerobot package imports.*pip install lerobot"):
        check_data("dataloaders.train.data_or_config", dict(_class_name="LeRobotDataset", repo_id="x"))
