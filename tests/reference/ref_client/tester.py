"""The client's Tester: loads the newest checkpoint's model folders and scores the test set."""
import os

import torch
from giga_train import ModuleDict, Tester, utils

from . import data, transforms  # noqa: F401  (registers TinyRegression with giga_datasets, ScaleX in TRANSFORMS)
from .models import Encoder, Head


class RefTester(Tester):
    def get_models(self, model_config):
        model = ModuleDict(dict(
            encoder=Encoder(in_dim=model_config.in_dim, hidden=model_config.hidden),
            head=Head(hidden=model_config.hidden),
        ))
        checkpoint = self.get_checkpoint()
        for name in model.keys():
            state_dict = utils.load_state_dict(os.path.join(checkpoint, name))
            model[name].load_state_dict(state_dict)
        model.to(self.device).eval()
        return model

    @torch.no_grad()
    def test(self):
        self.print_before_test()
        self.results = []
        for step, batch_dict in enumerate(self.dataloader):
            self._cur_step = step + 1
            pred = self.model('head', self.model('encoder', batch_dict['x'].to(self.device)))
            self.results.extend(((pred - batch_dict['y'].to(self.device)) ** 2).tolist())
            self.print_step()
        self.print_after_test()
