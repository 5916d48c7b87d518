"""train.dry_run (or `giga-train train CONFIG --dry-run`): the job's every part once, quickly, leaving nothing
behind: N training steps (N = dry_run, 2 for True) with a validation of at most N batches at the last one
(when dataloaders.val is configured), no checkpoint, no tracker (log_with='none'), no resume, no config.json;
then one line and exit 0. The train log (logs/train.log) is written as in any run."""
from ..errors import ConfigError


def dry_run_steps(cfg):
    """The number of steps of a dry run (0: not one)."""
    value = cfg.train.get("dry_run")
    if value in (None, False, 0):
        return 0
    if value is True:
        return 2
    if isinstance(value, int) and value > 0:
        return value
    raise ConfigError(f"train.dry_run: true or a number of steps, got {value!r}")


def prepare_dry_run(cfg):
    """Rewrite the validated config's train section for a dry run; returns its number of steps (0: none)."""
    steps = dry_run_steps(cfg)
    if steps:
        train = cfg.train
        train.update(max_steps=steps, max_epochs=None, resume=False, log_with=[], checkpoint_best=None,
                     checkpoint_async=False, profile=None, eval_ema=False)
        if cfg.dataloaders.get("val") is not None:
            train.eval_interval = steps  # one validation, at the last step
    return steps


def dry_run_line(runner, steps):
    validator = getattr(getattr(runner, "evaluation", None), "validator", None)
    validated = f" and a validation of at most {validator.max_batches} batches" if validator is not None else ""
    return f"dry run: ok, {steps} training steps{validated}; no checkpoint, no tracker, no config.json written"
