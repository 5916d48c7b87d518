"""GigaTrain's schedulers: values per optimizer step through LambdaLR, its call forms, and the lr per
step equal to GigaTrain 1.1.0's, float for float (tests/reference/scheduler_lrs.py under both)."""
import math

import pytest
import torch

from giga_train import SCHEDULERS, build_scheduler
from giga_train.registry import RegistryError
from giga_train.schedulers import BaseScheduler, WarmupCosineScheduler
from tests.ref_compare import compare_with_reference


def optimizer(lr=1.0):
    return torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)


def lrs(cfg, steps, **trainer_args):
    opt = optimizer()
    sched = SCHEDULERS.build(cfg, opt, **trainer_args)
    out = [sched.get_last_lr()[0]]
    for _ in range(steps - 1):
        opt.step()
        sched.step()
        out.append(sched.get_last_lr()[0])
    return out


def test_warmup_cosine():
    # GigaTrain's definition: step 0 at 1/(warmup+1), then n/warmup; cosine from warmup_steps to
    # decay_steps (an absolute step), end_value after. (Re-derived: before, decay_steps counted from
    # the end of the warmup and the warmup ran (n+1)/(warmup+1).)
    v = lrs(dict(type="WarmupCosineScheduler", warmup_steps=4, decay_steps=10, end_value=0.1), 20)
    assert v[:5] == pytest.approx([0.2, 0.25, 0.5, 0.75, 1.0])
    assert v[7] == pytest.approx(0.1 + 0.9 * 0.5)  # halfway from step 4 to step 10
    assert v[5] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 6)))
    assert v[10:] == pytest.approx([0.1] * 10)


def test_warmup_cosine_decay_steps_is_the_step_where_the_decay_ends():
    s = WarmupCosineScheduler(warmup_steps=1000, decay_steps=30000, end_value=0.1, max_steps=30000)
    assert s.get_value(15500) == pytest.approx(0.55)  # alpha = 14500 / 29000 = 0.5
    assert s.get_value(1000) == 1.0 and s.get_value(30000) == pytest.approx(0.1)


def test_warmup_linear_and_constant():
    v = lrs(dict(type="WarmupLinearScheduler", warmup_steps=0, decay_steps=4, end_value=0.0), 6)
    assert v == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0, 0.0])
    assert lrs(dict(type="ConstantScheduler", warmup_steps=1), 3) == pytest.approx([0.5, 1.0, 1.0])
    assert lrs(dict(type="ConstantScheduler"), 3) == [1.0, 1.0, 1.0]


def test_state_dict_round_trip():
    opt = optimizer()
    a = SCHEDULERS.build(dict(type="WarmupCosineScheduler", warmup_steps=2, decay_steps=5), opt)
    for _ in range(3):
        opt.step()
        a.step()
    b = SCHEDULERS.build(dict(type="WarmupCosineScheduler", warmup_steps=2, decay_steps=5), optimizer())
    b.load_state_dict(a.state_dict())
    assert b.last_epoch == 3 and b.get_last_lr() == a.get_last_lr()


def test_the_schedules_that_end_at_max_steps():
    args = dict(epoch_size=5, max_epochs=2, max_steps=10)
    linear = lrs(dict(type="LinearScheduler", end_value=0.1), 11, **args)
    assert linear[:2] == [1.0, 1.0] and linear[10] == pytest.approx(0.1)  # steps 0 and 1 at start_value
    assert linear[4] == pytest.approx(1 - 0.9 * 3 / 9)
    poly = lrs(dict(type="PolyScheduler", power=2), 11, **args)
    assert poly[4] == pytest.approx((1 - 3 / 9) ** 2) and poly[10] == pytest.approx(0.0)
    poly2 = lrs(dict(type="PolyScheduler", power=2, method=2), 11, **args)
    assert poly2[4] == pytest.approx(1 - (3 / 9) ** 2)
    cosine = lrs(dict(type="CosineScheduler", weight=0.5), 11, **args)
    assert cosine[4] == pytest.approx(0.25 * (1 + math.cos(math.pi * 3 / 9)))


def test_cycle_step_and_func():
    cycle = lrs(dict(type="CycleScheduler", step_size=3, end_value=1.0, start_value=0.0), 10, max_steps=10)
    assert cycle == pytest.approx([0.0, 0.0, 0.5, 1.0, 0.5, 0.0, 0.5, 1.0, 0.5, 0.0])
    halving = lrs(dict(type="CycleScheduler", mode="triangular2", step_epoch=1, end_value=1.0, start_value=0.0),
                  8, epoch_size=3, max_steps=10)
    assert halving[3] == 1.0 and halving[7] == pytest.approx(0.5)  # the second peak is half the first
    step = lrs(dict(type="StepScheduler", step_factor=0.5, step_epoch_list=[1, 2]), 12, epoch_size=4, max_steps=12)
    assert step == pytest.approx([1] * 5 + [0.5] * 4 + [0.25] * 3)  # a milestone s counts from step s + 1
    func = lrs(dict(type="FuncScheduler", func="tests.test_schedulers.quarter"), 3, max_steps=3)
    assert func == [0.75, 0.75, 0.75]


def quarter(scheduler, num_update):
    return 0.75, 0.0


def test_build_scheduler_call_forms():
    opt = optimizer(0.5)
    sched = build_scheduler("LinearScheduler", opt, epoch_size=4, max_epochs=1, max_steps=4)
    assert isinstance(sched, torch.optim.lr_scheduler.LambdaLR) and sched.get_last_lr() == [0.5]
    assert build_scheduler(dict(type="CosineScheduler", end_value=0.2), optimizer=optimizer(), epoch_size=2,
                           max_epochs=1, max_steps=2).lr_lambdas[0].__self__.end_value == 0.2
    assert build_scheduler(None, optimizer()) is None
    with pytest.raises(RegistryError, match="'max_steps' is given both"):
        build_scheduler(dict(type="LinearScheduler", max_steps=3), optimizer(), max_steps=4)
    with pytest.raises(RegistryError, match="did you mean 'CosineScheduler'"):
        build_scheduler("CosineSchedular", optimizer())
    torch_sched = SCHEDULERS.build(dict(type="torch.optim.lr_scheduler.StepLR", step_size=2), optimizer())
    assert isinstance(torch_sched, torch.optim.lr_scheduler.StepLR)


def test_errors_name_what_is_missing():
    with pytest.raises(ValueError, match="LinearScheduler needs max_steps"):
        lrs(dict(type="LinearScheduler"), 3)
    with pytest.raises(ValueError, match="step 4 is outside 0..3"):
        lrs(dict(type="ConstantScheduler"), 6, max_steps=3)
    with pytest.raises(ValueError, match="needs step_size > 0 or step_epoch > 0"):
        SCHEDULERS.build(dict(type="CycleScheduler"))


def test_a_subclass_in_gigatrain_form():
    @SCHEDULERS.register("HalfScheduler")
    class Half(BaseScheduler):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)

        def get_factor(self, num_update):
            return 0.5, 0.5

    try:
        assert lrs(dict(type="HalfScheduler", end_value=0.5), 2, epoch_size=1, max_epochs=2, max_steps=2) == [0.75] * 2
    finally:
        del SCHEDULERS["HalfScheduler"]


def test_lr_per_step_equals_gigatrain():
    ref, ours = compare_with_reference("scheduler_lrs.py")
    assert len(ref["lrs"]) == len(ours["lrs"]) == 16
    for i, (a, b) in enumerate(zip(ref["lrs"], ours["lrs"])):
        assert a == b, f"case {i}: first difference at step {next(k for k, (x, y) in enumerate(zip(a, b)) if x != y)}"
