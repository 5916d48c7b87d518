"""The usual first-hour mistakes answered in one line, and what a first project reaches for: a Tester-only
config, runner classes given from Python, did-you-mean for constructor arguments and runner names, a missing
model path at check, a batch larger than the data, no DCP noise at one process, wandb without a key."""
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

from giga_train import Trainer, launch_from_config
from giga_train.cli import main
from tests import gigatrain_client
from tests.tiny import MODEL, TinyTrainer, tiny_config


def check(tmp_path, cfg, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    code = main(["check", str(path)])
    return code, capsys.readouterr()


def test_a_tester_only_config_runs(tmp_path):
    cfg = dict(runners=["tests.gigatrain_client.IndexTester"], project_dir=str(tmp_path),
               dataloaders=dict(test=dict(data_or_config=dict(_class_name="CountingDataset", size=7),
                                          batch_size_per_gpu=3)), models=dict(dim=4))
    launch_from_config(cfg)
    assert sorted(json.load(open(tmp_path / "tested_0.json"))["seen"]) == list(range(7))


def test_runner_classes_from_python(tmp_path):
    cfg = tiny_config(tmp_path, max_steps=2)
    cfg["runners"] = [gigatrain_client.HookTrainer]
    cfg["models"] = dict(dim=4)
    cfg["dataloaders"]["train"] = dict(data_or_config=dict(_class_name="CountingDataset", size=8), batch_size_per_gpu=4)
    trainer = launch_from_config(cfg)
    assert type(trainer) is gigatrain_client.HookTrainer and trainer.step == 2
    saved = json.load(open(tmp_path / "config.json"))
    assert saved["runners"] == ["tests.gigatrain_client.HookTrainer"]  # importable back: written as its path


@pytest.mark.parametrize("edit, message", [
    (dict(runners=["tests.tiny.tinytrainer"]), "did you mean 'TinyTrainer'?"),
    (dict(optimizers=dict(type="AdamW", learning_rate=1e-3)),
     "optimizers: optimizer 'AdamW' takes no argument 'learning_rate'; did you mean 'lr'?"),
    (dict(schedulers=dict(type="WarmupCosineScheduler", warmup=5)), "did you mean 'warmup_steps'?"),
    (dict(runners=["tests.tinny.TinyTrainer"]), "'tests' has no attribute or module 'tinny'; did you mean 'tiny'?"),
    (dict(runners=["not_here_pkg.trainers.T"]), "no module named 'not_here_pkg' (your modules are imported from the"
                                                " folder giga-train runs in, "),
    (dict(schedulers=dict(type="cosine")), "unknown scheduler 'cosine'; did you mean 'CosineScheduler'?"),
    (dict(dataloaders=dict(train=dict(data_or_config=dict(_class_name="Unregistered")))),
     "a name @register'ed in a module is known once that module is imported"),
])
def test_did_you_mean(tmp_path, capsys, edit, message):
    cfg = tiny_config(tmp_path / "run")
    cfg.update(edit)
    code, out = check(tmp_path, cfg, capsys)
    assert code == 2 and message in out.err, out.err
    assert len(out.err.strip().splitlines()) == 1


@pytest.mark.parametrize("path, refused", [("/nowhere/Llama-3-8B", True), ("./weights/model.safetensors", True),
                                           ("meta-llama/Llama-3.1-8B", False), ("gpt2", False), (None, False)])
def test_a_missing_local_model_path_is_one_line_at_check(tmp_path, capsys, path, refused):
    cfg = tiny_config(tmp_path / "run")
    cfg["runners"] = ["tests.test_first_hour.PathTrainer"]
    cfg["models"] = dict(MODEL, backbone=dict(pretrained_model_name_or_path=path))
    code, out = check(tmp_path, cfg, capsys)
    if refused:
        assert code == 2 and out.err.strip() == (f"giga-train: error: models.backbone.pretrained_model_name_or_path:"
                                                 f" no such file or folder '{path}' (a local path; a hub id is 'name'"
                                                 " or 'namespace/name')")
    else:  # a hub id (or nothing): the loader's business, not check's
        assert code == 0, out.err


class PathTrainer(TinyTrainer):
    def get_models(self, model_config):
        return super().get_models({k: v for k, v in model_config.items() if k != "backbone"})


def test_a_batch_larger_than_the_data_is_said_once(tmp_path):
    cfg = tiny_config(tmp_path, max_steps=1)
    cfg["dataloaders"]["train"] = dict(data_or_config=dict(_class_name="CountingDataset", size=5),
                                       batch_size_per_gpu=8)
    cfg["runners"] = ["tests.test_first_hour.IndexTrainer"]
    launch_from_config(cfg)
    said = [line for line in (tmp_path / "logs" / "train.log").read_text().splitlines() if "larger than" in line]
    assert len(said) == 1 and said[0].endswith("dataloaders.train.batch_size_per_gpu: a global batch of 8 samples (8 x 1 ranks x 1 accumulation)"
                    " is larger than the dataset (5 samples): each step repeats samples")


class IndexTrainer(Trainer):
    def get_models(self, model_config):
        return torch.nn.Linear(1, 1)

    def forward_step(self, batch_dict):
        return self.model(batch_dict["index"].float()[:, None]).pow(2).mean()


def test_one_process_checkpoints_give_no_dcp_warning(tmp_path):
    """DCP's "torch.distributed is disabled..." at every one-process save and load: not shown (it broke the
    progress bar's line); other warnings are untouched."""
    cfg = tiny_config(tmp_path, max_steps=2, checkpoint_interval=1, resume=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        launch_from_config(cfg)
        cfg["train"]["max_steps"] = 3
        launch_from_config(cfg)  # resumes: DCP loads the optimizer state
        warnings.warn("another warning", UserWarning)
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "torch.distributed is disabled" in m]
    assert "another warning" in messages
    assert (tmp_path / "models" / "checkpoint_epoch_1_step_3").is_dir()


def test_wandb_online_without_a_key_is_one_line(tmp_path):
    """wandb's UsageError traceback becomes one line naming the fixes; as any tracker that fails (tracking/
    guarded.py), wandb is then turned off and the run goes on. In a subprocess: wandb keeps its settings in the
    process (the offline tests of test_trackers.py must not inherit an online one)."""
    pytest.importorskip("wandb")
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DISABLED")}
    env.update(HOME=str(tmp_path / "home"), WANDB_CONFIG_DIR=str(tmp_path / "home" / "cfg"))  # no login anywhere
    path = tmp_path / "cfg.py"
    path.write_text(f"config = {tiny_config(tmp_path / 'run', max_steps=1, log_with='wandb')!r}\n")
    run = subprocess.run([sys.executable, "-m", "giga_train", "train", str(path)], env=env, capture_output=True,
                         text=True, cwd=os.getcwd(), timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    said = [line for line in run.stderr.splitlines() + run.stdout.splitlines() if "API key" in line]
    assert len(said) == 1 and ("train.log_with: 'wandb' online needs a W&B API key: set WANDB_API_KEY (or run"
                               " `wandb login`), or WANDB_MODE=offline") in said[0], said
    assert "Traceback" not in run.stderr


class FromPretrainedTrainer(Trainer):
    """The usual get_models: a transformers model from a local folder (by its class or an Auto class)."""

    def get_models(self, model_config):
        import transformers
        cls = transformers.AutoModelForCausalLM if model_config["auto"] else transformers.LlamaForCausalLM
        return cls.from_pretrained(model_config["path"], torch_dtype=torch.bfloat16)

    def forward_step(self, batch_dict):
        return self.model(input_ids=batch_dict["index"][:, None] % 100).logits.float().mean()


@pytest.mark.parametrize("auto", [False, True])
def test_plan_builds_from_pretrained_models_from_their_config(tmp_path, auto):
    transformers = pytest.importorskip("transformers")
    from giga_train.tools.plan import plan
    folder = tmp_path / "llama"
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=2, vocab_size=100)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    real = transformers.LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.bfloat16)
    cfg = tiny_config(tmp_path / "run", max_steps=1)
    cfg.update(runners=["tests.test_first_hour.FromPretrainedTrainer"], models=dict(path=str(folder), auto=auto))
    cfg["dataloaders"]["train"] = dict(data_or_config=dict(_class_name="CountingDataset", size=8), batch_size_per_gpu=2)
    result = plan(cfg, gpus=(1,), activations=False)
    assert result["parameters"]["numel"] == sum(p.numel() for p in real.parameters())
    assert result["parameters"]["bytes"] == sum(p.numel() * 2 for p in real.parameters())  # bf16, as asked
    import transformers as again
    assert "from_pretrained" in vars(again.PreTrainedModel)  # restored after the build
    assert again.LlamaForCausalLM.from_pretrained(folder).model.embed_tokens.weight.device.type == "cpu"


def test_version_and_env(capsys):
    from giga_train import __version__
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"giga-train {__version__}"
    assert main(["env"]) == 0
    rows = dict(line[2:].split(":", 1) for line in capsys.readouterr().out.splitlines())
    rows = {name: value.strip() for name, value in rows.items()}
    assert rows["giga-train"] == __version__ and rows["torch"] == torch.__version__
    for name in ("Python", "torch CUDA", "cuDNN", "deepspeed", "torchao", "diffusers", "transformers", "triton"):
        assert rows[name], name


@pytest.mark.parametrize("out", [None, "full.yaml", "full.json"])
def test_the_whole_config_with_defaults(tmp_path, capsys, out):
    from giga_train.config import load_config
    cfg = tiny_config(tmp_path / "run")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    argv = ["check", str(path)] + (["--out", str(tmp_path / out)] if out else ["--print-config"])
    assert main(argv) == 0
    text = capsys.readouterr().out
    full = load_config(str(tmp_path / out)) if out else json.loads(text)
    assert full["train"]["max_grad_norm"] is None and full["train"]["nan_policy"] == "skip"  # defaults, not given
    assert full["launch"]["distributed_type"] == "NO" and full["optimizers"] == cfg["optimizers"]
    assert main(["check", str(tmp_path / out) if out else str(path)]) == 0  # what it wrote is a config again


class CountingValTrainer(TinyTrainer):
    def validation_step(self, batch_dict):
        with open(f"{self.project_dir}.val_batches", "a") as f:
            f.write("1\n")
        return self.model(batch_dict["tokens"], batch_dict["targets"])


def test_dry_run(tmp_path, capsys):
    """train --dry-run: 2 steps and at most 2 validation batches, nothing written but the train log, exit 0."""
    cfg = tiny_config(tmp_path / "run", runner="tests.test_first_hour.CountingValTrainer", max_steps=1000,
                      checkpoint_interval=1, eval_interval=500, log_with="tensorboard", resume=True)
    cfg["dataloaders"]["val"] = dict(batch_size_per_gpu=2, data_or_config=dict(
        _class_name="StdlibText", block_size=16, stride=16, max_bytes=40_000, split="val", val_fraction=0.004))
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert main(["train", str(path), "--dry-run"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == (
        "dry run: ok, 2 training steps and a validation of at most 2 batches; no checkpoint, no tracker, no"
        " config.json written")
    assert (tmp_path / "run.val_batches").read_text().split() == ["1", "1"]  # 5 batches in dataloaders.val
    written = sorted(str(p.relative_to(tmp_path / "run")) for p in (tmp_path / "run").rglob("*") if p.is_file())
    assert written == [".giga_train.lock", "logs/train.log"]  # the run's lock and log only
    last = (tmp_path / "run" / "logs" / "train.log").read_text().strip().splitlines()[-1]
    assert last.endswith("(dry run)") and "checkpoint" not in last, last  # no checkpoint of an earlier run named


@pytest.mark.parametrize("log_with, pointer", [("jsonl", "metrics: {logs}/metrics.jsonl"),
                                               ("none", "log: {logs}/train.log")])
def test_the_last_line_points_at_the_trackers_the_run_has(tmp_path, log_with, pointer):
    launch_from_config(tiny_config(tmp_path, max_steps=1, log_with=log_with))
    last = (tmp_path / "logs" / "train.log").read_text().strip().splitlines()[-1]
    assert last.endswith(pointer.format(logs=tmp_path / "logs")) and "tensorboard" not in last, last


class ReturnsModelOutput(TinyTrainer):
    def forward_step(self, batch_dict):
        from transformers.modeling_outputs import CausalLMOutputWithPast
        logits = self.model(batch_dict["tokens"])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch_dict["targets"].flatten())
        return CausalLMOutputWithPast(loss=loss, logits=logits)


def test_a_model_output_from_forward_step_is_one_line(tmp_path):
    from giga_train.errors import ConfigError
    with pytest.raises(ConfigError, match=r"^forward_step: returned the model's CausalLMOutputWithPast \(loss, logits\):"
                                          r" return its \.loss, or a dict of named losses only$"):
        launch_from_config(tiny_config(tmp_path, runner="tests.test_first_hour.ReturnsModelOutput", max_steps=1))


@pytest.mark.parametrize("normalization", ["mean", "tokens"])
def test_what_is_not_a_loss_is_named(normalization):
    from diffusers.models.unets.unet_2d import UNet2DOutput
    from transformers.modeling_outputs import CausalLMOutputWithPast
    from giga_train.errors import ConfigError
    from giga_train.trainers.losses import LossBook
    book, loss = LossBook(1, normalization), torch.tensor(2.0, requires_grad=True)
    cases = [(UNet2DOutput(sample=torch.ones(2)), r"UNet2DOutput \(sample\): return "),
             (CausalLMOutputWithPast(logits=torch.ones(2)), r"\(logits\): return " + (
                 r"a loss \(it holds none: pass labels=" if normalization == "mean" else r"dict\(loss_sum="))]
    if normalization == "mean":
        cases += [(dict(loss=loss, logits=torch.ones(2, 3)), r"'logits' is a model output, not a loss"),
                  (dict(loss=loss, cache=object()), r"'cache' is not a loss tensor \(object\)"),
                  ((loss, loss), r"return a loss tensor or a dict of named loss tensors; got tuple")]
    for returned, message in cases:
        with pytest.raises(ConfigError, match=message):
            book.parse(returned)
    if normalization == "mean":
        assert book.parse(dict(a=loss, b=loss * 2)).item() == 6.0  # losses pass
