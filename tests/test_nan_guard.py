"""NaN/Inf guard: a non-finite step is skipped on every rank (or stops the run without saving), and a
skipping run equals one that never saw those batches. With an optimizer that honours `found_inf` the skip
is decided on the device and settled on the host later: the same weights, state, lr and counts."""
import os
import subprocess
import sys

import pytest
import torch

from giga_train import ConfigError, launch_from_config
from giga_train.checkpoint import list_checkpoints, read_weights
from giga_train.optimizers.found_inf import supports_found_inf
from giga_train.optimizers import FusedAdam
from giga_train.trainers import nan_guard
from giga_train.errors import TrainingStopped
from tests.distributed import job
from tests.tiny import late_flags, tiny_config


def weights(project, step, member="model"):
    path = dict(list_checkpoints(os.path.join(str(project), "models")))[step]
    return read_weights(path, ema=member == "model_ema")


def assert_equal(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def config(project, runner, optimizer=None, **train):
    cfg = tiny_config(project, runner=f"tests.tiny.{runner}", **dict(dict(
        max_steps=8, checkpoint_interval=1, max_grad_norm=1.0, with_ema=True, ema_decay=0.9, log_interval=1,
        log_with="none"), **train))
    cfg["models"]["dropout"] = 0.0  # a skipped forward must not shift the RNG of the later ones
    if optimizer is not None:
        cfg["optimizers"] = dict(optimizer, lr=3e-3, weight_decay=0.01)
    return cfg


# Optimizers that skip on the device (found_inf), each with the same math skipped by the host instead.
DEVICE_SKIP = {"AdamW-fused": (dict(type="AdamW", fused=True), dict(type="tests.tiny.HostPathAdamW", fused=True)),
               "FusedAdam": (dict(type="FusedAdam"), dict(type="tests.tiny.HostPathFusedAdam"))}


def test_skip_equals_a_run_without_those_batches(tmp_path, monkeypatch):
    monkeypatch.setenv("GT_NAN", "3,4")
    nan_run = launch_from_config(config(tmp_path / "nan", "NanTrainer"))
    assert nan_run.step == 8
    for member in ("model", "model_ema"):  # the skipped steps left weights and EMA as they were
        assert_equal(weights(tmp_path / "nan", 2, member), weights(tmp_path / "nan", 4, member))
    assert not torch.equal(weights(tmp_path / "nan", 4)["head.weight"], weights(tmp_path / "nan", 5)["head.weight"])
    dropped = launch_from_config(config(tmp_path / "dropped", "BatchDroppingTrainer", max_steps=6))
    for member in ("model", "model_ema"):  # optimizer state and lr schedule untouched by the skips
        assert_equal(weights(tmp_path / "nan", 8, member), weights(tmp_path / "dropped", 6, member))
    assert nan_run.scheduler.last_epoch == dropped.scheduler.last_epoch == 6
    text = (tmp_path / "nan" / "logs" / "train.log").read_text()
    assert "step 3: non-finite loss and grad_norm; skipped the update (1 in a row" in text
    assert "step 4 | total_loss nan" not in text and "nan_skipped 1" in text


@pytest.mark.parametrize("optimizer", [None, DEVICE_SKIP["FusedAdam"][0]], ids=["host", "device"])
def test_stop_policy_and_max_nan_steps_stop_without_saving(tmp_path, monkeypatch, optimizer):
    monkeypatch.setenv("GT_NAN", "5")
    cfg = config(tmp_path / "stop", "NanTrainer", optimizer, checkpoint_interval=2, nan_policy="stop")
    with pytest.raises(TrainingStopped, match=r"^step 5: non-finite loss and grad_norm \(train.nan_policy='stop'\);"
                       r" stopped, nothing saved; newest good checkpoint: .*checkpoint_epoch_1_step_4$"):
        launch_from_config(cfg)
    assert [s for s, _ in list_checkpoints(str(tmp_path / "stop" / "models"))] == [2, 4]
    assert not [n for n in os.listdir(tmp_path / "stop" / "models") if n.startswith(".tmp")]
    assert all(torch.isfinite(v).all() for v in weights(tmp_path / "stop", 4).values())

    monkeypatch.setenv("GT_NAN", "3,4,5,6")
    cfg = config(tmp_path / "row", "NanTrainer", optimizer, checkpoint_interval=2, max_nan_steps=3)
    with pytest.raises(TrainingStopped, match=r"step 5: .* for 3 steps in a row \(train.max_nan_steps=3\)"):
        launch_from_config(cfg)
    assert [s for s, _ in list_checkpoints(str(tmp_path / "row" / "models"))] == [2, 4]  # 4: a good (skipped) state


def test_nan_policy_is_validated(tmp_path):
    with pytest.raises(ConfigError, match=r"train.nan_policy: 'skp' is not one of .*did you mean 'skip'"):
        launch_from_config(tiny_config(tmp_path, nan_policy="skp"))


def test_two_ranks_one_sees_nan_both_skip_then_stop_is_one_line_exit_1(tmp_path):
    env = {**os.environ, "GT_NAN": "3", "GT_NAN_RANK": "1"}
    cfg = job(tmp_path / "skip", "DDP", ranks=2, checkpoint_interval=1, max_steps=4)
    cfg["runners"] = ["tests.tiny.NanTrainer"]
    cfg_file = tmp_path / "skip.py"
    cfg_file.write_text(f"config = {cfg!r}\n")
    run = subprocess.run([sys.executable, "-m", "giga_train", "train", str(cfg_file)], env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert_equal(weights(tmp_path / "skip", 2), weights(tmp_path / "skip", 3))  # rank 0 skipped too
    assert not torch.equal(weights(tmp_path / "skip", 3)["head.weight"], weights(tmp_path / "skip", 4)["head.weight"])

    cfg = job(tmp_path / "stop", "DDP", ranks=2, checkpoint_interval=2, max_steps=4, nan_policy="stop",
              launch=dict(max_restarts=2))
    cfg["runners"] = ["tests.tiny.NanTrainer"]
    cfg_file = tmp_path / "stop.py"
    cfg_file.write_text(f"config = {cfg!r}\n")
    run = subprocess.run([sys.executable, "-m", "giga_train", "train", str(cfg_file)], env=env,
                         capture_output=True, text=True)
    assert run.returncode == 1, run.stderr[-3000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("giga-train: error: step 3: non-finite loss") and last.endswith("step_2"), last
    log = (tmp_path / "stop" / "logs" / "train.log").read_text()
    assert log.count("training CharLM from step") == 1, "a stop must not be retried by the agent"
    assert [s for s, _ in list_checkpoints(str(tmp_path / "stop" / "models"))] == [2]


@pytest.mark.parametrize("stage", [2, 0])
def test_deepspeed_skips_where_the_engine_can_else_stops(tmp_path, monkeypatch, stage):
    """ZeRO-1/2/3 skip a non-finite gradient norm themselves (read back through was_step_applied);
    ZeRO-0 in fp32 applies it, so the run stops before saving the NaN state."""
    monkeypatch.setenv("GT_NAN", "3")
    cfg = job(tmp_path, "DEEPSPEED", ranks=2, max_steps=4, checkpoint_interval=1,
              launch=dict(deepspeed_config=dict(deepspeed_config_file=f"zero{stage}.json")))
    cfg["runners"] = ["tests.tiny.NanTrainer"]
    if stage == 0:
        with pytest.raises(TrainingStopped, match="step 3: non-finite loss, and the engine had already applied"):
            launch_from_config(cfg)
        assert [s for s, _ in list_checkpoints(str(tmp_path / "models"))] == [1, 2]
        return
    assert launch_from_config(cfg)["step"] == 4
    assert_equal(weights(tmp_path, 2), weights(tmp_path, 3))


# -- the device-side skip (found_inf) -----------------------------------------------------------------
def _opt_state(optimizer):
    return {k: {n: v.clone() if torch.is_tensor(v) else v for n, v in s.items()}
            for k, s in optimizer.state_dict()["state"].items()}


@pytest.mark.parametrize("make,dtype", [
    (lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, fused=True), torch.float32),
    (lambda ps: FusedAdam(ps, lr=1e-2, weight_decay=0.1), torch.float32),
    (lambda ps: FusedAdam(ps, lr=1e-2, weight_decay=0.1, adam_w_mode=False), torch.float32),
    (lambda ps: FusedAdam(ps, lr=1e-2, master_weights=True), torch.bfloat16)],
    ids=["AdamW-fused", "FusedAdam", "FusedAdam-L2", "FusedAdam-master-bf16"])
def test_found_inf_leaves_parameters_and_all_state_untouched(make, dtype):
    gen = torch.Generator().manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(s, generator=gen).to(dtype)) for s in [(7, 5), (5,)]]
    optimizer = make(ps)
    for flag in (None, 0.0, 1.0, 1.0, 0.0):  # a skip after two steps, and another in a row
        before = ([p.detach().clone() for p in ps], _opt_state(optimizer))
        for p in ps:
            p.grad = torch.full_like(p, float("nan")) if flag else torch.randn(p.shape, generator=gen).to(dtype)
        if flag is not None:
            optimizer.found_inf = torch.tensor(flag)
        optimizer.step()
        optimizer.__dict__.pop("found_inf", None)
        if flag:
            assert all(torch.equal(a, b) for a, b in zip(before[0], ps))
            after = _opt_state(optimizer)
            assert after.keys() == before[1].keys()
            for k in after:
                assert all(torch.equal(after[k][n], before[1][k][n]) for n in after[k]), (k, after[k]["step"])
        else:
            assert all(torch.isfinite(p).all() for p in ps) and not torch.equal(before[0][0], ps[0])
    assert all(float(s["step"]) == 3 for s in optimizer.state.values())
    if dtype == torch.bfloat16:
        assert all(s["master_param"].dtype == torch.float32 for s in optimizer.state.values())


def test_found_inf_is_the_step_without_it_when_zero_and_fused_adam_skips_on_any_positive_value():
    gen = torch.Generator().manual_seed(0)
    a = [torch.nn.Parameter(torch.randn(9, generator=gen))]
    b = [torch.nn.Parameter(a[0].detach().clone())]
    oa, ob = FusedAdam(a, lr=1e-2), FusedAdam(b, lr=1e-2)
    for _ in range(3):
        a[0].grad = torch.randn(9, generator=gen)
        b[0].grad = a[0].grad.clone()
        oa.step()
        ob.found_inf = torch.zeros(1)  # a 1-element flag works as well as a 0-dim one
        ob.step()
        del ob.found_inf
    assert torch.equal(a[0], b[0]) and torch.equal(oa.state[a[0]]["exp_avg_sq"], ob.state[b[0]]["exp_avg_sq"])
    b[0].grad = torch.randn(9, generator=gen)
    ob.found_inf = torch.tensor(0.5)
    ob.step()
    assert torch.equal(a[0], b[0]) and float(ob.state[b[0]]["step"]) == 3


def test_which_optimizers_skip_on_the_device():
    ps = [torch.nn.Parameter(torch.zeros(2))]
    assert supports_found_inf(torch.optim.AdamW(ps, fused=True))
    assert supports_found_inf(torch.optim.Adam(ps, fused=True))
    assert supports_found_inf(FusedAdam(ps))
    assert not supports_found_inf(torch.optim.AdamW(ps)) and not supports_found_inf(torch.optim.SGD(ps, lr=1.0))
    assert not hasattr(FusedAdam(ps), "_step_supports_amp_scaling")  # GradScaler must not hand it grad_scale


def _final(trainer):
    return dict(weights={k: v.clone() for k, v in trainer.unwrapped_model.state_dict().items()},
                ema=[s.clone() for s in trainer.ema.shadow], state=_opt_state(trainer.optimizer),
                lr=trainer.scheduler.get_last_lr(), group_lr=[g["lr"] for g in trainer.optimizer.param_groups],
                last_epoch=trainer.scheduler.last_epoch, step=trainer.step)


def _assert_same_final(a, b):
    assert_equal(a["weights"], b["weights"])
    assert all(torch.equal(x, y) for x, y in zip(a["ema"], b["ema"]))
    assert a["state"].keys() == b["state"].keys()
    for k in a["state"]:
        for n, v in a["state"][k].items():
            assert torch.equal(v, b["state"][k][n]), (k, n)
    assert (a["lr"], a["group_lr"], a["last_epoch"], a["step"]) == (b["lr"], b["group_lr"], b["last_epoch"], b["step"])


def _log_lines(project):
    """train.log without timestamps, timings and memory: warnings and the logged scalars."""
    lines = []
    for line in (project / "logs" / "train.log").read_text().splitlines():
        text = line.split(" ", 3)[3]  # after the date, time and level
        if " | " in text or "non-finite" in text:
            lines.append(" | ".join(p for p in text.split(" | ") if not p.startswith(("step_time", "samples_per", "peak_"))))
    return lines


@pytest.mark.parametrize("name", sorted(DEVICE_SKIP))
def test_device_skip_equals_the_host_skip(tmp_path, monkeypatch, name):
    """NaN losses at 3 and 4 and a NaN gradient with a finite loss at 6: skipped on the device, the run
    ends bit-identical to the host's skip with the same kernels (weights, EMA, optimizer state, lr),
    logs the same losses (the skipped ones left out on the device) and the same skip counts."""
    monkeypatch.setenv("GT_NAN", "3,4")
    monkeypatch.setenv("GT_NAN_GRAD", "6")
    device_opt, host_opt = DEVICE_SKIP[name]
    runs = {}
    for path, optimizer in (("device", device_opt), ("host", host_opt)):
        runs[path] = launch_from_config(config(tmp_path / path, "NanTrainer", optimizer, max_steps=9, log_interval=2,
                                               checkpoint_interval=5))
    assert supports_found_inf(runs["device"].optimizer) and not supports_found_inf(runs["host"].optimizer)
    _assert_same_final(_final(runs["device"]), _final(runs["host"]))
    assert runs["device"].scheduler.last_epoch == 6 and all(float(s["step"]) == 6
                                                            for s in runs["device"].optimizer.state.values())
    lines = _log_lines(tmp_path / "device")
    assert lines == _log_lines(tmp_path / "host")
    assert "step 3: non-finite loss and grad_norm; skipped the update (1 in a row, train.max_nan_steps=10)" in lines
    assert "step 6: non-finite grad_norm; skipped the update (1 in a row, train.max_nan_steps=10)" in lines
    window = [line for line in lines if line.startswith("step 4 |")]  # steps 3 and 4: both skipped, no loss
    assert window and window[0].startswith("step 4 | grad_norm nan | lr") and window[0].endswith("nan_skipped 2")
    assert [line for line in lines if line.startswith("step 6 |")][0].startswith("step 6 | total_loss ")
    assert_equal(weights(tmp_path / "device", 5), weights(tmp_path / "host", 5))


def test_device_skip_settled_late_rewinds_the_scheduler(tmp_path, monkeypatch):
    """Flags that reach the host two steps late (a GPU behind the host): once settled, the lr, the step
    counts and the skip count are the host path's; the weights may differ a little (the steps in between
    ran at a later lr), and stay finite."""
    monkeypatch.setenv("GT_NAN", "3,4")
    monkeypatch.setenv("GT_NAN_GRAD", "6")
    device_opt, host_opt = DEVICE_SKIP["FusedAdam"]
    host = _final(launch_from_config(config(tmp_path / "host", "NanTrainer", host_opt, max_steps=9, log_interval=9,
                                            checkpoint_interval=9)))
    monkeypatch.setattr(nan_guard, "StepFlags", late_flags(2))
    late = _final(launch_from_config(config(tmp_path / "late", "NanTrainer", device_opt, max_steps=9, log_interval=9,
                                            checkpoint_interval=9)))
    assert (late["lr"], late["group_lr"], late["last_epoch"]) == (host["lr"], host["group_lr"], host["last_epoch"])
    assert [float(s["step"]) for s in late["state"].values()] == [float(s["step"]) for s in host["state"].values()]
    assert all(torch.isfinite(v).all() for v in late["weights"].values())
    text = (tmp_path / "late" / "logs" / "train.log").read_text()
    assert "nan_skipped 3" in text and text.count("skipped the update") == 3


def test_device_skip_settled_late_still_stops_before_saving(tmp_path, monkeypatch):
    monkeypatch.setattr(nan_guard, "StepFlags", late_flags(2))
    optimizer = DEVICE_SKIP["AdamW-fused"][0]
    monkeypatch.setenv("GT_NAN", "5")  # settled lazily two steps later, at step 7: the stop names both
    cfg = config(tmp_path / "stop", "NanTrainer", optimizer, checkpoint_interval=4, log_interval=10, nan_policy="stop")
    with pytest.raises(TrainingStopped, match=r"^step 5: non-finite loss and grad_norm \(train.nan_policy='stop'\);"
                       r" stopped at step 7, nothing saved; newest good checkpoint: .*checkpoint_epoch_1_step_4$"):
        launch_from_config(cfg)
    assert [s for s, _ in list_checkpoints(str(tmp_path / "stop" / "models"))] == [4]

    monkeypatch.setenv("GT_NAN", "3,4,5,6")  # the checkpoint at 6 settles step 5 first: the third in a row
    cfg = config(tmp_path / "row", "NanTrainer", optimizer, checkpoint_interval=2, log_interval=10, max_nan_steps=3)
    with pytest.raises(TrainingStopped, match=r"^step 5: .* for 3 steps in a row \(train.max_nan_steps=3\); stopped at"
                       r" step 6, nothing saved; newest good checkpoint: .*checkpoint_epoch_1_step_4$"):
        launch_from_config(cfg)
    assert [s for s, _ in list_checkpoints(str(tmp_path / "row" / "models"))] == [2, 4]
    assert all(torch.isfinite(v).all() for v in weights(tmp_path / "row", 4).values())


@pytest.mark.parametrize("strategy,optimizer", [("DDP", DEVICE_SKIP["AdamW-fused"][0]),
                                                ("FSDP", DEVICE_SKIP["FusedAdam"][0])], ids=["DDP", "FSDP2"])
def test_two_ranks_device_skip_one_sees_nan_both_skip(tmp_path, monkeypatch, strategy, optimizer):
    """Only rank 1 sees the NaN; rank 0's flags settle late: both skip on the device (all-reduced flag),
    EMA included; with nan_policy='stop' rank 1's stop is agreed at the step end, and rank 0 (settling
    then) reports it: one line, nothing saved."""
    monkeypatch.setenv("GT_NAN", "3")
    monkeypatch.setenv("GT_NAN_RANK", "1")
    monkeypatch.setenv("GT_SETTLE_LATE", "0:3")
    launch = dict(fsdp_config=dict(fsdp_version=2, fsdp_transformer_layer_cls_to_wrap="Block")) \
        if strategy == "FSDP" else None
    cfg = job(tmp_path / "skip", strategy, ranks=2, launch=launch, checkpoint_interval=1, max_steps=4,
              with_ema=True, ema_decay=0.9)
    cfg.update(runners=["tests.tiny.LateSettleNanTrainer"], optimizers=dict(optimizer, lr=3e-3, weight_decay=0.01))
    assert launch_from_config(cfg)["step"] == 4
    for member in ("model", "model_ema"):  # rank 0 skipped too
        assert_equal(weights(tmp_path / "skip", 2, member), weights(tmp_path / "skip", 3, member))
    assert not torch.equal(weights(tmp_path / "skip", 3)["head.weight"], weights(tmp_path / "skip", 4)["head.weight"])
    assert "step 3: non-finite loss and grad_norm; skipped the update" in (tmp_path / "skip/logs/train.log").read_text()

    cfg = job(tmp_path / "stop", strategy, ranks=2, launch=launch, checkpoint_interval=2, max_steps=6,
              log_interval=10, nan_policy="stop")
    cfg.update(runners=["tests.tiny.LateSettleNanTrainer"], optimizers=dict(optimizer, lr=3e-3, weight_decay=0.01))
    with pytest.raises(TrainingStopped, match=r"^step 3: non-finite loss and grad_norm \(train.nan_policy='stop'\);"
                       r" stopped, nothing saved; newest good checkpoint: .*checkpoint_epoch_1_step_2$"):
        launch_from_config(cfg)
    assert [s for s, _ in list_checkpoints(str(tmp_path / "stop" / "models"))] == [2]


def test_fp16_overflow_skips_are_counted_and_a_run_that_cannot_step_stops(tmp_path, monkeypatch):
    """fp16, the gradients non-finite from step 3 on (the loss finite): each step is the loss scaler's skip,
    counted as skipped (nan_skipped) and not stepping the scheduler; the scale halves from 2**16 each time,
    and the 17th skip in a row takes it below its floor 1: one line, nothing saved past a good checkpoint."""
    monkeypatch.setenv("GT_NAN_GRAD", ",".join(str(s) for s in range(3, 41)))
    cfg = config(tmp_path / "floor", "NanTrainer", max_steps=40, checkpoint_interval=4, mixed_precision="fp16",
                 with_ema=False)
    with pytest.raises(TrainingStopped, match=r"^step 19: fp16 gradients inf or nan in every step since step 3 \(17"
                       r" skipped, no update; the loss scale fell to 0.5, below its floor 1\): nothing trains;"
                       r" stopped, nothing saved; newest good checkpoint: .*checkpoint_epoch_1_step_16$"):
        launch_from_config(cfg)
    assert [s for s, _ in list_checkpoints(str(tmp_path / "floor" / "models"))] == [4, 8, 12, 16]
    assert_equal(weights(tmp_path / "floor", 4), weights(tmp_path / "floor", 16))  # no update after step 2
    text = (tmp_path / "floor" / "logs" / "train.log").read_text()
    assert "step 2 | total_loss" in text and "step 10 | grad_norm nan | lr 0.0012 | nan_skipped 1 |" in text

    monkeypatch.setenv("GT_NAN_GRAD", "3,4,5,6,7,8")
    cfg = config(tmp_path / "row", "NanTrainer", max_steps=8, checkpoint_interval=4, mixed_precision="fp16",
                 with_ema=False, max_overflow_steps=4)
    with pytest.raises(TrainingStopped, match=r"^step 6: .* \(4 skipped, no update; train.max_overflow_steps=4\)"):
        launch_from_config(cfg)

    monkeypatch.setenv("GT_NAN_GRAD", "3,4")  # two skips: the run goes on, the schedule counts 6 updates
    run = launch_from_config(config(tmp_path / "two", "NanTrainer", max_steps=8, mixed_precision="fp16",
                                    with_ema=False))
    assert run.step == 8 and run.scheduler.last_epoch == 6
    assert run.strategy.precision.scaler.get_scale() == 2.0 ** 14
    text = (tmp_path / "two" / "logs" / "train.log").read_text()
    assert "step 3 | grad_norm nan | lr 0.0012 | nan_skipped 1 |" in text and "step 5 | total_loss" in text


def test_max_overflow_steps_is_validated(tmp_path):
    with pytest.raises(ConfigError, match="max_overflow_steps"):
        launch_from_config(config(tmp_path, "NanTrainer", max_overflow_steps=0))
