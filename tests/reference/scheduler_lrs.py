"""lr per optimizer step for a list of scheduler cases, through `giga_train.build_scheduler`.

Run by whichever interpreter is given, so the same file measures GigaTrain 1.1.0 (in its own venv)
and us: `python tests/reference/scheduler_lrs.py < cases.json` prints
{"version": ..., "lrs": [[[lr of each param group] per step] per case]}. The cases are CASES below
unless a JSON list comes on stdin. A case: the scheduler config, epoch_size, max_epochs, max_steps."""
import json
import sys


def half_linear(scheduler, num_update):
    """A FuncScheduler function: the linear schedule at half speed."""
    end = min(num_update / (2 * scheduler.max_steps), 1.0)
    return 1 - end, end


CASES = [
    dict(cfg=dict(type="ConstantScheduler"), max_steps=12),
    dict(cfg=dict(type="LinearScheduler", end_value=0.1), max_steps=20),
    dict(cfg=dict(type="LinearScheduler", start_value=2.0, end_value=0.5), max_steps=7),
    dict(cfg=dict(type="PolyScheduler", end_value=0.01), max_steps=25),
    dict(cfg=dict(type="PolyScheduler", power=3, method=2, end_value=0.2), max_steps=25),
    dict(cfg=dict(type="CosineScheduler", end_value=0.05), max_steps=33),
    dict(cfg=dict(type="CosineScheduler", weight=0.8), max_steps=10),
    dict(cfg=dict(type="WarmupCosineScheduler", warmup_steps=4, decay_steps=10, end_value=0.1), max_steps=20),
    dict(cfg=dict(type="WarmupCosineScheduler", warmup_steps=0, decay_steps=15), max_steps=15),
    dict(cfg=dict(type="WarmupCosineScheduler", warmup_steps=1000, decay_steps=30000, end_value=0.1),
         max_steps=30000),
    dict(cfg=dict(type="CycleScheduler", step_size=5, end_value=0.1), max_steps=30),
    dict(cfg=dict(type="CycleScheduler", mode="triangular2", step_epoch=1, start_value=0.2, end_value=1.0),
         epoch_size=6, max_steps=40),
    dict(cfg=dict(type="CycleScheduler", mode="exp_range", gamma=0.9, step_size=4), max_steps=20),
    dict(cfg=dict(type="StepScheduler", step_size_list=[3, 7]), max_steps=12),
    dict(cfg=dict(type="StepScheduler", step_factor=0.5, step_epoch_list=[1, 2]), epoch_size=5, max_epochs=4,
         max_steps=20),
    dict(cfg=dict(type="FuncScheduler"), func="half_linear", max_steps=10),
]


def run(cases):
    import torch
    from giga_train import build_scheduler

    out = []
    for case in cases:
        cfg = dict(case["cfg"])
        if "func" in case:
            cfg["func"] = globals()[case["func"]]
        params = [torch.zeros(1, requires_grad=True), torch.zeros(1, requires_grad=True)]
        optimizer = torch.optim.SGD([dict(params=params[:1], lr=0.1), dict(params=params[1:], lr=0.03)], lr=0.1)
        max_steps = case["max_steps"]
        scheduler = build_scheduler(cfg, optimizer=optimizer, epoch_size=case.get("epoch_size", max_steps),
                                    max_epochs=case.get("max_epochs", 1), max_steps=max_steps)
        lrs = []
        for _ in range(max_steps):
            lrs.append([group["lr"] for group in optimizer.param_groups])
            optimizer.step()
            scheduler.step()
        lrs.append(list(scheduler.get_last_lr()))
        out.append(lrs)
    return out


if __name__ == "__main__":
    text = sys.stdin.read() if not sys.stdin.isatty() else ""
    cases = json.loads(text) if text.strip() else CASES
    import giga_train
    json.dump(dict(version=giga_train.__version__, file=giga_train.__file__, lrs=run(cases)), sys.stdout)
