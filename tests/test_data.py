"""DefaultSampler's order, resumable position, and worker-independent random transforms."""
import torch

from giga_train import DefaultSampler
from giga_train.data import DataStream
from giga_train.config import Config
from giga_train.schema import LOADER
from tests.tiny import CountingDataset


def stream(batch, workers=0, world_size=1, rank=0, transform=None, size=50):
    cfg = Config({k: v.default for k, v in LOADER.items()})
    cfg.update(data_or_config=dict(_class_name="CountingDataset", size=size), batch_size_per_gpu=batch,
               num_workers=workers, transform=transform, sampler=dict(type="DefaultSampler", shuffle=True))
    return DataStream(cfg, seed=7, rank=rank, world_size=world_size, device=torch.device("cpu"))


def test_ranks_together_make_the_big_batch():
    one = stream(8)
    two = [stream(4, world_size=2, rank=r) for r in (0, 1)]
    for _ in range(15):  # past an epoch boundary (50 samples = 7 global batches of 8, the last wrapped)
        big = next(one)["index"]
        parts = torch.cat([next(s)["index"] for s in two])
        assert torch.equal(big, parts)
    assert one.epoch == 2 and one.batch_in_epoch == 1


def test_epochs_are_reshuffled_and_cover_the_data():
    s = DefaultSampler(CountingDataset(50), batch_size=8, shuffle=True, infinite=False, seed=1)
    first = list(s)
    s.set_epoch(1)
    second = list(s)
    assert sorted(set(first)) == list(range(50)) and len(first) == 56  # wrapped to whole batches
    assert first != second
    s = DefaultSampler(CountingDataset(50), batch_size=8, shuffle=False, infinite=False, drop_last=True)
    assert list(s) == list(range(48))


def test_position_resumes_mid_epoch():
    full = stream(4)
    seen = [next(full)["index"] for _ in range(20)]
    resumed = stream(4)
    part = [next(resumed)["index"] for _ in range(9)]
    state = resumed.state_dict()
    fresh = stream(4)
    fresh.load_state_dict(state)
    rest = [next(fresh)["index"] for _ in range(11)]
    assert all(torch.equal(a, b) for a, b in zip(seen, part + rest))
    assert state["samples_seen"] == 36


def test_random_transform_is_the_same_with_any_number_of_workers():
    noisy = dict(type="tests.test_data.AddNoise")
    outs = []
    for workers in (1, 2):
        s = stream(4, workers=workers, transform=noisy)
        outs.append(torch.cat([next(s)["noise"] for _ in range(6)]))
    assert torch.equal(outs[0], outs[1])
    assert outs[0].unique().numel() == outs[0].numel()  # and the samples do differ


class AddNoise:
    def __call__(self, sample):
        return dict(sample, noise=torch.rand(()))
