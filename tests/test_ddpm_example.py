"""examples/ddpm: the UNet2DModel project trains a few steps and logs a DDIM grid of samples at validation
(samples/grid in the JSONL run), on the EMA weights; the README's diffusion snippet does the same as written."""
import json

import pytest
from PIL import Image

from giga_train import launch_from_config, load_config

pytest.importorskip("diffusers")


def test_ddpm_example_logs_a_grid_of_samples_at_validation(tmp_path):
    cfg = load_config("examples/ddpm/configs/cpu.py").to_dict()
    cfg["project_dir"] = str(tmp_path)
    cfg["dataloaders"]["train"].update(batch_size_per_gpu=4)
    cfg["dataloaders"]["train"]["data_or_config"]["num_samples"] = 16
    cfg["dataloaders"]["val"]["data_or_config"]["num_samples"] = 4
    cfg["models"].update(block_out_channels=(8, 16), norm_num_groups=4, sample_steps=2, num_samples=3)
    cfg["train"].update(max_steps=2, eval_interval=2, log_with="jsonl", progress_bar=False)
    launch_from_config(cfg)
    lines = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    [grid] = [line["samples/grid"] for line in lines if "samples/grid" in line]
    assert grid["type"] == "image" and grid["shape"] == [16, 48, 3]
    assert Image.open(tmp_path / "logs" / grid["path"]).size == (48, 16)
    assert any("val/loss" in line for line in lines)


def readme_ddpm_trainer():
    """The README's diffusion snippet, run as it is written (with the imports it leaves out)."""
    import re
    text = open("README.md").read()
    [code] = [block for block in re.findall(r"```python\n(.*?)```", text, re.S) if "class DDPMTrainer" in block]
    namespace = {}
    exec("import diffusers, torch, torch.nn.functional as F\nfrom giga_train import Trainer\n" + code, namespace)
    return namespace["DDPMTrainer"]


def test_the_readmes_diffusion_snippet_trains_and_logs_its_samples(tmp_path):
    cfg = load_config("examples/ddpm/configs/cpu.py").to_dict()
    cfg.update(project_dir=str(tmp_path), runners=[readme_ddpm_trainer()])
    for name, size in (("train", 16), ("val", 4)):
        cfg["dataloaders"][name]["data_or_config"].update(_class_name="examples.ddpm.data.ColouredSquares",
                                                          num_samples=size)
    cfg["dataloaders"]["train"].update(batch_size_per_gpu=4)
    del cfg["models"]["sample_steps"], cfg["models"]["num_samples"]
    cfg["models"].update(block_out_channels=(8, 16), norm_num_groups=4)
    cfg["train"].update(max_steps=2, eval_interval=2, log_with="jsonl", progress_bar=False)
    launch_from_config(cfg)
    lines = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    [grid] = [line["samples/grid"] for line in lines if "samples/grid" in line]
    assert grid["shape"] == [16, 64, 3]  # 4 samples of 16 x 16 side by side
