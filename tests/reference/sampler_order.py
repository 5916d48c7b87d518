"""The sample indices each rank trains on, micro-batch by micro-batch, as a GigaTrain run draws them.

Under GigaTrain 1.1.0 (its own venv: `python tests/reference/sampler_order.py < cases.json`) this is
its Trainer's data path: giga_datasets' DefaultSampler(dataset, batch_size=global batch) -> torch
BatchSampler(batch_size_per_gpu) -> Accelerate's prepare_data_loader for each rank (round-robin
batches). Under ours, the same numbers come from giga_train.data.DataStream. A case: data_size,
batch_size_per_gpu, world_size, accumulation, micro_batches (per rank), sampler (config dict).
Prints {"version": ..., "batches": [[[indices of each micro-batch] per rank] per case]}."""
import json
import sys

CASES = [
    dict(data_size=50, batch_size_per_gpu=8, world_size=1, accumulation=1, micro_batches=20, sampler={}),
    dict(data_size=50, batch_size_per_gpu=4, world_size=2, accumulation=1, micro_batches=20, sampler={}),
    dict(data_size=37, batch_size_per_gpu=3, world_size=2, accumulation=2, micro_batches=30, sampler=dict(seed=3)),
    dict(data_size=10, batch_size_per_gpu=4, world_size=3, accumulation=1, micro_batches=9, sampler={}),
    dict(data_size=23, batch_size_per_gpu=5, world_size=1, accumulation=3, micro_batches=16,
         sampler=dict(shuffle=False)),
    dict(data_size=64, batch_size_per_gpu=8, world_size=4, accumulation=1, micro_batches=10, sampler={}),
]


class Indices:
    def __init__(self, size):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        return i


def reference_sampler_class():
    """giga_datasets' DefaultSampler; loaded from its file when the package's heavy imports fail."""
    try:
        from giga_datasets import DefaultSampler
        return DefaultSampler
    except ImportError:
        import importlib.util
        spec = importlib.util.find_spec("giga_datasets")
        path = spec.submodule_search_locations[0] + "/samplers/default_sampler.py"
        module_spec = importlib.util.spec_from_file_location("_gd_default_sampler", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        return module.DefaultSampler


def reference(case):
    import itertools

    import torch
    from accelerate.data_loader import prepare_data_loader

    DefaultSampler = reference_sampler_class()
    B, W, A = case["batch_size_per_gpu"], case["world_size"], case["accumulation"]
    out = []
    for rank in range(W):
        dataset = Indices(case["data_size"])
        sampler = DefaultSampler(dataset, batch_size=B * W * A, **case["sampler"])
        batch_sampler = torch.utils.data.BatchSampler(sampler, batch_size=B, drop_last=False)
        loader = torch.utils.data.DataLoader(dataset, batch_sampler=batch_sampler)
        loader = prepare_data_loader(loader, device=torch.device("cpu"), num_processes=W, process_index=rank,
                                     split_batches=False, put_on_device=False, even_batches=True)
        out.append([b.tolist() for b in itertools.islice(iter(loader), case["micro_batches"])])
    return out


def ours(case):
    import torch
    from giga_train.config import Config
    from giga_train.data import DataStream
    from giga_train.schema import LOADER

    B, W, A = case["batch_size_per_gpu"], case["world_size"], case["accumulation"]
    out = []
    for rank in range(W):
        cfg = Config({k: v.default for k, v in LOADER.items()})
        cfg.update(data_or_config=Indices(case["data_size"]), batch_size_per_gpu=B,
                   sampler=dict(type="DefaultSampler", **case["sampler"]))
        stream = DataStream(cfg, seed=42, rank=rank, world_size=W, device=torch.device("cpu"), accumulation=A)
        out.append([next(stream).tolist() for _ in range(case["micro_batches"])])
    return out


if __name__ == "__main__":
    text = sys.stdin.read() if not sys.stdin.isatty() else ""
    cases = json.loads(text) if text.strip() else CASES
    import giga_train
    run = reference if giga_train.__version__ == "1.1.0" else ours
    json.dump(dict(version=giga_train.__version__, batches=[run(c) for c in cases]), sys.stdout)
