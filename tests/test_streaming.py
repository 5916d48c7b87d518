"""Streaming data (an IterableDataset): sharded by rank and worker, resumed exactly when the dataset is
stateful, by reading the consumed batches again when it is not; in a training run at 1 and 2 ranks."""
import pytest
import torch

from giga_train import launch_from_config
from giga_train.config import Config
from giga_train.data import StreamingData, build_stream
from giga_train.schema import LOADER
from tests.distributed import assert_same_weights, final_weights

SIZE = 37  # not a multiple of anything: shards and last batches are uneven


def stream(kind="StatefulCountingStream", batch=3, workers=0, world_size=1, rank=0):
    cfg = Config({k: v.default for k, v in LOADER.items()})
    cfg.update(data_or_config=dict(_class_name=f"tests.streams.{kind}", size=SIZE), batch_size_per_gpu=batch,
               num_workers=workers)
    return build_stream(cfg, seed=7, rank=rank, world_size=world_size, device=torch.device("cpu"))


def take(s, n):
    return [next(s)["index"].tolist() for _ in range(n)]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["CountingStream", "StatefulCountingStream", "ShardedStatefulStream"])
def test_ranks_and_workers_cover_each_epoch_once(kind, workers):
    streams = [stream(kind, workers=workers, world_size=2, rank=r) for r in (0, 1)]
    assert isinstance(streams[0], StreamingData)
    seen = []
    for s in streams:
        while True:
            batch = next(s)["index"].tolist()
            if s.epoch == 1:  # the end of a shard shows when the next batch is drawn
                break
            seen += batch
    assert sorted(seen) == list(range(SIZE))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["CountingStream", "StatefulCountingStream", "ShardedStatefulStream"])
@pytest.mark.parametrize("stop", [5, 12, 13, 15])  # mid-epoch, shards ending, the epoch end, epoch 1
def test_resume_is_exact(kind, workers, stop):
    expected = take(stream(kind, workers=workers), 20)
    first = stream(kind, workers=workers)
    got = take(first, stop)
    state = first.state_dict()
    resumed = stream(kind, workers=workers)
    resumed.load_state_dict(state)
    got += take(resumed, 20 - stop)
    assert got == expected
    if kind != "CountingStream":  # a stateful dataset is positioned, not replayed
        assert state["streaming"]["positions"]


def test_stateful_resume_reads_nothing_twice():
    first = stream(workers=0)
    take(first, 4)
    resumed = stream(workers=0)
    resumed.load_state_dict(first.state_dict())
    next(resumed)
    assert resumed.dataset.position == 15  # 4 batches of 3 consumed, then one more: no replay


def test_another_worker_count_restarts_the_epoch(caplog):
    first = stream(workers=2)
    take(first, 4)
    resumed = stream(workers=0)
    resumed.load_state_dict(first.state_dict())
    assert resumed.batch_in_epoch == 0 and "starts again from its beginning" in caplog.text


def run(project, ranks, workers, max_steps, kind="StatefulCountingStream"):
    cfg = dict(runners=["tests.streams.StreamTrainer"], project_dir=str(project),
               launch=dict(distributed_type="DDP" if ranks > 1 else "NO", num_processes=ranks),
               dataloaders=dict(train=dict(data_or_config=dict(_class_name=f"tests.streams.{kind}", size=SIZE),
                                           batch_size_per_gpu=3, num_workers=workers)),
               models={}, optimizers=dict(type="SGD", lr=0.1), schedulers=dict(type="ConstantScheduler"),
               train=dict(max_steps=max_steps, checkpoint_interval=4, resume=True, log_with="none",
                          progress_bar=False))
    return launch_from_config(cfg)


def seen(project, rank):
    return (project / f"seen_{rank}.txt").read_text().split()


WHOLE = {}


@pytest.mark.parametrize("ranks,workers,kind", [(2, 0, "StatefulCountingStream"), (2, 2, "StatefulCountingStream"),
                                                (2, 2, "CountingStream")])
def test_training_resumes_the_stream_exactly(tmp_path, tmp_path_factory, ranks, workers, kind):
    """8 steps in one go == 4 steps, stop, 4 more (resumed from the checkpoint): the same samples on
    every rank, past an epoch's end (a rank's shard: 19 or 18 samples, 7 or 6 batches), the same weights.
    A dataset without state is replayed (and says so). (One process: the tests above.)"""
    if (ranks, workers) not in WHOLE:  # both datasets stream the same samples: one uninterrupted run serves
        WHOLE[ranks, workers] = tmp_path_factory.mktemp("whole")
        run(WHOLE[ranks, workers], ranks, workers, 8)
    whole, parts = WHOLE[ranks, workers], tmp_path / "parts"
    run(parts, ranks, workers, 4, kind)
    run(parts, ranks, workers, 8, kind)
    replayed = "reading the 4 consumed batches of epoch 0 again" in (parts / "logs" / "train.log").read_text()
    assert replayed == (kind == "CountingStream")
    for rank in range(ranks):
        assert seen(parts, rank) == seen(whole, rank)
    assert_same_weights(final_weights(parts), final_weights(whole), rtol=0, atol=0)


@pytest.mark.parametrize("command", ["check", "train"])
@pytest.mark.parametrize("extra, message", [
    (dict(train=dict(max_steps=None, max_epochs=2)), "train.max_epochs: dataloaders.train.data_or_config is an"
                                                     " IterableDataset"),
    (dict(sampler=dict(type="DefaultSampler")), "dataloaders.train.sampler: an IterableDataset orders"),
])
def test_check_and_train_refuse_what_streaming_cannot_have(tmp_path, capsys, command, extra, message):
    import json
    from giga_train.cli import main
    cfg = dict(runners=["tests.streams.StreamTrainer"], project_dir=str(tmp_path / "run"),
               dataloaders=dict(train=dict(data_or_config=dict(_class_name="tests.streams.CountingStream"),
                                           batch_size_per_gpu=3, sampler=extra.get("sampler"))),
               models={}, optimizers=dict(type="SGD", lr=0.1), schedulers=dict(type="ConstantScheduler"),
               train=dict(dict(max_steps=2, log_with="none"), **extra.get("train", {})))
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert main([command, str(path)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
