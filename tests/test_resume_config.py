"""The config is the truth at resume: a corrected lr (any optimizer hyper-parameter, the scheduler's values,
an optimizer type whose state is the saved one's) applies, with one line listing what differs; a model or
optimizer the saved state cannot fit is refused in one line before training, the checkpoints intact."""

import pytest
import torch

from giga_train import launch_from_config
from giga_train.checkpoint import list_checkpoints
from giga_train.cli import main
from tests.distributed import assert_same_weights, final_weights, job
from tests.tiny import tiny_config

FSDP2 = dict(fsdp_config=dict(fsdp_version=2, fsdp_transformer_layer_cls_to_wrap="Block"))


def last_lr(project):
    line = [line for line in (project / "logs" / "train.log").read_text().splitlines() if " | lr " in line][-1]
    return float(line.split(" | lr ")[1].split(" | ")[0])


def test_a_corrected_lr_and_optimizer_values_apply_at_resume(tmp_path):
    cfg = tiny_config(tmp_path / "run", max_steps=4, resume=True, log_interval=1)
    launch_from_config(cfg)
    cfg["train"]["max_steps"] = 8
    cfg["optimizers"] = dict(type="Adam", lr=1e-3, weight_decay=0.05, betas=(0.8, 0.95), eps=1e-6)
    cfg["schedulers"]["end_value"] = 0.2
    resumed = launch_from_config(cfg)
    fresh = launch_from_config(dict(cfg, project_dir=str(tmp_path / "fresh"), train=dict(cfg["train"], resume=False)))
    group, expected = resumed.optimizer.param_groups[0], fresh.optimizer.param_groups[0]
    assert {k: v for k, v in group.items() if k != "params"} == {k: v for k, v in expected.items() if k != "params"}
    assert type(resumed.optimizer) is torch.optim.Adam and not group.get("decoupled_weight_decay", False)
    assert resumed.scheduler.base_lrs == [1e-3] and resumed.scheduler.last_epoch == 8
    assert resumed.scheduler.get_last_lr() == fresh.scheduler.get_last_lr()
    assert last_lr(tmp_path / "run") == last_lr(tmp_path / "fresh")  # logged: the schedule of the new values
    assert resumed.optimizer.state[group["params"][0]]["step"] == 8  # the state is the checkpoint's
    text = (tmp_path / "run" / "logs" / "train.log").read_text()
    line = next(line for line in text.splitlines() if "resume: the config differs from" in line)
    for change in ("optimizers.type AdamW -> Adam", "optimizers.lr 0.003 -> 0.001", "optimizers.weight_decay 0.01 -> 0.05",
                   "optimizers.betas (unset) -> (0.8, 0.95)", "schedulers.end_value 0.1 -> 0.2"):
        assert change in line, line


def test_an_unchanged_config_resumes_without_a_line(tmp_path):
    cfg = tiny_config(tmp_path, max_steps=2, resume=True)
    launch_from_config(cfg)
    cfg["train"]["max_steps"] = 4
    launch_from_config(cfg)
    assert "resume: the config differs" not in (tmp_path / "logs" / "train.log").read_text()


CONFIG = '''
from tests.tiny import tiny_config
config = tiny_config({project!r}, max_steps=4, resume=True)
'''


@pytest.mark.parametrize("override,expected", [
    (["models.dim=32"], "the config changed since it was saved (models.dim 16 -> 32), and its saved state does"
                        " not fit (size mismatch for"),
    (["optimizers.type='SGD'", "optimizers.momentum=0.9"], "(optimizers.momentum (unset) -> 0.9; optimizers.type AdamW"
     " -> SGD), and its saved state does not fit (Missing key in checkpoint state_dict: optimizer.state."),
    (["runners=['tests.tiny.SplitOptimizerTrainer']"], "its saved state does not fit"),
])
def test_a_change_the_saved_state_cannot_take_is_one_line_before_training(tmp_path, capsys, override, expected):
    config = tmp_path / "config.py"
    config.write_text(CONFIG.format(project=str(tmp_path / "project")))
    assert main(["train", str(config), "--set", "train.max_steps=2"]) == 0
    before = list_checkpoints(str(tmp_path / "project" / "models"))
    capsys.readouterr()
    args = ["train", str(config)]
    for item in override:
        args += ["--set", item]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"giga-train: error: resume from {before[-1][1]}: ") and expected in err, err
    assert "restore those keys, or train from scratch in another project_dir" in err
    assert list_checkpoints(str(tmp_path / "project" / "models")) == before


def test_a_corrected_lr_applies_under_fsdp2_at_two_ranks(tmp_path):
    """Resumed at 2 ranks (FSDP2) with a new lr and weight decay: the same weights as one process resumed
    with the same change, and the lr of a run that had the new values from the start."""
    def two_runs(project, *args, **kwargs):
        cfg = job(project, *args, resume=True, max_steps=2, log_interval=1, **kwargs)
        launch_from_config(cfg)
        cfg["train"]["max_steps"] = 4
        cfg["optimizers"] = dict(type="AdamW", lr=1e-3, weight_decay=0.1)
        launch_from_config(cfg)
        return cfg
    cfg = two_runs(tmp_path / "fsdp2", "FSDP", ranks=2, launch=FSDP2)
    two_runs(tmp_path / "one")
    assert_same_weights(final_weights(tmp_path / "fsdp2"), final_weights(tmp_path / "one"))
    fresh = job(tmp_path / "fresh", max_steps=4, log_interval=1)
    fresh["optimizers"] = cfg["optimizers"]
    launch_from_config(fresh)
    assert last_lr(tmp_path / "fsdp2") == last_lr(tmp_path / "fresh") == last_lr(tmp_path / "one")
    assert "resume: the config differs" in (tmp_path / "fsdp2" / "logs" / "train.log").read_text()
