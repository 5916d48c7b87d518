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


def test_default_sampler_is_gigatrains():
    """GigaTrain's definition: epoch e = np.random.seed(seed + e) permutations, padded to a multiple of
    batch_size from the next permutation; infinite by default, each pass advancing the epoch."""
    import itertools

    import numpy as np
    rng = np.random.RandomState(6666)
    epoch0 = np.concatenate([rng.permutation(10), rng.permutation(10)[:2]]).tolist()
    rng = np.random.RandomState(6667)
    epoch1 = np.concatenate([rng.permutation(10), rng.permutation(10)[:2]]).tolist()
    before = np.random.get_state()[1].copy()
    s = DefaultSampler(CountingDataset(10), batch_size=4)
    assert len(s) == 12 and list(itertools.islice(iter(s), 24)) == epoch0 + epoch1
    assert s.epoch == 2 and (np.random.get_state()[1] == before).all()  # NumPy's global RNG untouched
    assert list(DefaultSampler(CountingDataset(5), shuffle=False, infinite=False)) == [0, 1, 2, 3, 4]


def test_rank_slices_and_resume_position():
    ranks = [DefaultSampler(CountingDataset(30), batch_size=12, infinite=False, rank=r, world_size=2,
                            batch_size_per_gpu=3) for r in (0, 1)]
    whole = DefaultSampler(CountingDataset(30), batch_size=12, infinite=False).epoch_order(0).tolist()
    got = [list(s) for s in ranks]
    assert len(got[0]) == len(ranks[0]) == 18  # 36 padded samples, half each
    for m in range(6):  # micro-batch m of rank r is batch m * 2 + r of the whole order
        for r in (0, 1):
            assert got[r][3 * m:3 * m + 3] == whole[(m * 2 + r) * 3:(m * 2 + r + 1) * 3]
    ranks[1].set_epoch(0, start_sample=12)
    assert len(ranks[1]) == 12 and list(ranks[1]) == got[1][6:]


def test_stream_pads_to_the_global_batch_of_a_step():
    """With gradient accumulation the epoch is padded to whole optimizer steps (GigaTrain's batch_size
    is batch_size_per_gpu * processes * accumulation)."""
    cfg = Config({k: v.default for k, v in LOADER.items()})
    cfg.update(data_or_config=dict(_class_name="CountingDataset", size=10), batch_size_per_gpu=2)
    s = DataStream(cfg, seed=7, rank=0, world_size=1, device=torch.device("cpu"), accumulation=3)
    assert len(s) == 6 and s.sampler.total_size == 12 and s.sampler.seed == 6666


def test_order_equals_gigatrains_data_path():
    from tests.ref_compare import compare_with_reference
    ref, ours = compare_with_reference("sampler_order.py")
    assert len(ref["batches"]) == len(ours["batches"]) == 6
    for i, (a, b) in enumerate(zip(ref["batches"], ours["batches"])):
        assert a == b, f"case {i} differs"


def test_parallel_batch_sampler():
    from giga_train import ParallelBatchSampler
    batches = torch.utils.data.BatchSampler(range(5), batch_size=2, drop_last=False)
    p = ParallelBatchSampler(batches, data_parallel_size=2)
    assert list(p) == [[0, 1], [0, 1], [2, 3], [2, 3], [4], [4]] and len(p) == 6 and p.batch_size == 2
