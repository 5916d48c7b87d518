"""Checkpoints in GigaTrain's model layout: a folder per ModuleDict member that diffusers' and transformers'
`from_pretrained` read directly, `<name>_ema/` with EMA, GigaTrain's load_checkpoint / remove_checkpoint
semantics (keeps by epoch, optimizer state only in the two newest), the same folders from FSDP2 at 2 ranks
as from one process, and checkpoints of the layout before still resuming."""
import json
import os
import shutil

import pytest
import torch
from torch import nn

from giga_train import ModuleDict, launch_from_config
from giga_train.checkpoint import list_checkpoints, read_meta, read_weights, save_weights, verify
from tests.distributed import assert_same_weights
from tests.tiny import TinyTrainer, tiny_config

# diffusers and transformers are in the test extra; the model classes are at module level for the spawned ranks
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from transformers import LlamaConfig, LlamaForCausalLM

LLAMA = dict(vocab_size=256, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=2, max_position_embeddings=16, tie_word_embeddings=False)


class TinyDenoiser(ModelMixin, ConfigMixin):
    """A diffusers model: ConfigMixin's save_config writes the config.json GigaTrain writes."""

    @register_to_config
    def __init__(self, dim=16):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        return self.norm(self.proj(x))


class HubTrainer(TinyTrainer):
    """A ModuleDict of a diffusers model and a transformers model, trained together."""

    def get_models(self, model_config):
        self.losses = []
        return ModuleDict(denoiser=TinyDenoiser(16), lm=LlamaForCausalLM(LlamaConfig(**LLAMA)))

    def forward_step(self, batch_dict):
        tokens = batch_dict["tokens"]
        lm = self.model("lm", input_ids=tokens, labels=batch_dict["targets"]).loss
        noise = self.model("denoiser", tokens.float() / 256)
        self.losses.append(lm.item())
        return {"lm": lm, "denoise": noise.pow(2).mean()}


def hub_job(project, ranks=1, launch=None, **train):
    cfg = tiny_config(project, runner="tests.test_checkpoint_layout.HubTrainer",
                      **dict(dict(max_steps=3, checkpoint_interval=3, max_grad_norm=1.0), **train))
    cfg["dataloaders"]["train"]["batch_size_per_gpu"] = 8 // ranks
    cfg["launch"] = dict(distributed_type="NO" if ranks == 1 else "FSDP", num_processes=ranks, **(launch or {}))
    return cfg


def newest(project):
    return list_checkpoints(os.path.join(str(project), "models"))[-1][1]


def pretrained(folder):
    """Both members read back by their libraries' own from_pretrained, as one state dict."""
    state = {f"denoiser.{k}": v for k, v in TinyDenoiser.from_pretrained(os.path.join(folder, "denoiser")
                                                                          ).state_dict().items()}
    lm = LlamaForCausalLM.from_pretrained(os.path.join(folder, "lm"), dtype=torch.float32)
    return dict(state, **{f"lm.{k}": v for k, v in lm.state_dict().items()})


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    project = tmp_path_factory.mktemp("hub")
    trainer = launch_from_config(hub_job(project))
    return project, trainer


def test_member_folders_load_with_from_pretrained_and_equal_the_trained_weights(one_process):
    project, trainer = one_process
    folder = newest(project)
    assert sorted(os.listdir(os.path.join(folder, "denoiser"))) == ["config.json", "diffusion_pytorch_model.safetensors"]
    assert sorted(os.listdir(os.path.join(folder, "lm"))) == ["config.json", "model.safetensors"]
    assert json.load(open(os.path.join(folder, "denoiser", "config.json")))["_class_name"] == "TinyDenoiser"
    assert json.load(open(os.path.join(folder, "lm", "config.json")))["architectures"] == ["LlamaForCausalLM"]
    trained = {k: v.detach() for k, v in trainer.unwrapped_model.state_dict().items()}
    assert_same_weights(pretrained(folder), trained, rtol=0, atol=0)
    assert not os.path.exists(os.path.join(folder, "model.safetensors"))  # without EMA: the folders only


def test_load_checkpoint_reads_model_folders_into_the_model_of_their_class(one_process):
    project, trainer = one_process
    name = os.path.basename(newest(project))
    denoiser, lm = TinyDenoiser(16), LlamaForCausalLM(LlamaConfig(**LLAMA))
    trainer.load_checkpoint([f"{name}/lm", f"{name}/denoiser"], [denoiser, lm])  # GigaTrain's call form
    loaded = dict({f"denoiser.{k}": v for k, v in denoiser.state_dict().items()},
                  **{f"lm.{k}": v for k, v in lm.state_dict().items()})
    assert_same_weights(loaded, read_weights(newest(project)), rtol=0, atol=0)
    with pytest.raises(ValueError, match="holds a TinyDenoiser, and no model given is one"):
        trainer.load_checkpoint(f"{name}/denoiser", [lm])


SHARDED = {  # TinyDenoiser sharded on its own under FSDP2, which then names its class FSDPTinyDenoiser
    "FSDP2": ("FSDP", dict(fsdp_config=dict(fsdp_version=2, fsdp_transformer_layer_cls_to_wrap=[
        "LlamaDecoderLayer", "TinyDenoiser"]))),
    "ZeRO-3": ("DEEPSPEED", dict(deepspeed_config=dict(deepspeed_config_file="zero3.json"))),
}


@pytest.mark.parametrize("strategy", sorted(SHARDED))
def test_sharded_at_two_ranks_writes_the_folders_one_process_writes(one_process, tmp_path, strategy):
    """The whole weights gathered on rank 0 (FSDP2's full state dict, ZeRO-3's fp32 master weights) in the
    same folders, equal to one process's within fp32 tolerance; config.json names the module's own class."""
    distributed_type, launch = SHARDED[strategy]
    cfg = hub_job(tmp_path, ranks=2, launch=launch)
    cfg["launch"]["distributed_type"] = distributed_type
    launch_from_config(cfg)
    folder = newest(tmp_path)
    assert json.load(open(os.path.join(folder, "denoiser", "config.json")))["_class_name"] == "TinyDenoiser"
    assert_same_weights(pretrained(folder), pretrained(newest(one_process[0])))


def test_with_ema_the_member_folders_hold_the_average_and_the_root_the_live_weights(tmp_path):
    trainer = launch_from_config(hub_job(tmp_path, max_steps=2, with_ema=True, ema_decay=0.5))
    folder = newest(tmp_path)
    files = sorted(os.listdir(folder))
    assert {"denoiser_ema", "lm_ema", "ema_config.json", "model.safetensors"} <= set(files)
    assert "denoiser" not in files and "lm" not in files  # as GigaTrain: the member folders hold only EMA
    module = trainer.unwrapped_model
    averaged = {k: v for k, v in trainer.ema.state_dict(module).items()}
    got = dict({f"denoiser.{k}": v for k, v in TinyDenoiser.from_pretrained(
        os.path.join(folder, "denoiser_ema")).state_dict().items()},
        **{f"lm.{k}": v for k, v in LlamaForCausalLM.from_pretrained(
            os.path.join(folder, "lm_ema"), dtype=torch.float32).state_dict().items()})
    assert_same_weights(got, averaged, rtol=0, atol=0)
    assert_same_weights(read_weights(folder), {k: v.detach() for k, v in module.state_dict().items()}, rtol=0, atol=0)
    assert json.load(open(os.path.join(folder, "ema_config.json")))["optimization_step"] == 2


def test_keeps_by_epoch_optimizer_state_in_the_two_newest_and_remove_checkpoint(tmp_path):
    """GigaTrain's epochs_ema rules: by epochs checkpoint_keeps lists epochs; with
    checkpoint_save_optimizer=False the two newest rolling checkpoints (and the kept ones) keep the optimizer
    state; a stripped checkpoint still verifies and resumes (the optimizer afresh)."""
    cfg = tiny_config(tmp_path, max_epochs=2, checkpoint_interval=0.25, checkpoint_keeps=[1],
                      checkpoint_total_limit=3, checkpoint_save_optimizer=False)
    del cfg["train"]["max_steps"]
    cfg["dataloaders"]["train"]["data_or_config"]["max_bytes"] = 16 * 32  # 32 samples: 4 steps an epoch
    trainer = launch_from_config(cfg)
    found = dict(list_checkpoints(str(tmp_path / "models")))
    with_optimizer = {s for s, p in found.items() if os.path.isdir(os.path.join(p, "optimizer_dcp"))}
    assert sorted(found) == [1, 2, 3, 4, 6, 7, 8] and with_optimizer == {1, 2, 3, 4, 7, 8}
    assert verify(found[6]) is None and read_meta(found[6])["step"] == 6
    trainer.remove_checkpoint(total_limit=1)  # this run's rolling checkpoints: 8 only; epoch 1's are kept
    assert sorted(s for s, _ in list_checkpoints(str(tmp_path / "models"))) == [1, 2, 3, 4, 8]


def test_a_checkpoint_of_the_layout_before_still_resumes(tmp_path):
    """Checkpoints written before GigaTrain's layout (`model/model.safetensors`, no `layout` in meta.json)."""
    cfg = tiny_config(tmp_path / "a", max_steps=4, checkpoint_interval=2)
    launch_from_config(cfg)
    uninterrupted = read_weights(newest(tmp_path / "a"))
    path = list_checkpoints(str(tmp_path / "a" / "models"))[0][1]  # step 2, rewritten in the old layout
    old = read_weights(path)
    shutil.rmtree(os.path.join(path, "model"))
    save_weights(os.path.join(path, "model"), old)
    meta = read_meta(path)
    meta.pop("layout"), meta.pop("files")
    json.dump(meta, open(os.path.join(path, "meta.json"), "w"))
    resumed = launch_from_config(dict(cfg, train=dict(cfg["train"], resume=path)))
    assert resumed.step == 4
    assert_same_weights(read_weights(newest(tmp_path / "a")), uninterrupted, rtol=0, atol=0)
