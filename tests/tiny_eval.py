"""Trainers for the validation and metric tests (tests/test_validation.py)."""
import json
import os

import torch
from torch import nn

from tests.distributed import job
from tests.tiny import TinyTrainer

VAL_SAMPLES = 9  # StdlibText(split="val", val_fraction=0.004) of 40 KB: 160 bytes -> 9 windows of 16


def eval_job(project, distributed_type="NO", ranks=1, runner="tests.tiny_eval.ValTrainer", **train):
    """tests.distributed.job (fp32, 4 steps) with dataloaders.val: 9 samples in batches of 2, so two ranks
    hold 3 and 2 batches (the shorter one repeats one) and the last batch is smaller."""
    cfg = job(project, distributed_type, ranks, **dict(dict(eval_interval=2, log_interval=2), **train))
    cfg["runners"] = [runner]
    cfg["dataloaders"]["val"] = dict(batch_size_per_gpu=2, data_or_config=dict(
        _class_name="StdlibText", block_size=16, stride=16, max_bytes=40_000, split="val", val_fraction=0.004))
    return cfg


class ValTrainer(TinyTrainer):
    """Writes every validation's results (rank 0: val.json; every rank: val_rank_R.json) and logs metrics
    that are not trained: `rank_value` = rank + step (once per micro-batch), `only_main` on rank 0 only,
    `uneven`: rank 0 logs 1.0 once a step, other ranks 10.0 twice."""

    def forward_step(self, batch_dict):
        self.log_metric("rank_value", self.rank + self.cur_step)
        if self.rank == 0:
            self.log_metrics({"only_main": torch.tensor([5.0, 7.0]), "uneven": 1.0})
        else:
            self.log_metric("uneven", 10.0)
            self.log_metric("uneven", torch.tensor(10.0))
        return super().forward_step(batch_dict)

    def validation_step(self, batch_dict):
        return self.model(batch_dict["tokens"], batch_dict["targets"])

    def validate(self):
        results = super().validate()
        path = os.path.join(self.project_dir, f"val_rank_{self.rank}.json")
        seen = json.load(open(path)) if os.path.exists(path) else []
        with open(path, "w") as f:
            json.dump(seen + [[self.step, results]], f)
        return results


class ScriptedScoreTrainer(TinyTrainer):
    """validation_step logs val/score from GT_SCORES ("step:score,..."), through log_metric."""

    def validation_step(self, batch_dict):
        scores = dict(item.split(":") for item in os.environ["GT_SCORES"].split(","))
        self.log_metric("score", float(scores[str(self.step)]))


class FloatInputTrainer(TinyTrainer):
    """A model fed float inputs (the DeepSpeed bf16 case): an MLP regressing the next byte from a window."""

    def get_models(self, model_config):
        self.losses = []
        return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 1))

    def forward_step(self, batch_dict):
        x = batch_dict["tokens"].float() / 255.0
        y = batch_dict["targets"][:, -1:].float() / 255.0
        loss = nn.functional.mse_loss(self.model(x).float(), y)
        self.losses.append(loss.item())
        return {"mse": loss}


class UnusedParameterTrainer(TinyTrainer):
    """A parameter that forward never uses (DDP needs find_unused_parameters=True)."""

    def get_models(self, model_config):
        model = super().get_models(model_config)
        model.unused = nn.Linear(4, 4)
        return model


class NoisyValTrainer(ValTrainer):
    """validation_step as a diffusion loss: its own noise (torch.rand) beside the model's loss; the training
    draws random numbers too (a diffusion model's noise), so the RNG moves between validations."""

    def forward_step(self, batch_dict):
        torch.rand(3)
        return super().forward_step(batch_dict)

    def validation_step(self, batch_dict):
        return {"noise": torch.rand(batch_dict["tokens"].shape[0]), "loss": super().validation_step(batch_dict)}
