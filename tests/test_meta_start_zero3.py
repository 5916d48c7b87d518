"""Meta-device start under DeepSpeed ZeRO-3 (2 gloo ranks). Rank-0 loading (zero3_init_flag) and a meta model
filled from safetensors partition by partition (both in fp32 and bf16), by a Trainer's init_weights (reset_parameters
under GatheredParameters), by the model's own init_weights (the whole model gathered) or by the default init
(each module's reset_parameters as it is materialised) hold the same weights and buffers after partitioning,
and after 4 steps, as a normal ZeRO-3 start: bit-exact, since the same values reach the same partitions and
the same ops run on them. A module nothing fills, the flag below stage 3 (check and train alike) and a meta
model below stage 3 are refused in one line."""
import pytest
import torch
from safetensors.torch import save_file

from giga_train import launch_from_config
from giga_train.cli import main
from giga_train.errors import ConfigError
from tests.distributed import assert_same_weights, final_weights, job
from tests.meta_models import build_model
from tests.test_meta_start import assert_same_start

pytest.importorskip("deepspeed")


def zero3_job(project, runner, ranks=2, stage=3, **deepspeed):
    cfg = job(project, "DEEPSPEED", ranks=ranks,
              launch=dict(deepspeed_config=dict(deepspeed_config_file=f"zero{stage}.json", **deepspeed)))
    cfg["runners"] = [f"tests.meta_models.{runner}"]
    return cfg


def run(project, runner, ranks=2, mixed_precision="no", **deepspeed):
    cfg = zero3_job(project, runner, ranks, **deepspeed)
    cfg["train"]["mixed_precision"] = mixed_precision
    launch_from_config(cfg)
    return [torch.load(project / f"after_sharding_{r}.pt", weights_only=True) for r in range(ranks)]


NORMAL = {}


def normal(tmp_path_factory, mixed_precision="no"):
    if mixed_precision not in NORMAL:
        project = tmp_path_factory.mktemp(f"normal_{mixed_precision}")
        NORMAL[mixed_precision] = run(project, "NormalStart", mixed_precision=mixed_precision), final_weights(project)
    return NORMAL[mixed_precision]


@pytest.mark.parametrize("mixed_precision", ["no", "bf16"])
def test_rank0_loading_equals_a_normal_start(tmp_path, tmp_path_factory, mixed_precision):
    after_sharding, weights = normal(tmp_path_factory, mixed_precision)
    got = run(tmp_path, "Rank0Start", mixed_precision=mixed_precision, zero3_init_flag=True)
    assert_same_start(got, after_sharding)
    assert_same_weights(final_weights(tmp_path), weights, rtol=0, atol=0)


@pytest.mark.parametrize("mixed_precision", ["no", "bf16"])  # bf16: fp32 file rows cast into bf16 partitions
def test_meta_model_from_safetensors_partitions_equals_a_normal_start(tmp_path, tmp_path_factory, monkeypatch,
                                                                      mixed_precision):
    after_sharding, weights = normal(tmp_path_factory, mixed_precision)
    save_file(build_model().state_dict(), str(tmp_path / "pretrained.safetensors"))
    monkeypatch.setenv("GT_PRETRAINED", str(tmp_path / "pretrained.safetensors"))
    got = run(tmp_path, "MetaStart", mixed_precision=mixed_precision)
    assert_same_start(got, after_sharding)
    assert_same_weights(final_weights(tmp_path), weights, rtol=0, atol=0)


def test_meta_model_from_reset_parameters_equals_a_normal_start(tmp_path, tmp_path_factory, monkeypatch):
    after_sharding, weights = normal(tmp_path_factory)
    monkeypatch.setenv("GT_PRETRAINED", "unused")
    got = run(tmp_path, "MetaResetStart")
    assert_same_start(got, after_sharding)
    assert_same_weights(final_weights(tmp_path), weights, rtol=0, atol=0)


def test_meta_model_with_its_own_init_weights_equals_a_normal_start(tmp_path, tmp_path_factory):
    """The model's init_weights() runs with the whole model gathered (it is written for a whole model)."""
    after_sharding, weights = normal(tmp_path_factory)
    assert_same_start(run(tmp_path, "SelfInitStart"), after_sharding)
    assert_same_weights(final_weights(tmp_path), weights, rtol=0, atol=0)


def test_meta_model_from_the_default_init_equals_a_normal_start(tmp_path):
    """The Trainer's init_weights: each module's reset_parameters as it is materialised, before partitioning."""
    expected = run(tmp_path / "normal", "PlainStart")
    weights = final_weights(tmp_path / "normal")
    assert_same_start(run(tmp_path / "meta", "PlainMetaStart"), expected)
    assert_same_weights(final_weights(tmp_path / "meta"), weights, rtol=0, atol=0)


def test_meta_module_without_reset_parameters_is_named(tmp_path):
    """Refused in one line; the run in this process leaves torch's F.linear in place (ZeRO-3 swaps in its own
    for good: a later plan in this process counted 26% more saved activations through it)."""
    linear = torch.nn.functional.linear
    with pytest.raises(ConfigError, match=r"nothing fills '1.scale' \(Gain has no reset_parameters\)"):
        run(tmp_path, "UnfilledStart", ranks=1)
    assert torch.nn.functional.linear is linear


def test_a_finished_zero3_run_leaves_torch_linear(tmp_path):
    linear = torch.nn.functional.linear
    run(tmp_path, "PlainMetaStart", ranks=1)
    assert torch.nn.functional.linear is linear


def test_meta_model_below_stage_3_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("GT_PRETRAINED", "unused")
    cfg = zero3_job(tmp_path, "MetaStart", ranks=1, stage=2)
    with pytest.raises(ConfigError, match="only FSDP2 .* and DeepSpeed ZeRO-3 materialise it .* DeepSpeedStrategy"):
        launch_from_config(cfg)


def test_check_and_train_agree_on_zero3_init_flag(tmp_path, capsys):
    """Refused by both below stage 3; accepted by check at stage 3, where train runs it (above)."""
    def config(stage):
        path = tmp_path / f"zero{stage}.py"
        cfg = zero3_job(tmp_path / "run", "Rank0Start", stage=stage, zero3_init_flag="true")
        path.write_text(f"config = {cfg!r}\n")
        return str(path)
    assert [main([command, config(2)]) for command in ("check", "train")] == [2, 2]
    err = capsys.readouterr().err
    line = "launch.deepspeed_config.zero3_init_flag: rank-0 loading partitions the model as ZeRO-3 does"
    assert err.count(line) == 2 and err.count("\n") == 2, err
    assert not (tmp_path / "run").exists()
    assert main(["check", config(3)]) == 0
