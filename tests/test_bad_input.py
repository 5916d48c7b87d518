"""What `train` would refuse, `check` refuses first, in one line naming the key and the value (exit 2), and
nothing is written (issue 18's cases)."""
import pytest

from giga_train.cli import main

CONFIG = '''
from tests.tiny import tiny_config
config = tiny_config({project!r}, max_steps=2)
{extra}
'''


def write_config(tmp_path, extra=""):
    path = tmp_path / "config.py"
    path.write_text(CONFIG.format(project=str(tmp_path / "project"), extra=extra))
    return str(path)


@pytest.mark.parametrize("override,expected", [
    ("optimizers.lr='1e-3'", "optimizers: optimizer 'AdamW' argument 'lr' takes a number (default 0.001), got the string '1e-3'"),
    ("optimizers.betas='fast'", "optimizers: optimizer 'AdamW' argument 'betas' takes a list"),
    ("dataloaders.train.data_or_config.block_size='x'",
     "dataloaders.train.data_or_config: dataset 'StdlibText' argument 'block_size' takes a number (default 128)"),
    ("train='fast'", "train: expected a dict (the train section), got str 'fast'"),
    ("launch=[1,2]", "launch: expected a dict (the launch section), got list [1, 2]"),
    ("train=5", "train: expected a dict (the train section), got int 5"),
])
@pytest.mark.parametrize("command", ["check", "train"])
def test_a_bad_value_is_one_line_at_check_time(tmp_path, capsys, command, override, expected):
    assert main([command, write_config(tmp_path), "--set", override]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"giga-train: error: {expected}") and "\n" not in err, err
    assert not (tmp_path / "project" / "models").exists()


@pytest.mark.parametrize("extra,expected", [
    ('config["dataloaders"]["train"]["batch_size_per_gpu"] = 10**10',
     "dataloaders.train.batch_size_per_gpu: a global batch of 10000000000 samples"),
    ('config["dataloaders"]["train"]["data_or_config"] = dict(_class_name="CountingDataset", size=0)',
     "dataloaders.train.data_or_config: the dataset is empty (0 samples)"),
])
def test_data_that_cannot_make_a_batch_is_one_line(tmp_path, capsys, extra, expected):
    assert main(["train", write_config(tmp_path, extra)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"giga-train: error: {expected}") and "\n" not in err, err
    assert not (tmp_path / "project" / "models").exists()


@pytest.mark.parametrize("override,expected", [
    ("optimizers.lr=-1", "optimizers: AdamW refuses its values: Invalid learning rate: -1"),
    ("optimizers.weight_decay=-0.1", "optimizers: AdamW refuses its values: Invalid weight_decay value: -0.1"),
    ("optimizers.betas=(0.9,1.0)", "optimizers: AdamW refuses its values: Invalid beta parameter at index 1: 1.0"),
    ("optimizers.betas=(-0.1,0.99)", "optimizers: AdamW refuses its values: Invalid beta parameter at index 0"),
    ("optimizers.lr=1e400", "optimizers.lr: inf is not a value this key can take"),
    ("schedulers.warmup_steps=-5", "schedulers: WarmupCosineScheduler refuses its values: warmup_steps must be >= 0"),
    ("schedulers.end_value=-1", "schedulers.end_value: -1 would make the lr negative"),
    ("train..max_steps=9", "--set 'train..max_steps=9': 'train..max_steps' has an empty or blank part"),
    ("train. max_steps=9", "--set 'train. max_steps=9': 'train. max_steps' has an empty or blank part"),
])
@pytest.mark.parametrize("command", ["check", "train"])
def test_what_a_constructor_refuses_is_one_line_at_check_time(tmp_path, capsys, command, override, expected):
    """The optimizer's and scheduler's own refusals (and values they accept but cannot train with: an inf
    lr, a negative end_value), and a --set key with an empty part, are one line before anything runs."""
    assert main([command, write_config(tmp_path), "--set", override]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"giga-train: error: {expected}") and "\n" not in err, err
    assert not (tmp_path / "project").exists()


def test_a_split_optimizer_list_is_checked_entry_by_entry(tmp_path, capsys):
    extra = ('config["optimizers"] = [dict(type="AdamW", lr=1e-3), dict(type="SGD", lr=0.1, momentum=-1)]\n'
             'config["models"] = dict(config["models"])')
    assert main(["check", write_config(tmp_path, extra)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("giga-train: error: optimizers[1]: SGD refuses its values: Invalid momentum value: -1"), err
