"""giga-train export --to hf: a checkpoint's model opened by from_pretrained of transformers, diffusers and
peft, with the weights and outputs of the run that wrote it (exactly; the merged LoRA model within fp32
rounding). Tiny Llama / diffusers / LoRA models trained two steps on CPU."""
import json
import os

import pytest
import torch
from torch import nn

from giga_train import ModuleDict, Trainer, launch_from_config
from giga_train.checkpoint import list_checkpoints
from giga_train.cli import main
from tests.tiny import tiny_config

transformers = pytest.importorskip("transformers")
diffusers = pytest.importorskip("diffusers")

LLAMA = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)


def llama(model_config):
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**model_config))


class Denoiser(diffusers.ModelMixin, diffusers.ConfigMixin):
    """A diffusers model as GigaTrain projects write them (ModelMixin + register_to_config)."""

    @diffusers.configuration_utils.register_to_config
    def __init__(self, dim=32):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, x):
        return self.net(x)


class LlamaTrainer(Trainer):
    def get_models(self, model_config):
        return llama(model_config)

    def forward_step(self, batch_dict):
        return self.model(input_ids=batch_dict["tokens"], labels=batch_dict["targets"]).loss


class TwoLibraryTrainer(Trainer):
    """A ModuleDict of a transformers model and a diffusers one: one folder each."""

    def get_models(self, model_config):
        return ModuleDict(lm=llama(model_config), denoiser=Denoiser(dim=model_config["hidden_size"]))

    def forward_step(self, batch_dict):
        lm = self.model("lm", input_ids=batch_dict["tokens"], labels=batch_dict["targets"]).loss
        emb = self.unwrapped_model["lm"].model.embed_tokens(batch_dict["tokens"]).detach()
        return {"lm": lm, "denoise": self.model("denoiser", emb).pow(2).mean()}


class LoraTrainer(LlamaTrainer):
    """LoRA on a base model read from a folder, as a fine-tuning project does."""

    def get_models(self, model_config):
        import peft
        base = transformers.LlamaForCausalLM.from_pretrained(model_config["base"])
        config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        return peft.get_peft_model(base, config)


def run(tmp_path, runner, models=LLAMA, launch=None, **train):
    cfg = tiny_config(tmp_path / "run", runner=f"tests.test_export.{runner}",
                      **dict(dict(max_steps=2, checkpoint_interval=2), **train))
    cfg["models"] = dict(models)
    cfg["launch"].update(launch or {})
    cfg["optimizers"] = dict(type="AdamW", lr=1e-2)
    trainer = launch_from_config(cfg)
    return trainer, list_checkpoints(str(tmp_path / "run" / "models"))[-1][1]


def logits(model, tokens):
    with torch.no_grad():
        return model(input_ids=tokens).logits


TOKENS = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))


def test_export_transformers_sharded_and_ema(tmp_path):
    trainer, checkpoint = run(tmp_path, "LlamaTrainer", with_ema=True)
    out = str(tmp_path / "hf")
    assert main(["export", checkpoint, "--to", "hf", "--out", out, "--max-shard-size", "100KB"]) == 0
    files = sorted(os.listdir(out))
    assert "config.json" in files and "model.safetensors.index.json" in files
    assert len([f for f in files if f.startswith("model-") and f.endswith(".safetensors")]) > 1  # sharded
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    trained = trainer.unwrapped_model
    assert loaded.state_dict().keys() == trained.state_dict().keys()
    assert all(torch.equal(v, trained.state_dict()[k]) for k, v in loaded.state_dict().items())
    assert torch.equal(logits(loaded.eval(), TOKENS), logits(trained.eval(), TOKENS))
    # --ema: the moving average's weights, not the trained ones
    assert main(["export", checkpoint, "--to", "hf", "--ema"]) == 0
    ema = transformers.AutoModelForCausalLM.from_pretrained(checkpoint + "_ema_hf").state_dict()
    averaged = trainer.ema.state_dict(trained)
    assert all(torch.equal(ema[k], averaged[k].float()) for k in ema)
    assert not torch.equal(ema["model.layers.0.self_attn.q_proj.weight"],
                           trained.state_dict()["model.layers.0.self_attn.q_proj.weight"])
    # nothing is overwritten; a run without EMA says so in one line
    assert main(["export", checkpoint, "--to", "hf", "--out", out]) == 2


def test_export_a_module_dict_of_transformers_and_diffusers(tmp_path):
    trainer, checkpoint = run(tmp_path, "TwoLibraryTrainer")
    assert main(["export", checkpoint, "--to", "hf"]) == 0
    out = checkpoint + "_hf"
    lm = transformers.LlamaForCausalLM.from_pretrained(os.path.join(out, "lm"))
    denoiser = Denoiser.from_pretrained(os.path.join(out, "denoiser"))
    assert os.path.isfile(os.path.join(out, "denoiser", "diffusion_pytorch_model.safetensors"))
    for name, loaded in (("lm", lm), ("denoiser", denoiser)):
        trained = trainer.unwrapped_model[name].state_dict()
        assert all(torch.equal(v, trained[k]) for k, v in loaded.state_dict().items()), name
    assert main(["export", checkpoint, "--to", "hf", "--ema", "--out", str(tmp_path / "x")]) == 2


def test_export_peft_adapter_only_and_merged(tmp_path):
    import peft  # in the test extra: a missing install fails here, it is not skipped
    base_dir = str(tmp_path / "base")
    torch.manual_seed(1)
    llama(LLAMA).save_pretrained(base_dir)
    trainer, checkpoint = run(tmp_path, "LoraTrainer", models=dict(base=base_dir))
    # the checkpoint holds the adapter only (the base is get_models'): export rebuilds the base from its folder
    assert sorted(os.listdir(os.path.join(checkpoint, "model"))) == ["adapter_config.json", "adapter_model.safetensors"]
    out = str(tmp_path / "adapter")
    assert main(["export", checkpoint, "--to", "hf", "--out", out, "--merged"]) == 0
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(os.listdir(out))
    from safetensors.torch import load_file
    adapter = load_file(os.path.join(out, "adapter_model.safetensors"))
    assert adapter and all("lora_" in k for k in adapter)  # the adapters only, not the base weights
    assert json.load(open(os.path.join(out, "adapter_config.json")))["r"] == 4
    trained = trainer.unwrapped_model.eval()
    loaded = peft.PeftModel.from_pretrained(transformers.LlamaForCausalLM.from_pretrained(base_dir), out).eval()
    assert torch.equal(logits(loaded, TOKENS), logits(trained, TOKENS))
    merged = transformers.LlamaForCausalLM.from_pretrained(os.path.join(out, "merged")).eval()
    torch.testing.assert_close(logits(merged, TOKENS), logits(trained, TOKENS), rtol=1e-5, atol=1e-5)


def test_export_refuses_a_model_without_save_pretrained(tmp_path, capsys):
    cfg = tiny_config(tmp_path / "run", max_steps=1, checkpoint_interval=1)
    launch_from_config(cfg)
    checkpoint = list_checkpoints(str(tmp_path / "run" / "models"))[-1][1]
    assert main(["export", checkpoint, "--to", "hf"]) == 2
    err = capsys.readouterr().err
    assert "CharLM" in err and "convert CHECKPOINT --to full" in err
    assert not os.path.exists(checkpoint + "_hf") and not os.path.exists(checkpoint + "_hf.tmp")


def test_export_from_deepspeed_takes_its_fp32_master_weights(tmp_path):
    """The model folder holds the engine's bf16 weights (GigaTrain's under DeepSpeed: its module's state dict),
    the export DeepSpeed's fp32 masters."""
    pytest.importorskip("deepspeed")
    from giga_train.checkpoint import read_weights
    from giga_train.tools.convert import read_state
    launch = dict(distributed_type="DEEPSPEED", deepspeed_config=dict(deepspeed_config_file="zero2.json"))
    trainer, checkpoint = run(tmp_path, "LlamaTrainer", launch=launch, mixed_precision="bf16")
    folder, module = read_weights(checkpoint), trainer.unwrapped_model.state_dict()
    assert {v.dtype for v in folder.values()} == {torch.bfloat16}
    assert folder.keys() == module.keys() and all(torch.equal(folder[k], module[k]) for k in folder)
    assert main(["export", checkpoint, "--to", "hf"]) == 0
    loaded = transformers.LlamaForCausalLM.from_pretrained(checkpoint + "_hf").state_dict()
    masters, _ = read_state(checkpoint)  # DeepSpeed's own files, through its universal checkpoint
    assert loaded.keys() == masters.keys() and all(torch.equal(loaded[k], masters[k]) for k in loaded)
    # the engine computes in bf16; the export holds the fp32 masters, not bf16-rounded weights
    assert any(not torch.equal(v, v.bfloat16().float()) for v in loaded.values())
    assert all(torch.equal(masters[k].bfloat16(), folder[k]) for k in folder)  # rounded as the engine rounds


def test_export_from_a_two_rank_fsdp2_checkpoint(tmp_path):
    from giga_train.checkpoint import read_weights
    _, checkpoint = run(tmp_path, "LlamaTrainer", launch=dict(distributed_type="FSDP", num_processes=2))
    assert main(["export", checkpoint, "--to", "hf"]) == 0
    loaded = transformers.LlamaForCausalLM.from_pretrained(checkpoint + "_hf").state_dict()
    gathered = read_weights(checkpoint)  # the whole weights rank 0 gathered
    assert loaded.keys() == gathered.keys() and all(torch.equal(loaded[k], gathered[k]) for k in loaded)
