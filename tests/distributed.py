"""Shared by the strategy tests: the same tiny job as one process (batch B) and as 2 ranks (B/2 each)."""
import os

import torch

from giga_train import launch_from_config
from giga_train.checkpoint import list_checkpoints, read_weights
from tests.tiny import tiny_config

BATCH = 8


def job(project, distributed_type="NO", ranks=1, launch=None, **train):
    """fp32, no dropout: every strategy must land on the same weights as one process."""
    cfg = tiny_config(project, **dict(dict(max_steps=4, max_grad_norm=1.0, checkpoint_interval=2), **train))
    cfg["models"]["dropout"] = 0.0
    cfg["launch"] = dict(distributed_type=distributed_type, num_processes=ranks, **(launch or {}))
    cfg["dataloaders"]["train"]["batch_size_per_gpu"] = BATCH // ranks
    return cfg


def final_weights(project):
    _, path = list_checkpoints(os.path.join(str(project), "models"))[-1]
    return read_weights(path)


def assert_same_weights(got, expected, rtol=1e-4, atol=1e-6):
    assert got.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=rtol, atol=atol, msg=key)


def assert_equal_up_to_code_flips(got, expected, lr, share=0.01):
    """An 8-bit optimizer's runs whose ranks reduce in another order: a state value at a rounding tie of the
    8-bit map may take the neighbouring code (how often depends on the CPU's kernels: 0.2-0.5% of the elements
    on an AVX512 EPYC, none on other machines), which moves that weight by a fraction of an lr. Every weight
    within half an lr, and at most `share` of all the elements off by more than float rounding."""
    assert got.keys() == expected.keys()
    off = total = 0
    for key in expected:
        assert (got[key] - expected[key]).abs().max().item() <= 0.5 * lr, key
        off += int((~torch.isclose(got[key], expected[key], rtol=1e-5, atol=1e-6)).sum())
        total += expected[key].numel()
    assert off <= share * total, (off, total)


def reference(tmp_path_factory, cache, **train):
    """The one-process run for these train settings (computed once per module)."""
    key = repr(sorted(train.items()))
    if key not in cache:
        project = tmp_path_factory.mktemp("reference")
        launch_from_config(job(project, **train))
        cache[key] = final_weights(project)
    return cache[key]


_SHARED = {}


def shared_run(tmp_path_factory, distributed_type="NO", ranks=1, launch=None, **train):
    """(project folder, result) of job(...) with these arguments, run once per session: the test files that
    train the same job (the strategies' own tests, the cross-resume sources) share it."""
    cfg = job("", distributed_type, ranks, launch, **train)
    key = repr(cfg)
    if key not in _SHARED:
        project = tmp_path_factory.mktemp(f"shared_{distributed_type}_{ranks}")
        cfg["project_dir"] = str(project)
        _SHARED[key] = project, launch_from_config(cfg)
    return _SHARED[key]
