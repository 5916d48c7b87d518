"""A tiny PEFT LoRA run: the char-LM (width 128) as the frozen base, loaded from a local file the test
writes (GT_LORA_BASE), with a rank-4 LoRA on its attention's qkv: from get_models (LoraTrainer), or from the
config's train.lora around the base BaseTrainer returns (LORA)."""
import os

import torch

from examples.char_lm.model import CharLM
from giga_train import ModuleDict
from tests.tiny import TinyTrainer

BASE = dict(vocab_size=256, block_size=16, dim=128, layers=2, heads=2, dropout=0.0)


def write_base(path):
    torch.manual_seed(0)
    torch.save(CharLM(**BASE).state_dict(), path)


def lora_section(path):
    """train.lora giving what LoraTrainer builds by hand."""
    return dict(target_modules=["qkv"], rank=4, alpha=8, base=str(path))


def load_base():
    base = CharLM(**BASE)
    base.load_state_dict(torch.load(os.environ["GT_LORA_BASE"], weights_only=True))
    return base


class LoraTrainer(TinyTrainer):
    def get_models(self, model_config):
        from peft import LoraConfig, get_peft_model
        self.losses = []
        model = get_peft_model(load_base(), LoraConfig(r=4, lora_alpha=8, target_modules=["qkv"]))
        model.peft_config["default"].base_model_name_or_path = os.environ["GT_LORA_BASE"]
        return model

    def forward_step(self, batch_dict):
        loss = self.model(tokens=batch_dict["tokens"], targets=batch_dict["targets"])
        self.losses.append(loss.detach().float().item())
        return loss


class BaseTrainer(LoraTrainer):
    """The base alone: train.lora adds the adapter."""

    def get_models(self, model_config):
        self.losses = []
        return load_base()


class DictTrainer(LoraTrainer):
    """A ModuleDict: the base (`lm`, which train.lora adapts by name) and a small head trained whole (`aux`)."""

    def get_models(self, model_config):
        self.losses = []
        return ModuleDict(lm=load_base(), aux=torch.nn.Linear(1, 1))

    def forward_step(self, batch_dict):
        lm = self.model("lm", tokens=batch_dict["tokens"], targets=batch_dict["targets"])
        aux = self.model("aux", batch_dict["tokens"].float()[..., None] / 256)
        return {"lm": lm, "aux": 0.1 * aux.pow(2).mean()}
