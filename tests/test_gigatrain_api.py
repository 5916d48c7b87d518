"""GigaTrain's Trainer and Tester surface on our engine: the hooks a project overrides are called, in
GigaTrain's order (set_ema_models comes after the optimizers here: EMA is kept on the sharded weights),
with per-sample losses, its properties, extra train keys in self.kwargs, and a Tester that gives each rank
a disjoint part of the test data."""
import json
import os

import pytest

from giga_train import launch_from_config
from tests import gigatrain_client
from tests.gigatrain_client import CALLS


def client_config(project_dir, runners=("tests.gigatrain_client.HookTrainer",), **launch):
    return dict(
        runners=list(runners),
        project_dir=str(project_dir),
        launch=dict(dict(distributed_type="NO"), **launch),
        dataloaders=dict(train=dict(data_or_config=dict(_class_name="CountingDataset", size=24),
                                    batch_size_per_gpu=4, num_workers=0),
                         test=dict(data_or_config=dict(_class_name="CountingDataset", size=23),
                                   batch_size_per_gpu=3, num_workers=0)),
        models=dict(dim=4),
        optimizers=dict(type="AdamW", lr=1e-2),
        schedulers=dict(type="ConstantScheduler"),
        train=dict(max_steps=3, gradient_accumulation_steps=2, log_interval=1, checkpoint_interval=2, seed=5,
                   log_with="none", progress_bar=False, my_option=3),
        test=dict(log_interval=2, another_option="x"),
    )


def test_overridden_hooks_are_called_in_order_with_per_sample_losses(tmp_path):
    CALLS.clear()
    trainer = launch_from_config(client_config(tmp_path))
    names = [name for name, _ in CALLS]
    assert names[:8] == ["get_dataloaders", "get_models", "apply_activation_checkpointing", "apply_fp8",
                         "get_optimizers", "set_ema_models", "get_schedulers", "print_before_train"]
    step = ["forward_step", "parse_losses", "backward_step"] * 2 + ["print_step", "save_checkpoint_step"]
    assert names[8:] == step * 3 + ["print_after_train"]
    assert [d for n, d in CALLS if n == "backward_step"] == [False, True] * 3  # the last micro-batch steps
    assert [d for n, d in CALLS if n == "forward_step"] == [1, 1, 2, 2, 3, 3]  # GigaTrain's cur_step, 1-based
    assert [d for n, d in CALLS if n == "print_step"] == [1, 2, 3]
    assert dict(CALLS)["parse_losses"] == ((4,), (4,))  # per-sample losses reach parse_losses as they are
    assert dict(CALLS)["get_schedulers"] == ("ConstantScheduler", 3, 3)  # epoch_size: ceil(6 batches / 2)
    metrics = trainer.last_metrics
    assert metrics["total_loss"] == pytest.approx(metrics["score"] + metrics["aux"], rel=1e-5)
    assert trainer.kwargs["my_option"] == 3 and "max_steps" not in trainer.kwargs
    assert (trainer.cur_step, trainer.cur_epoch, trainer.max_steps, trainer.max_epochs) == (3, 1, 3, 1)
    assert (trainer.num_processes, trainer.process_index, trainer.is_main_process, trainer.is_last_process) == \
        (1, 0, True, True)
    assert (trainer.data_size, trainer.batch_size, trainer.epoch_size) == (24, 8, 3)
    assert trainer.mixed_precision is None and str(trainer.dtype) == "torch.float32"  # GigaTrain: None when unset
    assert sorted(os.listdir(trainer.model_dir)) == ["checkpoint_epoch_1_step_2", "checkpoint_epoch_1_step_3"]
    saved = json.load(open(tmp_path / "config.json"))  # save_config: what load_config(project_dir) reads
    assert saved["train"]["my_option"] == 3 and saved["runners"] == ["tests.gigatrain_client.HookTrainer"]


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_tester_after_the_trainer_sees_every_test_sample_once(tmp_path, ranks):
    cfg = client_config(tmp_path, runners=("tests.gigatrain_client.HookTrainer", "tests.gigatrain_client.IndexTester"),
                        **(dict(distributed_type="DDP", num_processes=ranks) if ranks > 1 else {}))
    launch_from_config(cfg)
    parts = [json.load(open(tmp_path / f"tested_{r}.json")) for r in range(ranks)]
    seen = [i for part in parts for i in part["seen"]]
    assert sorted(seen) == list(range(23)) and len(seen) == 23  # every sample, none twice
    assert all(part["kwargs"] == {"another_option": "x"} for part in parts)
    assert parts[0]["batch_size"] == 3 * ranks
    assert (tmp_path / "logs" / "test.log").exists()


def test_tester_batches_arrive_on_the_device():
    """GigaTrain's Tester gets its batches from Accelerate's prepared loader, on the device: so do ours (the
    meta device stands in for a GPU here); the loader's own attributes stay reachable."""
    import torch

    from giga_train.trainers.tester import OnDevice
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(10.0)), batch_size=4)
    on_device = OnDevice(loader, torch.device("meta"))
    batches = list(on_device)
    assert len(batches) == len(on_device) == 3 and all(b[0].is_meta for b in batches)
    assert on_device.batch_sampler.batch_size == 4 and len(on_device.dataset) == 10


def test_the_client_module_is_importable_without_side_effects():
    assert gigatrain_client.HookTrainer.SECTION == "train" and gigatrain_client.IndexTester.SECTION == "test"
