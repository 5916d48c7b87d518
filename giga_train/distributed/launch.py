"""launch_from_config: validate, then run the runners here (one rank, or a rank torchrun/SLURM started)
or spawn the ranks through torch.distributed's elastic agent (max_restarts restarts failed workers)."""
import json
import logging
import os
import pickle
import shutil
import sys
import tempfile
import uuid

from ..config import load_config
from ..errors import ConfigError, TrainingStopped
from ..runners import run_runners, validated_runners
from ..schema import world_size_of
from .preemption import ForwardSIGUSR1, write_pid

log = logging.getLogger("giga_train")
RESULT_DIR = "GIGA_TRAIN_RESULT_DIR"


def started_by_a_launcher(world_size):
    """True when torchrun (LOCAL_RANK) or SLURM (one task per rank) already made this process a rank."""
    if "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return True
    return os.environ.get("SLURM_NTASKS", "") == str(world_size) and world_size > 1 and "SLURM_PROCID" in os.environ


def launch_from_config(config, overrides=()):
    """Run every runner of `config` (a path, module path or dict). Returns the main rank's summary."""
    cfg = load_config(config, overrides)
    validated_runners(cfg)
    world_size = world_size_of(cfg.launch)
    if world_size == 1 or started_by_a_launcher(world_size):
        return run_runners(cfg)
    return spawn(cfg, world_size)


def spawn(cfg, world_size):
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch
    launch = cfg.launch
    nproc = world_size // launch.num_machines
    machine_rank = int(os.environ.get("SLURM_NODEID", launch.machine_rank))
    results = tempfile.mkdtemp(prefix="giga_train_")
    child_env = {"GIGA_TRAIN_SPAWNED": "1", RESULT_DIR: results,
                 "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(max((os.cpu_count() or 1) // nproc, 1)))}
    if launch.gpu_ids:
        child_env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in launch.gpu_ids)
    if launch.num_machines == 1:
        rdzv = dict(rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{launch.main_process_port or 0}",
                    run_id=str(uuid.uuid4()))
    else:  # the machines' agents meet under one run id: the rendezvous store's keys are prefixed by it
        endpoint = f"{launch.main_process_ip}:{launch.main_process_port or 29500}"
        rdzv = dict(rdzv_backend="static", rdzv_configs={"rank": machine_rank}, rdzv_endpoint=endpoint,
                    run_id=os.environ.get("SLURM_JOB_ID", f"giga_train_{endpoint}"))
    config = LaunchConfig(min_nodes=launch.num_machines, max_nodes=launch.num_machines, nproc_per_node=nproc,
                          max_restarts=launch.max_restarts, monitor_interval=0.1,
                          start_method="spawn", **rdzv)
    log.info("launching %d ranks (%d on this machine, rank %d of %d machines)", world_size, nproc, machine_rank,
             launch.num_machines)
    with open(os.path.join(results, "config.pkl"), "wb") as f:
        pickle.dump(cfg, f)  # the validated config, as the ranks must see it (overrides applied)
    saved = {k: os.environ.get(k) for k in child_env}
    os.environ.update(child_env)  # the ranks inherit these; this process gets its own back below
    try:
        # A command entrypoint (as torchrun does): each rank is a fresh interpreter, judged by exit code.
        with ForwardSIGUSR1(results):
            elastic_launch(config, sys.executable)("-m", "giga_train.distributed.worker", results)
        return _read_result(results)
    except SignalException as e:
        # SIGTERM (or INT/HUP/QUIT): the agent passed it to the ranks, waited up to
        # TORCH_ELASTIC_SHUTDOWN_TIMEOUT (30 s) and raised. A preemption when they reported a checkpoint.
        result = _read_result(results)
        if result and result.get("preempted"):
            return result
        raise TrainingStopped(f"stopped by {e.sigval.name} before the ranks saved a checkpoint") from None
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(results, ignore_errors=True)


def _read_result(results):
    error = os.path.join(results, "config_error.txt")
    if os.path.exists(error):
        with open(error) as f:
            raise ConfigError(f.read().strip())
    stopped = os.path.join(results, "stop_error.txt")
    if os.path.exists(stopped):
        with open(stopped) as f:
            raise TrainingStopped(f.read().strip())
    path = os.path.join(results, "result.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return None


def worker_main(results):
    """One spawned rank. Ends with os._exit: gloo threads can abort a normal interpreter exit."""
    import torch.distributed as dist
    with open(os.path.join(results, "config.pkl"), "rb") as f:
        cfg = pickle.load(f)
    write_pid(results)
    try:
        trainer = run_runners(cfg)
        if trainer.is_main_process:
            summary = dict(step=trainer.step, metrics=getattr(trainer, "last_metrics", {}),
                           checkpoint=trainer.checkpoints.latest(), preempted=trainer.preempted)
            with open(os.path.join(results, "result.json"), "w") as f:
                json.dump(summary, f)
    except (ConfigError, TrainingStopped) as e:  # the same on every rank: report it once, do not restart
        name = "config_error.txt" if isinstance(e, ConfigError) else "stop_error.txt"
        if os.environ.get("RANK", "0") == "0":
            with open(os.path.join(results, name), "w") as f:
                f.write(str(e))
    finally:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    if dist.is_initialized():
        dist.destroy_process_group()
    os._exit(0)
