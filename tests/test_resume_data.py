"""Data at resume: epochs continue from the samples already seen when the global batch changed, and a
dataset that shrank below the saved position starts its next epoch with one warning line."""
from giga_train import launch_from_config
from giga_train.checkpoint import list_checkpoints
from tests.tiny import tiny_config


def log(project):
    return (project / "logs" / "train.log").read_text().splitlines()


def small(project, **train):
    cfg = tiny_config(project, resume=True, log_interval=100, **train)
    cfg["dataloaders"]["train"]["data_or_config"]["max_bytes"] = 2064  # 122 samples
    return cfg


def test_max_epochs_after_a_batch_change_counts_the_samples_seen(tmp_path):
    """12 steps of 8 samples, then batch 16 with max_epochs=2: 10 more steps make 2 epochs of 122 samples
    (8 batches of 16 each), the epoch checkpoint lands at the end of epoch 1 of the data, names match."""
    cfg = small(tmp_path, max_steps=12)
    launch_from_config(cfg)
    cfg["train"] = dict(cfg["train"], max_steps=None, max_epochs=2)
    cfg["dataloaders"]["train"]["batch_size_per_gpu"] = 16
    trainer = launch_from_config(cfg)
    assert trainer.step == 22 and (trainer.epoch, trainer._stream.batch_in_epoch) == (2, 0)
    assert trainer._stream.samples_seen == 12 * 8 + 10 * 16
    names = [path.rsplit("/", 1)[1] for _, path in list_checkpoints(str(tmp_path / "models"))]
    assert names[-2:] == ["checkpoint_epoch_1_step_14", "checkpoint_epoch_2_step_22"]
    line = [line for line in log(tmp_path) if "resume: global batch" in line]
    assert len(line) == 1 and "global batch 8 -> 16 samples; step 12 stands at epoch 0.75 of the data" in line[0]
    assert "(train.max_epochs=2: until step 22)" in line[0]
    cfg["train"]["max_epochs"] = 3  # the offset is kept by the next resume (same batch)
    assert launch_from_config(cfg).step == 30


def test_a_dataset_smaller_than_the_saved_position_starts_the_next_epoch(tmp_path):
    cfg = small(tmp_path, max_steps=12)
    launch_from_config(cfg)
    cfg["train"]["max_steps"] = 14
    cfg["dataloaders"]["train"]["data_or_config"]["max_bytes"] = 1040  # 58 samples: 8 batches, saved at 12
    trainer = launch_from_config(cfg)
    assert trainer.step == 14 and (trainer.epoch, trainer._stream.batch_in_epoch) == (1, 2)
    assert [line.split(" WARNING ")[1] for line in log(tmp_path) if "smaller than when saved" in line] == [
        f"resume: the dataset has {len(trainer._stream)} batches an epoch now, and epoch 0 was saved at batch 12"
        " (it is smaller than when saved); epoch 1 starts"]


def test_a_stateless_stream_that_shrank_starts_its_next_epoch(tmp_path):
    """A streaming dataset without state replays the consumed batches of its epoch at a resume; one that
    shrank below them (37 -> 10 samples, 10 batches of 3 consumed) starts its next epoch, one warning line."""
    import torch
    from giga_train.config import Config
    from giga_train.data import build_stream
    from giga_train.schema import LOADER

    def stream(size):
        cfg = Config({k: v.default for k, v in LOADER.items()})
        cfg.update(data_or_config=dict(_class_name="tests.streams.CountingStream", size=size), batch_size_per_gpu=3)
        return build_stream(cfg, seed=7, rank=0, world_size=1, device=torch.device("cpu"))
    saved = stream(37)
    for _ in range(10):
        next(saved)
    small = stream(10)
    small.load_state_dict(saved.state_dict())
    first = next(small)["index"].tolist()
    expected = stream(10)
    expected.epoch = 1
    expected.load_state_dict(dict(expected.state_dict(), epoch=1))
    assert small.epoch == 1 and first == next(expected)["index"].tolist()
