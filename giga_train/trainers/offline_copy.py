"""A copy of a live trainer whose hooks (get_models, get_dataloaders, forward_step) run on another device (the
meta device, or the CPU under a FakeTensorMode) without touching the run: its own model list, no engine."""
import copy
import dataclasses

import torch

from .evaluation import Evaluation
from .lora import with_lora


class ModelHolder:
    """The copy's strategy: unwrap() is the copy's own model; anything else (the data rank...) the run's."""

    def __init__(self, trainer, strategy=None):
        self.trainer, self.strategy = trainer, strategy

    def unwrap(self):
        return self.trainer._models[0]

    def __getattr__(self, name):
        if self.__dict__.get("strategy") is None:
            raise AttributeError(name)
        return getattr(self.strategy, name)


def offline_copy(trainer, device):
    """A shallow copy of `trainer` whose hooks build on `device` and see no engine (its own model list)."""
    shadow = copy.copy(trainer)
    shadow.env = dataclasses.replace(trainer.env, device=torch.device(device))
    shadow._models, shadow._dataloaders = [], []
    shadow.strategy = ModelHolder(shadow, getattr(trainer, "strategy", None))
    if hasattr(trainer, "evaluation"):  # a log_metric in forward_step logs nothing of the run's
        shadow.evaluation = Evaluation(torch.device(device))
    return shadow


def build(trainer, context):
    """The trainer's get_models(config.models) under `context` (a device, or a FakeTensorMode): its model."""
    models = trainer.prepare_arguments(trainer.config)["models"]
    with context:
        model = trainer.get_models(models)
    model = model[0] if isinstance(model, (list, tuple)) else model
    model = with_lora(model, trainer.train_config.get("lora"))
    trainer._models = [model]
    return model
