"""launch_from_config: validate, then run the runners here (one rank, or a rank torchrun/SLURM started)
or spawn the ranks through torch.distributed's elastic agent (max_restarts restarts failed workers)."""
import glob
import json
import logging
import os
import pickle
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import uuid

from ..config import load_config
from ..errors import CheckpointError, ConfigError, RankFailed, TrainingStopped
from .runners import run_runners
from ..schema.launch import world_size_of
from ..schema.validate import validate_config
from ..distributed.env import TIMEOUT_VARIABLE, collective_timeout
from ..distributed.preemption import ForwardSIGUSR1, write_pid

log = logging.getLogger("giga_train")
RESULT_DIR = "GIGA_TRAIN_RESULT_DIR"
RELAUNCH_PAUSE = "GIGA_TRAIN_RELAUNCH_PAUSE"  # seconds between launch.until_completion attempts (10, GigaTrain's)


def started_by_a_launcher(world_size):
    """True when torchrun (LOCAL_RANK) or SLURM (one task per rank) already made this process a rank."""
    if "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return True
    return os.environ.get("SLURM_NTASKS", "") == str(world_size) and world_size > 1 and "SLURM_PROCID" in os.environ


def launch_from_config(config_path, runners=None, gpu_memory=None, seconds=10, overrides=()):
    """Run the runners of `config_path` (GigaTrain's name: a path, module path or dict; `runners`: others, a
    list or a comma-separated string, as GigaTrain's); `gpu_memory` (MB): first wait until each GPU of
    launch.gpu_ids has that much free, checking every `seconds`. Returns the main rank's summary (the runner
    itself in one process)."""
    cfg = load_config(config_path, overrides)
    if runners is not None:
        cfg.runners = runners.split(",") if isinstance(runners, str) else list(runners)
    cfg = validate_config(cfg)  # the one validation of the launch: the ranks get this config as it is
    if gpu_memory is not None:
        wait_for_gpu_memory(cfg.launch.gpu_ids, gpu_memory, seconds)
    world_size = world_size_of(cfg.launch)
    with _project_lock(cfg, world_size):
        attempt = 0
        while True:
            try:
                if world_size == 1 or started_by_a_launcher(world_size):
                    return run_runners(cfg)
                return spawn(cfg, world_size)
            except (ConfigError, TrainingStopped, CheckpointError, KeyboardInterrupt):
                raise  # the same on a rerun, or asked for
            except Exception as e:
                if not cfg.launch.get("until_completion"):
                    raise
                attempt += 1
                pause = float(os.environ.get(RELAUNCH_PAUSE, "10"))
                log.error("run failed (%s: %s); launch.until_completion: relaunching from the newest checkpoint"
                          " in %.0f s (attempt %d)", type(e).__name__, str(e).strip().splitlines()[0]
                          if str(e).strip() else "", pause, attempt + 1)
                time.sleep(pause)
                cfg.train.resume = True


def wait_for_gpu_memory(gpu_ids, megabytes, seconds):
    """Block until each of `gpu_ids` has `megabytes` free (one line per wait), polling every `seconds`."""
    import torch
    gpu_ids = [g for ids in gpu_ids for g in (ids if isinstance(ids, (list, tuple)) else [ids])] if gpu_ids else []
    if not gpu_ids:
        return
    while True:
        free = {g: torch.cuda.mem_get_info(g)[0] / 2**20 for g in gpu_ids}
        short = {g: f for g, f in free.items() if f < megabytes}
        if not short:
            return
        log.info("waiting for %d MB free on GPU %s (free now: %s)", megabytes, ", ".join(map(str, short)),
                 ", ".join(f"{f:.0f} MB" for f in short.values()))
        time.sleep(seconds)


def _project_lock(cfg, world_size):
    """One run per project_dir: held by the process that runs or launches the job's first rank (this
    one when it spawns the ranks or is the only one; rank 0 under torchrun/SLURM; machine 0's launcher)."""
    import contextlib

    from ..checkpoint.lock import ProjectLock
    if world_size > 1 and started_by_a_launcher(world_size):
        first = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0"
    else:
        first = int(os.environ.get("SLURM_NODEID", cfg.launch.get("machine_rank", 0) or 0)) == 0
    return ProjectLock(cfg.project_dir) if first else contextlib.nullcontext()


def spawn(cfg, world_size):
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
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
    quiet = logging.getLogger("torch.distributed.elastic")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # its per-rank failure tables and shutdown notes: we say it in one line
    try:
        # A command entrypoint (as torchrun does): each rank is a fresh interpreter, judged by exit code.
        with ForwardSIGUSR1(results):
            elastic_launch(config, sys.executable)("-m", "giga_train.launch.worker", results)
        return _read_result(results)
    except ChildFailedError as e:
        _read_result(results)  # a config error or a stop that a rank reported comes first
        raise RankFailed(_failure_line(results, e)) from None
    except SignalException as e:
        # SIGTERM (or INT/HUP/QUIT): the agent passed it to the ranks, waited up to
        # TORCH_ELASTIC_SHUTDOWN_TIMEOUT (30 s) and raised. A preemption when they reported a checkpoint.
        result = _read_result(results)
        if result and result.get("preempted"):
            return result
        raise TrainingStopped(f"stopped by {e.sigval.name} before the ranks saved a checkpoint; the newest complete"
                              f" one is {_newest(cfg) or 'none yet'}") from None
    finally:
        quiet.setLevel(level)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(results, ignore_errors=True)


def _read_result(results):
    for kind, error in (("config", ConfigError), ("stop", TrainingStopped), ("checkpoint", CheckpointError)):
        found = sorted(glob.glob(os.path.join(results, f"{kind}_error_rank_*.txt")), key=_rank_of)
        if found:
            with open(found[0]) as f:
                raise error(f.read().strip())
    path = os.path.join(results, "result.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return None


def _rank_of(path):
    return int(re.search(r"rank_(\d+)", os.path.basename(path)).group(1))


def _failure_line(results, error):
    """The one line for a rank that failed: an error in the user's code (its traceback is above) before
    a collective that failed because of it; else how the rank ended (a signal, an exit code)."""
    lines = {}
    for path in glob.glob(os.path.join(results, "failed_rank_*.txt")):
        with open(path) as f:
            kind, _, line = f.read().strip().partition(" ")
        lines.setdefault(kind, []).append((_rank_of(path), line))
    for kind in ("error", "collective"):
        if lines.get(kind):
            return sorted(lines[kind])[0][1]
    failures = sorted(getattr(error, "failures", {}).items())
    if failures:
        rank, failure = failures[0]
        code = failure.exitcode
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        return f"rank {rank} {how}"
    return str(error).strip().splitlines()[0]


COLLECTIVE_FAILURE = re.compile(r"timed out|connection (closed|reset) by peer|broken pipe|communicator was aborted"
                                r"|watchdog caught collective", re.IGNORECASE)


def _collective_failure(error):
    import torch.distributed as dist
    return isinstance(error, getattr(dist, "DistError", ())) or (
        isinstance(error, RuntimeError) and COLLECTIVE_FAILURE.search(str(error)) is not None)


class _InterruptFlag:
    """SIGINT in a rank: remembered (what fails after it is its consequence, not news) and raised."""

    def __init__(self):
        self.got = False
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame):
        self.got = True
        raise KeyboardInterrupt


def worker_main(results):
    """One spawned rank. Ends with os._exit: gloo threads can abort a normal interpreter exit.

    What it reports (files in `results`, read by the launcher): bad config, a stop (NaN guard, full
    disk) and a refused checkpoint, as their one line, exit 0 (a restart would not help); a failed
    collective (a stuck or dead peer: the watchdog) as one line, exit 1; any other error with its
    traceback printed here and one line for the launcher, exit 1; after SIGINT, nothing, exit 130."""
    import torch.distributed as dist
    with open(os.path.join(results, "config.pkl"), "rb") as f:
        cfg = pickle.load(f)
    write_pid(results)
    rank = int(os.environ.get("RANK", "0"))
    for stale in glob.glob(os.path.join(results, f"*_rank_{rank}.txt")):  # an earlier attempt's (restarts)
        os.remove(stale)
    interrupt, code = _InterruptFlag(), 0

    def report(name, text):
        with open(os.path.join(results, f"{name}_rank_{rank}.txt"), "w") as f:
            f.write(text)
    try:
        trainer = run_runners(cfg)
        if trainer.is_main_process:
            checkpoints = getattr(trainer, "checkpoints", None)  # a Tester-only job has none
            summary = dict(step=getattr(trainer, "step", None), metrics=getattr(trainer, "last_metrics", {}),
                           checkpoint=checkpoints.latest() if checkpoints else None,
                           preempted=getattr(trainer, "preempted", False))
            with open(os.path.join(results, "result.json"), "w") as f:
                json.dump(summary, f)
    except (ConfigError, TrainingStopped, CheckpointError) as e:  # not helped by a restart: exit 0
        kind = "config" if isinstance(e, ConfigError) else "stop" if isinstance(e, TrainingStopped) else "checkpoint"
        report(f"{kind}_error", str(e))
    except BaseException as e:
        code = 130 if interrupt.got else 1
        if interrupt.got:
            pass  # the launcher says "stopped by SIGINT"; this rank's KeyboardInterrupt or peer errors add nothing
        elif _collective_failure(e):
            report("failed", f"collective rank {rank}: {_first_line(e)}: a collective found another rank stuck,"
                             f" stopped or gone (the watchdog's limit, launch.collective_timeout or"
                             f" ${TIMEOUT_VARIABLE}, is {collective_timeout(cfg.launch).total_seconds():.0f} s);"
                             f" the checkpoints on disk are unchanged, the newest complete one is"
                             f" {_newest(cfg) or 'none yet'}")
            _kill_stopped_peers(results)
        else:
            traceback.print_exc()  # an error in the user's code (or ours): where it happened
            report("failed", f"error rank {rank} failed with {_first_line(e)} (its traceback is above)")
    finally:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    if dist.is_initialized() and code == 0:
        dist.destroy_process_group()  # after a failure it could wait on the peer that is stuck
    os._exit(code)


def _kill_stopped_peers(results):
    """SIGKILL this machine's ranks that are stopped (SIGSTOP: state T). The agent would do it after its
    30 s grace (a stopped process never acts on the SIGTERM it sends first); the job is ending anyway."""
    for path in glob.glob(os.path.join(results, "pid_*")):
        try:
            with open(path) as f:
                pid = int(f.read())
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
            if pid != os.getpid() and state == "T":
                os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            pass  # gone already, or no /proc here


def _first_line(error):
    text = str(error).strip().splitlines()
    text = text[0] if text else ""
    text = re.sub(r"\. This is typically caused by .*$", "", re.sub(r"^\[[^\]]*\.cc:\d+\]\s*", "", text))  # gloo's
    return f"{type(error).__name__}: {text}".rstrip(": ")


def _newest(cfg):
    from ..checkpoint import CheckpointManager
    try:
        return CheckpointManager(os.path.join(cfg.project_dir, "models")).latest()
    except OSError:
        return None
