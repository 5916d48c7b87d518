"""GigaTrain's data path through giga_datasets (issue 16, items 1 and 4): folders and lists loaded by its
load_dataset, filter, set_transform, DefaultCollator, its samplers; exact resume on them; the same samples
per step as GigaTrain 1.1.

giga_datasets cannot be imported beside our CPU torch (its torchvision import: README, "giga_datasets"),
so the tests that need it run our package in a subprocess under the reference venv's Python (torch
2.14.1 CUDA build + torchvision 0.29.1, run on the CPU) with this repository first on PYTHONPATH: our
`giga_train` shadows the reference's there, which each job checks (`leaks`). The jobs are in
tests/giga_datasets_job.py. The rest (a missing package, bad input) runs here."""
import json
import os
import subprocess
import sys

import pytest
import torch

from giga_train.config import Config
from giga_train.data import DataStream
from giga_train.errors import ConfigError
from giga_train.schema import LOADER
from tests.ref_compare import reference_python
from tests.reference import harness
from tests.tiny import CountingDataset  # noqa: F401  (registers it in DATASETS)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def job(mode, work, *args):
    """tests/giga_datasets_job.py's JSON for `mode`, run under the reference venv's Python with our package."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PYTHONPATH=ROOT, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    os.makedirs(work, exist_ok=True)
    call = ", ".join(repr(a) for a in (mode, str(work), *args))
    proc = subprocess.run([reference_python(), "-c", f"from tests.giga_datasets_job import main; main({call})"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("JSON:")), None)
    assert proc.returncode == 0 and line, f"{mode} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    doc = json.loads(line[len("JSON:"):])
    assert doc["leaks"] == [], f"the reference's giga_train was imported: {doc['leaks']}"
    return doc


def record(scenario, work):
    """A recorded-client scenario run by ours under the reference venv's Python."""
    return harness.record(scenario, work, python=reference_python(), allow_failure=True, giga_train_path=ROOT)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every subprocess of this module, started at once in two queues (they mostly import; the two
    2-rank launches in one queue, never side by side): {name: future of its JSON}."""
    from concurrent.futures import Future, ThreadPoolExecutor
    work = tmp_path_factory.mktemp("giga-datasets")
    queues = [[("DDP", job, "ddp", work / "ddp", "bucket_batch", "DDP"),
               ("FSDP", job, "ddp", work / "fsdp", "bucket", "FSDP")],
              [("streams", job, "streams", work / "streams"), ("disk", record, "disk", work),
               ("disk_bucket", record, "disk_bucket", work)]]
    futures = {entry[0]: Future() for queue in queues for entry in queue}

    def drain(queue):
        for name, fn, *args in queue:
            try:
                futures[name].set_result(fn(*args))
            except BaseException as e:  # the test that reads it fails with it
                futures[name].set_exception(e)

    with ThreadPoolExecutor(max_workers=2) as pool:
        for queue in queues:
            pool.submit(drain, queue)
        yield futures


@pytest.fixture(scope="module")
def streams(runs):
    return runs["streams"].result()


def indices(batches):
    return [b["index"] for b in batches]


EXACT = ["default", "bucket", "aspect_ratio", "bucket_batch_ordered"]


@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("name", EXACT)
def test_samples_per_micro_batch_are_gigatrains(streams, name, world_size):
    """Each rank's micro-batches, past the first epoch, equal GigaTrain's data path (its get_dataloaders,
    then Accelerate's prepare for that rank) on the same giga_datasets folders."""
    ours, gigatrain = streams["ours"][f"{name}/{world_size}"], streams["gigatrain"][f"{name}/{world_size}"]
    for rank in range(world_size):
        assert indices(ours[rank]["uninterrupted"]) == gigatrain[rank], (name, rank)
        assert len(gigatrain[rank]) > ours[rank]["epoch_length"]  # the second epoch is compared too


def test_giga_datasets_samplers_are_in_SAMPLERS(streams):
    registered = streams["registered"]
    assert registered.pop("DefaultSampler") == "giga_train.data.samplers"  # ours: GigaTrain's order, positioned
    assert len(registered) == 7 and all(module.startswith("giga_datasets.samplers.") for module in registered.values())


def test_shuffled_bucket_batches_are_gigatrains_in_another_order(streams):
    """The stated difference: BucketBatchSampler shuffles its batches with Python's global `random`, which it
    never seeds, so GigaTrain's order depends on the process's RNG history. Ours draws each epoch with it
    seeded from (sampler seed, epoch): the same batches (GigaTrain's, sizes 2 and 3 here), in an order that
    is the same on every rank and after a resume."""
    for world_size in (1, 2):
        key = f"bucket_batch/{world_size}"
        ours, gigatrain = streams["ours"][key], streams["gigatrain"][key]
        length = ours[0]["epoch_length"]
        mine = sorted(tuple(b) for rank in range(world_size) for b in indices(ours[rank]["uninterrupted"])[:length])
        theirs = sorted(tuple(b) for rank in range(world_size) for b in gigatrain[rank][:length])
        assert mine == theirs and {len(b) for b in mine} == {2, 3}


@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("name", EXACT + ["bucket_batch"])
def test_resume_mid_epoch_is_exact(streams, name, world_size):
    """Stopped mid-epoch, resumed in a fresh stream: the rest of the run (into the next epoch) is the
    uninterrupted run's, samples and the random transform's values alike (torch and NumPy)."""
    for rank, run in enumerate(streams["ours"][f"{name}/{world_size}"]):
        assert run["resumed"] == run["uninterrupted"], (name, rank)


@pytest.mark.parametrize("name", ["bucket_batch", "default"])
def test_resume_with_workers_keeps_their_randomness(streams, name):
    run = streams["workers"][name][0]
    assert run["resumed"] == run["uninterrupted"]
    noise = [v for b in run["uninterrupted"] for v in b["noise"]]
    assert len(set(noise)) > len(noise) // 2  # random indeed (repeats: samples padded into an epoch twice)


@pytest.mark.parametrize("strategy,name,sampler", [("DDP", "bucket_batch", "BucketBatchSampler"),
                                                   ("FSDP", "bucket", "BucketSampler")])
def test_two_ranks_stopped_and_resumed(runs, strategy, name, sampler):
    """Our Trainer at 2 gloo ranks (DDP; FSDP2), with BucketBatchSampler (per-GPU batches of 2 and 3) or
    BucketSampler: 3 steps, then a relaunch resumes to 6; each rank's micro-batches are those of an
    uninterrupted stream of that rank, and the resume says in the log that it skipped by index."""
    doc = runs[strategy].result()
    for rank in range(2):
        assert [r["step"] for r in doc["seen"][rank]] == [1, 2, 3, 4, 5, 6]
        assert [r["index"] for r in doc["seen"][rank]] == doc["expected"][rank]
    sizes = {len(r["index"]) for rank in range(2) for r in doc["seen"][rank]}
    assert sizes == ({2, 3} if name == "bucket_batch" else {2})
    assert doc["skip_lines"] == [f"resume: {sampler} cannot say where it is; epoch 0's order is drawn again and its"
                                 " first 3 batches skipped (their indices only, as GigaTrain skips consumed batches)"]


@pytest.mark.parametrize("scenario,steps", [("disk", 6), ("disk_bucket", 9)])
def test_disk_scenarios_steps_equal_gigatrains(runs, scenario, steps):
    """The recorded client's `disk` scenario (two PklDataset folders as a list, filter, a TRANSFORMS
    transform, collator, the sampler's own seed) and `disk_bucket` (BucketSampler over two giga_datasets
    `Dataset` folders, into the second epoch), run by GigaTrain 1.1 (its recordings in
    tests/reference/snapshots, which tests/test_reference_sanity.py checks against a live run) and by
    ours: the same samples per step, the same lr, losses within 1e-5 (torch builds differ)."""
    with open(os.path.join(ROOT, "tests", "reference", "snapshots", f"{scenario}.json")) as f:
        reference = json.load(f)
    ours = runs[scenario].result()
    assert ours["implementation"]["giga_train"] != "1.1.0" and reference["implementation"]["giga_train"] == "1.1.0"
    ref_run, our_run = (harness.trainer_run(doc, 0) for doc in (reference, ours))
    assert [[m["indices"] for m in s["micro_batches"]] for s in our_run["steps"]] == \
        [[m["indices"] for m in s["micro_batches"]] for s in ref_run["steps"]]
    assert [s["lr"] for s in our_run["steps"]] == [s["lr"] for s in ref_run["steps"]]
    expected = [[m["total_loss"] for m in s["micro_batches"]] for s in ref_run["steps"]]
    actual = [[m["total_loss"] for m in s["micro_batches"]] for s in our_run["steps"]]
    assert len(expected) == steps and not harness.diff(expected, actual, rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------------- here, in our venv
def loader(**keys):
    cfg = Config({k: v.default for k, v in LOADER.items()})
    cfg.update(batch_size_per_gpu=2, **keys)
    return cfg


def stream(cfg):
    return DataStream(cfg, seed=1, rank=0, world_size=1, device=torch.device("cpu"))


def without_giga_datasets(monkeypatch):
    monkeypatch.setitem(sys.modules, "giga_datasets", None)  # `import giga_datasets` raises ImportError


def test_a_folder_without_the_package_is_one_line(tmp_path, monkeypatch):
    without_giga_datasets(monkeypatch)
    with pytest.raises(ConfigError, match=r"^dataloaders.train.data_or_config: needs the giga-datasets package") as e:
        stream(loader(data_or_config=str(tmp_path)))
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"^dataloaders.train.data_or_config\[1\]: needs the giga-datasets"):
        stream(loader(data_or_config=[dict(_class_name="CountingDataset", size=4), str(tmp_path)]))


def test_a_giga_datasets_sampler_without_the_package_is_one_line(tmp_path, monkeypatch):
    from giga_train import load_config
    from giga_train.launch.runners import validated_runners
    from tests.tiny import tiny_config
    without_giga_datasets(monkeypatch)
    cfg = tiny_config(tmp_path / "run")
    cfg["dataloaders"]["train"]["sampler"] = dict(type="BucketSampler")
    with pytest.raises(ConfigError, match=r"^dataloaders.train.sampler: needs the giga-datasets package"):
        validated_runners(load_config(cfg))


def test_a_list_of_our_datasets_without_the_package_is_concatenated(monkeypatch):
    without_giga_datasets(monkeypatch)
    s = stream(loader(data_or_config=[dict(_class_name="CountingDataset", size=3)] * 2,
                      sampler=dict(type="DefaultSampler", shuffle=False)))
    assert [next(s)["index"].tolist() for _ in range(3)] == [[0, 1], [2, 0], [1, 2]]


def test_filter_on_a_dataset_without_one_names_it(monkeypatch):
    without_giga_datasets(monkeypatch)
    with pytest.raises(ConfigError, match=r"^dataloaders.train.filter: CountingDataset has no filter method"):
        stream(loader(data_or_config=dict(_class_name="CountingDataset", size=4), filter=dict(mode="index", end=2)))


def test_a_missing_folder_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"^dataloaders.train.data_or_config: no dataset folder .*nowhere'$"):
        stream(loader(data_or_config=str(tmp_path / "nowhere")))


def test_data_parallel_size_repeats_each_batch_as_gigatrains_parallel_batch_sampler():
    """GigaTrain wraps the batch sampler in ParallelBatchSampler, then Accelerate deals its batches to the
    ranks round-robin: each batch twice in a row at one rank, each batch at both of two ranks."""
    from giga_train import DefaultSampler, ParallelBatchSampler
    cfg = loader(data_or_config=dict(_class_name="CountingDataset", size=10), sampler=dict(type="DefaultSampler"))
    for world_size in (1, 2):
        order = DefaultSampler(CountingDataset(10), batch_size=2 * world_size).epoch_order(0).tolist()
        expected = list(ParallelBatchSampler(torch.utils.data.BatchSampler(order, 2, False), data_parallel_size=2))
        ranks = [DataStream(cfg, seed=1, rank=r, world_size=world_size, device=torch.device("cpu"),
                            data_parallel_size=2) for r in range(world_size)]
        assert all(len(s) == len(expected) // world_size for s in ranks)
        got = [[next(s)["index"].tolist() for _ in range(len(s))] for s in ranks]
        assert got == [expected[r::world_size] for r in range(world_size)]
