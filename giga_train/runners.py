"""The runners a config names (`runners`): validated with the config, then run in order in each rank."""
from .errors import ConfigError
from .schema import validate_config
from .trainers import Trainer


def validated_runners(cfg):
    """Validate `cfg` (filling its defaults) and return its runner classes; one line for anything wrong."""
    classes = validate_config(cfg)
    for i, (path, cls) in enumerate(zip(cfg.runners, classes)):
        if not (isinstance(cls, type) and issubclass(cls, Trainer)):
            raise ConfigError(f"runners[{i}]: '{path}' is not a subclass of giga_train.Trainer")
    return classes


def run_runners(cfg):
    """Build and run each runner in turn (this process is one rank); returns the last one."""
    from .distributed.env import fill_slurm_rendezvous
    fill_slurm_rendezvous(cfg.launch)
    runner = None
    for cls in validated_runners(cfg):
        runner = cls(cfg)
        runner.train()
        if runner.preempted:
            break  # the job was asked to stop: the rerun resumes this runner
    return runner
