"""The giga_datasets data path, run under an interpreter that has giga_datasets: the reference venv's, with
this repository first on PYTHONPATH (tests/test_giga_datasets.py; our `giga_train` then shadows the
reference's, which `leaks()` checks). Prints one JSON document.

    python -c 'from tests.giga_datasets_job import main; main("streams", WORKDIR)'   # data paths, resumed or not
    python -c 'from tests.giga_datasets_job import main; main("ddp", WORKDIR)'       # our Trainer at 2 gloo ranks

(imported by name, never run as __main__: the workers import it as tests.giga_datasets_job)

The data set is written with giga_datasets' own writers (PklWriter, then Dataset(...).save: the layout
its bucket and aspect-ratio samplers read): two folders, given as a list (a ConcatDataset), each sample
carrying `bucket_index`, `bucket_info` (per-GPU batch size, bucket) and an image size."""
import itertools
import json
import os
import sys

import numpy as np
import torch

from giga_train import TRANSFORMS, Trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B = 2  # batch_size_per_gpu
STEPS = 14  # micro-batches per rank read in each case: past the end of the first epoch in every case
SAMPLERS = {  # name -> (dataloaders keys, micro-batches before the interruption)
    "default": (dict(sampler=dict(type="DefaultSampler", seed=5)), 5),
    "bucket": (dict(sampler=dict(type="BucketSampler", seed=5)), 4),
    "aspect_ratio": (dict(sampler=dict(type="AspectRatioSampler", aspect_ratios=[0.5, 1.0, 2.0], seed=5)), 6),
    "bucket_batch": (dict(batch_sampler=dict(type="BucketBatchSampler", seed=5)), 3),
    "bucket_batch_ordered": (dict(batch_sampler=dict(type="BucketBatchSampler", shuffle=False)), 3),
}


def write_data(folder):
    """Two giga_datasets `Dataset` folders (each over one PklDataset) of 13 and 11 samples."""
    from giga_datasets import Dataset, PklDataset, PklWriter
    paths = []
    for name, start, size in (("part_a", 0, 13), ("part_b", 13, 11)):
        writer = PklWriter(os.path.join(folder, name, "pkl"))
        for i in range(start, start + size):
            writer.write_dict(dict(index=i, x=np.full(3, i, dtype=np.float32), bucket_index=i % 3,
                                   bucket_info=(2 if i % 2 else 3, i % 3), image_height=[1, 2, 4][i % 3] * 8,
                                   image_width=8))
        writer.write_config()
        writer.close()
        Dataset([PklDataset.load(os.path.join(folder, name, "pkl"))]).save(os.path.join(folder, name))
        paths.append(os.path.join(folder, name))
    return paths


@TRANSFORMS.register
class Noisy:
    """A random transform: torch's and NumPy's global RNGs (seeded per sample in workers, saved in checkpoints)."""

    def __call__(self, sample):
        return dict(sample, noise=float(torch.rand(())), np_noise=float(np.random.rand()))


def loader_config(paths, name, workers=0):
    from giga_train.config import Config
    from giga_train.schema import LOADER
    cfg = Config({k: v.default for k, v in LOADER.items()})
    cfg.update(data_or_config=list(paths), filter=dict(mode="index", start=0, end=12), transform=dict(type="Noisy"),
               batch_size_per_gpu=B, num_workers=workers, **SAMPLERS[name][0])
    return cfg


def batch_record(batch):
    return dict(index=[int(i) for i in batch["index"]], noise=[round(float(v), 7) for v in batch["noise"]],
                np_noise=[round(float(v), 7) for v in batch["np_noise"]])


def our_stream(paths, name, rank, world_size, workers=0):
    from giga_train.data import DataStream
    torch.manual_seed(1)
    np.random.seed(1)
    return DataStream(loader_config(paths, name, workers), seed=11, rank=rank, world_size=world_size,
                      device=torch.device("cpu"))


def ours(paths, name, world_size, workers=0):
    """Per rank: the uninterrupted micro-batches, and those of a run stopped after `stop` and resumed in a
    fresh stream (the global RNGs as a checkpoint restores them)."""
    stop = SAMPLERS[name][1]
    out = []
    for rank in range(world_size):
        full = our_stream(paths, name, rank, world_size, workers)
        uninterrupted = [batch_record(next(full)) for _ in range(STEPS)]
        first = our_stream(paths, name, rank, world_size, workers)
        part = [batch_record(next(first)) for _ in range(stop)]
        state, rngs = first.state_dict(), (torch.get_rng_state(), np.random.get_state())
        resumed = our_stream(paths, name, rank, world_size, workers)
        torch.set_rng_state(rngs[0])
        np.random.set_state(rngs[1])
        resumed.load_state_dict(json.loads(json.dumps(state)))
        part += [batch_record(next(resumed)) for _ in range(STEPS - stop)]
        out.append(dict(uninterrupted=uninterrupted, resumed=part, epoch_length=len(full)))
    return out


def gigatrains(paths, name, world_size):
    """GigaTrain 1.1's Trainer.get_dataloaders (T:507-556) then Accelerate's prepare for each rank, with
    giga_datasets' own classes: the indices of each rank's micro-batches."""
    import giga_datasets
    from accelerate.data_loader import prepare_data_loader
    keys = SAMPLERS[name][0]
    out = []
    for rank in range(world_size):
        dataset = giga_datasets.load_dataset(list(paths))
        dataset.filter(mode="index", start=0, end=12)
        dataset.set_transform(None)
        batch_size = B * world_size
        if "batch_sampler" in keys:
            cfg = {k: v for k, v in keys["batch_sampler"].items() if k != "type"}
            batches = giga_datasets.BucketBatchSampler(dataset, batch_size_per_gpu=B, batch_size=batch_size, **cfg)
        else:
            cfg = {k: v for k, v in keys["sampler"].items() if k != "type"}
            sampler = getattr(giga_datasets, keys["sampler"]["type"])(dataset, batch_size=batch_size, **cfg)
            batches = torch.utils.data.BatchSampler(sampler, batch_size=B, drop_last=False)
        loader = torch.utils.data.DataLoader(dataset, batch_sampler=batches, collate_fn=giga_datasets.DefaultCollator())
        loader = prepare_data_loader(loader, device=torch.device("cpu"), num_processes=world_size, process_index=rank,
                                     split_batches=False, put_on_device=False,
                                     even_batches=getattr(batches, "batch_size", None) is not None)
        out.append([[int(i) for i in b["index"]] for b in itertools.islice(iter(loader), STEPS)])
    return out


def leaks():
    """Modules named giga_train* that are not this repository's (the reference's must not be imported)."""
    return sorted(m for m, mod in list(sys.modules.items())
                  if m.split(".")[0] == "giga_train" and not (getattr(mod, "__file__", None) or ROOT).startswith(ROOT))


def streams(work):
    paths = write_data(os.path.join(work, "data"))
    doc = dict(ours={}, gigatrain={}, workers={})
    for name in SAMPLERS:
        for world_size in (1, 2):
            doc["ours"][f"{name}/{world_size}"] = ours(paths, name, world_size)
            doc["gigatrain"][f"{name}/{world_size}"] = gigatrains(paths, name, world_size)
    doc["workers"] = {name: ours(paths, name, 1, workers=2) for name in ("bucket_batch", "default")}
    from giga_train import SAMPLERS as registry
    from giga_train.compat.giga_datasets import SAMPLER_NAMES
    doc["registered"] = {name: registry.get(name).__module__ for name in SAMPLER_NAMES + ("DefaultSampler",)}
    doc["leaks"] = leaks()
    return doc


# ----------------------------------------------------------------------------------------- the DDP job
class IndexTrainer(Trainer):
    """A linear model on `x`; each rank appends the indices of its micro-batches to batches_<rank>.jsonl."""

    def get_models(self, model_config):
        return torch.nn.Linear(3, 1)

    def forward_step(self, batch_dict):
        with open(os.path.join(self.project_dir, f"batches_{self.process_index}.jsonl"), "a") as f:
            f.write(json.dumps(dict(step=self.step + 1, index=[int(i) for i in batch_dict["index"]])) + "\n")
        x = batch_dict["x"].to(self.device)
        noise = torch.tensor(batch_dict["noise"], device=self.device)  # DefaultCollator keeps floats a list
        return (self.model(x).squeeze(1) - noise).pow(2).mean()


LAUNCH = dict(FSDP=dict(fsdp_config=dict(fsdp_version=2)))  # FSDP2 (FSDP1 is CUDA only)


def ddp(work, name="bucket_batch", strategy="DDP"):
    from giga_train import launch_from_config
    paths = write_data(os.path.join(work, "data"))
    project = os.path.join(work, "project")
    loader = {k: v for k, v in loader_config(paths, name).items() if v is not None}
    for max_steps, resume in ((3, False), (6, True)):
        launch_from_config(dict(
            runners=["tests.giga_datasets_job.IndexTrainer"], project_dir=project,
            launch=dict(distributed_type=strategy, num_processes=2, **LAUNCH.get(strategy, {})),
            dataloaders=dict(train=loader), models={},
            optimizers=dict(type="SGD", lr=1e-4), schedulers=dict(type="ConstantScheduler"),
            train=dict(max_steps=max_steps, resume=resume, checkpoint_interval=3, log_with="none", progress_bar=False,
                       seed=3)))
    seen = []
    for rank in range(2):
        with open(os.path.join(project, f"batches_{rank}.jsonl")) as f:
            seen.append([json.loads(line) for line in f])
    expected = [[r["index"] for r in ours(paths, name, 2)[rank]["uninterrupted"][:6]] for rank in range(2)]
    with open(os.path.join(project, "logs", "train.log")) as f:
        skip_lines = [line.split(" INFO ", 1)[-1].strip() for line in f if "cannot say where it is" in line]
    return dict(seen=seen, expected=expected, skip_lines=skip_lines, leaks=leaks())


def main(mode, work, *args):
    doc = streams(work) if mode == "streams" else ddp(work, *args)
    print("JSON:" + json.dumps(doc))
