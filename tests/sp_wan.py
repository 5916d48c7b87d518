"""The Wan example's trainer writing its per-step losses (reduced over the ranks) for the sequence-parallel
tests."""
from examples.wan.trainer import WanTrainer
from tests.sp_models import LossFileTrainer


class WanLossFileTrainer(WanTrainer):
    record = LossFileTrainer.record

    def get_models(self, model_config):
        self.losses = []
        return super().get_models(model_config)

    def forward_step(self, batch_dict):
        loss = super().forward_step(batch_dict)
        self.record(loss)
        return loss
