"""Checks of config values that the schema runs (kept here, beside nothing else, to stay importable from
anywhere): a NaN never passes for a number."""
import math

from ..errors import ConfigError

SECTIONS = ("train", "optimizers", "schedulers", "launch")


def refuse_nan(cfg, sections=SECTIONS):
    """ConfigError naming the first key whose value is a float NaN (at any depth of these sections; in
    lists too). Inf stays allowed (max_grad_norm=inf is "no clipping"). A NaN max_grad_norm, for one,
    passes every finiteness guard (the loss and the pre-clip norm are finite) and writes NaN weights."""
    for section in sections:
        found = _first_nan(cfg.get(section) if hasattr(cfg, "get") else getattr(cfg, section, None), section)
        if found:
            raise ConfigError(f"{found}: nan is not a number this key can take (give a finite value)")


def _first_nan(value, where):
    if isinstance(value, float) and math.isnan(value):
        return where
    if isinstance(value, dict):
        for key, item in value.items():
            found = _first_nan(item, f"{where}.{key}")
            if found:
                return found
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = _first_nan(item, f"{where}[{i}]")
            if found:
                return found
    return None
