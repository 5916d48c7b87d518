"""The DeepSpeed JSON, with the train config as the single source of truth.

"auto" values are filled from the train config; an explicit value that disagrees is an error, never
silently overridden. Files resolve against the working directory, then the package's own
accelerate_configs/ (zero0.json .. zero3.json): the folder keeps GigaTrain's name because GigaTrain configs
name their DeepSpeed files by that path."""
import copy
import json
import os

from ..errors import ConfigError

PACKAGE_CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "accelerate_configs")


def read_deepspeed_config(deepspeed_config):
    """(the DeepSpeed dict, where it came from) from launch.deepspeed_config."""
    deepspeed_config = dict(deepspeed_config or {})
    deepspeed_config.pop("zero3_init_flag", None)  # ours (rank-0 loading), beside DeepSpeed's own keys
    deepspeed_config = deepspeed_config or {"deepspeed_config_file": "zero2.json"}
    if "deepspeed_config_file" not in deepspeed_config:
        return copy.deepcopy(deepspeed_config), "launch.deepspeed_config"
    name = deepspeed_config["deepspeed_config_file"]
    candidates = [name, os.path.join(PACKAGE_CONFIGS, os.path.basename(name))]
    path = next((p for p in candidates if os.path.isfile(p)), None)
    if path is None:
        shipped = ", ".join(sorted(os.listdir(PACKAGE_CONFIGS)))
        raise ConfigError(f"launch.deepspeed_config.deepspeed_config_file: '{name}' not found here nor among the"
                          f" shipped configs ({shipped})")
    try:
        with open(path) as f:
            return json.load(f), path
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None


def resolve_deepspeed_config(deepspeed_config, train, micro_batch, world_size):
    ds, source = read_deepspeed_config(deepspeed_config)
    stage = ds.get("zero_optimization", {}).get("stage", 0)
    if (deepspeed_config or {}).get("zero3_init_flag") and stage != 3:
        raise ConfigError(f"launch.deepspeed_config.zero3_init_flag: rank-0 loading partitions the model as ZeRO-3"
                          f" does, and {source} sets ZeRO stage {stage}; use stage 3 or remove the flag")
    for section in ("optimizer", "scheduler"):
        if section in ds:
            raise ConfigError(f"{source}: remove '{section}': giga-train builds it from the config's"
                              f" '{section}s' section and hands it to the engine")
    wanted = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": train.gradient_accumulation_steps,
        "train_batch_size": micro_batch * train.gradient_accumulation_steps * world_size,
        "gradient_clipping": float(train.max_grad_norm or 0.0),
    }
    for key, value in wanted.items():
        _fill(ds, key, value, source, key)
    for mode in ("bf16", "fp16"):
        section = ds.setdefault(mode, {})
        _fill(section, "enabled", train.mixed_precision == mode, source, f"{mode}.enabled")
    ds.setdefault("zero_allow_untested_optimizer", True)
    ds.setdefault("steps_per_print", 10**9)
    return ds


def _fill(node, key, value, source, where):
    current = node.get(key, "auto")
    if current == "auto":
        node[key] = value
    elif current != value:
        raise ConfigError(f"{source}: {where}={current!r} conflicts with the train config's {value!r}"
                          " (set it to \"auto\" or change the train config)")
