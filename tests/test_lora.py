"""LoRA: a PEFT model from get_models, or train.lora around get_models' base. Checkpoints hold the adapter only
(PEFT's files, its EMA too, meta.json naming the base), under 10% of the base's size under every strategy;
resume rebuilds the base by get_models and continues exactly; export writes the adapter and the merged model."""
import json
import os

import pytest

pytest.importorskip("peft")

import torch  # noqa: E402

from giga_train import ModuleDict, launch_from_config  # noqa: E402
from giga_train.checkpoint import list_checkpoints, read_weights  # noqa: E402
from giga_train.config import Config  # noqa: E402
from giga_train.errors import ConfigError  # noqa: E402
from giga_train.schema.validate import validate_config  # noqa: E402
from giga_train.trainers.lora import with_lora  # noqa: E402
from tests.distributed import assert_same_weights, job  # noqa: E402
from tests.tiny_lora import BASE, lora_section, write_base  # noqa: E402
from examples.char_lm.model import CharLM  # noqa: E402

FSDP2 = dict(fsdp_config=dict(fsdp_version=2, fsdp_transformer_layer_cls_to_wrap="Block"))
SHARDED = dict(fsdp_config=dict(FSDP2["fsdp_config"], fsdp_state_dict_type="SHARDED_STATE_DICT"))
ZERO2 = dict(deepspeed_config=dict(deepspeed_config_file="zero2.json"))
ADAPTER_FILES = ["adapter_config.json", "adapter_model.safetensors"]


def lora_job(project, base, kind="NO", ranks=1, launch=None, config_block=False, runner=None, **train):
    """4 steps, a checkpoint every 2; `config_block`: train.lora (LoRA's, unless given) around BaseTrainer's
    base (or `runner`'s), else LoraTrainer's own get_peft_model."""
    if config_block:
        train.setdefault("lora", lora_section(base))
    cfg = job(project, kind, ranks, launch=launch, **dict(dict(max_steps=4, checkpoint_interval=2), **train))
    runner = runner or ("BaseTrainer" if config_block else "LoraTrainer")
    cfg["runners"] = [f"tests.tiny_lora.{runner}"]
    return cfg


def folder_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def straight_and_resumed(tmp_path, monkeypatch, *args, **kwargs):
    """(last checkpoint of 4 straight steps, of 2 more steps resumed from the straight run's step 2)."""
    base = tmp_path / "base.pt"
    monkeypatch.setenv("GT_LORA_BASE", str(base))
    write_base(base)
    launch_from_config(lora_job(tmp_path / "straight", base, *args, **kwargs))
    (_, first), (_, last) = list_checkpoints(str(tmp_path / "straight" / "models"))
    launch_from_config(lora_job(tmp_path / "resumed", base, *args, resume=first, **kwargs))
    return last, list_checkpoints(str(tmp_path / "resumed" / "models"))[-1][1]


def assert_adapter_only(state):
    assert state and all("lora_" in k for k in state), sorted(state)


CASES = dict(  # (distributed_type, ranks, launch, config_block, with_ema)
    NO=("NO", 1, None, True, True),
    DDP=("DDP", 2, None, False, False),
    # SHARDED_STATE_DICT writes the folders FULL_STATE_DICT writes for a model of adapters alone: one case for both
    FSDP2_sharded=("FSDP", 2, SHARDED, True, True),
    ZeRO2=("DEEPSPEED", 2, ZERO2, False, False),
)


@pytest.mark.parametrize("case", list(CASES))
def test_adapter_checkpoints_are_small_and_resume_exactly(tmp_path, monkeypatch, case):
    kind, ranks, launch, config_block, ema = CASES[case]
    last, resumed = straight_and_resumed(tmp_path, monkeypatch, kind, ranks, launch, config_block, with_ema=ema)
    meta = json.load(open(os.path.join(last, "meta.json")))
    adapters = meta["layout"]["adapters"]["model"]
    assert adapters["base"] == str(tmp_path / "base.pt") and adapters["base_class"].endswith("CharLM")
    # SHARDED_STATE_DICT too: the adapter alone is gathered and written in PEFT's format, no shards of the model
    assert not meta["layout"].get("sharded") and not os.path.exists(os.path.join(last, "model_dcp"))
    assert sorted(os.listdir(os.path.join(last, "model"))) == ADAPTER_FILES
    assert not ema or sorted(os.listdir(os.path.join(last, "model_ema"))) == ADAPTER_FILES
    # the whole checkpoint (optimizer state, RNG, DeepSpeed's own files...) against the base's weights alone
    assert folder_bytes(last) < 0.1 * os.path.getsize(tmp_path / "base.pt")
    got, expected = read_weights(resumed), read_weights(last)
    assert_adapter_only(expected)
    assert_same_weights(got, expected, rtol=0, atol=0)  # bit for bit: the same steps from the same state
    if ema:  # the average of the adapter's weights, resumed exactly too
        got, expected = read_weights(resumed, ema=True), read_weights(last, ema=True)
        assert_adapter_only(expected)
        assert_same_weights(got, expected, rtol=0, atol=0)
        assert any(not torch.equal(expected[k], v) for k, v in read_weights(last).items())  # not the live weights


def test_config_block_is_get_peft_model_and_exports(tmp_path, monkeypatch):
    """train.lora trains the weights a hand-made get_peft_model trains, to the bit; export writes PEFT's adapter
    and the merged model: the base's qkv plus alpha / rank * B @ A; --ema the average's adapter."""
    from giga_train.tools.export import export
    base = tmp_path / "base.pt"
    monkeypatch.setenv("GT_LORA_BASE", str(base))
    write_base(base)
    for name, block in (("hand", False), ("block", True)):
        launch_from_config(lora_job(tmp_path / name, base, config_block=block, max_steps=2, with_ema=True))
    (_, hand), = list_checkpoints(str(tmp_path / "hand" / "models"))
    (_, block), = list_checkpoints(str(tmp_path / "block" / "models"))
    adapter = read_weights(block)
    assert_same_weights(adapter, read_weights(hand), rtol=0, atol=0)
    out = export(block, str(tmp_path / "export"), merged=True)
    assert set(ADAPTER_FILES) <= set(os.listdir(out))
    merged = read_weights_file(os.path.join(out, "merged"))
    start = torch.load(base, weights_only=True)
    a, b = (adapter[f"base_model.model.blocks.0.qkv.lora_{x}.default.weight"] for x in "AB")
    torch.testing.assert_close(merged["blocks.0.qkv.weight"], start["blocks.0.qkv.weight"] + 8 / 4 * b @ a)
    out = export(block, str(tmp_path / "export_ema"), ema=True)
    exported, saved = (read_weights_file(os.path.join(folder, ADAPTER_FILES[1])) for folder in
                       (out, os.path.join(block, "model_ema")))
    assert_same_weights(exported, saved, rtol=0, atol=0)
    assert not all(torch.equal(v, read_weights_file(os.path.join(block, "model", ADAPTER_FILES[1]))[k])
                   for k, v in saved.items())  # the average, not the live adapter


def read_weights_file(folder):
    from giga_train.checkpoint.formats.weights import load_state_dict
    return load_state_dict(folder)


def check(tmp_path, **lora):
    cfg = lora_job(tmp_path, tmp_path / "base.pt")
    cfg["train"]["lora"] = lora
    return validate_config(Config(cfg))


@pytest.mark.parametrize("lora, message", [
    (dict(target_modules=["qkv"], rnak=4), "train.lora.rnak: unknown key; did you mean 'rank'?"),
    (dict(target_modules=["qkv"], r=4), "train.lora.r: peft's name; giga-train's is 'rank'"),
    (dict(target_modules=["qkv"], rank=0), "train.lora.rank: must be >= 1, got 0"),
    (dict(target_modules="", rank=4), "train.lora.target_modules: give module names or a regex"),
    (dict(target_modules=["qkv"], layers_pattern="blocks"), "train.lora: peft.LoraConfig refuses it: When `layers_pattern`"),
])
def test_config_block_refused_in_one_line(tmp_path, lora, message):
    with pytest.raises(ConfigError) as caught:
        check(tmp_path, **lora)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_config_block_fills_defaults_and_passes_peft_fields(tmp_path):
    lora = check(tmp_path, target_modules=["qkv"], use_rslora=True).train.lora
    assert (lora.rank, lora.alpha, lora.dropout, lora.model, lora.use_rslora) == (8, 8, 0.0, None, True)


def test_config_block_names_the_module_dict_member():
    lora = check_section(target_modules=["qkv"], rank=4, model="lm")
    models = with_lora(ModuleDict(lm=CharLM(**BASE), aux=torch.nn.Linear(4, 4)), lora)
    assert type(models["lm"]).__name__ == "PeftModel" and isinstance(models["aux"], torch.nn.Linear)
    assert all(p.requires_grad for p in models["aux"].parameters())  # another member stays as get_models made it
    for model, message in ((None, "ModuleDict of 2 members (lm, aux): name the one(s) to adapt"),
                           ("lmm", "'lmm' is not a member of get_models' ModuleDict; did you mean 'lm'?")):
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            with_lora(ModuleDict(lm=CharLM(**BASE), aux=torch.nn.Linear(4, 4)),
                      check_section(target_modules=["qkv"], model=model))
    with pytest.raises(ConfigError, match="train.lora.target_modules: peft's get_peft_model refuses it for the model"):
        with_lora(CharLM(**BASE), check_section(target_modules=["nowhere"]))
    with pytest.raises(ConfigError, match="train.lora: the model is already a peft.PeftModel"):
        with_lora(with_lora(CharLM(**BASE), check_section(target_modules=["qkv"])), check_section(target_modules=["qkv"]))


def check_section(**lora):
    from giga_train.schema.lora import check_lora
    return check_lora(lora)


def test_sharded_module_dict_holds_the_adapter_and_the_other_member(tmp_path, monkeypatch):
    """SHARDED_STATE_DICT with train.lora on one ModuleDict member: the shards hold that member's adapter and the
    other member whole (not the base), the EMA's too; resume exact (FSDP2, one rank)."""
    last, resumed = straight_and_resumed(tmp_path, monkeypatch, "FSDP", 1, SHARDED, True, "DictTrainer",
                                         with_ema=True, lora=dict(lora_section(tmp_path / "base.pt"), model="lm"))
    meta = json.load(open(os.path.join(last, "meta.json")))
    assert meta["layout"]["sharded"] and list(meta["layout"]["adapters"]) == ["lm"]
    for ema in (False, True):
        got, expected = read_weights(resumed, ema=ema), read_weights(last, ema=ema)
        assert sorted(k for k in expected if not k.startswith("lm.")) == ["aux.bias", "aux.weight"]
        assert_adapter_only({k: v for k, v in expected.items() if k.startswith("lm.")})
        assert_same_weights(got, expected, rtol=0, atol=0)
