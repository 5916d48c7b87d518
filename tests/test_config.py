"""load_config in every form, --set overrides, and one-line answers to every malformed config."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
import yaml

from giga_train import load_config
from giga_train.cli import main
from giga_train.config import parse_value
from giga_train.errors import ConfigError
from tests.tiny import tiny_config


def write_py(path, cfg):
    path.write_text(f"config = {cfg!r}\n")
    return str(path)


def test_py_yaml_json_and_module_give_the_same_config(tmp_path):
    cfg = tiny_config(tmp_path / "run")
    py = load_config(write_py(tmp_path / "c.py", cfg))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(json.loads(json.dumps(cfg))))
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    assert load_config(str(tmp_path / "c.yaml")) == load_config(str(tmp_path / "c.json"))
    assert load_config(str(tmp_path / "c.json")).train.max_steps == py.train.max_steps == 10
    module = load_config("examples.char_lm.configs.cpu.config")
    assert module.dataloaders.train.data_or_config._class_name == "StdlibText"
    assert load_config("examples.char_lm.configs.cpu") == module


def test_attribute_access_at_every_depth(tmp_path):
    cfg = load_config(tiny_config(tmp_path))
    assert cfg.dataloaders.train.sampler.type == "DefaultSampler"
    cfg.train.new_key = dict(a=dict(b=1))
    assert cfg.train.new_key.a.b == 1
    assert cfg.dataloaders["train"].batch_size_per_gpu == 8


@pytest.mark.parametrize("text, value", [("100", 100), ("1e-4", 1e-4), ("[0, 1]", [0, 1]), ("True", True),
                                         ("None", None), ("bf16", "bf16"), ("'7'", "7"), ("a b", "a b")])
def test_set_values_are_literals_else_strings(text, value):
    assert parse_value(text) == value


def test_set_overrides_nested_keys(tmp_path):
    path = write_py(tmp_path / "c.py", tiny_config(tmp_path / "run"))
    cfg = load_config(path, ["train.max_steps=3", "launch.gpu_ids=[]", "train.new.deep=x"])
    assert cfg.train.max_steps == 3 and cfg.launch.gpu_ids == [] and cfg.train.new.deep == "x"


def bad(tmp_path, edit):
    cfg = tiny_config(tmp_path / "run")
    edit(cfg)
    return write_py(tmp_path / "bad.py", cfg)


def set_in(path, value):
    def edit(cfg):
        node = cfg
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return edit


def drop(*path):
    def edit(cfg):
        node = cfg
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]
    return edit


MALFORMED = [
    (set_in(["train", "mixed_precision"], "fp17"), "train.mixed_precision: 'fp17' is not one of"),
    (set_in(["train", "max_step"], 5), "train.max_step: unknown key; did you mean 'max_steps'?"),
    (set_in(["trian"], {}), "trian: unknown key; did you mean 'train'?"),
    (set_in(["train", "max_steps"], "ten"), "train.max_steps: expected an integer, got str 'ten'"),
    # GigaTrain's max_steps=0 means "not set" (tests/test_gigatrain_config.py): a negative count is the error now
    (set_in(["train", "max_steps"], -1), "train.max_steps: must be >= 0"),
    (set_in(["optimizers", "type"], "Adamw8"), "optimizers: unknown optimizer 'Adamw8'; did you mean 'AdamW'?"),
    (set_in(["optimizers", "betaz"], (0.9, 0.9)), "optimizers: optimizer 'AdamW' takes no argument 'betaz';"
                                                    " did you mean 'betas'?"),
    (set_in(["schedulers", "type"], "Cosine"), "schedulers: unknown scheduler 'Cosine'"),
    (set_in(["dataloaders", "train", "transform"], {"type": "Flip"}), "dataloaders.train.transform: unknown"
                                                                       " transform 'Flip'"),
    (set_in(["dataloaders", "train", "data_or_config", "_class_name"], "StdlibTxt"),
     "dataloaders.train.data_or_config: unknown dataset 'StdlibTxt'; did you mean 'StdlibText'?"),
    (set_in(["dataloaders", "train", "sampler", "type"], "Default"), "dataloaders.train.sampler: unknown sampler"),
    (set_in(["dataloaders", "train", "batch_size"], 4), "dataloaders.train.batch_size: unknown key; did you"
                                                          " mean 'batch_size_per_gpu'?"),
    (set_in(["runners"], ["tests.nowhere.Trainer"]), "runners[0]: cannot import 'tests.nowhere.Trainer'"),
    (set_in(["runners"], ["tests.tiny.MODEL"]), "runners[0]: 'tests.tiny.MODEL' is not a subclass of"),
    (set_in(["launch", "distributed_type"], "FSPD"), "launch.distributed_type: unknown 'FSPD'"),
    (set_in(["launch", "gpu_ids"], [99]), "launch.gpu_ids: GPU 99 does not exist" if torch.cuda.is_available()
     else "launch.gpu_ids=[99]: no CUDA GPU is visible"),
    (drop("project_dir"), "project_dir: required key is missing"),
    (lambda c: (c["launch"].update(distributed_type="DDP", num_processes=2), c["train"].update(mixed_precision="fp16")),
     "train.mixed_precision: 'fp16' needs GPUs under DDP"),
    (drop("train", "max_steps"), "train: set max_steps or max_epochs"),
    (set_in(["train", "activation_checkpointing"], True), "train.activation_class_names: name the module"),
    (set_in(["train", "activation_class_names"], ["Block__##__x"]), "'Block__##__x' is not 'Class' or"),
    (set_in(["train", "resume"], 3), "train.resume: expected true/false or a string"),
]


@pytest.mark.parametrize("edit, message", MALFORMED, ids=[m for _, m in MALFORMED])
def test_malformed_config_gets_one_line_and_exit_2(tmp_path, capsys, edit, message):
    path = bad(tmp_path, edit)
    assert main(["train", path]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert message in err, err
    assert not (tmp_path / "run").exists(), "nothing may be written before the config is valid"


def test_missing_file_syntax_error_and_bad_set(tmp_path, capsys):
    assert main(["train", str(tmp_path / "absent.py")]) == 2
    assert f"config file not found: {tmp_path / 'absent.py'}" in capsys.readouterr().err
    broken = tmp_path / "broken.py"
    broken.write_text("config = dict(\n  train=dict(max_steps=1,\n")
    assert main(["train", str(broken)]) == 2
    err = capsys.readouterr().err
    assert f"{broken}:" in err and "syntax error" in err and err.count("\n") == 1
    (tmp_path / "bad.json").write_text("{nope")
    assert main(["check", str(tmp_path / "bad.json")]) == 2
    assert "invalid JSON" in capsys.readouterr().err
    good = write_py(tmp_path / "good.py", tiny_config(tmp_path / "run"))
    assert main(["check", good, "--set", "no_equals_sign"]) == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err
    assert main(["check", "no.such.module"]) == 2
    assert "config not found: 'no.such.module'" in capsys.readouterr().err


def test_unknown_model_class_for_activation_checkpointing(tmp_path, capsys):
    path = write_py(tmp_path / "c.py", tiny_config(tmp_path / "run", activation_checkpointing=True,
                                                   activation_class_names=["Blok"]))
    assert main(["train", path]) == 2
    err = capsys.readouterr().err
    assert "no module of class 'Blok' in the model (classes present: Block," in err and err.count("\n") == 1


def test_console_script_and_module_entry_points(tmp_path):
    path = write_py(tmp_path / "c.py", tiny_config(tmp_path / "run"))
    bad_path = bad(tmp_path, set_in(["train", "mixed_precision"], "fp17"))
    ok = subprocess.run([sys.executable, "-m", "giga_train", "check", path], capture_output=True, text=True)
    assert ok.returncode == 0 and "ok" in ok.stdout, ok.stderr
    beside = os.path.join(os.path.dirname(sys.executable), "giga-train")
    script_path = beside if os.path.exists(beside) else shutil.which("giga-train")
    assert script_path, "the giga-train console script is not installed"
    script = subprocess.run([script_path, "train", bad_path], capture_output=True, text=True)
    assert script.returncode == 2 and script.stderr.count("\n") == 1 and "fp17" in script.stderr
    # the console script is this package's cli: its one line names the key and the value, with a suggestion
    assert script.stderr.startswith("giga-train: error: train.mixed_precision: 'fp17' is not one of"), script.stderr
    assert "did you mean 'fp16'?" in script.stderr and ok.stdout.startswith(f"{path}: ok (tests.tiny.TinyTrainer)")


def test_gigatrain_config_semantics(tmp_path):
    from giga_train import Config
    cfg = Config(dict(train=dict(max_steps=10, opt=dict(lr=1, betas=(0.9, 0.99))), models=dict(dim=4)))
    assert cfg.update(dict(train=dict(max_steps=20)), models=dict(depth=2)) is cfg
    assert cfg.train.max_steps == 20 and cfg.train.opt.lr == 1 and cfg.models == dict(dim=4, depth=2)
    cfg.update(models=dict(__force__=True, depth=3))  # GigaTrain's marker: replace the section
    assert cfg.models == dict(depth=3)
    assert cfg.pop("absent") is None and cfg.pop("absent", 5) == 5
    deep = cfg.copy()
    deep.train.opt.lr = 2
    assert cfg.train.opt.lr == 1 and isinstance(deep, Config)
    assert cfg.to_dict(tuple_as_list=True)["train"]["opt"]["betas"] == ["__tuple__", 0.9, 0.99]
    cfg.save(str(tmp_path / "run" / "config.json"))
    again = load_config(str(tmp_path / "run"))  # a project folder: the config.json a run saved
    assert again == cfg and again.train.opt.betas == (0.9, 0.99)
    assert Config.load(str(tmp_path / "run" / "config.json")) == cfg
    (tmp_path / "extra.json").write_text(json.dumps(dict(train=dict(seed=1))))
    assert cfg.copy().merge_from_file(str(tmp_path / "extra.json")).train == dict(max_steps=20, opt=cfg.train.opt, seed=1)
    assert load_config(cfg) is cfg and str(cfg).startswith("Config:\n")
    with pytest.raises(ConfigError, match="without the config.json"):
        load_config(str(tmp_path))
