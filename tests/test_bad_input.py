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
