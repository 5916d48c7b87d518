"""LoRA and PEFT projects as GigaTrain runs them (giga_models' LoRAPeftWrapper): a ModuleDict member whose
save_config writes no config.json (an adapter_config.json here) and whose state_dict renames its weights is
checkpointed, EMA included, and resumes exactly; ModuleDict.load_state_dict_mode='each' saves and loads each
member through its own state_dict and load_state_dict; an EMA
missing weights stops in one line, or under train.checkpoint_strict=False starts their average from the
weights."""
import os

import pytest
import torch
from torch import nn

from giga_train import ModuleDict, Trainer, launch_from_config
from giga_train.checkpoint import list_checkpoints, read_weights
from giga_train.errors import CheckpointError
from giga_train.trainers.ema import EMA
from tests.tiny import tiny_config

peft = pytest.importorskip("peft")


class LoRAWrapper(nn.Module):
    """A PEFT LoRA model as giga_models' LoRAPeftWrapper wraps one: save_config writes the adapter's config
    (adapter_config.json), not config.json; state_dict gives the adapter's weights under PEFT's saved names
    (get_peft_model_state_dict), which torch's recursion, passing a prefix, turns into none at all (GigaTrain's
    LoRA checkpoints hold no tensors); load_state_dict maps them back (set_peft_model_state_dict)."""

    def __init__(self):
        super().__init__()
        base = nn.Sequential()
        base.add_module("embed", nn.Embedding(256, 16))
        base.add_module("proj", nn.Linear(16, 256))
        self.net = peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["proj"], init_lora_weights=False))

    def save_config(self, folder):
        self.net.peft_config["default"].save_pretrained(folder)

    def state_dict(self, *args, destination=None, **kwargs):
        out = {} if destination is None else destination
        out.update(peft.get_peft_model_state_dict(self.net, self.net.state_dict(**kwargs)))
        return out

    def load_state_dict(self, state_dict, strict=True, **kwargs):
        result = peft.set_peft_model_state_dict(self.net, state_dict)
        result.missing_keys.clear()
        return result

    def forward(self, tokens):
        return self.net(tokens)


class LoRATrainer(Trainer):
    def get_models(self, model_config):
        model = ModuleDict(transformer=LoRAWrapper())
        model.load_state_dict_mode = "each"
        return model

    def forward_step(self, batch_dict):
        logits = self.model("transformer", batch_dict["tokens"])
        return nn.functional.cross_entropy(logits.flatten(0, 1), batch_dict["targets"].flatten())


def run(project, **train):
    cfg = tiny_config(project, runner="tests.test_lora_projects.LoRATrainer",
                      **dict(dict(max_steps=4, checkpoint_interval=2, with_ema=True, checkpoint_total_limit=-1), **train))
    cfg["optimizers"] = dict(type="AdamW", lr=1e-2)
    return launch_from_config(cfg)


def test_lora_model_checkpoints_and_resumes_exactly(tmp_path):
    whole = run(tmp_path / "whole")
    checkpoints = dict(list_checkpoints(str(tmp_path / "whole" / "models")))
    last = checkpoints[4]
    for folder in ("transformer_ema",):  # with EMA the live weights are the root file (GigaTrain's layout)
        names = set(os.listdir(os.path.join(last, folder)))
        assert "adapter_config.json" in names and "config.json" not in names
        assert "diffusion_pytorch_model.safetensors" in names
    half = run(tmp_path / "half", max_steps=2)
    resumed = run(tmp_path / "half", resume=True)
    assert half.step == 2 and resumed.step == 4
    again = dict(list_checkpoints(str(tmp_path / "half" / "models")))[4]
    a, b = read_weights(last), read_weights(again)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # under load_state_dict_mode='each' the state dict is each member's own: the adapter's weights are there
    assert sorted(a) == ["transformer.base_model.model.proj.lora_A.weight", "transformer.base_model.model.proj.lora_B.weight"]
    ema_a, ema_b = read_weights(last, ema=True), read_weights(again, ema=True)
    assert any("lora_A" in k for k in ema_a) and all(torch.equal(ema_a[k], ema_b[k]) for k in ema_a)
    assert whole.step == 4


class KeyMapping(nn.Module):
    """A member whose own load_state_dict maps the checkpoint's names (as a PEFT wrapper does)."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(2, 2)

    def load_state_dict(self, state, strict=True):
        return self.inner.load_state_dict({k.replace("renamed.", ""): v for k, v in state.items()}, strict=strict)


def test_load_state_dict_mode_each_uses_the_members_own_load():
    model = ModuleDict(a=KeyMapping(), b=nn.Linear(2, 1))
    state = {"a.renamed.weight": torch.ones(2, 2), "a.renamed.bias": torch.zeros(2),
             "b.weight": torch.full((1, 2), 3.0), "b.bias": torch.zeros(1)}
    with pytest.raises(RuntimeError):  # torch's one load does not know the mapping
        model.load_state_dict(dict(state))
    model.load_state_dict_mode = "each"
    model.load_state_dict(dict(state))
    assert torch.equal(model["a"].inner.weight, torch.ones(2, 2)) and torch.equal(model["b"].weight, torch.full((1, 2), 3.0))
    with pytest.raises(RuntimeError, match="unexpected"):
        model.load_state_dict(dict(state, **{"c.weight": torch.zeros(1)}))
    model.load_state_dict_mode = "all"
    with pytest.raises(ValueError, match="load_state_dict_mode='all'"):
        model.load_state_dict(state)


def test_ema_missing_weights_strict_or_from_the_weights():
    module = nn.Linear(3, 2)
    ema = EMA(module, 0.9, warmup=True)
    saved = {"weight": torch.full((2, 3), 5.0)}  # no bias: a checkpoint missing tensors
    with pytest.raises(CheckpointError, match="lacks 1 of 2 trained weights \\(bias\\).*checkpoint_strict=False"):
        ema.load_state_dict(saved, 3, strict=True, where="ckpt")
    with torch.no_grad():
        module.bias.fill_(7.0)  # the weight as loaded just before the EMA
    ema.load_state_dict(saved, 3, strict=False, where="ckpt")
    state = ema.state_dict(module)
    assert torch.equal(state["weight"], saved["weight"]) and torch.equal(state["bias"], torch.full((2,), 7.0))
    assert ema.optimization_step == 3
