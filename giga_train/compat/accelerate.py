"""Accelerate's forms in `launch` (GigaTrain's `launch` is Accelerate's ClusterConfig): FSDP and DeepSpeed plugin
keys, their string values ('2', 'false', 'FULL_SHARD'), and the ClusterConfig keys giga-train has no use for.

Each function takes the user's dict and returns the normalised one that our strategies read, or raises
ConfigError in one line. A key is either honoured (mapped onto what our code does) or refused with the reason;
none is dropped without a word."""
from ..errors import ConfigError
from ..registry import did_you_mean

TRUE, FALSE = ("y", "yes", "t", "true", "on", "1"), ("n", "no", "f", "false", "off", "0")  # Accelerate's str_to_bool
SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")  # torch's 1..5
WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
PREFETCH = ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")
STATE_DICT_TYPES = ("FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT")


def as_bool(where, value):
    """True/False, or Accelerate's strings for them ('true', 'False', 'yes', '0'...)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in TRUE + FALSE:
        return value.strip().lower() in TRUE
    raise ConfigError(f"{where}: expected true/false (or 'true'/'false'), got {value!r}")


def as_int(where, value, minimum=None):
    """An int, or its string ('2')."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: expected an integer, got {type(value).__name__} {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{where}: must be >= {minimum}, got {value!r}")
    return value


def as_float(where, value):
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: expected a number, got {type(value).__name__} {value!r}")
    return float(value)


def as_choice(where, value, choices, refused=None):
    """One of `choices`, case-insensitive; Accelerate also takes an enum's 1-based index ('1' = the first).
    `refused`: {choice: why}, the choices Accelerate takes and we do not, each refused in one line."""
    choice = _choice(where, value, choices)
    if choice in (refused or {}):
        raise ConfigError(f"{where}: {choice!r} {refused[choice]}")
    return choice


def _choice(where, value, choices):
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= len(choices):
        return choices[value - 1]
    if isinstance(value, str) and value.strip().isdigit() and 1 <= int(value) <= len(choices):
        return choices[int(value) - 1]
    if isinstance(value, str) and value.strip().upper() in choices:
        return value.strip().upper()
    raise ConfigError(f"{where}: {value!r} is not one of {', '.join(choices)}{did_you_mean(value, choices)}")


def class_list(where, value):
    """'A,B' (Accelerate's form) or a list -> ['A', 'B']."""
    if value is None:
        return None
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return [v.strip() for v in value]
    raise ConfigError(f"{where}: expected class names ('A,B' or a list), got {value!r}")


# ---------------------------------------------------------------------------------------------------- FSDP
FSDP_KEYS = ("fsdp_version", "fsdp_auto_wrap_policy", "fsdp_transformer_layer_cls_to_wrap", "fsdp_min_num_params",
             "fsdp_sharding_strategy", "fsdp_reshard_after_forward", "fsdp_offload_params", "fsdp_backward_prefetch",
             "fsdp_state_dict_type", "fsdp_forward_prefetch", "fsdp_use_orig_params", "fsdp_cpu_ram_efficient_loading",
             "fsdp_sync_module_states", "fsdp_activation_checkpointing", "fsdp_activation_checkpointing_offload",
             "fsdp_ignored_modules")
FSDP_DEFAULTS = dict(fsdp_version=2, fsdp_auto_wrap_policy="TRANSFORMER_BASED_WRAP",
                     fsdp_transformer_layer_cls_to_wrap=None, fsdp_cpu_ram_efficient_loading=False,
                     fsdp_state_dict_type="FULL_STATE_DICT", fsdp_reshard_after_forward=True,
                     fsdp_activation_checkpointing=False)
# What happens to a value we do not implement: refused with this reason.
NOT_IMPLEMENTED = "giga-train does not implement it"


def normalise_fsdp(user):
    """launch.fsdp_config in Accelerate's forms -> the keys the FSDP strategies read (FSDP_DEFAULTS' keys).

    Keys may be written without the 'fsdp_' prefix, as Accelerate allows."""
    where = "launch.fsdp_config"
    given, named = {}, {}
    for key, value in dict(user or {}).items():
        full = key if key.startswith("fsdp_") else f"fsdp_{key}"
        if full not in FSDP_KEYS:
            raise ConfigError(f"{where}.{key}: unknown key{did_you_mean(full, FSDP_KEYS)}")
        if full in given:
            raise ConfigError(f"{where}: '{named[full]}' and '{key}' are the same key; give it once")
        given[full], named[full] = value, key
    out = dict(FSDP_DEFAULTS)
    at = lambda k: f"{where}.{k}"  # noqa: E731
    if "fsdp_version" in given:
        out["fsdp_version"] = as_int(at("fsdp_version"), given["fsdp_version"])
        if out["fsdp_version"] not in (1, 2):
            raise ConfigError(f"{at('fsdp_version')}: {given['fsdp_version']!r} is not 1 or 2")
    v2 = out["fsdp_version"] == 2
    if "fsdp_auto_wrap_policy" in given:
        out["fsdp_auto_wrap_policy"] = as_choice(
            at("fsdp_auto_wrap_policy"), given["fsdp_auto_wrap_policy"], WRAP_POLICIES,
            refused={"SIZE_BASED_WRAP": "is not implemented; use 'TRANSFORMER_BASED_WRAP' with"
                                        " fsdp_transformer_layer_cls_to_wrap"})
    if given.get("fsdp_transformer_layer_cls_to_wrap") is not None:
        out["fsdp_transformer_layer_cls_to_wrap"] = class_list(at("fsdp_transformer_layer_cls_to_wrap"),
                                                              given["fsdp_transformer_layer_cls_to_wrap"])
    if "fsdp_min_num_params" in given:  # read by SIZE_BASED_WRAP only (refused above): Accelerate ignores it too
        as_int(at("fsdp_min_num_params"), given["fsdp_min_num_params"], 0)
    reshard = None
    if "fsdp_sharding_strategy" in given:
        reshard = _reshard_of(at("fsdp_sharding_strategy"), given["fsdp_sharding_strategy"])
    if "fsdp_reshard_after_forward" in given:
        value = given["fsdp_reshard_after_forward"]
        is_name = isinstance(value, str) and value.strip().lower() not in TRUE + FALSE
        mine = (_reshard_of(at("fsdp_reshard_after_forward"), value) if is_name
                else as_bool(at("fsdp_reshard_after_forward"), value))
        if reshard is not None and mine != reshard:
            raise ConfigError(f"{where}: fsdp_sharding_strategy={given['fsdp_sharding_strategy']!r} and"
                              f" fsdp_reshard_after_forward={value!r} disagree; give one")
        reshard = mine
    if reshard is not None:
        out["fsdp_reshard_after_forward"] = reshard
    if as_bool(at("fsdp_offload_params"), given.get("fsdp_offload_params", False)):
        raise ConfigError(f"{at('fsdp_offload_params')}: CPU offload of parameters is not implemented"
                          " (use DEEPSPEED with offload_optimizer_device='cpu', or remove it)")
    if given.get("fsdp_backward_prefetch") is not None:
        prefetch = as_choice(at("fsdp_backward_prefetch"), given["fsdp_backward_prefetch"], PREFETCH)
        if not v2 and prefetch != "BACKWARD_PRE":  # FSDP2 schedules its own prefetch; Accelerate drops the key
            raise ConfigError(f"{at('fsdp_backward_prefetch')}: only 'BACKWARD_PRE' (torch's default) is"
                              f" implemented with fsdp_version=1, got {prefetch!r}")
    if "fsdp_state_dict_type" in given:
        # FULL: the model gathered into its folders at each checkpoint; SHARDED: each rank writes its shards
        # (checkpoint/formats/model_layout.py)
        out["fsdp_state_dict_type"] = as_choice(
            at("fsdp_state_dict_type"), given["fsdp_state_dict_type"], STATE_DICT_TYPES,
            refused={"LOCAL_STATE_DICT": "is not supported (checkpoints must reload at any world size); use"
                                         " FULL_STATE_DICT or SHARDED_STATE_DICT"})
    if as_bool(at("fsdp_forward_prefetch"), given.get("fsdp_forward_prefetch", False)) and not v2:
        raise ConfigError(f"{at('fsdp_forward_prefetch')}: forward prefetch is not implemented (FSDP1); remove it")
    if "fsdp_use_orig_params" in given and not v2 and not as_bool(at("fsdp_use_orig_params"),
                                                                  given["fsdp_use_orig_params"]):
        raise ConfigError(f"{at('fsdp_use_orig_params')}: giga-train's FSDP1 always uses the original parameters"
                          " (use_orig_params=True); remove it or set it true")
    elif "fsdp_use_orig_params" in given:
        as_bool(at("fsdp_use_orig_params"), given["fsdp_use_orig_params"])  # FSDP2: always original parameters
    if as_bool(at("fsdp_cpu_ram_efficient_loading"), given.get("fsdp_cpu_ram_efficient_loading", False)):
        if not v2:  # FSDP2 shards the meta model and broadcasts rank 0's weights (distributed/meta_start.py)
            raise ConfigError(f"{at('fsdp_cpu_ram_efficient_loading')}: rank-0 loading is implemented with"
                              " fsdp_version=2 only; set it 'false' or use fsdp_version 2")
        out["fsdp_cpu_ram_efficient_loading"] = True
    if "fsdp_sync_module_states" in given:  # ranks build identical weights (same seed, same files): holds as is
        as_bool(at("fsdp_sync_module_states"), given["fsdp_sync_module_states"])
    if "fsdp_activation_checkpointing" in given:
        out["fsdp_activation_checkpointing"] = as_bool(at("fsdp_activation_checkpointing"),
                                                       given["fsdp_activation_checkpointing"])
    if as_bool(at("fsdp_activation_checkpointing_offload"), given.get("fsdp_activation_checkpointing_offload", False)):
        raise ConfigError(f"{at('fsdp_activation_checkpointing_offload')}: offloading checkpointed activations"
                          " is not implemented; remove it")
    if given.get("fsdp_ignored_modules") is not None:
        raise ConfigError(f"{at('fsdp_ignored_modules')}: not implemented (every parameter is sharded); remove it")
    return out


def _reshard_of(where, value):
    """A sharding strategy name (or its index) -> reshard_after_forward; the strategies we cannot run: refused."""
    hybrid = ("(sharding within a node, replication across nodes) is not implemented; use 'FULL_SHARD' or"
              " 'SHARD_GRAD_OP'")
    name = as_choice(where, value, SHARDING, refused={"NO_SHARD": "is data parallelism: use distributed_type='DDP'",
                                                       "HYBRID_SHARD": hybrid, "HYBRID_SHARD_ZERO2": hybrid})
    return name == "FULL_SHARD"  # SHARD_GRAD_OP keeps the gathered parameters until backward (ZeRO-2 like)


# ----------------------------------------------------------------------------------------------- DeepSpeed
DS_PLUGIN_KEYS = ("deepspeed_config_file", "zero_stage", "offload_optimizer_device", "offload_param_device",
                  "offload_optimizer_nvme_path", "offload_param_nvme_path", "gradient_accumulation_steps",
                  "gradient_clipping", "zero3_init_flag", "zero3_save_16bit_model", "deepspeed_hostfile",
                  "deepspeed_exclusion_filter", "deepspeed_inclusion_filter", "deepspeed_multinode_launcher",
                  "deepspeed_moe_layer_cls_names")
# Accelerate refuses these next to a deepspeed_config_file (they belong in the file)
DS_NOT_WITH_FILE = ("zero_stage", "offload_optimizer_device", "offload_param_device", "offload_optimizer_nvme_path",
                    "offload_param_nvme_path", "gradient_accumulation_steps", "gradient_clipping",
                    "zero3_save_16bit_model")
OFFLOAD_DEVICES = ("none", "cpu", "nvme")


def normalise_deepspeed(user, train):
    """launch.deepspeed_config, with `zero3_init_flag` (Accelerate's key, in either form) kept beside the result
    when true: here it asks for rank-0 loading under ZeRO-3 (distributed/meta_start.py)."""
    user = dict(user or {})
    rank0 = as_bool("launch.deepspeed_config.zero3_init_flag", user.pop("zero3_init_flag", False))
    ds = _deepspeed_without_init_flag(user, train)
    return dict(ds or {}, zero3_init_flag=True) if rank0 else ds


def _deepspeed_without_init_flag(user, train):
    """launch.deepspeed_config: Accelerate's plugin keys -> {'deepspeed_config_file': ...} or an inline DeepSpeed
    dict, which distributed/deepspeed_config.py resolves against the train config. A dict with none of the plugin
    keys is an inline DeepSpeed config already (our own form) and is returned unchanged.

    `gradient_clipping` (DeepSpeed clips) becomes train.max_grad_norm when that is unset: one value for both."""
    where = "launch.deepspeed_config"
    user = dict(user or {})
    # gradient_clipping and gradient_accumulation_steps are keys of both forms (with the same meaning)
    shared = ("gradient_clipping", "gradient_accumulation_steps")
    plugin = [k for k in user if k in DS_PLUGIN_KEYS and k not in shared]
    other = [k for k in user if k not in DS_PLUGIN_KEYS]
    if not user or (other and not plugin):
        return user or None  # an inline DeepSpeed config (our own form)
    if other:
        raise ConfigError(f"{where}.{other[0]}: unknown key{did_you_mean(other[0], DS_PLUGIN_KEYS)} (Accelerate's"
                          " keys and inline DeepSpeed JSON cannot be mixed: put DeepSpeed's own keys in the file)")
    at = lambda k: f"{where}.{k}"  # noqa: E731
    for key in ("deepspeed_hostfile", "deepspeed_exclusion_filter", "deepspeed_inclusion_filter",
                "deepspeed_multinode_launcher"):
        if user.get(key) is not None:
            raise ConfigError(f"{at(key)}: giga-train does not start machines over pdsh/ssh: run giga-train on each"
                              " machine with launch.machine_rank (or under SLURM/torchrun); remove it")
    if user.get("deepspeed_moe_layer_cls_names") is not None:
        raise ConfigError(f"{at('deepspeed_moe_layer_cls_names')}: DeepSpeed MoE leaf modules are not implemented")
    clipping = None
    if user.get("gradient_clipping") is not None:
        clipping = as_float(at("gradient_clipping"), user["gradient_clipping"])
    if user.get("deepspeed_config_file") is not None:
        clash = [k for k in DS_NOT_WITH_FILE if user.get(k) is not None]
        if clash:  # Accelerate raises here too: "the following accelerate config variables will be ignored"
            raise ConfigError(f"{at(clash[0])}: set it inside deepspeed_config_file, not beside it (Accelerate"
                              " refuses the pair too)")
        if not isinstance(user["deepspeed_config_file"], str):
            raise ConfigError(f"{at('deepspeed_config_file')}: expected a path, got {user['deepspeed_config_file']!r}")
        return {"deepspeed_config_file": user["deepspeed_config_file"]}
    stage = as_int(at("zero_stage"), user.get("zero_stage", 2))  # Accelerate's default stage: 2
    if stage not in (0, 1, 2, 3):
        raise ConfigError(f"{at('zero_stage')}: {stage!r} is not 0, 1, 2 or 3")
    zero = {"stage": stage}
    for part in ("optimizer", "param"):
        device = user.get(f"offload_{part}_device") or "none"
        device = as_choice(at(f"offload_{part}_device"), device, tuple(d.upper() for d in OFFLOAD_DEVICES)).lower()
        path = user.get(f"offload_{part}_nvme_path")
        if device == "nvme" and (not isinstance(path, str) or path.lower() == "none"):
            raise ConfigError(f"{at(f'offload_{part}_nvme_path')}: offload to nvme needs a folder")
        if device != "none":
            zero[f"offload_{part}"] = dict(device=device, **({"nvme_path": path} if device == "nvme" else {}))
    if "zero3_save_16bit_model" in user:
        zero["stage3_gather_16bit_weights_on_model_save"] = as_bool(at("zero3_save_16bit_model"),
                                                                    user["zero3_save_16bit_model"])
    ds = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "zero_optimization": zero,
          "gradient_accumulation_steps": "auto", "gradient_clipping": "auto"}
    if user.get("gradient_accumulation_steps") is not None:
        steps = as_int(at("gradient_accumulation_steps"), user["gradient_accumulation_steps"], 1)
        if steps != train.gradient_accumulation_steps:
            raise ConfigError(f"{at('gradient_accumulation_steps')}={steps} disagrees with"
                              f" train.gradient_accumulation_steps={train.gradient_accumulation_steps}; set one")
    if clipping is not None:
        if train.max_grad_norm is None:
            train.max_grad_norm = clipping or None  # 0.0: DeepSpeed's "no clipping"
        elif float(train.max_grad_norm) != clipping:
            raise ConfigError(f"{at('gradient_clipping')}={clipping} disagrees with"
                              f" train.max_grad_norm={train.max_grad_norm}; set one")
    return ds


# ------------------------------------------------------------------------------------- other ClusterConfig keys
def check_cluster_key(key, value):
    """ClusterConfig keys (GigaTrain hands launch's extra keys to Accelerate) that we do not run: refused unless
    empty/false. Returns None when the value asks for nothing."""
    empty = value in (None, False, {}, [], "", "no", "NO")
    reasons = {
        "downcast_bf16": "TPU only", "tpu_name": "TPU only", "tpu_zone": "TPU only", "tpu_use_cluster": "TPU only",
        "tpu_use_sudo": "TPU only", "command_file": "TPU pods only", "commands": "TPU pods only",
        "tpu_vm": "TPU only", "tpu_env": "TPU only",
        "megatron_lm_config": "Megatron-LM is not a giga-train engine",
        "mpirun_config": "mpirun is not used (run under SLURM or torchrun, or let giga-train start the ranks)",
        "fp8_config": "fp8 is a train setting here: train.mixed_precision='fp8' and train.fp8_config",
        "enable_cpu_affinity": "pinning ranks to CPU cores is not implemented",
    }
    if key in reasons and not empty:
        raise ConfigError(f"launch.{key}: {reasons[key]}; remove it")


def dynamo_from_launch(value):
    """launch.dynamo_config (Accelerate: dynamo_backend 'INDUCTOR', dynamo_mode, dynamo_use_fullgraph, ...) ->
    train.dynamo_config's keys, or None when the backend is 'no'."""
    where = "launch.dynamo_config"
    names = dict(backend="backend", mode="mode", use_fullgraph="fullgraph", use_dynamic="dynamic",
                 use_regional_compilation="use_regional_compilation")
    out = {}
    for key, v in dict(value or {}).items():
        short = key[len("dynamo_"):] if key.startswith("dynamo_") else key
        if short not in names:
            raise ConfigError(f"{where}.{key}: unknown key"
                              f"{did_you_mean(short, names)} (keys: dynamo_{', dynamo_'.join(names)})")
        if short in ("use_fullgraph", "use_dynamic", "use_regional_compilation"):
            v = None if v is None else as_bool(f"{where}.{key}", v)
        elif short == "backend":
            v = str(v).lower()
        if v is not None:
            out[names[short]] = v
    if out.get("backend", "no") == "no":
        return None
    return out
