"""The config schema's `train.lora`: a LoRA adapter that giga-train adds to the model get_models returned
(with peft's own get_peft_model, before the engine wraps it), so a project need not wrap it by hand. Its
keys, their checks, and the peft.LoraConfig they make; any other LoraConfig field is passed to it as is."""
import dataclasses
import numbers

from ..config import Config
from ..errors import ConfigError
from ..registry import did_you_mean
from .keys import Key, _fill, _list_of, _positive

def _check_model(value):
    return None if isinstance(value, str) else _list_of(str, "a member name")(value)


def _check_dropout(value):
    return None if 0 <= value < 1 else f"must be in [0, 1), got {value!r}"


LORA = dict(
    target_modules=Key(None, (list, tuple, str), check=lambda v: _check_targets(v)),
    rank=Key(8, int, min=1),  # the adapter's rank (peft's r)
    alpha=Key(8, numbers.Real, check=_positive),  # the update is scaled by alpha / rank (peft's lora_alpha)
    dropout=Key(0.0, numbers.Real, check=_check_dropout),  # on the adapter's input (peft's lora_dropout)
    modules_to_save=Key(None, (list, tuple), check=_list_of(str, "a module name")),  # trained whole, in the adapter
    model=Key(None, (str, list, tuple), check=_check_model),
    base=Key(None, str),
)
# What target_modules, model and base mean: scripts/config_reference.py's MEANINGS (docs/config.md).

# peft's names for our keys: refused with ours named (one name per meaning)
PEFT_NAMES = dict(r="rank", lora_alpha="alpha", lora_dropout="dropout", base_model_name_or_path="base")
# LoraConfig fields that peft itself sets (or that make no sense to train with)
NOT_PASSED = ("peft_type", "auto_mapping", "peft_version", "inference_mode", "revision")


def lora_fields():
    """The LoraConfig fields a config may pass through (peft imported here: a one-line error without it)."""
    try:
        import peft
    except ImportError:
        raise ConfigError("train.lora: needs the peft package, not installed here (pip install 'giga-train[peft]')"
                          ) from None
    return [f.name for f in dataclasses.fields(peft.LoraConfig)
            if f.name not in NOT_PASSED and f.name not in PEFT_NAMES and f.name not in LORA]


def check_lora(section):
    """train.lora filled with its defaults (a Config), every key checked, and peft's LoraConfig built from it
    once (its own checks, e.g. of `bias`, answered in one line)."""
    if not isinstance(section, dict):
        raise ConfigError(f"train.lora: expected a dict (target_modules=..., rank=..., alpha=...), got"
                          f" {type(section).__name__} {section!r}")
    fields = lora_fields()
    for key in section:
        if key in PEFT_NAMES:
            raise ConfigError(f"train.lora.{key}: peft's name; giga-train's is '{PEFT_NAMES[key]}'")
        if key not in LORA and key not in fields:
            raise ConfigError(f"train.lora.{key}: unknown key{did_you_mean(key, [*LORA, *fields])} (giga-train's keys:"
                              f" {', '.join(LORA)}; or a field of peft.LoraConfig)")
    ours = Config({k: v for k, v in section.items() if k in LORA})
    _fill("train.lora", ours, LORA)
    filled = Config(dict(ours, **{k: v for k, v in section.items() if k not in LORA}))
    lora_config(filled)
    return filled


def lora_config(section):
    """The peft.LoraConfig of a filled train.lora section."""
    import peft
    passed = {k: (list(v) if isinstance(v, tuple) else v) for k, v in section.items() if k not in LORA}
    targets = section.target_modules
    try:
        return peft.LoraConfig(
            r=section.rank, lora_alpha=section.alpha, lora_dropout=section.dropout,
            target_modules=list(targets) if isinstance(targets, (list, tuple)) else targets,
            modules_to_save=list(section.modules_to_save) if section.modules_to_save is not None else None,
            **passed)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"train.lora: peft.LoraConfig refuses it: {str(e).splitlines()[0]}") from None


def _check_targets(value):
    if isinstance(value, str):
        return None if value else "give module names or a regex, not ''"
    if not value:
        return "give at least one module name (None: peft's defaults for known transformers models)"
    return _list_of(str, "a module name")(value)
