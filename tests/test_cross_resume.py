"""A checkpoint written under one strategy at N ranks resumes under another at M ranks: steps 1-2 there,
steps 3-4 here, and the weights equal one process's 4 uninterrupted steps (fp32, rtol 1e-4)."""
import os
import shutil

import pytest
import torch

from giga_train import launch_from_config
from giga_train.checkpoint import list_checkpoints, read_meta, read_weights
from giga_train.checkpoint.formats.full_state import read_dcp
from tests.distributed import assert_equal_up_to_code_flips, assert_same_weights, final_weights, job, shared_run
from tests.tiny import TinyTrainer

# eps1 1e-8: the key bias of attention gets ~zero gradients, whose CAME update (g / |g|) is noise
CAME = dict(type="CAME8Bit", lr=3e-3, weight_decay=0.01, block_size=16, min_8bit_size=256, eps=(1e-8, 1e-16))
STRATEGIES = {
    "NO": dict(distributed_type="NO"),
    "DDP": dict(distributed_type="DDP"),
    "FSDP2": dict(distributed_type="FSDP", launch=dict(fsdp_config=dict(
        fsdp_version=2, fsdp_transformer_layer_cls_to_wrap="Block"))),
    **{f"ZeRO-{s}": dict(distributed_type="DEEPSPEED", launch=dict(deepspeed_config=dict(
        deepspeed_config_file=f"zero{s}.json"))) for s in (0, 1, 2, 3)},
}
_RUNS = {}


def _job(project, strategy, ranks, optimizer=None, max_steps=4):
    spec = STRATEGIES[strategy]
    cfg = job(project, spec["distributed_type"], ranks=ranks, launch=spec.get("launch"), max_steps=max_steps,
              resume=True)
    if optimizer:
        cfg["optimizers"] = dict(optimizer)
    return cfg


def _run(tmp_path_factory, strategy, ranks, optimizer=None, max_steps=4):
    """The project folder of a run (computed once per module and reused as a source). The plain 4-step runs
    are the strategies' own tests' (tests/distributed.py's shared_run, once per session): a source is then
    their step-2 checkpoint, which a run stopped at step 2 writes the same."""
    if optimizer is None and max_steps == 4:
        spec = STRATEGIES[strategy]
        return shared_run(tmp_path_factory, spec["distributed_type"], ranks, spec.get("launch"))[0]
    key = (strategy, ranks, repr(optimizer), max_steps)
    if key not in _RUNS:
        project = tmp_path_factory.mktemp(f"{strategy}_{ranks}")
        launch_from_config(_job(project, strategy, ranks, optimizer, max_steps))
        _RUNS[key] = project
    return _RUNS[key]


def _resume(tmp_path, source, strategy, ranks, optimizer=None):
    """Copy the source's step-2 checkpoint into a new project and train it to step 4 here."""
    path = _step_2(source)
    shutil.copytree(path, tmp_path / "models" / os.path.basename(path))
    launch_from_config(_job(tmp_path, strategy, ranks, optimizer))
    assert list_checkpoints(str(tmp_path / "models"))[-1][0] == 4
    return final_weights(tmp_path)


def _step_2(project):
    step, path = list_checkpoints(os.path.join(str(project), "models"))[0]
    assert step == 2
    return path


@pytest.mark.parametrize("source,target", [
    (("NO", 1), ("FSDP2", 4)),
    (("FSDP2", 2), ("NO", 1)),
    (("DDP", 2), ("ZeRO-3", 2)),
    (("ZeRO-2", 2), ("FSDP2", 2)),
    (("ZeRO-3", 2), ("DDP", 4)),
    (("ZeRO-1", 2), ("ZeRO-2", 4)),  # DeepSpeed in this process would leave its groups behind
    (("ZeRO-0", 2), ("NO", 1)),
], ids=lambda s: f"{s[0]}x{s[1]}")
def test_resume_under_another_strategy_and_world_size(tmp_path, tmp_path_factory, source, target):
    reference = final_weights(_run(tmp_path_factory, "NO", 1))
    src = _run(tmp_path_factory, *source)
    assert_same_weights(_resume(tmp_path, src, *target), reference)
    meta = read_meta(list_checkpoints(str(tmp_path / "models"))[-1][1])
    assert meta["samples_seen"] == 4 * 8 and meta["world_size"] == target[1]


class ResaveTrainer(TinyTrainer):
    """Resumes, then writes its checkpoint again at once: what it loaded, as it holds it."""
    def train(self):
        self.save_checkpoint()
        return self._finish()


def _full_optimizer_state(project):
    path = list_checkpoints(os.path.join(str(project), "models"))[-1][1]
    return read_dcp(path)["state"]


@pytest.mark.parametrize("target", [("NO", 1), ("FSDP2", 4)], ids=lambda t: f"{t[0]}x{t[1]}")
def test_came8bit_state_survives_resharding_exactly(tmp_path, tmp_path_factory, target):
    """FSDP2 at 2 ranks -> another world size and back to disk: codes, scales and factors bit for bit."""
    src = _run(tmp_path_factory, "FSDP2", 2, CAME, max_steps=2)
    path = list_checkpoints(os.path.join(src, "models"))[-1][1]
    shutil.copytree(path, tmp_path / "models" / os.path.basename(path))
    cfg = _job(tmp_path, *target, optimizer=CAME, max_steps=2)
    cfg["runners"] = ["tests.test_cross_resume.ResaveTrainer"]
    launch_from_config(cfg)
    before, after = _full_optimizer_state(src), _full_optimizer_state(tmp_path)
    assert before.keys() == after.keys()
    codes = 0
    for name, entry in before.items():
        for key, value in entry.items():
            if torch.is_tensor(value):
                assert after[name][key].dtype == value.dtype and torch.equal(after[name][key], value), (name, key)
        codes += "exp_avg_codes" in entry
    assert codes >= 4  # the 8-bit path was exercised


def test_came8bit_trains_on_after_a_cross_resume(tmp_path, tmp_path_factory):
    """FSDP2 at 2 ranks -> one process: the 8-bit run continues as one process's own (up to code flips
    at rounding ties, which the ranks' other reduction order causes)."""
    reference = final_weights(_run(tmp_path_factory, "NO", 1, CAME))
    src = _run(tmp_path_factory, "FSDP2", 2, CAME, max_steps=2)
    assert_equal_up_to_code_flips(_resume(tmp_path, src, "NO", 1, optimizer=CAME), reference, CAME["lr"])


@pytest.mark.parametrize("source", [("FSDP2", 2), ("ZeRO-2", 2), ("ZeRO-0", 2)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_convert_to_full_and_dcp(tmp_path, tmp_path_factory, source):
    from examples.char_lm.model import CharLM
    from giga_train.cli import main
    from tests.tiny import MODEL
    path = _step_2(_run(tmp_path_factory, *source))
    assert main(["convert", path, "--to", "full", "--out", str(tmp_path / "full")]) == 0
    model = CharLM(**dict(MODEL, dropout=0.0))
    from safetensors.torch import load_file
    model.load_state_dict(load_file(tmp_path / "full" / "model.safetensors"))  # strict: every key, right shapes
    reference = read_weights(_step_2(_run(tmp_path_factory, "NO", 1)))
    assert_same_weights(model.state_dict(), reference)
    optimizer = torch.load(tmp_path / "full" / "optimizer.pt", weights_only=True)
    names = {n for n, p in model.named_parameters()}
    assert set(optimizer["state"]) == names and optimizer["param_groups"][0]["lr"] > 0
    assert main(["convert", path, "--to", "dcp", "--out", str(tmp_path / "dcp")]) == 0
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys
    back = _load_state_dict_from_keys(checkpoint_id=str(tmp_path / "dcp"))
    assert torch.equal(back["optimizer"]["state"]["embed.weight"]["exp_avg"],
                       optimizer["state"]["embed.weight"]["exp_avg"])
    assert main(["convert", path, "--to", "full", "--out", str(tmp_path / "full")]) == 2  # never overwrites


def test_bf16_deepspeed_checkpoint_resumes_elsewhere_from_its_fp32_masters(tmp_path):
    """Under bf16 the model folder holds the engine's bf16 weights (GigaTrain's); another strategy resuming
    the checkpoint takes DeepSpeed's fp32 masters (the tied head's too), not their bf16 rounding."""
    from giga_train.checkpoint import read_weights
    from giga_train.tools.convert import read_state
    launch = STRATEGIES["ZeRO-2"]["launch"]
    launch_from_config(job(tmp_path, "DEEPSPEED", launch=launch, max_steps=2, mixed_precision="bf16", resume=True))
    path = list_checkpoints(str(tmp_path / "models"))[-1][1]
    masters, _ = read_state(path)
    assert {v.dtype for v in read_weights(path).values()} == {torch.bfloat16}
    trainer = launch_from_config(job(tmp_path, "NO", max_steps=2, mixed_precision="bf16", resume=True))
    weights = trainer.unwrapped_model.state_dict()
    assert trainer.step == 2 and masters.keys() == weights.keys()
    assert all(torch.equal(weights[k], masters[k]) for k in masters)
    assert any(not torch.equal(v, v.bfloat16().float()) for v in masters.values())  # not bf16-rounded
