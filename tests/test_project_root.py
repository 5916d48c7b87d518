"""The project root is where the user's code lives: `giga-train export` from there imports the project's
trainer without PYTHONPATH (as every command does, and GigaTrain's setup_environment), and a config file
that exits instead of defining a config is one line, not a silent success."""
import os
import subprocess
import sys

import pytest

from giga_train.cli import main

PROJECT_MODULE = '''
import transformers
from giga_train import Trainer
from examples.char_lm import data  # noqa: F401  (registers StdlibText)


class LlamaTrainer(Trainer):
    def get_models(self, model_config):
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**model_config))

    def forward_step(self, batch_dict):
        return self.model(input_ids=batch_dict["tokens"], labels=batch_dict["targets"]).loss
'''


def test_export_from_the_project_root_imports_the_projects_trainer(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from giga_train import launch_from_config
    from giga_train.checkpoint import list_checkpoints
    from tests.test_export import LLAMA
    from tests.tiny import tiny_config
    (tmp_path / "my_project.py").write_text(PROJECT_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))  # the training run imports it as a project's launch would
    cfg = tiny_config(tmp_path / "run", runner="my_project.LlamaTrainer", max_steps=1)
    cfg["models"] = dict(LLAMA)
    launch_from_config(cfg)
    checkpoint = list_checkpoints(str(tmp_path / "run" / "models"))[-1][1]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root)  # giga_train itself only: my_project is found from the cwd
    done = subprocess.run([sys.executable, "-c", "import sys; from giga_train.cli import main; sys.exit(main())",
                           "export", checkpoint, "--to", "hf"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert os.path.isfile(os.path.join(checkpoint + "_hf", "config.json"))


@pytest.mark.parametrize("call", ["sys.exit(0)", "sys.exit()", "raise SystemExit(3)"])
@pytest.mark.parametrize("command", ["check", "train"])
def test_a_config_that_exits_is_one_line_and_not_zero(tmp_path, capsys, command, call):
    path = tmp_path / "config.py"
    path.write_text(f"import sys\n{call}\nconfig = dict()\n")
    assert main([command, str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"giga-train: error: {path}: the config called sys.exit(") and "\n" not in err, err
    assert "must define `config`, not exit" in err
