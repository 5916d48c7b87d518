"""mixed_precision="fp8": which Linears go to float8 (pure logic, no torchao needed), the config's
one-line errors, and the conversion itself where torchao is installed."""
import sys

import pytest
import torch
from torch import nn

from examples.llama.model import Llama, shape_of
from examples.char_lm.model import CharLM
from giga_train.errors import ConfigError
from giga_train.engine.fp8 import check_fp8_config, convert_to_float8, float8_linear_names, head_names
from tests.tiny import MODEL


def test_the_head_and_dims_not_multiple_of_16_stay_in_high_precision():
    model = Llama(shape_of("tiny"))
    model.layers[1].feed_forward.w2 = nn.Linear(160, 72, bias=False)  # 72 is not a multiple of 16
    names = float8_linear_names(model)
    assert head_names(model) == ["output"] and "output" not in names
    assert "layers.1.feed_forward.w2" not in names and "layers.0.feed_forward.w2" in names
    assert len(names) == 2 * 7 - 1
    assert "output" in float8_linear_names(model, exclude=[])  # an explicit list replaces the default
    assert not any("attention" in n for n in float8_linear_names(model, exclude=["attention"]))


def test_the_head_is_looked_for_outside_the_blocks():
    # At dim 64 CharLM's MLP maps 64 -> 256, its vocabulary, but inside the blocks: not a head.
    model = CharLM(**dict(MODEL, dim=64))
    assert head_names(model) == ["head"]
    names = float8_linear_names(model)
    assert "blocks.0.mlp.0" in names and "head" not in names
    no_embedding = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
    assert head_names(no_embedding) == ["2"] and float8_linear_names(no_embedding) == ["0"]


@pytest.mark.parametrize("cfg, message", [
    (dict(recipie="rowwise"), "unknown key 'recipie'; did you mean 'recipe'?"),
    (dict(recipe="rowwize"), "recipe: 'rowwize' is not one of"),
    (dict(exclude="output"), "exclude: expected a list"),
    (dict(recipe="rowwise", fsdp_float8_all_gather=True), "only with recipe='tensorwise'"),
])
def test_bad_fp8_config_gets_one_line(cfg, message):
    assert message in check_fp8_config(cfg)


def test_missing_torchao_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao.float8", None)  # import fails, installed or not
    with pytest.raises(ConfigError, match="'fp8' needs the torchao package"):
        convert_to_float8(Llama(shape_of("tiny")))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU refusal")
def test_conversion_swaps_exactly_the_chosen_linears():
    pytest.importorskip("torchao.float8")
    from torchao.float8.float8_linear import Float8Linear
    model = Llama(shape_of("tiny"))
    expected = float8_linear_names(model)
    assert convert_to_float8(model) == sorted(expected)
    swapped = sorted(n for n, m in model.named_modules() if isinstance(m, Float8Linear))
    assert swapped == sorted(expected) and type(model.output) is nn.Linear
    assert type(model.layers[0].attention.wq) is Float8Linear and type(model.layers[1].feed_forward.w2) is Float8Linear
    assert isinstance(model.layers[0].attention.wq.weight, torch.nn.Parameter)  # still trained as a parameter



def test_fp8_where_it_cannot_run_is_refused_by_check_in_one_line(capsys):
    from giga_train.cli import main as cli
    rc = cli(["check", "examples/wan/configs/tiny_cpu.py", "--set", "train.mixed_precision='fp8'"])
    err = capsys.readouterr().err.strip()
    if torch.cuda.is_available() and pytest.importorskip("torchao"):
        assert rc == 0, err
        return
    assert rc == 2 and err.count("\n") == 0, err
    try:
        import torchao  # noqa: F401
        assert "'fp8' needs a CUDA GPU" in err
    except ImportError:
        assert "'fp8' needs the torchao package, not installed here" in err


def test_a_token_count_not_divisible_by_16_trains_in_float8():
    pytest.importorskip("torchao.float8")
    from torchao.float8.float8_linear import Float8Linear
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64), nn.Linear(64, 64))
    assert convert_to_float8(model, dict(exclude=["3"])) == ["0", "2"]
    assert all(m.config.pad_inner_dim for m in model.modules() if isinstance(m, Float8Linear))
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8 GEMMs need a CUDA GPU of compute capability 8.9+")
    model.cuda()
    x = torch.randn(1, 5070, 64, device="cuda")  # 5,070 tokens: Wan's 480x832x49, no multiple of 16
    with torch.autocast("cuda", dtype=torch.bfloat16):
        model(x).float().square().mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
