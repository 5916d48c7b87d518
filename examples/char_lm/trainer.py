"""The char-LM Trainer: the two methods a user writes."""
from giga_train import Trainer

from . import data  # noqa: F401  (registers StdlibText and RandomShift)
from .model import CharLM


class CharLMTrainer(Trainer):
    def get_models(self, model_config):
        return CharLM(**model_config)

    def forward_step(self, batch_dict):
        return self.model(batch_dict["tokens"], batch_dict["targets"])
