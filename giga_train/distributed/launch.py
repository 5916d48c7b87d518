"""launch_from_config: validate, then run the config's runners in this process (one rank)."""
import logging

from ..config import ConfigError, load_config
from ..schema import validate_config

log = logging.getLogger("giga_train")


def world_size_of(launch):
    per_machine = len(launch.gpu_ids) if launch.gpu_ids else launch.num_processes
    return per_machine * launch.num_machines


def launch_from_config(config, overrides=()):
    """Run every runner of `config` (a path, module path or dict) in order. Returns the last trainer."""
    cfg = load_config(config, overrides)
    runners = validate_config(cfg)
    if world_size_of(cfg.launch) > 1:
        raise ConfigError(f"launch: {world_size_of(cfg.launch)} processes requested, but only the"
                          " single-process launch exists so far (use one GPU id or num_processes=1)")
    trainer = None
    for runner in runners:
        trainer = runner(cfg)
        trainer.train()
    return trainer
