"""The config schema's `launch` section (GigaTrain's Launcher keys, Accelerate's ClusterConfig keys): the
machines, the ranks and the strategy; Accelerate's own forms are read by compat/accelerate.py."""
import numbers

from ..config import Config
from ..errors import ConfigError
from .. import engine  # noqa: F401  (registers the strategies)
from ..registry import STRATEGIES, did_you_mean
from ..compat.accelerate import dynamo_from_launch, normalise_deepspeed, normalise_fsdp
from .keys import Key, _list_of


# GigaTrain's Launcher keys (distributed/launch.py) and ours. Its extra keys go to Accelerate's ClusterConfig:
# those are in CLUSTER below (honoured, or refused in one line by schema_accelerate.check_cluster_key).
LAUNCH = dict(
    gpu_ids=Key(None, (list, tuple)),  # one list, or one list per machine (normalised to this machine's list)
    num_processes=Key(1, int, min=1),
    distributed_type=Key(None, str),  # None: GigaTrain's default, MULTI_GPU (DDP) for several ranks, else NO
    fsdp_config=Key(None, dict),
    deepspeed_config=Key(None, dict),
    num_machines=Key(None, int, min=1),  # None: len(main_process_ip) when a list, else 1
    machine_rank=Key(0, int, min=0),
    main_process_ip=Key("127.0.0.1", (str, list, tuple)),  # a list: one per machine, the first is the main one
    main_process_port=Key(None, int, min=1),  # one machine: a free port; several: 29500
    max_restarts=Key(0, int, min=0),
    until_completion=Key(False, bool),  # relaunch (resuming) until the job exits 0
    num_cpu_threads_per_process=Key(None, int, min=1),  # OMP_NUM_THREADS per rank; None: cores / ranks
    nccl_socket_ifname=Key(None, str),  # NCCL_SOCKET_IFNAME for the ranks
    env=Key(None, dict, check=lambda v: None if all(isinstance(k, str) for k in v) else "keys must be strings"),
    executable=Key(None, str),  # GigaTrain: the `accelerate` CLI it runs; no effect here (no Accelerate)
    save_config_path=Key(None, str),  # GigaTrain: where it writes Accelerate's temporary config; no effect
    save_hostfile_path=Key(None, str),  # GigaTrain: its temporary pdsh hostfile; no effect
    # Accelerate's ClusterConfig
    rdzv_backend=Key(None, str, choices=("static", "c10d")),  # ours: c10d on one machine, static on several
    same_network=Key(None, bool),  # no effect (the machines reach main_process_ip)
    main_training_function=Key(None, str),  # notebook launcher only; no effect
    dynamo_config=Key(None, dict),  # Accelerate's form -> train.dynamo_config when that is unset
    collective_timeout=Key(None, numbers.Real, min=1),  # seconds (ours): the watchdog of every collective
    # Accelerate's ParallelismConfig sizes (dp_replicate_size, dp_shard_size, sp_size, sp_backend): parallelism.py
    parallelism_config=Key(None, dict),  # dp_replicate_size, dp_shard_size, sp_size, sp_backend: docs/parallelism.md
)


CLUSTER_REFUSED = ("downcast_bf16", "tpu_name", "tpu_zone", "tpu_use_cluster", "tpu_use_sudo", "command_file",
                   "commands", "tpu_vm", "tpu_env", "megatron_lm_config", "mpirun_config",
                   "fp8_config", "enable_cpu_affinity")


# GigaTrain hands these to ClusterConfig itself: in `launch` they are a TypeError there, an answer here.
LAUNCH_ELSEWHERE = dict(mixed_precision="set train.mixed_precision", use_cpu="leave out gpu_ids to run on CPU",
                        debug="no debug mode", compute_environment="only the local machine environment exists")


def world_size_of(launch):
    """Ranks in the whole job: one per GPU id (or num_processes on CPU) on each machine."""
    per_machine = len(launch.gpu_ids) if launch.gpu_ids else launch.num_processes
    return per_machine * (launch.num_machines or 1)


def _pop_cluster_keys(launch):
    """Take Accelerate's ClusterConfig keys that are not launch keys out of `launch` (checked later)."""
    out = {}
    for key in list(launch):
        if key in LAUNCH_ELSEWHERE:
            raise ConfigError(f"launch.{key}: not a launch key ({LAUNCH_ELSEWHERE[key]})")
        if key in CLUSTER_REFUSED:
            out[key] = launch.pop(key)
    return out


def _check_launch(launch, train):
    launch.fsdp_config = launch.fsdp_config and Config(launch.fsdp_config)
    _machines(launch)
    kind = launch.distributed_type
    if kind is None:  # GigaTrain: MULTI_GPU when Accelerate starts several ranks
        kind = "NO" if world_size_of(launch) == 1 else "DDP"
    kind = {"MULTI_CPU": "DDP"}.get(kind.upper(), kind.upper())
    if kind not in STRATEGIES:
        raise ConfigError(f"launch.distributed_type: unknown {launch.distributed_type!r}"
                          f"{did_you_mean(launch.distributed_type, STRATEGIES.names())}"
                          f" (choose from {', '.join(STRATEGIES.names())})")
    launch.distributed_type = kind
    if launch.fsdp_config is not None or kind == "FSDP":
        launch.fsdp_config = Config(normalise_fsdp(launch.fsdp_config))  # the FSDP strategies read every key
        if launch.fsdp_config.fsdp_activation_checkpointing and not train.activation_checkpointing:
            # Accelerate checkpoints the wrapped blocks: the same as ours with the wrap classes
            train.activation_checkpointing = True
            if not train.activation_class_names:
                train.activation_class_names = list(launch.fsdp_config.fsdp_transformer_layer_cls_to_wrap or [])
    if launch.deepspeed_config is not None or kind == "DEEPSPEED":
        launch.deepspeed_config = _as_config(normalise_deepspeed(launch.deepspeed_config, train))
    if launch.dynamo_config is not None:
        mapped = dynamo_from_launch(launch.dynamo_config)
        if mapped and train.dynamo_config is None:
            train.dynamo_config = Config(mapped)  # train.dynamo_config wins, as GigaTrain's Trainer does
        launch.dynamo_config = None
    if launch.gpu_ids:
        import torch
        if not torch.cuda.is_available():
            raise ConfigError(f"launch.gpu_ids={list(launch.gpu_ids)}: no CUDA GPU is visible on this machine"
                              " (remove gpu_ids to run on CPU)")
        count = torch.cuda.device_count()
        bad = [g for g in launch.gpu_ids if not 0 <= g < count]
        if bad:
            raise ConfigError(f"launch.gpu_ids: GPU {bad[0]} does not exist (this machine has {count})")
        if len(set(launch.gpu_ids)) != len(launch.gpu_ids):
            raise ConfigError(f"launch.gpu_ids: {list(launch.gpu_ids)} names a GPU twice")


def _as_config(value):
    return None if value is None else Config(value)


def _machines(launch):
    """GigaTrain's multi-machine forms: main_process_ip as a list (one per machine; num_machines inferred, the
    first is the main machine) and gpu_ids as one list per machine (this machine's list is kept)."""
    ips = launch.main_process_ip
    if isinstance(ips, (list, tuple)):
        if not ips or not all(isinstance(ip, str) for ip in ips):
            raise ConfigError(f"launch.main_process_ip: expected an address or a list of addresses, got {ips!r}")
        if launch.num_machines is not None and launch.num_machines != len(ips):
            raise ConfigError(f"launch.num_machines={launch.num_machines} but main_process_ip lists {len(ips)}"
                              " machines")
        launch.num_machines, launch.main_process_ip = len(ips), ips[0]
    launch.num_machines = launch.num_machines or 1
    ids = launch.gpu_ids
    if ids and all(isinstance(g, (list, tuple)) for g in ids):
        for i, one in enumerate(ids):
            problem = _list_of(int, "a GPU index")(one)
            if problem:
                raise ConfigError(f"launch.gpu_ids[{i}]: {problem}")
        if len(ids) != launch.num_machines:
            raise ConfigError(f"launch.gpu_ids: {len(ids)} lists for {launch.num_machines} machines (one per machine)")
        if len({len(one) for one in ids}) != 1:
            raise ConfigError(f"launch.gpu_ids: every machine must run as many ranks, got {[len(i) for i in ids]}")
        import os
        rank = int(os.environ.get("SLURM_NODEID", launch.machine_rank))
        if rank >= len(ids):
            raise ConfigError(f"launch.machine_rank={rank} but gpu_ids lists {len(ids)} machines")
        launch.gpu_ids = list(ids[rank])
    elif ids:
        problem = _list_of(int, "a GPU index (or one list per machine)")(ids)
        if problem:
            raise ConfigError(f"launch.gpu_ids: {problem}")
    if launch.machine_rank >= launch.num_machines:
        raise ConfigError(f"launch.machine_rank={launch.machine_rank} but num_machines={launch.num_machines}")
