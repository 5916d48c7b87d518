"""EMAModel (GigaTrain's API and decay warmup, equal to GigaTrain 1.1.0's numbers) and the trainer's EMA."""
import json

import torch

from giga_train import EMAModel
from giga_train.compat.ema_model import save_ema, warmup_decay
from giga_train.trainers.ema import EMA
from tests.ref_compare import compare_with_reference


def test_first_update_copies_then_the_decay_warms_up():
    assert [warmup_decay(t, 0.9999) for t in (1, 2, 3)] == [0.0, 2 / 11, 3 / 12]
    assert warmup_decay(10**6, 0.9999) == 0.9999
    model = torch.nn.Linear(3, 2)
    ema = EMAModel(decay=0.9)
    ema.load_state_dict(model.state_dict())
    target = {k: v + 1 for k, v in model.state_dict().items()}
    ema.step(target)
    assert all(torch.equal(ema.state_dict()[k], target[k]) for k in target)  # decay 0: a copy
    before = {k: v.clone() for k, v in ema.state_dict().items()}  # (world_size 1: views of the average)
    ema.step(model.state_dict())
    d = 2 / 11
    for k, v in model.state_dict().items():
        torch.testing.assert_close(ema.state_dict()[k], before[k] * d + v * (1 - d))
    assert ema.optimization_step == 2


def test_config_round_trip_and_buffers(tmp_path):
    ema = EMAModel(decay=0.5, update_after_step=3)
    ema.load_state_dict({"w": torch.ones(2), "step": 7, "nothing": torch.zeros(0)})
    ema.step({"w": torch.zeros(2), "step": 8, "nothing": torch.zeros(0)})
    assert ema.state_dict()["step"] == 8 and torch.equal(ema.state_dict()["w"], torch.zeros(2))
    path = str(tmp_path / "ema_config.json")
    ema.save_config(path)
    assert json.load(open(path))["optimization_step"] == 1
    other = EMAModel.from_config(path)
    assert other.config == ema.config
    fresh = EMAModel()
    fresh.load_config(path)
    assert fresh.decay == 0.5 and fresh.update_after_step == 3


def test_trainer_ema_keeps_its_interface_and_can_warm_up():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    fixed = EMA(model, 0.5)
    warm = EMA(model, 0.9, warmup=True)
    reference = EMAModel(decay=0.9)
    reference.load_state_dict({k: v.clone() for k, v in model.state_dict().items()})
    start = {k: v.clone() for k, v in model.state_dict().items()}
    for step in range(4):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        skip = torch.tensor(1.0 if step == 2 else 0.0)
        fixed.update()
        warm.update(skip=skip)
        if step != 2:
            reference.step(model.state_dict())
    assert warm.optimization_step == 3
    for name, value in warm.state_dict(model).items():
        torch.testing.assert_close(value, reference.state_dict()[name])
    assert not torch.equal(fixed.state_dict(model)["weight"], start["weight"])
    again = EMA(model, 0.9, warmup=True)
    again.load_state_dict(warm.state_dict(model), optimization_step=3)
    assert again.optimization_step == 3 and torch.equal(again.shadow[0], warm.shadow[0])


def test_save_ema(tmp_path):
    from giga_train.utils import load_state_dict, save_state_dict
    paths = []
    for i in range(3):
        paths.append(str(tmp_path / f"{i}.safetensors"))
        save_state_dict({"w": torch.full((2,), float(i), dtype=torch.bfloat16)}, paths[-1])
    save_ema(paths, str(tmp_path / "avg.bin"), decay=0.5)
    got = load_state_dict(str(tmp_path / "avg.bin"))["w"]
    assert got.dtype == torch.bfloat16 and got.tolist() == [1.25, 1.25]  # (0 * .5 + 1 * .5) * .5 + 2 * .5


def test_averages_equal_gigatrains():
    ref, ours = compare_with_reference("ema_values.py")
    assert ref["results"] == ours["results"]
    assert ours["results"][0]["decays"][0] == 0.0
