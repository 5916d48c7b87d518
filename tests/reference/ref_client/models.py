"""Two tiny models. Each can write a diffusers-style ``config.json`` (``save_config``), which
GigaTrain 1.1 calls when it saves a checkpoint and reads back in ``Trainer.load_checkpoint``."""
import json
import os

import torch
from torch import nn


class _Configured(nn.Module):
    def save_config(self, save_directory):
        os.makedirs(save_directory, exist_ok=True)
        config = dict(_class_name=type(self).__name__, **self.init_kwargs)
        with open(os.path.join(save_directory, 'config.json'), 'w') as f:
            json.dump(config, f, indent=2, sort_keys=True)


class Encoder(_Configured):
    def __init__(self, in_dim: int = 4, hidden: int = 8):
        super().__init__()
        self.init_kwargs = dict(in_dim=in_dim, hidden=hidden)
        self.proj = nn.Linear(in_dim, hidden)

    def forward(self, x):
        return torch.tanh(self.proj(x))


class Head(_Configured):
    def __init__(self, hidden: int = 8):
        super().__init__()
        self.init_kwargs = dict(hidden=hidden)
        self.out = nn.Linear(hidden, 1)

    def forward(self, h):
        return self.out(h).squeeze(-1)
