"""A run of the real GigaTrain 1.1 continued under giga-train (issue 16, items 3 and 4): GigaTrain trains the
tiny client (tests/reference/ref_client) to the end; one of its checkpoint folders (RESUME) is put into a
fresh project of ours, which resumes (train.resume=True, as a job moved over) and trains to the end.

With AdamW (also with EMA and accumulation) the remaining steps are GigaTrain's own: the same samples, the
same lr exactly, losses and final weights within 1e-6 relative (the two venvs run torch 2.14.1 and 2.13.0;
on this CPU they agree to the last bit). With CAME8Bit the two implementations differ in how they keep the
first moment (GigaTrain: min-max 8-bit blocks of rows; ours: signed square-root codes in blocks of
elements), so: the first step (taken with the imported weights) is GigaTrain's, later losses are within
1e-2 relative, and the converted state is GigaTrain's within our code's resolution. Bad folders give one
line naming the file."""
import json
import logging
import os
import pickle
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from giga_train import ModuleDict
from giga_train.tools.convert import read_state
from giga_train.compat.gigatrain_checkpoint import is_gigatrain_checkpoint, read_gigatrain_checkpoint
from giga_train.errors import CheckpointError, ConfigError
from giga_train.optimizers.came_8bit import CAME8Bit
from giga_train.optimizers.group import OptimizerGroup
from giga_train.optimizers.kernels import qmap
from tests.reference import harness
from tests.reference.ref_client.models import Encoder, Head

# ours (a scenario of tests/reference/record.py) -> (the GigaTrain run whose folder it resumes from, that
# folder, the GigaTrain run it must continue). `main` and `epochs_ema` are the session's reference runs.
RESUME = {
    "keep_all": ("main", "checkpoint_epoch_1_step_6", "main"),  # AdamW; keep_all is main without the Tester
    "keep_all_came8bit": ("keep_all_came8bit", "checkpoint_epoch_1_step_3", "keep_all_came8bit"),  # mid-epoch
    "epochs_ema": ("epochs_ema", "checkpoint_epoch_2_step_5", "epochs_ema"),  # EMA, accumulation 2, mid-epoch
}
SCENARIOS = tuple(RESUME)


@pytest.fixture(scope="module")
def runs(reference_docs, reference_workdir, tmp_path_factory):
    """{ours: (GigaTrain's uninterrupted run, ours resumed from GigaTrain's folder, GigaTrain's work folder
    (its projects), ours)}."""
    came_work, our_work = tmp_path_factory.mktemp("gigatrain-came8bit"), tmp_path_factory.mktemp("migrate-ours")
    refs = dict(reference_docs, keep_all_came8bit=harness.record("keep_all_came8bit", came_work))
    works = dict.fromkeys(reference_docs, reference_workdir) | dict(keep_all_came8bit=came_work)

    def resumed(ours):
        source, folder, _ = RESUME[ours]
        return harness.record(ours, our_work, python=sys.executable,
                              resume_from=checkpoint(works[source], source, folder))

    with ThreadPoolExecutor(max_workers=2) as pool:
        mine = dict(zip(SCENARIOS, pool.map(resumed, SCENARIOS)))
    return {s: (refs[RESUME[s][2]], mine[s], works[RESUME[s][0]], our_work) for s in SCENARIOS}


def checkpoint(work, scenario, name):
    return os.path.join(str(work), scenario, "project", "models", name)


def steps(doc):
    return {s["step"]: s for s in harness.trainer_run(doc)["steps"]}


def losses(step):
    return [mb["total_loss"] for mb in step["micro_batches"]]


def close(a, b, rtol):
    return all(abs(x - y) <= rtol * abs(x) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_resumed_run_takes_gigatrains_steps(runs, scenario):
    ref, ours, _, _ = runs[scenario]
    expected, got = steps(ref), steps(ours)
    first = int(RESUME[scenario][1].rsplit("_", 1)[1]) + 1
    assert sorted(got) == list(range(first, max(expected) + 1))  # continued from the checkpoint's step
    for step, mine in got.items():
        theirs = expected[step]
        assert mine["lr"] == theirs["lr"] and mine["last_lr"] == theirs["last_lr"], step  # scheduler: exact
        assert [mb["indices"] for mb in mine["micro_batches"]] == \
            [mb["indices"] for mb in theirs["micro_batches"]], step  # the data position the step gives
    assert close(losses(expected[first]), losses(got[first]), 1e-6)  # the imported weights, exactly
    rtol = 1e-2 if scenario == "keep_all_came8bit" else 1e-6
    for step in range(first + 1, max(expected) + 1):
        assert close(losses(expected[step]), losses(got[step]), rtol), (step, losses(expected[step]), losses(got[step]))


def test_adamw_final_weights_are_gigatrains(runs):
    _, _, ref_work, our_work = runs["keep_all"]
    final = "checkpoint_epoch_2_step_8"
    theirs = {f"{member}.{k}": v for member in ("encoder", "head") for k, v in torch.load(
        os.path.join(checkpoint(ref_work, "main", final), member, "diffusion_pytorch_model.bin"),
        weights_only=True).items()}
    mine, _ = read_state(checkpoint(our_work, "keep_all", final))
    assert sorted(mine) == sorted(theirs)
    for name, value in theirs.items():
        torch.testing.assert_close(mine[name], value, rtol=1e-6, atol=0)


def client_model():
    torch.manual_seed(0)
    return ModuleDict(dict(encoder=Encoder(in_dim=4, hidden=8), head=Head(hidden=8)))


def layout(model, optimizer):
    names = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    return names, optimizer.param_groups


def test_came8bit_state_is_gigatrains_within_our_code_resolution(runs):
    _, _, ref_work, _ = runs["keep_all_came8bit"]
    folder = checkpoint(ref_work, "keep_all_came8bit", RESUME["keep_all_came8bit"][1])
    model = client_model()
    ours = CAME8Bit(model.parameters(), lr=0.01, weight_decay=0.01, min_8bit_size=16)
    state = read_gigatrain_checkpoint(folder, layout(model, ours), [ours], members=["encoder", "head"])
    saved = torch.load(os.path.join(folder, "optimizer.bin"), weights_only=True)
    assert state.training_state["step"] == 3 and state.training_state["data"] is None
    assert [g["lr"] for g in state.optimizer["param_groups"]] == [g["lr"] for g in saved["param_groups"]]
    for index, (name, _) in enumerate(layout(model, ours)[0]):
        theirs, mine = saved["state"][index], state.optimizer["state"][name]
        assert float(mine["step"]) == theirs["step"] == 3
        for key in ("exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_res_row", "exp_avg_res_col", "exp_avg_sq"):
            if key in theirs:
                assert torch.equal(mine[key], theirs[key].float()), (name, key)  # fp32 in both: copied
        if isinstance(theirs["exp_avg"], list):  # GigaTrain's 8-bit blocks -> our codes
            assert name == "encoder.proj.weight" and "exp_avg_codes" in mine
            decoded = torch.cat([b["data"].float() * b["scale"] + b["min"] for b in theirs["exp_avg"]]).reshape(-1)
            ours_decoded = qmap.dequantize_blockwise(mine["exp_avg_codes"].reshape(-1), mine["exp_avg_scales"],
                                                     ours.block_size)
            # half the widest gap of our map (codes k*|k|/127^2 of the block's absmax), at k = 127
            bound = decoded.abs().max() * (2 * 127 - 1) / (2 * 127 ** 2)
            assert 0 < (ours_decoded - decoded).abs().max() <= bound * (1 + 1e-6)
        else:
            assert torch.equal(mine["exp_avg"], theirs["exp_avg"]), name


def fake_gigatrain_folder(folder):
    """A folder as Accelerate's save_state writes it for GigaTrain's Trainer with one optimizer per model
    (torch.save of each optimizer's and scheduler's state_dict, the trainer's {"step"})."""
    from safetensors.torch import save_file
    model = client_model()
    optimizers = [torch.optim.AdamW(model[m].parameters(), lr=0.01) for m in ("encoder", "head")]
    schedulers = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0 / (1 + s)) for o in optimizers]
    for _ in range(2):
        model("head", model("encoder", torch.randn(3, 4))).square().mean().backward()
        for optimizer, scheduler in zip(optimizers, schedulers):
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
    os.makedirs(folder)
    for member in ("encoder", "head"):
        os.makedirs(os.path.join(folder, member))
        save_file(model[member].state_dict(), os.path.join(folder, member, "diffusion_pytorch_model.safetensors"))
    for i, (optimizer, scheduler) in enumerate(zip(optimizers, schedulers)):
        torch.save(optimizer.state_dict(), os.path.join(folder, "optimizer.bin" if i == 0 else f"optimizer_{i}.bin"))
        torch.save(scheduler.state_dict(), os.path.join(folder, "scheduler.bin" if i == 0 else f"scheduler_{i}.bin"))
    torch.save({"step": 2}, os.path.join(folder, "custom_checkpoint_0.pkl"))
    return model, optimizers


def test_several_optimizers_map_to_parameter_names_in_order(tmp_path):
    folder = str(tmp_path / "checkpoint_epoch_1_step_2")
    saved_model, saved = fake_gigatrain_folder(folder)
    assert is_gigatrain_checkpoint(folder)
    model = client_model()
    group = OptimizerGroup([torch.optim.AdamW(model[m].parameters(), lr=0.01) for m in ("encoder", "head")])
    state = read_gigatrain_checkpoint(folder, layout(model, group), group.optimizers, members=["encoder", "head"],
                                      data_position=lambda step: dict(step_seen=step))
    assert state.training_state["step"] == 2 and state.training_state["data"] == dict(step_seen=2)
    assert [s["last_epoch"] for s in state.training_state["schedulers"]] == [2, 2]
    assert [g["params"] for g in state.optimizer["param_groups"]] == \
        [["encoder.proj.weight", "encoder.proj.bias"], ["head.out.weight", "head.out.bias"]]
    named = dict(saved_model.named_parameters())
    for name, mine in state.optimizer["state"].items():
        member = name.split(".")[0]
        original = saved[0 if member == "encoder" else 1].state[named[name]]
        assert all(torch.equal(mine[key], original[key]) for key in ("exp_avg", "exp_avg_sq"))
    assert all(torch.equal(state.weights[k], v) for k, v in saved_model.state_dict().items())
    assert state.rng is None and state.ema_weights is None  # no random_states_0.pkl, no *_ema/ here
    # the optimizer state as our loader takes it: by name into the engine's optimizer (OptimizerGroup)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
    set_optimizer_state_dict(model, group, state.optimizer, options=StateDictOptions(full_state_dict=True))
    mine = dict(model.named_parameters())
    for name in named:
        member = 0 if name.startswith("encoder") else 1
        assert torch.equal(group.optimizers[member].state[mine[name]]["exp_avg"],
                           saved[member].state[named[name]]["exp_avg"])


class Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return open, (self.marker, "w")


def test_unsafe_or_unreadable_files_give_one_line_naming_the_file(tmp_path, caplog):
    folder = str(tmp_path / "checkpoint_epoch_1_step_2")
    fake_gigatrain_folder(folder)
    model = client_model()
    group = OptimizerGroup([torch.optim.AdamW(model[m].parameters(), lr=0.01) for m in ("encoder", "head")])

    def read():
        return read_gigatrain_checkpoint(folder, layout(model, group), group.optimizers, members=["encoder", "head"])

    marker = str(tmp_path / "ran")
    torch.save({"step": Evil(marker)}, os.path.join(folder, "custom_checkpoint_0.pkl"))
    with pytest.raises(CheckpointError) as info:
        read()
    assert "custom_checkpoint_0.pkl" in str(info.value) and "\n" not in str(info.value) and not os.path.exists(marker)
    torch.save({"step": 2}, os.path.join(folder, "custom_checkpoint_0.pkl"))

    with open(os.path.join(folder, "optimizer_1.bin"), "r+b") as f:
        f.truncate(100)
    with pytest.raises(CheckpointError) as info:
        read()
    assert "optimizer_1.bin" in str(info.value) and "\n" not in str(info.value)
    os.remove(os.path.join(folder, "optimizer_1.bin"))  # one optimizer file for two optimizers: a mismatch
    with pytest.raises(ConfigError) as info:
        read()
    assert "optimizer.bin" in str(info.value) and "get_optimizers" in str(info.value) and "\n" not in str(info.value)
    os.remove(os.path.join(folder, "optimizer.bin"))

    # the RNG file is not worth failing for: refused, it is skipped with one warning naming it
    with open(os.path.join(folder, "random_states_0.pkl"), "wb") as f:
        pickle.dump({"random_state": Evil(marker)}, f)
    with caplog.at_level(logging.WARNING, logger="giga_train"):
        state = read()
    assert state.rng is None and state.optimizer is None and not os.path.exists(marker)
    warned = [r.getMessage() for r in caplog.records if "random_states_0.pkl" in r.getMessage()]
    assert len(warned) == 1 and "\n" not in warned[0] and "not restored" in warned[0]


def test_ema_and_accelerates_root_weights_are_read(runs):
    """GigaTrain with EMA: the live weights are Accelerate's model.safetensors, the average <member>_ema/."""
    from safetensors.torch import load_file
    _, _, ref_work, _ = runs["epochs_ema"]
    folder = checkpoint(ref_work, "epochs_ema", RESUME["epochs_ema"][1])
    model = client_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    state = read_gigatrain_checkpoint(folder, layout(model, optimizer), [optimizer], members=["encoder", "head"])
    live = load_file(os.path.join(folder, "model.safetensors"))
    assert sorted(live) == sorted(state.weights) and all(torch.equal(state.weights[k], v) for k, v in live.items())
    for member in ("encoder", "head"):
        ema = load_file(os.path.join(folder, f"{member}_ema", "diffusion_pytorch_model.safetensors"))
        assert all(torch.equal(state.ema_weights[f"{member}.{k}"], v) for k, v in ema.items())
    assert state.ema_step == json.load(open(os.path.join(folder, "ema_config.json")))["optimization_step"] == 5
    assert state.training_state["step"] == 5 and state.rng is not None  # numpy's state read through the allow-list
    assert not any(torch.equal(state.weights[k], state.ema_weights[k]) for k in state.weights if "weight" in k)


def test_a_resume_path_to_a_gigatrain_folder_continues_it(runs, tmp_path, monkeypatch):
    """`train.resume: <GigaTrain's folder>` in a fresh project (in this process): ours trains steps 7-8 and
    its step-8 weights are GigaTrain's; GigaTrain's folder is left as it was."""
    from giga_train import launch_from_config
    from tests.reference import record
    _, _, ref_work, _ = runs["keep_all"]
    folder = checkpoint(ref_work, "main", RESUME["keep_all"][1])
    before = {name: os.path.getmtime(os.path.join(folder, name)) for name in os.listdir(folder)}
    monkeypatch.syspath_prepend(record.HERE)  # the client's package, as record.py puts it on the path
    cfg = record.base_config(str(tmp_path / "project"))
    cfg["runners"] = cfg["runners"][:1]
    cfg["train"]["resume"] = folder
    trainer = launch_from_config(cfg)
    assert trainer.step == 8 and {n: os.path.getmtime(os.path.join(folder, n)) for n in os.listdir(folder)} == before
    mine, _ = read_state(os.path.join(str(tmp_path), "project", "models", "checkpoint_epoch_2_step_8"))
    theirs = checkpoint(ref_work, "main", "checkpoint_epoch_2_step_8")
    for member in ("encoder", "head"):
        saved = torch.load(os.path.join(theirs, member, "diffusion_pytorch_model.bin"), weights_only=True)
        for k, v in saved.items():
            torch.testing.assert_close(mine[f"{member}.{k}"], v, rtol=1e-6, atol=0)


def test_came8bit_state_of_a_wide_convolution_becomes_our_factors():
    """GigaTrain's CAME8Bit keeps a whole second moment for a 3x3 convolution (its form, as its step writes
    it: step an int, RMS, exp_avg and exp_avg_sq full tensors), ours its row/column factors: they are its
    means, and our optimizer steps on from the converted state."""
    from giga_train.compat.gigatrain_checkpoint import _came_state
    conv = torch.nn.Conv2d(3, 4, 3)
    torch.manual_seed(1)
    theirs = dict(step=5, RMS=torch.tensor(0.2), exp_avg=torch.randn(4, 3, 3, 3) * 1e-2,
                  exp_avg_sq=torch.rand(4, 3, 3, 3) * 1e-4)
    ours = CAME8Bit([conv.weight], lr=0.01)
    state = _came_state(theirs, tuple(conv.weight.shape), (ours.block_size, ours.min_8bit_size), "conv")
    torch.testing.assert_close(state["exp_avg_sq_row"], theirs["exp_avg_sq"].mean(dim=-1), rtol=1e-6, atol=0)
    torch.testing.assert_close(state["exp_avg_sq_col"], theirs["exp_avg_sq"].mean(dim=-2), rtol=1e-6, atol=0)
    assert torch.equal(state["exp_avg"], theirs["exp_avg"]) and float(state["step"]) == 5
    ours.state[conv.weight] = state
    before = conv.weight.detach().clone()
    conv(torch.randn(2, 3, 5, 5)).square().mean().backward()
    ours.step()
    assert float(ours.state[conv.weight]["step"]) == 6 and torch.isfinite(conv.weight).all()
    assert not torch.equal(conv.weight, before)


def test_a_gigatrain_folder_that_does_not_fit_the_model_is_one_line_and_left_as_it_was(tmp_path, monkeypatch):
    """A GigaTrain checkpoint of another model shape (hidden 8 against the config's 16): one line naming the
    folder before any step, as for our own checkpoints, and the folder untouched."""
    from giga_train import launch_from_config
    from tests.reference import record
    folder = str(tmp_path / "moved" / "checkpoint_epoch_1_step_2")
    fake_gigatrain_folder(folder)
    before = {name: os.path.getmtime(os.path.join(folder, name)) for name in os.listdir(folder)}
    monkeypatch.syspath_prepend(record.HERE)
    cfg = record.base_config(str(tmp_path / "project"))
    cfg["runners"] = cfg["runners"][:1]
    cfg["models"]["hidden"] = 16
    cfg["train"]["resume"] = folder
    with pytest.raises(ConfigError) as info:
        launch_from_config(cfg)
    message = str(info.value)
    assert folder in message and "\n" not in message
    assert {n: os.path.getmtime(os.path.join(folder, n)) for n in os.listdir(folder)} == before
