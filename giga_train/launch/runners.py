"""The runners a config names (`runners`), run in order in each rank, as GigaTrain's run_tasks does: load,
print the config, and for a Trainer save config.json, resume when asked (or after an elastic restart),
train; for a Tester, test. The config arrives validated (schema.validate_config, once, in the launcher)."""
import contextlib
import os

from ..registry import import_object
from .dry_run import dry_run_line, prepare_dry_run
from ..schema.validate import validate_config
from ..trainers import Trainer


def validated_runners(cfg):
    """Validate `cfg` (filling its defaults in place) and return its runner classes; one line for anything
    wrong. What `giga-train check` runs."""
    return runner_classes(validate_config(cfg))


def runner_classes(cfg):
    """The runner classes a validated config names (imported by validation already: no check here)."""
    return [path if isinstance(path, type) else import_object(path) for path in cfg.runners]


def run_runners(cfg):
    """Build and run each runner of the validated config `cfg` in turn (this process is one rank); returns
    the last Trainer (the last runner when none trains)."""
    from ..distributed.env import fill_slurm_rendezvous
    fill_slurm_rendezvous(cfg.launch)
    runner = trainer = None
    dry_steps = prepare_dry_run(cfg)
    for cls in runner_classes(cfg):
        runner = cls.load(cfg)
        try:
            _run(runner, dry=bool(dry_steps))
        except BaseException:
            with contextlib.suppress(Exception):  # this process may run another job (tests, notebooks)
                runner.abandon()
            raise
        if isinstance(runner, Trainer):
            trainer = runner
            if dry_steps and runner.is_main_process:
                print(dry_run_line(runner, dry_steps), flush=True)
            if runner.preempted:
                break  # the job was asked to stop: the rerun resumes this runner
    return trainer or runner


def _run(runner, dry=False):
    """One runner, as GigaTrain's run_tasks runs it (GigaTrain also prints the whole config first: ours is in
    project_dir/config.json; not for a dry run)."""
    if not isinstance(runner, Trainer):
        try:
            runner.test()
        finally:
            getattr(runner, "close_trackers", lambda: None)()  # a Tester's media trackers (tester_log.py)
        return
    if not dry:
        runner.save_config(runner.config)
    resume = runner.train_config.get("resume")
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        resume = resume or True  # the elastic agent restarted us: continue from the newest checkpoint
    if resume:
        runner.resume(None if resume is True else resume)
    runner.train()
