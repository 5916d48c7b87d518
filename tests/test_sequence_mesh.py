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


# -- the Wan transformer (non-causal, 3-D RoPE) through the example's trainer -----------------------------
WAN_COMPOSED = dict(optimizers=dict(type="CAME8Bit", lr=1e-3, weight_decay=0.01, block_size=16, min_8bit_size=256,
                                    eps=(1e-8, 1e-16)),
                    train=dict(with_ema=True, activation_checkpointing=True,
                               activation_class_names=["WanTransformerBlock"]))


def wan_job(project, data, launch):
    from giga_train import load_config
    cfg = load_config("examples/wan/configs/tiny_cpu.py")
    cfg.project_dir, cfg.runners = str(project), ["tests.sp_wan.WanLossFileTrainer"]
    cfg.launch = dict(launch, num_processes=2 if launch["distributed_type"] != "NO" else 1)
    cfg.dataloaders.train.update(batch_size_per_gpu=4, data_or_config=dict(
        _class_name="WanLatentDataset", root=str(data), text_len=16))
    cfg.optimizers = WAN_COMPOSED["optimizers"]
    cfg.train.update(WAN_COMPOSED["train"], max_steps=4, gradient_accumulation_steps=1, checkpoint_interval=4,
                     log_with="none", progress_bar=False)
    return cfg


def test_wan_under_sp2_with_fsdp2_checkpointing_ema_and_came8bit_trains_as_one_process(tmp_path):
    """27 tokens per sample (3 x 3 x 3 patches: odd, padded on the second rank) over SP=2 under FSDP2 with
    activation checkpointing of the blocks, EMA and CAME8Bit, against one process: losses rtol 1e-5; weights
    and EMA weights within atol 1e-3 = lr, the most one update moves a weight: CAME8Bit's 8-bit state can
    round a last-bit difference of the summed gradients into the next code (measured: 1 element of 21,784 off
    by 1.6e-4 after 4 steps, every other within 5e-7; with AdamW all within 1e-6)."""
    pytest.importorskip("diffusers")
    from examples.wan.samples import write_synthetic_dataset
    write_synthetic_dataset(str(tmp_path / "data"), 8, (4, 3, 6, 6), (16, 32), seed=0)
    launch_from_config(wan_job(tmp_path / "no", tmp_path / "data", dict(distributed_type="NO")))
    launch_from_config(wan_job(tmp_path / "sp", tmp_path / "data", dict(
        distributed_type="FSDP", parallelism_config=dict(sp_size=2),
        fsdp_config=dict(fsdp_version=2, fsdp_transformer_layer_cls_to_wrap="WanTransformerBlock"))))
    assert read_losses(tmp_path / "sp") == pytest.approx(read_losses(tmp_path / "no"), rel=1e-5)
    assert_same_weights(final_weights(tmp_path / "sp"), final_weights(tmp_path / "no"), atol=1e-3)
    _, sp_folder = list_checkpoints(str(tmp_path / "sp" / "models"))[-1]
    _, no_folder = list_checkpoints(str(tmp_path / "no" / "models"))[-1]
    assert_same_weights(ema_weights(sp_folder), ema_weights(no_folder), atol=1e-3)


def ema_weights(folder):
    from safetensors.torch import load_file
    import glob
    files = sorted(glob.glob(os.path.join(folder, "*_ema", "*.safetensors")))
    assert files, f"no EMA weights in {folder}"
    return {k: v for f in files for k, v in load_file(f).items()}


def test_the_720p_config_checks_and_check_refuses_what_the_mesh_cannot_run(capsys):
    """`giga-train check` of examples/wan's 720p SP config at 8 ranks; one line per refusal."""
    from giga_train.cli import main as cli
    path, ranks = "examples/wan/configs/wan_5b_720p_sp.py", ["--set", "launch.gpu_ids=None"]
    assert cli(["check", path, *ranks, "--set", "launch.num_processes=8"]) == 0, capsys.readouterr().err
    refusals = {
        ("num_processes=10", "parallelism_config.sp_size=5"):
            "models.transformer.num_attention_heads=24: Ulysses sequence parallelism gives each of the sp_size=5",
        ("num_processes=6", "parallelism_config.sp_size=4"): "the sizes multiply to 8, which does not divide",
        ("num_processes=8", "distributed_type='DEEPSPEED'"): "DEEPSPEED does not take sp",
        ("num_processes=8", "parallelism_config.tp_size=2"): "tp_size=2: tensor parallelism is not built",
    }
    for sets, message in refusals.items():
        assert cli(["check", path, *ranks, *[a for s in sets for a in ("--set", f"launch.{s}")]]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
