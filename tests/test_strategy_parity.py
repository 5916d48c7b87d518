"""A trainer that works under one strategy works under all: DeepSpeed bf16 runs a float-input forward_step
written for NO/DDP/FSDP (the same autocast); train.ddp_config reaches DDP (find_unused_parameters);
validation under ZeRO-3 at two ranks equals one process."""
import os

import pytest
import torch

from giga_train import launch_from_config
from tests.distributed import assert_same_weights, final_weights, job
from tests.tiny_eval import eval_job

ZERO2 = dict(deepspeed_config=dict(deepspeed_config_file="zero2.json"))


def float_job(project, distributed_type, launch=None, mixed_precision="bf16"):
    cfg = eval_job(project, distributed_type, launch=launch, runner="tests.tiny_eval.FloatInputTrainer",
                   mixed_precision=mixed_precision, max_grad_norm=None)
    return cfg


def test_deepspeed_bf16_runs_a_float_input_model_as_no_does(tmp_path):
    """Before: `mat1 and mat2 must have the same dtype` (the engine holds bf16 weights, the inputs are
    float). Now both train 4 steps and validate. The first loss (the same weights, rounded to bf16 by the
    engine) is equal; later ones drift (the engine's forward uses bf16 copies of the weights, which round away
    updates below bf16's resolution). Measured on CPU (2026-12-04, torch 2.13): losses 0.05-1.09, at most 0.038
    apart; val/mse 1.1% apart. Bounds: 0.06 absolute, 3% for val/mse."""
    pytest.importorskip("deepspeed")
    plain = launch_from_config(float_job(tmp_path / "no", "NO"))
    engine = launch_from_config(float_job(tmp_path / "ds", "DEEPSPEED", launch=ZERO2))
    assert engine.step == plain.step == 4
    assert engine.losses[0] == pytest.approx(plain.losses[0], rel=1e-6)
    assert engine.losses == pytest.approx(plain.losses, abs=0.06)
    assert engine.last_metrics["val/mse"] == pytest.approx(plain.last_metrics["val/mse"], rel=3e-2)
    assert next(engine.model.module.parameters()).dtype == torch.bfloat16  # the engine's own bf16 weights


def test_deepspeed_fp32_trains_a_float_input_model_as_no_does(tmp_path):
    """In fp32 nothing is rounded: ZeRO-2 in one rank gives one process's losses and validation (measured
    equal on CPU; bound rel 1e-5)."""
    pytest.importorskip("deepspeed")
    plain = launch_from_config(float_job(tmp_path / "no", "NO", mixed_precision="no"))
    engine = launch_from_config(float_job(tmp_path / "ds", "DEEPSPEED", launch=ZERO2, mixed_precision="no"))
    assert engine.step == plain.step == 4 and len(plain.losses) == len(engine.losses) > 4
    assert engine.losses == pytest.approx(plain.losses, rel=1e-5)
    assert engine.last_metrics["val/mse"] == pytest.approx(plain.last_metrics["val/mse"], rel=1e-5)


def test_ddp_config_find_unused_parameters_trains_a_model_with_an_unused_parameter(tmp_path):
    """DDP stops at the second step for a parameter forward never uses, and names the key torch wants;
    train.ddp_config=dict(find_unused_parameters=True) passes it to DDP, which then trains as NO does."""
    def run(project, distributed_type, **train):
        cfg = job(project, distributed_type, **train)
        cfg["runners"] = ["tests.tiny_eval.UnusedParameterTrainer"]
        return launch_from_config(cfg)
    with pytest.raises(RuntimeError, match="find_unused_parameters=True"):
        run(tmp_path / "refused", "DDP")
    run(tmp_path / "ddp", "DDP", ddp_config=dict(find_unused_parameters=True))
    run(tmp_path / "no", "NO")
    assert_same_weights(final_weights(tmp_path / "ddp"), final_weights(tmp_path / "no"))


def test_validation_under_zero3_at_two_ranks_equals_one_process(tmp_path):
    """ZeRO-3 gathers each layer's weights in every forward: both ranks run the same number of validation
    batches (rank 1 repeats one, weighted 0), and the results are the one-process ones."""
    pytest.importorskip("deepspeed")
    import json
    launch_from_config(eval_job(tmp_path / "no"))
    zero3 = dict(deepspeed_config=dict(deepspeed_config_file="zero3.json"))
    launch_from_config(eval_job(tmp_path / "z3", "DEEPSPEED", ranks=2, launch=zero3))
    expected = json.load(open(os.path.join(tmp_path, "no", "val_rank_0.json")))
    for rank in range(2):
        got = json.load(open(os.path.join(tmp_path, "z3", f"val_rank_{rank}.json")))
        assert [s for s, _ in got] == [s for s, _ in expected] == [2, 4]
        for (_, g), (_, e) in zip(got, expected):
            assert g["val/loss"] == pytest.approx(e["val/loss"], rel=1e-5)
