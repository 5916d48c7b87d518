"""Sequence parallelism and the N-D mesh (launch.parallelism_config) against one process: the same global
batch of 8 sequences of 15 tokens (15 divides by neither 2 nor 4: the last slice is padded and masked) under
SP=2, SP=4, SP=2 x FSDP2=2, SP=2 x DDP=2 and HSDP 2x2 (with and without SP) logs the same loss at every
step and lands on the same weights after 4 clipped AdamW steps (fp32: losses rtol 1e-5, weights rtol 1e-4,
the tolerance of the other strategies' parity tests). A checkpoint written at sp=2 x dp_shard=2 and at
HSDP 2x2 resumes at sp=1 on one process and at sp=2 on two ranks, to the same weights."""
import os
import shutil

import pytest

from giga_train import launch_from_config
from giga_train.checkpoint import list_checkpoints
from tests.distributed import assert_same_weights, final_weights
from tests.sp_models import read_losses
from tests.tiny import tiny_config

FSDP2 = dict(fsdp_version=2, fsdp_transformer_layer_cls_to_wrap="RopeBlock")
MESHES = {  # name: (distributed_type, ranks, parallelism_config)
    "NO": ("NO", 1, None),
    "sp2": ("DDP", 2, dict(sp_size=2)),
    "sp4": ("FSDP", 4, dict(sp_size=4)),
    "sp2xfsdp2": ("FSDP", 4, dict(dp_shard_size=2, sp_size=2)),
    "sp2xddp2": ("DDP", 4, dict(dp_replicate_size=2, sp_size=2)),
    "hsdp2x2": ("FSDP", 4, dict(dp_replicate_size=2, dp_shard_size=2)),
    "hsdp2xsp2": ("FSDP", 4, dict(dp_replicate_size=2, sp_size=2)),
    "sp2_ring": ("DDP", 2, dict(sp_size=2, sp_backend="ring")),
}
_RUNS = {}


def sp_job(project, mesh, max_steps=4, batch=8):
    distributed_type, ranks, block = MESHES[mesh]
    cfg = tiny_config(project, runner="tests.sp_models.LossFileTrainer", max_steps=max_steps, max_grad_norm=1.0,
                      checkpoint_interval=2, resume=True)
    cfg["models"] = dict(vocab_size=256, dim=16, layers=2, heads=4)
    cfg["dataloaders"]["train"]["data_or_config"].update(block_size=15, stride=15)
    data_ranks = ranks // ((block or {}).get("sp_size", 1))
    cfg["dataloaders"]["train"]["batch_size_per_gpu"] = batch // data_ranks
    cfg["launch"] = dict(distributed_type=distributed_type, num_processes=ranks, parallelism_config=block)
    if distributed_type == "FSDP":
        cfg["launch"]["fsdp_config"] = dict(FSDP2)
    return cfg


def run(tmp_path_factory, mesh):
    if mesh not in _RUNS:
        project = tmp_path_factory.mktemp(mesh)
        launch_from_config(sp_job(project, mesh))
        _RUNS[mesh] = project
    return _RUNS[mesh]


@pytest.mark.parametrize("mesh", ["sp2", "sp4", "sp2xfsdp2", "sp2xddp2", "hsdp2x2", "hsdp2xsp2"])
def test_the_mesh_trains_as_one_process(tmp_path_factory, mesh):
    reference, got = run(tmp_path_factory, "NO"), run(tmp_path_factory, mesh)
    assert read_losses(got) == pytest.approx(read_losses(reference), rel=1e-5)
    assert len(read_losses(got)) == 4
    assert_same_weights(final_weights(got), final_weights(reference))


@pytest.mark.parametrize("source,target", [("sp2xfsdp2", "NO"), ("hsdp2x2", "sp2")])
def test_a_checkpoint_resumes_on_another_mesh(tmp_path, tmp_path_factory, source, target):
    """Steps 1-2 on the source mesh, 3-4 on the target: the weights of one process's 4 steps."""
    reference = final_weights(run(tmp_path_factory, "NO"))
    checkpoints = dict(list_checkpoints(os.path.join(run(tmp_path_factory, source), "models")))
    shutil.copytree(checkpoints[2], tmp_path / "models" / os.path.basename(checkpoints[2]))
    launch_from_config(sp_job(tmp_path, target))
    assert list_checkpoints(str(tmp_path / "models"))[-1][0] == 4
    assert_same_weights(final_weights(tmp_path), reference)
