"""examples/ddpm: the UNet2DModel project trains a few steps and logs a DDIM grid of samples at validation
(samples/grid in the JSONL run), on the EMA weights."""
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
