"""The CPU bf16 Conv3d guard (giga_train/engine/cpu_conv3d.py): on a CPU where oneDNN's bf16 Conv3d weight
gradient comes out non-finite (this machine kind: AMD EPYC with AVX512-BF16), a bf16 run of a model with a
Conv3d turns oneDNN off and its gradients are finite at every step; where neither the CPU's AVX512-BF16 flag nor
the probe says so, nothing is changed (the probe alone missed the bug once in a full run here). The probe leaves
the global RNG as it was (GigaTrain's random stream goes on from get_models)."""
import logging
import os

import pytest
import torch
from torch import nn

from giga_train.engine import cpu_conv3d
from tests.tiny import TinyTrainer, tiny_config


@pytest.fixture(autouse=True)
def _onednn_restored():
    enabled = torch.backends.mkldnn.enabled
    yield
    torch.backends.mkldnn.enabled = enabled


class VideoHead(nn.Module):
    """The char LM's embeddings through a Conv3d over (frames, height, width), as a video model's patchify."""

    def __init__(self, lm):
        super().__init__()
        self.lm, self.conv = lm, nn.Conv3d(16, 4, 3, padding=1)

    def forward(self, tokens, targets):
        x = self.lm.embed(tokens[:, :16]).transpose(1, 2).reshape(tokens.shape[0], 16, 1, 4, 4)
        x = torch.cat([x, x.flip(-1)], dim=2)  # 2 frames of 4 x 4
        return self.lm(tokens, targets) + self.conv(x).float().pow(2).mean()


class ConvTrainer(TinyTrainer):
    def get_models(self, model_config):
        self.grad_norms = []  # of the Conv3d weight, as backward makes it
        model = VideoHead(super().get_models(model_config))
        model.conv.weight.register_hook(lambda g: self.grad_norms.append(float(g.float().norm())))
        return model


def test_probe_leaves_the_global_rng_alone():
    before = torch.get_rng_state()
    cpu_conv3d.onednn_conv3d_broken(probes=2)
    assert torch.equal(before, torch.get_rng_state())


@pytest.mark.parametrize("mixed_precision, dtype, conv, expected", [
    ("bf16", torch.float32, True, True), ("no", torch.bfloat16, True, True), ("no", torch.float32, True, False),
    ("bf16", torch.float32, False, False)], ids=["autocast", "bf16-weights", "fp32", "no-conv3d"])
def test_guard_acts_only_on_a_bf16_conv3d(monkeypatch, caplog, mixed_precision, dtype, conv, expected):
    monkeypatch.setattr(cpu_conv3d, "conv3d_bug_expected", lambda: True)  # as on a CPU with the bug
    torch.backends.mkldnn.enabled = True
    model = (nn.Conv3d(4, 4, 1) if conv else nn.Linear(4, 4)).to(dtype)
    with caplog.at_level(logging.WARNING, logger="giga_train"):
        assert cpu_conv3d.guard_cpu_conv3d(model, torch.device("cpu"), mixed_precision) is expected
    assert torch.backends.mkldnn.enabled is not expected
    assert ("oneDNN is off for this run" in caplog.text) is expected
    assert not cpu_conv3d.guard_cpu_conv3d(model, torch.device("meta"), mixed_precision)  # not the CPU


def test_bf16_conv3d_trains_finite(tmp_path):
    """A bf16 run of a model with a Conv3d: every step's Conv3d weight gradient is finite; oneDNN was turned off
    (with the line) exactly when the guard expects the bug on this machine (AVX512-BF16 or the probe)."""
    torch.backends.mkldnn.enabled = True
    broken = cpu_conv3d.conv3d_bug_expected()
    cfg = tiny_config(tmp_path, runner="tests.test_cpu_conv3d.ConvTrainer", max_steps=8, mixed_precision="bf16",
                      checkpoint_interval=100)
    trainer = ConvTrainer.load(cfg)
    trainer.train()
    assert len(trainer.grad_norms) == 8 and all(torch.isfinite(torch.tensor(trainer.grad_norms)))
    with open(os.path.join(trainer.logging_dir, "train.log")) as f:
        assert ("oneDNN is off for this run" in f.read()) is broken
    assert torch.backends.mkldnn.enabled  # on again once the run is over
