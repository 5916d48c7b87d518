"""The config is validated once per launch, and passed to the runners explicitly: a Trainer built directly
from a dict trains as a launched one does (and its constructor opens no process group); the engine's own
refusals are `giga-train check`'s, one line each."""
import pytest
import torch.distributed as dist

from giga_train import launch_from_config
from giga_train.cli import main
from tests.tiny import TinyTrainer, tiny_config


def test_a_trainer_built_from_a_dict_trains_as_a_launched_one(tmp_path):
    """No load(), no runners key: MyTrainer(config=a_dict).train() gives the losses a launch of the same
    config gives, exactly (same seed, same data order, one process); the constructor opens nothing."""
    cfg = tiny_config(tmp_path / "direct", max_steps=3)
    del cfg["runners"]
    trainer = TinyTrainer(config=cfg)
    assert not dist.is_initialized() and trainer.strategy is None and trainer.step == 0
    assert trainer.train_config.max_steps == 3 and "runners" not in cfg  # the caller's dict is not edited
    trainer.train()
    assert trainer.step == 3 and trainer.checkpoints.latest_step() == 3
    launched = launch_from_config(tiny_config(tmp_path / "launched", max_steps=3))
    assert trainer.losses == launched.losses and len(trainer.losses) == 3


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_launch_validates_its_config_once(tmp_path, monkeypatch, ranks):
    """One validation pass per launch: in the launcher, before the ranks start (they get it as it is);
    not again in load(), nor in each rank."""
    counts = tmp_path / "validations.txt"
    monkeypatch.setenv("GT_VALIDATIONS", str(counts))  # the spawned ranks inherit it
    cfg = tiny_config(tmp_path / "project", runner="tests.tiny.ValidationCountingTrainer", max_steps=2)
    cfg["launch"] = dict(distributed_type="DDP" if ranks > 1 else "NO", num_processes=ranks)
    cfg["dataloaders"]["train"]["batch_size_per_gpu"] = 4
    result = launch_from_config(cfg)
    assert (result["step"] if isinstance(result, dict) else result.step) == 2
    assert len(counts.read_text().splitlines()) == 1


FSDP1 = "config['launch'] = dict(distributed_type='FSDP', fsdp_config=dict(fsdp_version=1{}))"
ZERO = "config['launch'] = dict(distributed_type='DEEPSPEED', deepspeed_config=dict(deepspeed_config_file='{}'{}))"


@pytest.mark.parametrize("extra,expected", [
    (FSDP1.format("") + "; config['train']['with_ema'] = True",
     "train.with_ema: not available with fsdp_version=1 (use fsdp_version=2)"),
    (FSDP1.format("") + "; config['optimizers'] = dict(type='CAME8Bit', lr=1e-3)",
     "optimizers.type=CAME8Bit: FSDP1 hands the optimizer flat 1-D shards"),
    (FSDP1.format(", fsdp_cpu_ram_efficient_loading=True"),
     "launch.fsdp_config.fsdp_cpu_ram_efficient_loading: rank-0 loading is implemented with fsdp_version=2 only"),
    (ZERO.format("zero3.json", "") + "; config['train']['with_ema'] = True",
     "train.with_ema: not available under ZeRO-3"),
    (ZERO.format("zero2.json", ", zero3_init_flag=True"),
     "launch.deepspeed_config.zero3_init_flag: rank-0 loading partitions the model as ZeRO-3 does"),
])
def test_check_refuses_what_the_engine_would_refuse_at_setup(tmp_path, capsys, extra, expected):
    path = tmp_path / "config.py"
    path.write_text(f"from tests.tiny import tiny_config\nconfig = tiny_config({str(tmp_path / 'p')!r})\n{extra}\n")
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"giga-train: error: {expected}") and "\n" not in err, err
