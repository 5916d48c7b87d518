"""train.profile's traces cover the chosen steps and no others; one step's FLOPs counted by the trainer equal
the analytic count of a small MLP; MFU and tokens/s follow from them; bad profile keys are refused."""
import json

import pytest
import torch
from torch import nn

from giga_train import Trainer, launch_from_config, load_config
from giga_train.errors import ConfigError
from giga_train.schema import validate_config
from giga_train.tracking import StepProfiler
from tests.tiny import tiny_config

D_IN, HIDDEN, BATCH, ACCUMULATE = 32, 64, 4, 2
PROFILE_OPTIONS = dict(skip_first=0, wait=1, warmup=1, active=2, repeat=1, record_shapes=False, profile_memory=False,
                       with_stack=False, with_flops=False)


class MLPTrainer(Trainer):
    """Linear(D_IN, HIDDEN) -> ReLU -> Linear(HIDDEN, 1) on features made from the sample index; each
    micro-batch is marked in the profiler as the (1-based) step it belongs to."""

    def get_models(self, model_config):
        return nn.Sequential(nn.Linear(D_IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1))

    def forward_step(self, batch_dict):
        with torch.profiler.record_function(f"giga_test_step_{self.step + 1}"):
            x = batch_dict["index"].float()[:, None].expand(-1, D_IN) / 64
            return self.model(x).pow(2).mean()


def mlp_config(project, **train):
    cfg = tiny_config(project, runner="tests.test_profiling.MLPTrainer",
                      **dict(dict(max_steps=6, log_interval=3, log_with="jsonl", gradient_accumulation_steps=ACCUMULATE),
                             **train))
    cfg["dataloaders"]["train"].update(data_or_config=dict(_class_name="CountingDataset", size=64),
                                       batch_size_per_gpu=BATCH)
    cfg["models"], cfg["schedulers"] = {}, dict(type="ConstantScheduler")
    return cfg


def analytic_flops_per_sample():
    """2 FLOPs a multiply-add. Forward: both matmuls. Backward: both weight gradients, and the input gradient
    of the second layer only (the first layer's input needs none)."""
    forward = 2 * (D_IN * HIDDEN + HIDDEN * 1)
    return forward + forward + 2 * HIDDEN * 1


def rows(project):
    return [json.loads(line) for line in (project / "logs" / "metrics.jsonl").read_text().splitlines()][1:]


def test_counted_flops_give_mfu_and_tokens_and_the_trace_covers_the_chosen_steps(tmp_path):
    peak = 1e9
    trainer = launch_from_config(mlp_config(tmp_path, count_flops=True, tokens_per_sample=10, peak_flops=peak,
                                            profile=dict(wait=2, warmup=1, active=2)))
    assert trainer.run_log.perf.flops_per_sample == analytic_flops_per_sample()  # counted over 2 micro-batches of 4
    for row in rows(tmp_path):
        assert row["tokens_per_sec"] == pytest.approx(10 * row["samples_per_sec"], rel=1e-9)
        achieved = row["samples_per_sec"] * analytic_flops_per_sample()
        assert row["tflops_per_device"] == pytest.approx(achieved / 1e12, rel=1e-9)
        assert row["mfu"] == pytest.approx(achieved / peak, rel=1e-9)
    # wait 2, warm-up 1, active 2: steps 4 and 5 of the 6, in one file, and no other step's work
    traces = sorted((tmp_path / "logs" / "profile").iterdir())
    assert [p.name for p in traces] == ["rank0_steps4-5.pt.trace.json"]
    names = {e.get("name", "") for e in json.loads(traces[0].read_text())["traceEvents"]}
    assert {n for n in names if n.startswith("giga_test_step_")} == {"giga_test_step_4", "giga_test_step_5"}
    assert any(n.startswith("aten::addmm") or n == "aten::mm" for n in names)


def test_given_flops_per_sample_and_no_mfu_without_a_peak(tmp_path):
    launch_from_config(mlp_config(tmp_path, flops_per_sample=1e6))
    for row in rows(tmp_path):
        assert row["tflops_per_device"] == pytest.approx(row["samples_per_sec"] * 1e6 / 1e12, rel=1e-9)
        assert "mfu" not in row and "tokens_per_sec" not in row  # CPU: no peak in the table, none given
        assert row["peak_rss_gb"] > 0
    assert not (tmp_path / "logs" / "profile").exists()


def test_profiler_windows_are_numbered_as_the_trainer_steps(tmp_path):
    """A run resumed at step 100, two windows of (wait 1, warm-up 1, active 2) after skip_first 1; the second
    is cut short by the end of the run and still written, for the step it recorded."""
    for steps, expected in ((10, ["rank3_steps104-105", "rank3_steps108-109"]), (8, ["rank3_steps104-105",
                                                                                      "rank3_steps108-108"]),
                            (3, [])):
        folder = tmp_path / str(steps)
        profiler = StepProfiler(dict(PROFILE_OPTIONS, skip_first=1, repeat=2), str(folder), 3, torch.device("cpu"),
                                start_step=100)
        for step in range(101, 101 + steps):
            with torch.profiler.record_function(f"giga_test_step_{step}"):
                torch.ones(4, 4) @ torch.ones(4, 4)
            profiler.step()
        profiler.close()
        written = sorted(p.name for p in (folder / "profile").iterdir()) if (folder / "profile").exists() else []
        assert written == [f"{name}.pt.trace.json" for name in expected]
        for name in expected:
            first, last = map(int, name.split("steps")[1].split("-"))
            events = json.loads((folder / "profile" / f"{name}.pt.trace.json").read_text())["traceEvents"]
            marks = {e["name"] for e in events if e.get("name", "").startswith("giga_test_step_")}
            assert marks == {f"giga_test_step_{s}" for s in range(first, last + 1)}


@pytest.mark.parametrize("train, message", [
    (dict(profile=dict(activ=3)), "train.profile.activ: unknown key; did you mean 'active'"),
    (dict(profile=dict(active=0)), "train.profile.active: must be >= 1"),
    (dict(profile=dict(wait="2")), "train.profile.wait: expected an integer"),
    (dict(count_flops=True, flops_per_sample=1e9), "count_flops and flops_per_sample both given"),
    (dict(peak_flop=1e12), "train.peak_flop: unknown key; did you mean 'peak_flops'"),
])
def test_bad_profile_and_flops_keys_are_refused(tmp_path, train, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(load_config(tiny_config(tmp_path, **train)))
