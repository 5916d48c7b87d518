"""The loop: learning, accumulation = big batch, named losses, checkpointing by class, precision, EMA."""
import math
import os

import pytest
import torch

from giga_train import Trainer, launch_from_config
from giga_train.checkpoint import list_checkpoints, read_weights
from giga_train.engine.activation_checkpointing import apply_activation_checkpointing
from examples.char_lm.model import CharLM
from tests.tiny import MODEL, tiny_config


def weights_of(project):
    _, path = list_checkpoints(os.path.join(project, "models"))[-1]
    return read_weights(path)


def test_loss_goes_down(tmp_path):
    trainer = launch_from_config(tiny_config(tmp_path, max_steps=40))
    first, last = sum(trainer.losses[:5]) / 5, sum(trainer.losses[-5:]) / 5
    assert last < first - 1.0, (first, last)


def test_accumulation_equals_the_big_batch(tmp_path):
    """batch 8 x 1 micro-step and batch 4 x 2 micro-steps reach the same weights (fp32, no dropout)."""
    runs = {}
    for batch, accum in ((8, 1), (4, 2), (2, 4)):
        cfg = tiny_config(tmp_path / f"b{batch}", max_steps=5, gradient_accumulation_steps=accum, max_grad_norm=0.5)
        cfg["models"]["dropout"] = 0.0
        cfg["dataloaders"]["train"]["batch_size_per_gpu"] = batch
        launch_from_config(cfg)
        runs[batch] = weights_of(str(tmp_path / f"b{batch}"))
    for batch in (4, 2):
        for key in runs[8]:
            torch.testing.assert_close(runs[batch][key], runs[8][key], rtol=1e-4, atol=1e-6, msg=key)
    assert not torch.equal(runs[8]["blocks.0.qkv.weight"], CharLM(**MODEL).state_dict()["blocks.0.qkv.weight"])


def test_named_losses_are_summed_and_module_dict_dispatches(tmp_path):
    cfg = tiny_config(tmp_path, max_steps=4, log_interval=2, checkpoint_interval=4,
                      runner="tests.tiny.DictLossTrainer")
    trainer = launch_from_config(cfg)
    assert set(trainer.last_metrics) >= {"lm", "aux", "total_loss", "lr", "grad_norm", "step_time", "samples_per_sec"}
    assert trainer.last_metrics["total_loss"] == pytest.approx(trainer.last_metrics["lm"] + trainer.last_metrics["aux"],
                                                         rel=1e-5)
    folder = tmp_path / "models" / "checkpoint_epoch_1_step_4"  # GigaTrain's layout: a folder per member
    assert [sorted(os.listdir(folder / m)) for m in ("aux", "lm")] == [["diffusion_pytorch_model.safetensors"]] * 2


def test_activation_checkpointing_keeps_gradients_and_counts_first_n():
    torch.manual_seed(0)
    plain = CharLM(**dict(MODEL, dropout=0.0, layers=3))
    checked = CharLM(**dict(MODEL, dropout=0.0, layers=3))
    checked.load_state_dict(plain.state_dict())
    assert apply_activation_checkpointing(checked, ["Block__##__2"]) == 2
    assert apply_activation_checkpointing(CharLM(**MODEL), ["Block", "LayerNorm__##__1"]) == 3
    tokens = torch.randint(0, 256, (2, 16))
    plain(tokens, tokens).backward()
    checked(tokens, tokens).backward()
    for (name, a), b in zip(plain.named_parameters(), checked.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-7, msg=name)
    assert list(checked.state_dict()) == list(plain.state_dict())


def test_activation_checkpointing_trains_the_same(tmp_path):
    runs = []
    for on in (False, True):
        cfg = tiny_config(tmp_path / str(on), max_steps=3, activation_checkpointing=on,
                          activation_class_names=["Block"] if on else [])
        runs.append(launch_from_config(cfg).losses)
    assert runs[0] == pytest.approx(runs[1], rel=1e-5)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains(tmp_path, precision):
    cfg = tiny_config(tmp_path, max_steps=3, mixed_precision=precision, max_grad_norm=1.0)
    cfg["models"].update(layers=1)
    trainer = launch_from_config(cfg)
    assert all(torch.isfinite(torch.tensor(trainer.losses)))
    assert next(trainer.unwrapped_model.parameters()).dtype == torch.float32  # weights stay fp32
    if precision == "fp16":
        state = torch.load(tmp_path / "models" / "checkpoint_epoch_1_step_3" / "precision.pt", weights_only=True)
        saved, live = state["precision"]["scaler"], trainer.strategy.precision.scaler.state_dict()
        assert saved == live  # the loss scaler's own state, as it ended the run
        # GradScaler starts at 2**16 and only halves (overflow) before growth_interval=2000 steps: a power
        # of two at most 2**16, with one growth-tracker tick per step since the last overflow (3 steps)
        assert math.log2(saved["scale"]).is_integer() and saved["scale"] <= 2.0**16
        assert 0 <= saved["_growth_tracker"] <= 3


@pytest.mark.parametrize("precision, enabled, dtype", [("no", False, torch.float32), ("bf16", True, torch.bfloat16),
                                                       ("fp16", True, torch.float16)])
def test_forward_step_runs_under_the_precisions_autocast(tmp_path, precision, enabled, dtype):
    cfg = tiny_config(tmp_path, runner="tests.tiny.AutocastProbeTrainer", max_steps=2, gradient_accumulation_steps=2,
                      mixed_precision=precision)
    cfg["models"].update(layers=1)
    trainer = launch_from_config(cfg)
    assert trainer.autocast_seen == [(enabled, dtype)] * 4  # every micro-batch of every step
    assert not torch.is_autocast_enabled("cpu")  # and not left on after the run


def test_max_grad_norm_bounds_the_update(tmp_path):
    cfg = tiny_config(tmp_path / "clip", max_steps=1, max_grad_norm=1e-3, with_ema=False)
    cfg["optimizers"] = dict(type="SGD", lr=1.0)
    cfg["schedulers"] = dict(type="ConstantScheduler")
    trainer = launch_from_config(cfg)
    torch.manual_seed(3)
    start = CharLM(**MODEL).state_dict()
    moved = [(p - start[n]).flatten() for n, p in trainer.unwrapped_model.named_parameters()]
    assert torch.cat(moved).norm() <= 1e-3 * 1.0001
    assert torch.cat(moved).norm() > 1e-4


def test_max_epochs_counts_batches(tmp_path):
    cfg = tiny_config(tmp_path, max_steps=None, max_epochs=1, gradient_accumulation_steps=2)
    del cfg["train"]["max_steps"]
    cfg["dataloaders"]["train"]["data_or_config"]["max_bytes"] = 4_000
    trainer = launch_from_config(cfg)
    batches = -(-len(trainer.dataloader.dataset) // 8)
    assert trainer.step == batches // 2 and len(trainer.losses) == trainer.step * 2


def test_ema_is_the_average_of_the_weights(tmp_path):
    cfg = tiny_config(tmp_path, max_steps=2, with_ema=True, ema_decay=0.5, checkpoint_interval=1)
    launch_from_config(cfg)
    models = tmp_path / "models"
    w1 = read_weights(str(models / "checkpoint_epoch_1_step_1"))
    w2 = read_weights(str(models / "checkpoint_epoch_1_step_2"))
    ema = read_weights(str(models / "checkpoint_epoch_1_step_2"), ema=True)
    for key in ("blocks.0.qkv.weight", "embed.weight", "pos"):
        # GigaTrain's decay warm-up: update 1 copies w1 (decay 0), update 2 has decay min(2/11, 0.5)
        expected = 2 / 11 * w1[key] + 9 / 11 * w2[key]
        torch.testing.assert_close(ema[key], expected, rtol=1e-5, atol=1e-7)
        assert ema[key].dtype == torch.float32


def test_trainer_without_methods_says_what_is_missing(tmp_path):
    class Bare(Trainer):
        pass
    cfg = tiny_config(tmp_path)
    with pytest.raises(NotImplementedError, match="must define get_models"):
        Bare.load(cfg)
