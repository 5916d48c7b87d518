"""A PEFT LoRA from get_models: checkpoints hold the adapter only (PEFT's files, meta.json naming the base),
a small fraction of the whole model's; resume rebuilds the base by get_models and continues exactly."""
import json
import os

import pytest

pytest.importorskip("peft")

from giga_train import launch_from_config  # noqa: E402
from giga_train.checkpoint import list_checkpoints, read_weights  # noqa: E402
from tests.distributed import assert_same_weights, job  # noqa: E402
from tests.tiny_lora import write_base  # noqa: E402


FSDP2 = dict(fsdp_config=dict(fsdp_version=2, fsdp_transformer_layer_cls_to_wrap="Block"))
LAUNCH = dict(FSDP=FSDP2, DEEPSPEED=dict(deepspeed_config=dict(deepspeed_config_file="zero2.json")))


def lora_job(project, distributed_type="NO", ranks=1, **train):
    cfg = job(project, distributed_type, ranks, launch=LAUNCH.get(distributed_type),
              **dict(dict(max_steps=4, checkpoint_interval=2), **train))
    cfg["runners"] = ["tests.tiny_lora.LoraTrainer"]
    return cfg


def folder_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


@pytest.mark.parametrize("kind, ranks", [("NO", 1), ("DDP", 2), ("FSDP", 2), ("DEEPSPEED", 2)],
                         ids=["NO", "DDP", "FSDP2", "ZeRO-2"])
def test_adapter_checkpoints_are_small_and_resume_exactly(tmp_path, monkeypatch, kind, ranks):
    monkeypatch.setenv("GT_LORA_BASE", str(tmp_path / "base.pt"))
    write_base(tmp_path / "base.pt")
    straight = tmp_path / "straight"
    launch_from_config(lora_job(straight, kind, ranks))
    (_, first), (_, last) = list_checkpoints(str(straight / "models"))
    files = sorted(os.listdir(os.path.join(last, "model")))
    assert files == ["adapter_config.json", "adapter_model.safetensors"], files
    meta = json.load(open(os.path.join(last, "meta.json")))
    assert meta["layout"]["adapters"]["model"]["base"] == str(tmp_path / "base.pt")
    # the whole checkpoint; DeepSpeed's own model_states file keeps the tied (shared) embedding/head weight
    # even with exclude_frozen_parameters, and copies its zero_to_fp32.py script into each checkpoint
    share = 0.2 if kind == "DEEPSPEED" else 0.1
    assert folder_bytes(last) < share * os.path.getsize(tmp_path / "base.pt")
    resumed = tmp_path / "resumed"
    launch_from_config(lora_job(resumed, kind, ranks, max_steps=2))
    launch_from_config(lora_job(resumed, kind, ranks, resume=True))
    _, resumed_last = list_checkpoints(str(resumed / "models"))[-1]
    got, expected = read_weights(resumed_last), read_weights(last)
    assert got.keys() == expected.keys() and all("lora_" in k for k in got)
    assert_same_weights(got, expected, rtol=0, atol=0)  # bit for bit: the same steps from the same state
