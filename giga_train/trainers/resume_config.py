"""The config is the truth at resume: what the user changed between runs either applies (optimizer
hyper-parameters, the scheduler's values: one line lists them) or is refused in one line naming the keys
before any step (a model shape, an optimizer whose state is another's), with nothing on disk changed
(docs/checkpoints.md, "What a resume takes from the config"). Data changes are epochs.py's."""
import contextlib
import logging
import math

from ..checkpoint.manager import read_meta
from ..errors import ConfigError

log = logging.getLogger("giga_train")
# A torch LRScheduler's state_dict holds its progress and its values together: these keys are the progress
PROGRESS_KEYS = ("last_epoch", "_step_count", "_last_lr", "_get_lr_called_within_step", "_is_initial",
                 "lr_lambdas")
COMPARED = ("models", "optimizers", "schedulers")  # the config sections whose changes are listed


@contextlib.contextmanager
def config_applies(trainer, path):
    """Around loading checkpoint `path` into `trainer`: the config's optimizer hyper-parameters and scheduler
    values are put back over what the checkpoint restored; a state that does not fit is one line."""
    saved = (read_meta(path).get("config") or {})
    changed = config_changes(saved, trainer.config.to_dict())
    fresh = [_hyper_parameters(optimizer) for optimizer in trainer.optimizers]
    fresh_schedules = [_schedule_values(scheduler) for scheduler in trainer.schedulers]
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException
    try:
        yield
    except (RuntimeError, KeyError, ValueError, IndexError, TypeError, CheckpointException) as e:
        if isinstance(e, ConfigError):
            raise
        raise refusal(path, changed, _first_failure(e)) from None
    applied = reapply(trainer, fresh, fresh_schedules)
    listed = [change for change in changed if change.split(" ", 1)[0].split(".")[0] in ("optimizers", "schedulers")]
    if listed or applied:
        trainer.print("resume: the config differs from %s's; applied (its optimizer state and schedule progress"
                      " are kept): %s", path, "; ".join(listed or applied))


def config_changes(saved, now):
    """'key: old -> new' for each leaf of COMPARED that differs between two configs (plain dicts)."""
    changes = []
    for section in COMPARED:
        _diff(section, saved.get(section), now.get(section), changes)
    return changes


def _diff(where, old, new, out):
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new), key=str):
            _diff(f"{where}.{key}", old.get(key, "(unset)"), new.get(key, "(unset)"), out)
    elif isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            _diff(f"{where}[{i}]", a, b, out)
    elif old != new and not (old is None and new == "(unset)"):
        out.append(f"{where} {_short(old)} -> {_short(new)}")


def _short(value):
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _first_failure(error):
    """torch.distributed.checkpoint's CheckpointException carries each rank's (exception, traceback)."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        return first[0] if isinstance(first, tuple) else first
    return error


def refusal(path, changed, error):
    """The one line for a checkpoint whose state does not fit what the config builds now."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    detail = lines[1] if len(lines) > 1 and lines[0].endswith(":") else (lines[0] if lines else type(error).__name__)
    detail = detail if len(detail) <= 200 else detail[:197] + "..."
    structural = [c for c in changed if not c.startswith("schedulers")]
    what = f"the config changed since it was saved ({'; '.join(structural[:4])})" if structural else \
        "the model or optimizer built now differs from the one saved"
    return ConfigError(f"resume from {path}: {what}, and its saved state does not fit ({detail}); restore those"
                       " keys, or train from scratch in another project_dir (or train.resume=False)")


def _hyper_parameters(optimizer):
    """Each param group's values but its params and current lr (the schedule sets that): what the config
    and get_optimizers built."""
    return [{k: v for k, v in group.items() if k not in ("params", "lr")} for group in optimizer.param_groups]


def _schedule_values(scheduler):
    return {k: v for k, v in scheduler.state_dict().items() if k not in PROGRESS_KEYS}


def reapply(trainer, fresh, fresh_schedules):
    """Put the config's hyper-parameters and schedule values back (in place: the engine's optimizer shares
    these dicts) and the lr the new values give at the restored progress. Returns what changed, as
    'param_groups[i].key old -> new' (for the line when the config's own text did not change)."""
    changed = []
    for o, (optimizer, groups) in enumerate(zip(trainer.optimizers, fresh)):
        if len(groups) != len(optimizer.param_groups):
            raise ConfigError(f"resume: optimizer {o} has {len(groups)} param groups now and"
                              f" {len(optimizer.param_groups)} in the checkpoint; restore get_optimizers or the config")
        for g, (group, values) in enumerate(zip(optimizer.param_groups, groups)):
            for key in [k for k in group if k not in values and k not in ("params", "lr")]:
                del group[key]  # another optimizer type's setting
            for key, value in values.items():
                if _differs(group.get(key), value):
                    changed.append(f"param_groups[{g}].{key} {_short(group.get(key))} -> {_short(value)}")
                    group[key] = value
    for scheduler, values in zip(trainer.schedulers, fresh_schedules):
        state = scheduler.state_dict()
        old_bases = list(getattr(scheduler, "base_lrs", []))
        state.update(values)
        scheduler.load_state_dict(state)
        _set_lr(scheduler, old_bases)
    return changed


def _differs(a, b):
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return False
    try:
        return bool(a != b)
    except Exception:  # tensors: compared by value
        import torch
        return not (torch.is_tensor(a) and torch.is_tensor(b) and torch.equal(a, b))


def _set_lr(scheduler, old_bases):
    """The lr of each group at the scheduler's restored step under the config's base lrs: the closed form
    of a LambdaLR (every value scheduler), else the restored lr scaled by new base / old base."""
    from torch.optim.lr_scheduler import LambdaLR
    groups = scheduler.optimizer.param_groups
    for i, (group, base) in enumerate(zip(groups, scheduler.base_lrs)):
        if isinstance(scheduler, LambdaLR):
            group["lr"] = base * scheduler.lr_lambdas[i](scheduler.last_epoch)
        elif i < len(old_bases) and old_bases[i]:
            group["lr"] = group["lr"] * base / old_bases[i]
    scheduler._last_lr = [group["lr"] for group in groups]  # what get_last_lr() answers
