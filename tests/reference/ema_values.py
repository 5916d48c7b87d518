"""EMAModel's averages after a few updates, through `giga_train.EMAModel`, under whichever interpreter
runs this (GigaTrain 1.1.0 in its venv, or ours). Prints {"version", "results": [...]} with, per
case, the averaged state (as lists), the decay per step, and the saved config."""
import json
import math
import sys

CASES = [
    dict(kwargs=dict(decay=0.9), steps=6),
    dict(kwargs=dict(decay=0.999, update_after_step=2, min_decay=0.1), steps=6),
    dict(kwargs=dict(decay=0.99, use_ema_warmup=True, inv_gamma=2.0, power=0.75), steps=5),
]


def state_at(k):
    import torch
    weight = torch.tensor([[math.sin(k + i + 3 * j) for j in range(3)] for i in range(2)], dtype=torch.float32)
    bias = torch.tensor([math.cos(k * 0.7 + i) for i in range(5)], dtype=torch.float32)  # 5: padded over ranks
    half = torch.tensor([0.1 * k, -0.2 * k], dtype=torch.bfloat16)
    return {"weight": weight, "bias": bias, "half": half, "count": torch.tensor(k), "empty": torch.zeros(0)}


def run(cases):
    import torch
    from giga_train import EMAModel

    results = []
    for case in cases:
        ema = EMAModel(**case["kwargs"])
        ema.load_state_dict(state_at(0))
        decays = []
        for k in range(1, case["steps"] + 1):
            decays.append(ema.get_decay(ema.optimization_step + 1))
            ema.step(state_at(k))
        state = ema.state_dict()
        results.append(dict(
            state={n: (v.float().tolist() if isinstance(v, torch.Tensor) else v) for n, v in state.items()},
            dtypes={n: str(v.dtype) for n, v in state.items()}, decays=decays, config=ema.config))
    return results


if __name__ == "__main__":
    text = sys.stdin.read() if not sys.stdin.isatty() else ""
    cases = json.loads(text) if text.strip() else CASES
    import giga_train
    json.dump(dict(version=giga_train.__version__, results=run(cases)), sys.stdout)
