"""Step time while a checkpoint is written in the background (train.checkpoint_async) against steps
with no save, and how long each save blocks the loop, sync against async.

    python3 bench/checkpoint_async.py --size tiny --steps 60 --every 15     # CPU smoke run (~1 min)
    python3 bench/checkpoint_async.py --size 1b --steps 300 --every 100     # one H200

The real Trainer from a config around bench/llama.py (as bench/throughput.py builds it), run twice in
this process: checkpoint_async off, then on, a checkpoint every --every steps (rolling limit 1, in a
temporary folder under --dir). BenchTrainer times each train_step and each save_checkpoint call (a
device sync around the timing only; the NaN guard reads the loss every step anyway). A step is "in
flight" when an async write was running at its start: the steps between a save's start and its
completion. The first --warmup steps are left out. Prints a markdown table last and writes --out.
"""
import argparse
import datetime
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.llama import SHAPES, Llama, Shape, shape_of  # noqa: E402
from bench.throughput import SEED, dataset_for, optimizer_config  # noqa: E402
from giga_train import Trainer, launch_from_config  # noqa: E402

TARGET = 1.10  # in-flight step time / normal step time


class BenchTrainer(Trainer):
    def get_models(self, model_config):
        self.step_s, self.in_flight, self.saves = [], [], []
        with torch.device(self.device):  # no CPU initialisation of a 1B model
            return Llama(Shape(**model_config["shape"]))

    def forward_step(self, batch_dict):
        return self.model(batch_dict["tokens"])

    def _now(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    def train_step(self):
        self.in_flight.append(self.checkpoints.in_flight)
        start = self._now()
        out = super().train_step()
        self.step_s.append(self._now() - start)
        return out

    def save_checkpoint(self):
        start = self._now()
        super().save_checkpoint()
        self.saves.append(dict(step=self.step, blocking_s=self._now() - start))


def bench_config(args, shape, device, project_dir, checkpoint_async):
    cuda = device.type == "cuda"
    train = dict(max_steps=args.steps, log_interval=args.steps, progress_bar=False, log_with="none", seed=SEED,
                 mixed_precision=args.precision or ("bf16" if cuda else "no"), checkpoint_interval=args.every,
                 checkpoint_total_limit=1, checkpoint_async=checkpoint_async)
    if shape.checkpointing:
        train.update(activation_checkpointing=True, activation_class_names=["Block"])
    launch = dict(distributed_type="NO", **({"gpu_ids": [device.index or 0]} if cuda else {}))
    return dict(
        runners=["bench.checkpoint_async.BenchTrainer"], project_dir=project_dir, launch=launch,
        dataloaders=dict(train=dict(data_or_config=dataset_for(shape, args.steps), batch_size_per_gpu=shape.batch,
                                    num_workers=0, sampler=dict(type="DefaultSampler", shuffle=False))),
        models=dict(shape=shape.to_dict()), optimizers=optimizer_config("adamw", device), train=train)


def folder_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, names in os.walk(path) for f in names)


def run(args, shape, device, checkpoint_async):
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    project = tempfile.mkdtemp(prefix="bench_checkpoint_async_", dir=args.dir)
    try:
        trainer = launch_from_config(bench_config(args, shape, device, project, checkpoint_async))
        row = dict(mode="async" if checkpoint_async else "sync",
                   checkpoint_gb=folder_bytes(trainer.checkpoints.latest()) / 1e9)
        steps = list(zip(trainer.step_s, trainer.in_flight))[args.warmup:]
        normal = [s for s, flying in steps if not flying]
        flying = [s for s, flying in steps if flying]
        row.update(normal_ms=1e3 * statistics.mean(normal) if normal else None,
                   in_flight_ms=1e3 * statistics.mean(flying) if flying else None, steps_in_flight=len(flying),
                   save_blocking_ms=[round(1e3 * s["blocking_s"], 2) for s in trainer.saves],
                   save_steps=[s["step"] for s in trainer.saves])
        row["ratio"] = row["in_flight_ms"] / row["normal_ms"] if flying and normal else None
        return row
    finally:
        trainer = None
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        shutil.rmtree(project, ignore_errors=True)


def _fmt(value, pattern="{:.1f}"):
    return "" if value is None else pattern.format(value)


def report(rows, meta, out):
    with open(out, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=2)
    print(f"\n{meta['device']}, torch {meta['torch']}, {meta['date']}; {meta['size']} "
          f"({meta['params'] / 1e6:,.1f}M params), {meta['steps']} steps, a checkpoint every {meta['every']} "
          f"({1e3 * rows[0]['checkpoint_gb']:,.1f} MB each); written to {out}")
    for r in rows:
        if r["ratio"] is not None:
            verdict = "PASS" if r["ratio"] <= TARGET else "MISS"
            print(f"- {r['mode']}: in-flight / normal step time {r['ratio']:.3f} (target <= {TARGET}) {verdict}")
    print("| mode | normal step ms | in-flight step ms | in-flight / normal | steps in flight | save blocks the loop"
          " ms (each) | mean block ms |")
    print("|" + "---|" * 7)
    for r in rows:
        blocks = r["save_blocking_ms"]
        print(f"| {r['mode']} | {_fmt(r['normal_ms'])} | {_fmt(r['in_flight_ms'])} | {_fmt(r['ratio'], '{:.3f}')} |"
              f" {r['steps_in_flight']} | {', '.join(f'{b:.0f}' for b in blocks)} |"
              f" {_fmt(statistics.mean(blocks) if blocks else None)} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1b", help=", ".join(SHAPES))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", choices=("no", "bf16"), help="default: bf16 on CUDA, no on CPU")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=100, help="checkpoint interval in steps")
    parser.add_argument("--warmup", type=int, default=3, help="first steps left out of the means")
    parser.add_argument("--dir", default=None, help="where the checkpoints go (default: the system temp folder)")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "checkpoint_async.json"))
    args = parser.parse_args(argv)
    if args.size not in SHAPES:
        parser.error(f"--size: {args.size!r} is not one of {', '.join(SHAPES)}")
    if not 0 <= args.warmup < args.every < args.steps:
        parser.error("need 0 <= --warmup < --every < --steps")
    device, shape = torch.device(args.device), shape_of(args.size)
    rows = [run(args, shape, device, checkpoint_async) for checkpoint_async in (False, True)]
    meta = dict(device=torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
                torch=torch.__version__, date=datetime.date.today().isoformat(), size=args.size,
                params=shape.params(), steps=args.steps, every=args.every, warmup=args.warmup,
                command="python3 bench/checkpoint_async.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    report(rows, meta, args.out)
    return 0


if __name__ == "__main__":
    from bench.checkpoint_async import main as _main  # one copy of this module: the config's runner names it
    sys.exit(_main())
