"""The runners a config names (`runners`): validated with the config, then run in order in each rank, as
GigaTrain's run_tasks does: load, print the config, and for a Trainer save config.json, resume when asked
(or after an elastic restart), train; for a Tester, test."""
import os

from .errors import ConfigError
from .schema import validate_config
from .trainers import Runner, Trainer


def validated_runners(cfg):
    """Validate `cfg` (filling its defaults) and return its runner classes; one line for anything wrong."""
    classes = validate_config(cfg)
    for i, (path, cls) in enumerate(zip(cfg.runners, classes)):
        if not (isinstance(cls, type) and issubclass(cls, Runner)):
            raise ConfigError(f"runners[{i}]: '{path}' is not a subclass of giga_train.Trainer or giga_train.Tester")
        if cls.SECTION not in cfg and cls.SECTION != "train":
            raise ConfigError(f"runners[{i}]: '{path}' runs the '{cls.SECTION}' section, which the config lacks")
    return classes


def run_runners(cfg):
    """Build and run each runner in turn (this process is one rank); returns the last Trainer (the last
    runner when none trains)."""
    from .distributed.env import fill_slurm_rendezvous
    fill_slurm_rendezvous(cfg.launch)
    runner = trainer = None
    for cls in validated_runners(cfg):
        runner = cls.load(cfg)
        if isinstance(runner, Trainer):  # (GigaTrain also prints the whole config here: ours is in config.json)
            trainer = runner
            runner.save_config(runner.config)
            resume = runner.train_config.get("resume")
            if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
                resume = resume or True  # the elastic agent restarted us: continue from the newest checkpoint
            if resume:
                runner.resume(None if resume is True else resume)
            runner.train()
            if runner.preempted:
                break  # the job was asked to stop: the rerun resumes this runner
        else:
            runner.test()
    return trainer or runner
