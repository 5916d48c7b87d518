"""Where this process runs: its rank, the world size, its device. Read from torchrun's or SLURM's env."""
import datetime
import os
from dataclasses import dataclass

import torch


@dataclass
class Environment:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    cpu_group: object = None  # a gloo group for host-side agreement when the default backend is NCCL
    timeout: object = None  # the collectives' timeout (a timedelta; the watchdog), for groups made later

    @property
    def is_main(self):
        return self.rank == 0

    @property
    def distributed(self):
        return self.world_size > 1

    def agree_any(self, flag, *more):
        """True on every rank when `flag` is true on any: one tiny all-reduce (MAX) of a CPU tensor over
        gloo, so it never waits for the GPU; no collective at world size 1. With `more` flags: a tuple,
        each agreed the same way, through the same single all-reduce."""
        import torch.distributed as dist
        flags = [bool(f) for f in (flag, *more)]
        if self.world_size > 1 and dist.is_initialized():
            value = torch.tensor([int(f) for f in flags], dtype=torch.int32)
            dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.cpu_group)
            flags = [bool(v) for v in value.tolist()]
        return tuple(flags) if more else flags[0]


def world_size_of(launch):
    """Ranks in the whole job (a validated launch section): one per GPU id (or num_processes on CPU) on each
    machine."""
    per_machine = len(launch.gpu_ids) if launch.gpu_ids else launch.num_processes
    return per_machine * (launch.num_machines or 1)


DEFAULT_COLLECTIVE_TIMEOUT_S = 600  # NCCL's own default in torch; gloo's is 30 minutes
TIMEOUT_VARIABLE = "GIGA_TRAIN_COLLECTIVE_TIMEOUT"


def collective_timeout(launch=None):
    """How long a collective may wait for the other ranks before it fails (the watchdog: a stuck or
    stopped rank turns into an error on the healthy ranks, which then stop; the launcher reports it in
    one line and the checkpoints on disk stay as they are). `launch.collective_timeout` (seconds) when
    the config has it, else $GIGA_TRAIN_COLLECTIVE_TIMEOUT, else 10 minutes. Keep it above the longest
    legitimate wait: a checkpoint save of the whole model on the main rank, a slow rank's first compile."""
    value = getattr(launch, "collective_timeout", None)
    if value is None and os.environ.get(TIMEOUT_VARIABLE, "").strip():
        value = float(os.environ[TIMEOUT_VARIABLE])
    return datetime.timedelta(seconds=float(value if value is not None else DEFAULT_COLLECTIVE_TIMEOUT_S))


def _env_int(*names, default=0):
    for name in names:
        if os.environ.get(name, "").strip():
            return int(os.environ[name])
    return default


def setup_environment(launch=None):
    """Read this process's place in the job (read_environment) and join its process group when it has
    several ranks."""
    env = read_environment(launch)
    if env.distributed:
        init_process_group(env, launch)
    return env


def read_environment(launch=None):
    """Read this process's place in the job and pick its device; quiet noisy libraries. Opens no process group.

    With `launch.gpu_ids`, the local rank indexes those GPUs (the launcher sets CUDA_VISIBLE_DEVICES
    to them when it spawns, so then it indexes the visible ones)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    rank = _env_int("RANK", "SLURM_PROCID")
    local_rank = _env_int("LOCAL_RANK", "SLURM_LOCALID")
    world_size = _env_int("WORLD_SIZE", "SLURM_NTASKS", default=1)
    gpu_ids = list(getattr(launch, "gpu_ids", None) or [])
    device = torch.device("cpu")
    if gpu_ids:
        visible = os.environ.get("GIGA_TRAIN_SPAWNED") == "1"
        index = local_rank if visible else gpu_ids[local_rank]
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
    return Environment(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


def fill_slurm_rendezvous(launch):
    """Under SLURM (one task per rank) torch needs MASTER_ADDR/PORT: take them from the config."""
    if "SLURM_PROCID" in os.environ and "LOCAL_RANK" not in os.environ:
        os.environ.setdefault("MASTER_ADDR", launch.main_process_ip)
        os.environ.setdefault("MASTER_PORT", str(launch.main_process_port or 29500))


def init_process_group(env, launch=None):
    """Join the job's process group (a one-rank group on a free port when this is the only process)."""
    import torch.distributed as dist
    if dist.is_initialized():
        _add_cpu_group(env, launch)  # a group someone else made (e.g. the user, with NCCL)
        return
    own_address = env.world_size == 1 and "MASTER_ADDR" not in os.environ
    if own_address:  # a fresh port for each one-rank group, given only to this init (never left in os.environ,
        import socket  # where a later group or a child process would reuse a port still held or in TIME_WAIT)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    extra = dict(device_id=env.device) if env.device.type == "cuda" else {}
    backend = "nccl" if env.device.type == "cuda" else "gloo"
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if restart is not None and "MASTER_ADDR" in os.environ:
        # Under the elastic agent: a store prefix per attempt, so restarted ranks never read the
        # addresses that the killed attempt left in the store.
        agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), env.world_size,
                              is_master=not agent_store and env.rank == 0)
        extra["store"] = dist.PrefixStore(f"giga_train/attempt_{restart}", store)
    env.timeout = collective_timeout(launch)
    try:
        dist.init_process_group(backend, rank=env.rank, world_size=env.world_size, timeout=env.timeout, **extra)
    finally:
        if own_address:
            os.environ.pop("MASTER_ADDR", None)
            os.environ.pop("MASTER_PORT", None)
    _add_cpu_group(env, launch)


def _add_cpu_group(env, launch=None):
    """Env.agree_any needs gloo: the default group when it is gloo, else one gloo group beside it."""
    import torch.distributed as dist
    env.timeout = env.timeout or collective_timeout(launch)
    if env.cpu_group is None and env.world_size > 1 and dist.get_backend() != "gloo":
        # a collective: every rank creates it here
        env.cpu_group = dist.new_group(backend="gloo", timeout=env.timeout)
