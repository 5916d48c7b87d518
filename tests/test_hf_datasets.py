"""Hugging Face `datasets` as data: a map-style Dataset (with the user's with_transform left as it is) and a
streaming IterableDataset train, and resume after a kill -9 with the losses of an uninterrupted run (the stream
also at 2 DDP ranks); a dataset returned by get_dataloaders; a DatasetDict in one line."""
import os
import subprocess
import sys

import pytest
import torch

from giga_train import launch_from_config
from giga_train.config import Config
from giga_train.errors import ConfigError
from giga_train.data import build_stream, open_dataset
from giga_train.schema import LOADER
from tests.distributed import assert_same_weights, final_weights
from tests.hf_data import hf_config, map_style, rows, streaming

datasets = pytest.importorskip("datasets")


@pytest.mark.parametrize("kind", ["map", "streaming"])
def test_killed_then_resumed_equals_uninterrupted(tmp_path, kind):
    """12 steps in one go == killed by SIGKILL in step 7 (checkpoint 4 on disk), then resumed to 12: the
    losses of steps 5..12 bit for bit, the same final weights."""
    whole = launch_from_config(hf_config(tmp_path / "whole", kind))
    assert len(whole.losses) == 12
    project = tmp_path / "killed"
    path = tmp_path / "cfg.py"
    path.write_text(f"from tests.hf_data import hf_config\nconfig = hf_config({str(project)!r}, {kind!r})\n")
    run = subprocess.run([sys.executable, "-m", "giga_train", "train", str(path)], env={**os.environ,
                         "GT_KILL": "step:7"}, capture_output=True, text=True, cwd=os.getcwd(), timeout=600)
    assert run.returncode == -9, run.stderr[-2000:]
    resumed = launch_from_config(hf_config(project, kind))
    assert resumed.losses == whole.losses[4:]
    assert_same_weights(final_weights(project), final_weights(tmp_path / "whole"), rtol=0, atol=0)
    if kind == "map":  # shuffled by our sampler: not the dataset's own order
        first = (tmp_path / "whole" / "losses_0.txt").read_text().splitlines()[0]
        assert first.split(" ", 2)[2] != "[0, 1, 2]"


def test_streaming_at_two_ranks_stopped_then_resumed_equals_uninterrupted(tmp_path):
    """DDP at 2 gloo ranks over a 3-shard stream (each rank every other example): 8 steps in one go == 4 steps,
    stop, then resumed to 8 (past the end of epoch 0: 7 batches a rank): every rank's losses and samples bit for
    bit, the same final weights."""
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    launch_from_config(hf_config(whole, "streaming", max_steps=8, ranks=2))
    launch_from_config(hf_config(parts, "streaming", max_steps=4, ranks=2))
    launch_from_config(hf_config(parts, "streaming", max_steps=8, ranks=2))
    per_rank = [(whole / f"losses_{rank}.txt").read_text().splitlines() for rank in (0, 1)]
    assert len(per_rank[0]) == 8 and per_rank[0][0] != per_rank[1][0]  # each rank its own examples
    for rank in (0, 1):
        assert (parts / f"losses_{rank}.txt").read_text().splitlines() == per_rank[rank]
    assert_same_weights(final_weights(parts), final_weights(whole), rtol=0, atol=0)


def stream(workers, rank=0, world_size=1, num_shards=3):
    cfg = Config({k: v.default for k, v in LOADER.items()})
    cfg.update(data_or_config=streaming(num_shards), batch_size_per_gpu=3, num_workers=workers)
    return build_stream(cfg, seed=7, rank=rank, world_size=world_size, device=torch.device("cpu"))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("num_shards", [3, 4])  # 3: every N-th example of the stream; 4: whole shards
def test_streaming_ranks_and_workers_cover_each_epoch_once(workers, num_shards):
    seen = []
    for rank in (0, 1):
        s = stream(workers, rank, 2, num_shards)
        while True:
            batch = next(s)["index"].tolist()
            if s.epoch == 1:
                break
            seen += batch
    assert sorted(seen) == list(range(40))


def test_streaming_resume_with_workers_is_exact():
    """2 DataLoader workers, each its half of the stream: positioned by datasets' own state_dict."""
    expected = [next(s)["index"].tolist() for s in [stream(2)] for _ in range(16)]
    assert sorted(sum(expected[:14], [])) == list(range(40))  # epoch 0: 7 batches a worker, every row once
    first = stream(2)
    got = [next(first)["index"].tolist() for _ in range(5)]
    resumed = stream(2)
    resumed.load_state_dict(first.state_dict())
    got += [next(resumed)["index"].tolist() for _ in range(11)]
    assert got == expected


def test_the_users_transform_stays_and_the_configs_applies_per_sample():
    cfg = Config(dict(data_or_config=map_style()))
    dataset, transform, _ = open_dataset(cfg, None, "dataloaders.train")
    assert isinstance(dataset[0]["x"], torch.Tensor)  # with_transform(to_tensors) still there
    double = lambda sample: {**sample, "y": sample["y"] * 2}  # noqa: E731
    dataset, transform, _ = open_dataset(cfg, double, "dataloaders.train")
    assert transform is double and isinstance(dataset[0]["x"], torch.Tensor)


@pytest.mark.parametrize("kind", ["map", "streaming"])
def test_get_dataloaders_returning_the_dataset_reads_it_as_data_or_config(tmp_path, kind):
    """A datasets.Dataset / IterableDataset returned by get_dataloaders (no data_or_config in the section) is
    read with the section's batch size and sampler: the losses of the same dataset given as data_or_config."""
    given = launch_from_config(hf_config(tmp_path / "given", kind, max_steps=5))
    cfg = hf_config(tmp_path / "returned", kind, max_steps=5, data_kind=kind)
    del cfg["dataloaders"]["train"]["data_or_config"]
    cfg["runners"] = ["tests.hf_data.ReturnsTheDataset"]
    assert launch_from_config(cfg).losses == given.losses


def test_a_dataset_dict_is_one_line(tmp_path):
    cfg = hf_config(tmp_path / "run", "map", max_steps=2, data_kind="splits")
    cfg["runners"] = ["tests.hf_data.ReturnsTheDataset"]
    with pytest.raises(ConfigError, match=r"get_dataloaders: a DatasetDict of splits \['train', 'test'\]: give one"
                                          r" split, e.g. dataset\['train'\]"):
        launch_from_config(cfg)
    cfg["runners"] = ["tests.hf_data.HFTrainer"]
    cfg["dataloaders"]["train"]["data_or_config"] = datasets.DatasetDict(train=map_style())
    with pytest.raises(ConfigError, match=r"dataloaders.train.data_or_config: a DatasetDict of splits \['train'\]"):
        launch_from_config(cfg)


def test_a_dataset_of_python_lists_without_a_format_is_said_once(caplog):
    """datasets without a format hand Python lists, which default_collate transposes: one warning naming the
    columns; a format (with_format, with_transform) is the user's and says nothing."""
    plain = datasets.Dataset.from_dict(rows())
    for data, said in ((plain, True), (plain.with_format("torch"), False), (map_style(), False)):
        caplog.clear()
        open_dataset(Config(dict(data_or_config=data)), None, "dataloaders.train")
        lines = [r.getMessage() for r in caplog.records if "without a format" in r.getMessage()]
        assert lines == ([("dataloaders.train.data_or_config: a datasets.Dataset without a format: its column(s) 'x'"
                           " hold Python lists, which torch's default_collate makes into a list of tensors per"
                           " position; set .with_format('torch') (or a with_transform), or give a collate_fn")]
                         if said else [])
