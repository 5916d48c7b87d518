"""A client project written the way GigaTrain projects are: a Trainer that overrides GigaTrain's hooks and
reads its properties, per-sample losses, a Tester; used by tests/test_gigatrain_api.py."""
import torch
from torch import nn

from giga_train import ModuleDict, Tester, Trainer
from tests.tiny import CountingDataset  # noqa: F401  (registers CountingDataset)

CALLS = []  # (hook, detail) in call order, in this process


class Pair(nn.Module):
    """Two members: a score per sample and an auxiliary scale."""

    def __init__(self, dim=4):
        super().__init__()
        self.net = ModuleDict(score=nn.Linear(dim, 1), aux=nn.Linear(dim, 1))

    def forward(self, x):
        return self.net["score"](x).squeeze(-1), self.net["aux"](x).squeeze(-1)


def features(index, dim=4):
    """A sample's input, derived from its index only (the same on every rank and in every run)."""
    return torch.stack([torch.sin(index.float() * (k + 1)) for k in range(dim)], -1)


class HookTrainer(Trainer):
    def get_dataloaders(self, data_config):
        CALLS.append(("get_dataloaders", type(data_config).__name__))
        return super().get_dataloaders(data_config)

    def get_models(self, model_config):
        CALLS.append(("get_models", dict(model_config)))
        self.seen = []
        return Pair(**model_config)

    def apply_activation_checkpointing(self, models=None):
        CALLS.append(("apply_activation_checkpointing", len(models or [])))
        return super().apply_activation_checkpointing(models)

    def apply_fp8(self, models=None):
        CALLS.append(("apply_fp8", len(models or [])))
        return super().apply_fp8(models)

    def get_optimizers(self, optimizers):
        CALLS.append(("get_optimizers", optimizers["type"]))
        return super().get_optimizers(optimizers)

    def set_ema_models(self):
        CALLS.append(("set_ema_models", self.train_config.with_ema))
        return super().set_ema_models()

    def get_schedulers(self, schedulers):
        CALLS.append(("get_schedulers", (schedulers["type"], self.epoch_size, self.max_steps)))
        return super().get_schedulers(schedulers)

    def print_before_train(self):
        CALLS.append(("print_before_train", self.cur_step))
        return super().print_before_train()

    def forward_step(self, batch_dict):
        self.seen.append(batch_dict["index"].tolist())
        CALLS.append(("forward_step", self.cur_step))
        score, aux = self.model(features(batch_dict["index"]))
        return {"score": (score - 1.0) ** 2, "aux": 0.1 * aux ** 2}  # per-sample (B,) losses

    def parse_losses(self, losses):
        CALLS.append(("parse_losses", tuple(v.shape for v in losses.values())))
        return super().parse_losses(losses)

    def backward_step(self, loss):
        CALLS.append(("backward_step", self.sync_gradients))
        return super().backward_step(loss)

    def print_step(self):
        CALLS.append(("print_step", self.cur_step))
        return super().print_step()

    def save_checkpoint_step(self):
        CALLS.append(("save_checkpoint_step", self.cur_step))
        return super().save_checkpoint_step()

    def print_after_train(self):
        CALLS.append(("print_after_train", self.cur_step))
        return super().print_after_train()


class IndexTester(Tester):
    """Records the sample indices this rank evaluates (to a file per rank)."""

    def get_models(self, model_config):
        return Pair(**model_config)

    def test(self):
        import json
        import os
        self.print_before_test()
        seen = []
        with torch.no_grad():
            for self._cur_step, batch in enumerate(self.dataloader, 1):
                seen += batch["index"].tolist()
                self.model(features(batch["index"]).to(self.device))
                self.print_step()
        self.print_after_test()
        with open(os.path.join(self.project_dir, f"tested_{self.process_index}.json"), "w") as f:
            json.dump(dict(seen=seen, kwargs=self.kwargs, batch_size=self.batch_size), f)
