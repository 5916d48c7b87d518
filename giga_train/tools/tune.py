"""`giga-train tune CONFIG [--set k=v] [--budget-s 540] [--steps N]`: a few real steps of each candidate setting
on this machine's device, the fastest that fits printed as --set lines. `plan` is the estimate without a GPU.

Each candidate runs in its own process and is measured by the trainer's own logged scalars; the candidates,
their order and what makes a failed row: docs/performance.md, "Finding the fastest setting that fits"."""
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

from ..config import load_config
from ..engine.activation_checkpointing import memory_budget_bytes
from ..errors import ConfigError

EXPLODED_GRAD_NORM = 1e3
TIE_FRACTION = 0.02  # candidates this close in samples/s are a tie (the noise between runs): the lower peak wins
WORKER_FLAG = "--tune-worker"


def candidates(cfg, fp8=False):
    """[(name, [--set overrides])] for the config `cfg` (already overridden), most promising first."""
    train = cfg.train
    names = list(train.get("activation_class_names") or [])
    checkpointing = [False, "auto", True] if names else [False]
    compiled = dict(train.get("dynamo_config") or {}) or {"backend": "inductor"}
    compiled.pop("disable", None)
    budget = train.get("checkpointing_memory_budget")
    compile_ = lambda ac: (f"compile, checkpointing={ac!r}",  # noqa: E731
                           [f"train.dynamo_config={_literal(compiled)}", *_checkpointing(ac, budget)])
    eager = lambda ac: (f"eager, checkpointing={ac!r}",  # noqa: E731
                        ["train.dynamo_config=None", *_checkpointing(ac, budget)])
    float8 = lambda ac: (f"fp8, compile, checkpointing={ac!r}",  # noqa: E731
                         [f"train.dynamo_config={_literal(compiled)}", *_checkpointing(ac, budget),
                          'train.mixed_precision="fp8"'])
    cheap = [ac for ac in checkpointing if ac is not True]  # the fast ones first: checkpointing every block is slow
    out = [compile_(ac) for ac in cheap] + ([float8(ac) for ac in cheap] if fp8 else [])
    out += [compile_(True)] if True in checkpointing else []
    out += [eager(ac) for ac in cheap] + ([eager(True)] if True in checkpointing else [])
    out += [float8(True)] if fp8 and True in checkpointing else []
    return out


def _checkpointing(value, budget):
    """The --set lines of one checkpointing policy; the config's memory budget only where it applies."""
    sets = [f"train.activation_checkpointing={_literal(value)}"]
    if budget is not None and value != "auto":
        sets.append("train.checkpointing_memory_budget=None")
    return sets


def _literal(value):
    """A --set value in double quotes (a shell line quotes it once): "auto", {"backend": "inductor"}."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    return repr(value)


def doubled_micro_batch(cfg, name, sets):
    """The candidate `sets` with twice the micro-batch (half the accumulation where it is even: the same
    samples per step), or None."""
    batch = cfg.dataloaders.train.get("batch_size_per_gpu") or 1
    accumulation = int(cfg.train.get("gradient_accumulation_steps") or 1)
    more = [f"dataloaders.train.batch_size_per_gpu={batch * 2}"]
    if accumulation % 2 == 0:
        more.append(f"train.gradient_accumulation_steps={accumulation // 2}")
    return f"{name}, micro-batch {batch * 2}", sets + more


def fp8_available():
    import importlib.util

    import torch
    return importlib.util.find_spec("torchao") is not None and torch.cuda.is_available()


def model_flops(config, overrides):
    """FLOPs per sample of the config's model, counted once here on fake tensors (trainers/flop_count.py) for
    every candidate (their MFU); None where it cannot be counted (each candidate then counts its own)."""
    from ..trainers.flop_count import count_flops_per_sample
    from .offline import offline_trainer
    try:
        trainer = offline_trainer(config, overrides, device="cpu")
        return count_flops_per_sample(trainer, trainer.config.dataloaders.train.get("batch_size_per_gpu") or 1)
    except Exception:
        return None


def run_candidate(config, overrides, steps, timeout, workdir, flops=None):
    """One candidate in its own process; a dict row (status 'ok' or why not)."""
    project = tempfile.mkdtemp(prefix="tune_", dir=workdir)
    sets = list(overrides) + [f"project_dir={project!r}", f"train.logging_dir={os.path.join(project, 'logs')!r}",
                              f"train.max_steps={steps}", "train.log_interval=1", "train.log_with='jsonl'",
                              "train.progress_bar=False", "train.resume=False", "train.checkpoint_interval=None",
                              "train.checkpoint_total_limit=None"]
    if flops is not None:  # counted once by the tune (the same per sample at any micro-batch or precision)
        sets += ["train.count_flops=False", f"train.flops_per_sample={flops!r}"]
    command = [sys.executable, "-m", "giga_train.tools.tune", WORKER_FLAG, str(config)]
    command += [x for s in sets for x in ("--set", s)]
    start = time.perf_counter()
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=max(timeout, 1))
        rows = _metric_rows(os.path.join(project, "logs", "metrics.jsonl"))
        if run.returncode != 0:
            return dict(status=_failure(run.stderr), wall_s=time.perf_counter() - start)
        return dict(_verdict(rows, steps), wall_s=time.perf_counter() - start)
    except subprocess.TimeoutExpired:
        return dict(status="timeout", wall_s=time.perf_counter() - start)
    finally:
        shutil.rmtree(project, ignore_errors=True)


def _metric_rows(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [r for r in (json.loads(line) for line in f if line.strip()) if "step_time" in r]


def _failure(stderr):
    text = stderr or ""
    if "out of memory" in text.lower() or "OutOfMemoryError" in text:
        return "failed: out of memory"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return "failed: " + (lines[-1][:120] if lines else "no output")


def _verdict(rows, steps):
    if not rows:
        return dict(status="failed: no step logged")
    norms = [r.get("grad_norm") for r in rows if r.get("grad_norm") is not None]
    skipped = sum(r.get("nan_skipped") or 0 for r in rows)
    timed = rows[len(rows) // 2:]  # the first steps compile and warm the allocator
    step_times = sorted(r["step_time"] for r in timed)
    median = step_times[len(step_times) // 2]
    last = rows[-1]
    row = dict(s_per_step=median, samples_per_sec=_scaled(last, "samples_per_sec", median),
               tokens_per_sec=_scaled(last, "tokens_per_sec", median), mfu=_scaled(last, "mfu", median),
               peak_gb=max((r.get("peak_allocated_gb") or r.get("peak_rss_gb") or 0) for r in rows),
               grad_norms=norms, nan_skipped=skipped, status="ok")
    if skipped:
        row["status"] = f"failed: the NaN guard skipped {skipped} steps"
    elif any(not math.isfinite(g) or g > EXPLODED_GRAD_NORM for g in norms):
        row["status"] = f"failed: grad norm exploded ({max(norms):.3g})"
    elif len(rows) < steps:
        row["status"] = f"failed: {len(rows)} of {steps} steps logged"
    return row


def _scaled(row, key, s_per_step):
    """A rate logged at the last step, scaled to the median step time."""
    return row[key] * row["step_time"] / s_per_step if row.get(key) is not None else None


def tune(config, overrides=(), budget_s=540, steps=6, out=print, todo=None, grow_micro_batch=True):
    """Runs the candidates (`todo`: [(name, [--set ...])], default candidates()), then the fastest with twice
    the micro-batch, within `budget_s`; returns (rows, the fastest ok row or None)."""
    from tqdm import tqdm
    cfg = load_config(config, overrides)
    if steps < 2:
        raise ConfigError(f"--steps: {steps}: at least 2 (the second half is timed)")
    todo = candidates(cfg, fp8_available()) if todo is None else list(todo)
    start, rows = time.perf_counter(), []
    flops = cfg.train.get("flops_per_sample") or model_flops(config, overrides)
    workdir = tempfile.mkdtemp(prefix="giga_tune_")
    bar = tqdm(total=len(todo) + grow_micro_batch, desc="tune", unit="candidate", dynamic_ncols=True, file=sys.stderr)
    try:
        for entry in todo + ([None] if grow_micro_batch else []):
            if entry is not None:
                name, sets = entry
            else:  # the fastest so far with twice the micro-batch
                best = _fastest(rows)
                if best is None:
                    break
                name, sets = doubled_micro_batch(cfg, best["name"], best["sets"])
            left = budget_s - (time.perf_counter() - start)
            if left < 10:
                rows.append(dict(name=name, sets=sets, status="skipped: time budget"))
                bar.update(1)
                continue
            bar.set_postfix_str(name)
            result = run_candidate(config, list(overrides) + sets, steps, left, workdir, flops)
            rows.append(dict(name=name, sets=sets, **result))
            _over_budget(rows[-1:], cfg.train.get("checkpointing_memory_budget"))
            bar.update(1)
    finally:
        bar.close()
        shutil.rmtree(workdir, ignore_errors=True)
    best = _fastest(rows)
    out(format_table(rows))
    if best is None:
        out("no candidate finished: nothing to suggest")
    else:
        out(f"fastest that fits: {best['name']} ({best['s_per_step']:.3f} s/step,"
            f" {best['samples_per_sec']:.3g} samples/s); set:")
        out("\n".join(f"--set {shlex.quote(s)}" for s in best["sets"]))
    return rows, best


def _over_budget(rows, budget):
    """Rows whose peak is above a size budget (train.checkpointing_memory_budget='60GiB') are not chosen."""
    if not isinstance(budget, str):
        return
    limit = memory_budget_bytes(budget, None) / 1e9
    for row in rows:
        if row.get("status") == "ok" and row["peak_gb"] > limit:
            row["status"] = f"over the budget {budget}"


def _fastest(rows, tie=TIE_FRACTION):
    """The most samples/s among the ok rows; of those within `tie` of it (run-to-run noise), the lowest peak."""
    ok = [r for r in rows if r.get("status") == "ok"]
    if not ok:
        return None
    best = max(r["samples_per_sec"] for r in ok)
    close = [r for r in ok if r["samples_per_sec"] >= (1 - tie) * best]
    return min(close, key=lambda r: (r.get("peak_gb") or 0.0, -r["samples_per_sec"]))


def format_table(rows):
    header = ("candidate", "s/step", "samples/s", "tokens/s", "MFU", "peak GB", "status")

    def cell(value, fmt):
        return "-" if value is None else format(value, fmt)
    table = [header] + [(r["name"], cell(r.get("s_per_step"), ".3f"), cell(r.get("samples_per_sec"), ".3g"),
                         cell(r.get("tokens_per_sec"), ".4g"), cell(r.get("mfu"), ".1%"),
                         cell(r.get("peak_gb"), ".1f"), r["status"]) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) if i in (0, 6) else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
                     .rstrip() for row in table)


def tune_command(args):
    tune(args.config, args.overrides, args.budget_s, args.steps)


def _worker(argv):
    """One candidate: the config's training run without writing checkpoints (only its step scalars count)."""
    import argparse
    from ..launch.launcher import launch_from_config
    from ..trainers.trainer import Trainer
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)
    Trainer.save_checkpoint = lambda self: None
    launch_from_config(args.config, overrides=args.overrides)


if __name__ == "__main__" and sys.argv[1:2] == [WORKER_FLAG]:
    _worker(sys.argv[2:])
