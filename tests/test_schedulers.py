import math

import pytest
import torch

from giga_train import SCHEDULERS


def lrs(cfg, steps):
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = SCHEDULERS.build(cfg, opt)
    out = []
    for _ in range(steps):
        out.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return out


def test_warmup_cosine():
    v = lrs(dict(type="WarmupCosineScheduler", warmup_steps=4, decay_steps=10, end_value=0.1), 20)
    assert v[:4] == pytest.approx([0.2, 0.4, 0.6, 0.8])
    assert v[4] == 1.0
    assert v[9] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert v[14:] == pytest.approx([0.1] * 6)


def test_warmup_linear_and_constant():
    v = lrs(dict(type="WarmupLinearScheduler", warmup_steps=0, decay_steps=4, end_value=0.0), 6)
    assert v == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0, 0.0])
    assert lrs(dict(type="ConstantScheduler", warmup_steps=1), 3) == pytest.approx([0.5, 1.0, 1.0])


def test_state_dict_round_trip():
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    a = SCHEDULERS.build(dict(type="WarmupCosineScheduler", warmup_steps=2, decay_steps=5), opt)
    for _ in range(3):
        opt.step()
        a.step()
    b = SCHEDULERS.build(dict(type="WarmupCosineScheduler", warmup_steps=2, decay_steps=5),
                         torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0))
    b.load_state_dict(a.state_dict())
    assert b.last_epoch == 3 and b.get_last_lr() == a.get_last_lr()
