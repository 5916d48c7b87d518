"""The client's Trainer: two models in one ModuleDict, per-sample losses in a dict.

Config section ``models`` (or ``models.train``) is handed to get_models as GigaTrain does.
Extra ``train`` keys (``aux_weight`` here) reach ``self.kwargs``.
"""
from giga_train import ModuleDict, Trainer

from . import data, transforms  # noqa: F401  (registers TinyRegression with giga_datasets, ScaleX in TRANSFORMS)
from .models import Encoder, Head


class RefTrainer(Trainer):
    def get_models(self, model_config):
        return ModuleDict(dict(
            encoder=Encoder(in_dim=model_config.in_dim, hidden=model_config.hidden),
            head=Head(hidden=model_config.hidden),
        ))

    def forward_step(self, batch_dict):
        x = batch_dict['x'].to(self.device)
        y = batch_dict['y'].to(self.device)
        h = self.model('encoder', x)
        pred = self.model('head', h)
        aux_weight = self.kwargs.get('aux_weight', 0.0)
        # per-sample losses, shape (B,): GigaTrain's parse_losses takes .mean() of each entry
        return dict(mse=(pred - y) ** 2, aux=aux_weight * h.pow(2).mean(dim=-1))
