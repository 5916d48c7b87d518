"""DeepSpeed ZeRO-0..3 at 2 ranks (gloo) equal one process with the same global batch; resume; bad input."""
import json
import os
import shutil

import pytest

from giga_train import launch_from_config
from giga_train.cli import main
from giga_train.checkpoint import list_checkpoints
from tests.distributed import assert_same_weights, final_weights, job, reference, shared_run

pytest.importorskip("deepspeed")  # an install extra ('.[deepspeed]'); `make test` installs it

CACHE = {}
VARIANT = dict(gradient_accumulation_steps=2, activation_checkpointing=True, activation_class_names=["Block"])


def zero(stage, **extra):
    return dict(deepspeed_config=dict(deepspeed_config_file=f"zero{stage}.json"), **extra)


def zero_run(tmp_path_factory, stage, **train):
    """The 4-step run at 2 ranks of this stage (once per session: the resume test here and
    tests/test_cross_resume.py start from its step 2)."""
    return shared_run(tmp_path_factory, "DEEPSPEED", 2, zero(stage), **train)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("train", [{}, VARIANT], ids=["plain", "accum2_ckpt"])
def test_zero_equals_one_process(tmp_path_factory, stage, train):
    project, result = zero_run(tmp_path_factory, stage, **train)
    assert result["step"] == 4
    assert_same_weights(final_weights(project), reference(tmp_path_factory, CACHE, **train))
    assert os.path.isdir(os.path.join(result["checkpoint"], "deepspeed", "state"))


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_resume_is_exact(tmp_path, tmp_path_factory, stage):
    """The plain run's step-2 checkpoint (a run stopped there wrote the same one), resumed to step 4."""
    source, _ = zero_run(tmp_path_factory, stage)
    step, path = list_checkpoints(os.path.join(source, "models"))[0]
    assert step == 2
    shutil.copytree(path, tmp_path / "models" / os.path.basename(path))
    launch_from_config(job(tmp_path, "DEEPSPEED", ranks=2, launch=zero(stage), resume=True))
    assert [s for s, _ in list_checkpoints(os.path.join(tmp_path, "models"))] == [2, 4]
    assert_same_weights(final_weights(tmp_path), reference(tmp_path_factory, CACHE))


def bad_config(tmp_path, deepspeed_config, **train):
    cfg = job(tmp_path / "run", "DEEPSPEED", ranks=2, launch=dict(deepspeed_config=deepspeed_config), **train)
    path = tmp_path / "cfg.py"
    path.write_text(f"config = {cfg!r}\n")
    return str(path)


def test_deepspeed_bad_input_is_one_line(tmp_path, capsys):
    (tmp_path / "broken.json").write_text("{\"zero_optimization\": ")
    (tmp_path / "explicit.json").write_text(json.dumps({"gradient_accumulation_steps": 4}))
    (tmp_path / "optim.json").write_text(json.dumps({"optimizer": {"type": "Adam"}}))
    cases = [
        (dict(deepspeed_config_file="zero9.json"), "'zero9.json' not found here nor among the shipped configs"
                                                    " (zero0.json, zero1.json, zero2.json, zero3.json)"),
        (dict(deepspeed_config_file=str(tmp_path / "broken.json")), "broken.json:1: invalid JSON"),
        (dict(deepspeed_config_file=str(tmp_path / "explicit.json")),
         "gradient_accumulation_steps=4 conflicts with the train config's 1"),
        (dict(deepspeed_config_file=str(tmp_path / "optim.json")), "remove 'optimizer'"),
    ]
    for ds, message in cases:
        assert main(["train", bad_config(tmp_path, ds)]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


def test_zero_runs_as_one_process_without_a_launcher(tmp_path, tmp_path_factory):
    launch_from_config(job(tmp_path, "DEEPSPEED", ranks=1, launch=zero(2)))
    assert_same_weights(final_weights(tmp_path), reference(tmp_path_factory, CACHE))
