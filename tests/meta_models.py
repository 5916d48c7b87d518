"""A model with a non-persistent buffer (a rotary-style frequency table) and the trainers of the meta-start
tests: a normal start, rank-0 loading (fsdp_cpu_ram_efficient_loading, zero3_init_flag), a meta start filled
from safetensors piece by piece, and one filled by reset_parameters. Each writes, after sharding, the full
weights and its rank's buffers."""
import os

import torch
from torch import nn

from examples.char_lm import data  # noqa: F401  (registers StdlibText)
from giga_train import Trainer, load_safetensors_shards
from giga_train.engine.meta_start import reset_parameters


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm, self.mix = nn.LayerNorm(dim), nn.Linear(dim, dim)
        self.register_buffer("inv_freq", self.frequencies(dim), persistent=False)

    @staticmethod
    def frequencies(dim):
        return 1.0 / (100 ** (torch.arange(dim, dtype=torch.float32) / dim))

    def forward(self, x):
        angle = torch.arange(x.shape[1], dtype=x.dtype, device=x.device)[:, None] * self.inv_freq
        return x + self.mix(self.norm(x) * torch.cos(angle))


class RotaryLM(nn.Module):
    def __init__(self, vocab_size=256, dim=16, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return nn.functional.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())


def build_model():
    torch.manual_seed(0)
    return RotaryLM()


class NormalStart(Trainer):
    def get_models(self, model_config):
        return build_model()

    def forward_step(self, batch_dict):
        return self.model(batch_dict["tokens"], batch_dict["targets"])

    def set_ema_models(self):  # right after sharding: what every rank holds
        full = self.strategy.model_state_dict()
        buffers = {k: v.clone() for k, v in self.unwrapped_model.named_buffers() if k.endswith("inv_freq")}
        torch.save(dict(full=full if self.is_main_process else None, buffers=buffers),
                   os.path.join(self.project_dir, f"after_sharding_{self.rank}.pt"))
        super().set_ema_models()


class Rank0Start(NormalStart):
    """Built as a normal start; under rank-0 loading ranks > 0 build it on meta."""

    def get_models(self, model_config):
        model = build_model()
        assert next(model.parameters()).is_meta == (self.rank != 0)
        return model


class MetaStart(NormalStart):
    """Built on the meta device on every rank; filled from the safetensors file the test wrote."""

    def get_models(self, model_config):
        self.pretrained = os.environ["GT_PRETRAINED"]
        with torch.device("meta"):
            return RotaryLM()

    def init_weights(self, model):
        load_safetensors_shards(model, self.pretrained)
        for block in model.blocks:
            block.inv_freq.copy_(Block.frequencies(block.inv_freq.numel()))


class MetaResetStart(MetaStart):
    """Built on the meta device; filled by every module's reset_parameters from build_model's seed, which
    draws the same numbers in the same order as the modules' constructors did."""

    def init_weights(self, model):
        torch.manual_seed(0)
        reset_parameters(model)
        for block in model.blocks:
            block.inv_freq.copy_(Block.frequencies(block.inv_freq.numel()))


class Gain(nn.Module):
    """A parameter of its own and no reset_parameters: nothing fills it on the meta device."""

    def __init__(self, dim):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))


class UnfilledStart(NormalStart):
    """Built on the meta device with a Gain module, filled by the Trainer's default init_weights."""

    def get_models(self, model_config):
        with torch.device("meta"):
            return nn.Sequential(nn.Embedding(256, 16), Gain(16), nn.Linear(16, 256))


class PlainLM(nn.Module):
    """No buffers: on the meta device the Trainer's default init_weights (reset_parameters) fills it."""

    def __init__(self, vocab_size=256, dim=16):
        super().__init__()
        self.embed, self.norm, self.head = nn.Embedding(vocab_size, dim), nn.LayerNorm(dim), nn.Linear(dim, vocab_size)

    def forward(self, tokens, targets):
        logits = self.head(self.norm(self.embed(tokens)))
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


class PlainStart(NormalStart):
    def get_models(self, model_config):
        return PlainLM()  # from the trainer's seed, as the meta start's reset_parameters draws


class PlainMetaStart(NormalStart):
    def get_models(self, model_config):
        with torch.device("meta"):
            return PlainLM()


class SelfInitLM(RotaryLM):
    """A model with its own init_weights(), written for a whole model (no ZeRO-3 gathering of its own)."""

    def init_weights(self):
        torch.manual_seed(0)
        for module in self.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
        for block in self.blocks:
            block.inv_freq.copy_(Block.frequencies(block.inv_freq.numel()))


class SelfInitStart(NormalStart):
    def get_models(self, model_config):
        with torch.device("meta"):
            return SelfInitLM()
