"""Meta-device start under FSDP2 (2 gloo ranks): rank-0 loading (fsdp_cpu_ram_efficient_loading) and a meta
model filled from safetensors shard by shard hold the same weights and buffers after sharding, and after 4
steps, as a normal start; the strategies that cannot start from meta, and FSDP1, say so in one line."""

import pytest
import torch
from safetensors.torch import save_file

from giga_train import launch_from_config
from giga_train.errors import ConfigError
from tests.distributed import assert_same_weights, final_weights, job
from tests.meta_models import build_model

FSDP = dict(fsdp_version=2, fsdp_transformer_layer_cls_to_wrap="Block")


def run(project, runner, ranks=2, distributed_type="FSDP", **fsdp):
    cfg = job(project, distributed_type, ranks=ranks,
              launch=dict(fsdp_config=dict(FSDP, **fsdp)) if distributed_type == "FSDP" else None)
    cfg["runners"] = [f"tests.meta_models.{runner}"]
    launch_from_config(cfg)
    return [torch.load(project / f"after_sharding_{r}.pt", weights_only=True) for r in range(ranks)]


@pytest.fixture(scope="module")
def normal(tmp_path_factory):
    project = tmp_path_factory.mktemp("normal")
    return run(project, "NormalStart"), final_weights(project)


def assert_same_start(got, expected):
    assert_same_weights(got[0]["full"], expected[0]["full"], rtol=0, atol=0)
    for rank in range(2):  # non-persistent buffers: in no state dict, filled on every rank
        assert_same_weights(got[rank]["buffers"], expected[rank]["buffers"], rtol=0, atol=0)


def test_rank0_loading_equals_a_normal_start(tmp_path, normal):
    after_sharding, weights = normal
    got = run(tmp_path, "Rank0Start", fsdp_cpu_ram_efficient_loading=True)
    assert_same_start(got, after_sharding)
    assert_same_weights(final_weights(tmp_path), weights, rtol=0, atol=0)


def test_meta_model_from_safetensors_shards_equals_a_normal_start(tmp_path, normal, monkeypatch):
    after_sharding, weights = normal
    save_file(build_model().state_dict(), str(tmp_path / "pretrained.safetensors"))
    monkeypatch.setenv("GT_PRETRAINED", str(tmp_path / "pretrained.safetensors"))
    got = run(tmp_path, "MetaStart")
    assert_same_start(got, after_sharding)
    assert_same_weights(final_weights(tmp_path), weights, rtol=0, atol=0)


def test_meta_model_without_init_weights_names_the_buffer(tmp_path, monkeypatch):
    monkeypatch.setenv("GT_PRETRAINED", "unused")
    monkeypatch.setattr("tests.meta_models.MetaStart.init_weights",
                        lambda self, model: type(self).__mro__[2].init_weights(self, model))
    with pytest.raises(ConfigError, match="non-persistent buffer 'blocks.0.inv_freq'"):
        run(tmp_path, "MetaStart", ranks=1)


def test_meta_model_under_one_process_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("GT_PRETRAINED", "unused")
    with pytest.raises(ConfigError, match="only FSDP2 .* and DeepSpeed ZeRO-3 materialise it"):
        run(tmp_path, "MetaStart", ranks=1, distributed_type="NO")


def test_rank0_loading_with_fsdp1_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="fsdp_cpu_ram_efficient_loading: rank-0 loading is implemented with"
                                          " fsdp_version=2 only"):
        run(tmp_path, "Rank0Start", fsdp_version=1, fsdp_cpu_ram_efficient_loading=True)


def test_safetensors_reader_casts_and_names_what_is_missing(tmp_path):
    from giga_train import load_safetensors_shards
    source = build_model()
    half = {k: v.to(torch.bfloat16) for k, v in source.state_dict().items()}
    save_file(half, str(tmp_path / "model.safetensors"))
    model = build_model()
    for p in model.parameters():
        torch.nn.init.zeros_(p)
    assert len(load_safetensors_shards(model, str(tmp_path))) == len(half)  # a folder of files
    assert_same_weights(model.state_dict(), {k: v.float() for k, v in half.items()}, rtol=0, atol=0)
    del half["head.bias"]
    save_file(half, str(tmp_path / "model.safetensors"))
    with pytest.raises(ConfigError, match="holds no tensor 'head.bias'"):
        load_safetensors_shards(model, str(tmp_path / "model.safetensors"))


def test_meta_model_with_fsdp1_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("GT_PRETRAINED", "unused")
    with pytest.raises(ConfigError, match="only FSDP2 .* materialise it .* under FSDP1Strategy"):
        run(tmp_path, "MetaStart", ranks=1, fsdp_version=1)
