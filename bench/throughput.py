"""Throughput of giga-train against a hand-written PyTorch loop doing the same work.

    python3 bench/throughput.py --size 1b --steps 30 [--compile] [--precision bf16|fp8|no]
                                [--optimizer adamw|came8bit] [--accumulate N] [--paths giga,hand] [--profile]
    python3 bench/throughput.py --size 1b --paths giga,hand --metrics --log-with jsonl --log-interval 10
                                # the trainer also logs tokens/s, MFU and peak memory (row["logged"])
    python3 bench/throughput.py --suite h200            # the whole H200 table in one run (~9 min)
    python3 bench/throughput.py --size tiny --device cpu --steps 4 --warmup 1   # CPU smoke run

The model is bench/llama.py's Llama-style decoder at a named size (tiny, 1b, 8b, 8b8 = 8 blocks of the
8B shape, 13b). The giga path is the real Trainer from a config (ThroughputTrainer below: a model, a
synthetic token Dataset object, progress bar and logging off, one log step at the end). The hand path
builds the same model at the same seed, reads the same batches through a pinned DataLoader, and runs
autocast / backward / step / zero_grad itself, with the same compile (each Block, in place),
activation checkpointing, float8 conversion (torchao, output head excluded), gradient accumulation
(`--accumulate` micro-batches per optimizer step) and optimizer.

Both time the same window with bench/probe.py: device sync at the end of `--warmup` steps and after
`--steps`; tokens/s over that window; MFU = tokens/s x model FLOPs per token (bench/llama.py) / 989
TFLOP/s (H200 dense bf16); "compile s" = warm-up time beyond warmup x the steady step time. Each
configuration runs in its own process (clean memory and peak statistics; an OOM or a crash is a row,
not the end of the bench). Prints a markdown table last and writes JSON (--out).
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.llama import SHAPES, Llama, Shape, SyntheticTokens, shape_of  # noqa: E402
from bench.probe import StepProbe  # noqa: E402
from giga_train import Trainer, launch_from_config  # noqa: E402

H200_BF16_FLOPS = 989e12
GPU_ANCHORS = ("Anchors measured 2026-12-02 on one H200: 1b hand-written 61.1k tokens/s eager (37.9% MFU), 81.7k per block"
               " (50.7%); Accelerate 60.8k, Fabric 60.9k eager; 8b8 compiled bf16 43.6k, torchao fp8 56.1k;"
               " 8b AdamW peak 128.6 GB")
LR, WEIGHT_DECAY, SEED = 1e-4, 0.01, 0
VAL_BATCHES = 4  # micro-batches each validation runs (forward only): its cost is stated per validation


def row_spec(size, path, device="cuda", compile=False, precision="bf16", optimizer="adamw", steps=30, warmup=5,
             profile_steps=0, expect_oom=False, budget_s=None, simulate=None, log_interval=None, accumulate=1,
             batch=None, strategy="NO", metrics=False, log_with="none", eval_interval=None):
    """One configuration of the bench (JSON-able: it is handed to a child process). A step is one
    optimizer step over `accumulate` micro-batches of `batch` sequences (None: the size's). `log_interval`:
    the giga path's (default: one log line, after the timed steps). `strategy`: the giga path's engine,
    "NO" or "ZERO2" (DeepSpeed ZeRO-2 at one rank: GigaTrain projects' usual engine). `metrics`: the giga
    path logs tokens/s, TFLOP/s and MFU from one counted step (train.count_flops) and peak memory;
    `log_with`: its trackers (train.log_with, e.g. "jsonl,tensorboard"), and a user metric (log_metric) each
    micro-batch; `eval_interval`: the giga path validates every that many steps on VAL_BATCHES held-out batches."""
    return dict(size=size, path=path, device=device, compile=compile, precision=precision, optimizer=optimizer,
                steps=steps, warmup=warmup, profile_steps=profile_steps, expect_oom=expect_oom,
                budget_s=budget_s, simulate=simulate, log_interval=log_interval, accumulate=accumulate, batch=batch,
                strategy=strategy, metrics=metrics, log_with=log_with, eval_interval=eval_interval)


def h200_suite():
    """Most important first: a row that does not fit in the time left is skipped, not half run."""
    s = row_spec
    return [
        s("1b", "hand", budget_s=40), s("1b", "giga", budget_s=40),
        s("1b", "hand", compile=True, budget_s=60), s("1b", "giga", compile=True, profile_steps=3, budget_s=90),
        # The whole 8B, bf16 against fp8. CAME8Bit (~9 B/param, 72 GB) leaves room for micro-batches of
        # 8 x 2048 tokens; AdamW's fp32 states (16 B/param, 128 GB) for 2 (x 2 accumulated).
        *[s("8b", "giga", compile=True, precision=p, optimizer="came8bit", batch=8, steps=6, warmup=2,
            profile_steps=int(p == "fp8"), budget_s=60) for p in ("bf16", "fp8")],
        *[s("8b", "giga", compile=True, precision=p, batch=2, accumulate=2, steps=7, warmup=2,
            profile_steps=int(p == "fp8"), budget_s=60) for p in ("bf16", "fp8")],
        s("13b", "giga", optimizer="came8bit", steps=4, warmup=2, budget_s=50),
        s("13b", "giga", optimizer="adamw", steps=4, warmup=2, expect_oom=True, budget_s=35),
        *[s("8b", "hand", compile=True, precision=p, optimizer="came8bit", batch=8, steps=6, warmup=2, budget_s=50)
          for p in ("bf16", "fp8")],
        *[s("8b", "hand", compile=True, precision=p, batch=2, accumulate=2, steps=7, warmup=2, budget_s=50)
          for p in ("bf16", "fp8")],
    ]


# -- the two paths ------------------------------------------------------------------------------
def autocast_dtype(precision):
    return {"no": None, "bf16": torch.bfloat16, "fp8": torch.bfloat16}[precision]


def optimizer_config(name, device):
    if name == "adamw":
        fused = {"fused": True} if device.type == "cuda" else {}
        return dict(type="AdamW", lr=LR, weight_decay=WEIGHT_DECAY, **fused)
    if name == "came8bit":
        return dict(type="CAME8Bit", lr=LR, weight_decay=WEIGHT_DECAY)
    raise ValueError(f"unknown optimizer {name!r} (adamw, came8bit)")


def build_optimizer(name, params, device):
    kwargs = optimizer_config(name, device)
    kind = kwargs.pop("type")
    if kind == "AdamW":
        return torch.optim.AdamW(params, **kwargs)
    from giga_train.optimizers import CAME8Bit
    return CAME8Bit(params, **kwargs)


def dataset_for(shape, steps, accumulate=1):
    return SyntheticTokens(size=shape.batch * accumulate * (steps + 1), seq=shape.seq, vocab=shape.vocab, seed=SEED)


class ThroughputTrainer(Trainer):
    """The bench's Trainer: the model built on the device, losses kept on the device, the probe
    around each step, and no checkpoint (the bench measures steps, not the writing of 50 GB)."""

    def get_models(self, model_config):
        bench = model_config["bench"]
        self.bench_losses = []
        self.probe = StepProbe(self.device, bench["warmup"], bench["steps"], bench["profile_steps"])
        with torch.device(self.device):  # no CPU initialisation of 13B parameters
            return Llama(Shape(**model_config["shape"]))

    def forward_step(self, batch_dict):
        loss = self.model(batch_dict["tokens"])
        if self.model.training:
            self.bench_losses.append(loss.detach())
            if self.kwargs.get("bench_metrics"):  # a scalar that is not trained, summed on the device
                self.log_metric("perplexity", loss.detach().float().exp())
        return loss

    def train_step(self):
        self.probe.before_step(self.step)
        out = super().train_step()
        self.probe.after_step(self.step + 1)
        return out

    def save_checkpoint(self):
        pass


def giga_config(spec, shape, device, project_dir):
    probe_steps = spec["steps"] + spec["profile_steps"]
    train = dict(max_steps=probe_steps, log_interval=spec.get("log_interval") or probe_steps, progress_bar=False,
                 log_with=(spec.get("log_with") or "none").split(","), mixed_precision=spec["precision"], seed=SEED,
                 resume=False, gradient_accumulation_steps=spec["accumulate"])
    if spec.get("metrics"):  # MFU against the bench's own peak, so the two MFU figures compare
        train.update(count_flops=True, tokens_per_sample=shape.seq,
                     peak_flops=H200_BF16_FLOPS if device.type == "cuda" else None)
        train["bench_metrics"] = True  # reaches self.kwargs
    loaders = dict(train=dict(data_or_config=dataset_for(shape, probe_steps, spec["accumulate"]),
                              batch_size_per_gpu=shape.batch,
                              num_workers=0, sampler=dict(type="DefaultSampler", shuffle=False)))
    if spec.get("eval_interval"):
        train["eval_interval"] = spec["eval_interval"]
        loaders["val"] = dict(data_or_config=SyntheticTokens(size=shape.batch * VAL_BATCHES, seq=shape.seq,
                                                             vocab=shape.vocab, seed=SEED + 1),
                              batch_size_per_gpu=shape.batch, num_workers=0)
    if shape.checkpointing:
        train.update(activation_checkpointing=True, activation_class_names=["Block"])
    if spec["compile"]:
        train["dynamo_config"] = dict(backend="inductor")
    launch = dict(distributed_type="NO", **({"gpu_ids": [device.index or 0]} if device.type == "cuda" else {}))
    if spec.get("strategy", "NO") == "ZERO2":
        launch.update(distributed_type="DEEPSPEED", deepspeed_config=dict(deepspeed_config_file="zero2.json"))
    return dict(
        runners=["bench.throughput.ThroughputTrainer"], project_dir=project_dir, launch=launch,
        dataloaders=loaders,
        models=dict(shape=shape.to_dict(), bench=dict(warmup=spec["warmup"], steps=spec["steps"],
                                                      profile_steps=spec["profile_steps"])),
        optimizers=optimizer_config(spec["optimizer"], device), train=train)


def run_giga(spec, shape, device):
    with tempfile.TemporaryDirectory(prefix="bench_throughput_") as project_dir:
        trainer = launch_from_config(giga_config(spec, shape, device, project_dir))
    return trainer.bench_losses, trainer.probe, getattr(trainer, "last_metrics", None)


def _checkpoint_blocks(model):
    from torch.utils.checkpoint import checkpoint
    for block in model.layers:
        forward = block.forward
        block.forward = lambda *args, _forward=forward: checkpoint(_forward, *args, use_reentrant=False)


def run_hand(spec, shape, device):
    """The minimal loop a PyTorch user writes for the same work."""
    torch.manual_seed(SEED)
    with torch.device(device):
        model = Llama(shape)
    if spec["precision"] == "fp8":
        from torchao.float8 import convert_to_float8_training
        convert_to_float8_training(model, module_filter_fn=lambda module, fqn: fqn != "output")
    if shape.checkpointing:
        _checkpoint_blocks(model)
    if spec["compile"]:
        for block in model.layers:
            block.compile()
    optimizer = build_optimizer(spec["optimizer"], model.parameters(), device)
    probe = StepProbe(device, spec["warmup"], spec["steps"], spec["profile_steps"])
    accumulate = spec["accumulate"]
    loader = torch.utils.data.DataLoader(dataset_for(shape, probe.total_steps, accumulate), batch_size=shape.batch,
                                         pin_memory=device.type == "cuda")
    dtype = autocast_dtype(spec["precision"])
    losses = []
    batches = iter(loader)
    for step in range(probe.total_steps):
        probe.before_step(step)
        for _ in range(accumulate):
            tokens = next(batches)["tokens"].to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = model(tokens)
            (loss / accumulate).backward()
            losses.append(loss.detach())  # per micro-batch, as the giga path's forward_step records them
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        probe.after_step(step + 1)
    return losses, probe, None


# -- one row, in this process -------------------------------------------------------------------
def _is_oom(error):
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower()


def run_row(spec):
    """Run one configuration here and return its row (an OOM is a row with status "OOM")."""
    device = torch.device(spec["device"])
    shape = shape_of(spec["size"], batch=spec.get("batch"))
    row = dict(spec, status="ok", params=shape.params(), flops_per_token=shape.flops_per_token(),
               tokens_per_step=shape.batch * shape.seq * spec["accumulate"], checkpointing=shape.checkpointing)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    try:
        if spec.get("simulate") == "oom":  # the tests' stand-in for a model that does not fit
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 52.00 GiB (simulated)")
        losses, probe, logged = (run_giga if spec["path"] == "giga" else run_hand)(spec, shape, device)
        if spec.get("metrics"):
            row["logged"] = logged  # the trainer's last log step: its own tokens/s, MFU, peak memory
        values = torch.stack(losses).float().tolist()
        row.update(probe.result(row["tokens_per_step"]), losses=values[:spec["steps"] * spec["accumulate"]])
        row["finite"] = all(v == v and abs(v) != float("inf") for v in values)
        if device.type == "cuda":
            row["mfu"] = row["tokens_per_s"] * shape.flops_per_token() / H200_BF16_FLOPS
    except Exception as error:  # noqa: BLE001  (any failure is reported in its row)
        if not _is_oom(error):
            raise
        row.update(status="OOM", error=str(error).strip().splitlines()[0][:300])
    row["wall_s"] = time.perf_counter() - start
    if device.type == "cuda":
        row["peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
        row["reserved_gb"] = torch.cuda.max_memory_reserved() / 1e9
    if spec["compile"]:
        from torch._dynamo.utils import counters
        row["graphs"] = counters["stats"]["unique_graphs"]
    return row


def child_main(spec_json, out_path):
    spec = json.loads(spec_json)
    if spec.get("simulate") == "crash":
        os._exit(3)  # the tests' stand-in for a child killed mid-run (segfault, OOM killer)
    try:
        row = run_row(spec)
    except Exception as error:  # noqa: BLE001
        traceback.print_exc()  # into the row's log, whose end the report shows
        row = dict(spec, status="failed", error=f"{type(error).__name__}: {error}".splitlines()[0][:300])
    with open(out_path, "w") as f:
        json.dump(row, f)
    return 0 if row["status"] != "failed" else 1


# -- many rows, one process each ----------------------------------------------------------------
def run_in_child(spec, timeout_s, log_dir, env, index=0):
    """Run one row in a fresh process; a crash, a timeout or a missing result is a failed row."""
    name = f"{index:02d}_" + row_name(spec).replace(" ", "_")
    out_path, log_path = os.path.join(log_dir, f"{name}.json"), os.path.join(log_dir, f"{name}.log")
    command = [sys.executable, "-m", "bench.throughput", "--row", json.dumps(spec), "--row-out", out_path]
    with open(log_path, "w") as log:
        child = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env,
                                 start_new_session=True)  # its own group: a timeout kills compile workers too
        try:
            code = child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, 9)
            child.wait()
            return dict(spec, status="timeout", error=f"killed after {timeout_s:.0f} s", log_tail=_tail(log_path))
    if os.path.exists(out_path):
        with open(out_path) as f:
            row = json.load(f)
        if row["status"] == "failed":
            row["log_tail"] = _tail(log_path)
        return row
    return dict(spec, status="failed", error=f"exit {code} without a result", log_tail=_tail(log_path))


def _tail(path, lines=25):
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def child_env(cold_compile, log_dir, index):
    env = dict(os.environ)
    # Fewer fragmentation OOMs for the largest models; the same for both paths.
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    if cold_compile:
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(log_dir, f"inductor_{index}")
    return env


def run_rows(specs, budget_s, row_timeout_s, cold_compile, out, meta, log_dir=None):
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
    else:
        log_dir = tempfile.mkdtemp(prefix="bench_throughput_logs_")
    meta["logs"] = log_dir
    deadline = time.monotonic() + budget_s if budget_s else None
    rows = []
    for index, spec in enumerate(specs):
        left = deadline - time.monotonic() if deadline else None
        if left is not None and left < (spec.get("budget_s") or 0):
            rows.append(dict(spec, status="skipped", error=f"{left:.0f} s left of the --budget"))
        else:
            timeout = min(row_timeout_s, left) if left is not None else row_timeout_s
            rows.append(run_in_child(spec, timeout, log_dir, child_env(cold_compile, log_dir, index), index))
        print(f"[throughput] {row_name(spec)}: {_status_line(rows[-1])}", flush=True)
        write_json(out, meta, rows)  # after every row: a kill of the bench keeps what was measured
    return rows


# -- the report ---------------------------------------------------------------------------------
def batch_label(spec):
    """Sequences per step: "8", or "2x2" for 2 micro-batches of 2 accumulated."""
    batch, accumulate = shape_of(spec["size"], batch=spec.get("batch")).batch, spec.get("accumulate", 1)
    return f"{batch}x{accumulate}" if accumulate > 1 else str(batch)


def row_name(spec):
    mode = "compiled" if spec["compile"] else "eager"
    extras = (" +metrics" if spec.get("metrics") else "") + \
        (f" +val{spec['eval_interval']}" if spec.get("eval_interval") else "")
    return f"{spec['size']} {spec['precision']} {mode} {spec['optimizer']} batch {batch_label(spec)} {spec['path']}{extras}"


def _status_line(row):
    if row["status"] != "ok":
        return f"{row['status']} {row.get('error', '')}"
    mfu = f", MFU {100 * row['mfu']:.1f}%" if row.get("mfu") is not None else ""
    return f"{row['tokens_per_s']:,.0f} tokens/s{mfu} ({row.get('wall_s', 0):.0f} s)"


def _key(row, **changes):
    fields = ("size", "device", "compile", "precision", "optimizer", "accumulate", "batch", "path")
    return tuple(changes.get(f, row.get(f)) for f in fields)


def add_comparisons(rows):
    """ours/hand tokens/s and loss agreement for each giga row with a hand twin; fp8/bf16 for fp8 rows."""
    ok = {_key(r): r for r in rows if r["status"] == "ok"}
    for r in rows:
        if r["status"] != "ok":
            continue
        hand = ok.get(_key(r, path="hand"))
        if r["path"] == "giga" and hand is not None:
            r["ours_over_hand"] = r["tokens_per_s"] / hand["tokens_per_s"]
            pairs = list(zip(r["losses"], hand["losses"]))
            r["loss_max_rel_diff"] = max(abs(a - b) / max(abs(b), 1e-12) for a, b in pairs) if pairs else None
        bf16 = ok.get(_key(r, precision="bf16"))
        if r["precision"] == "fp8" and bf16 is not None:
            r["fp8_over_bf16"] = r["tokens_per_s"] / bf16["tokens_per_s"]
    return rows


def targets(rows):
    """The issue's targets that this run's rows can judge: (what, value, bar, passed)."""
    found = []

    def pick(**want):
        return [r for r in rows if all(r.get(k) == v for k, v in want.items())]

    for r in pick(size="1b", path="giga", precision="bf16", status="ok"):
        if "ours_over_hand" in r:
            found.append((f"overhead 1b {'compiled' if r['compile'] else 'eager'}: ours/hand tokens/s",
                          f"{r['ours_over_hand']:.3f}", ">= 0.99", r["ours_over_hand"] >= 0.99))
        if r["compile"] and r.get("mfu") is not None:
            found.append(("MFU 1b bf16 compiled", f"{100 * r['mfu']:.1f}%", ">= 50%", r["mfu"] >= 0.50))
    for r in pick(size="8b", path="giga", precision="fp8", status="ok"):
        if "fp8_over_bf16" in r:
            found.append((f"fp8 / bf16 tokens/s, 8B, {r['optimizer']}, batch {batch_label(r)}",
                          f"{r['fp8_over_bf16']:.2f}x", ">= 1.3x", r["fp8_over_bf16"] >= 1.3))
    for r in pick(size="13b", path="giga"):
        if r["optimizer"] == "came8bit":
            found.append(("13b trains with CAME8Bit", r["status"] + (f", peak {r['peak_gb']:.1f} GB" if r.get("peak_gb")
                                                                     else ""), "ok", r["status"] == "ok"))
        elif r["expect_oom"]:
            found.append(("13b with AdamW fp32 states does not fit", r["status"], "OOM", r["status"] == "OOM"))
    return found


def write_json(out, meta, rows):
    with open(out, "w") as f:
        json.dump(dict(meta=meta, rows=add_comparisons([dict(r) for r in rows])), f, indent=2)


def _fmt(value, pattern, empty=""):
    return pattern.format(value) if value is not None else empty


def report(rows, meta, out):
    rows = add_comparisons(rows)
    write_json(out, meta, rows)
    for r in rows:
        if r.get("profile"):
            p = r["profile"]
            busy = f", device busy {100 * p['device_busy']:.0f}% of the step" if p.get("device_busy") else ""
            shares = ", ".join(f"{k} {100 * v:.0f}%" for k, v in p["share"].items())
            print(f"\nTop kernels, {row_name(r)} ({p['step_ms']:.1f} ms/step profiled{busy}; {shares}):")
            for k in p["top"]:
                print(f"  {k['ms_per_step']:8.2f} ms {100 * k['share']:5.1f}%"
                      f"  x{k['calls_per_step']:<5.0f} {k['name']}")
        if r["status"] == "failed" and r.get("log_tail"):
            print(f"\n{row_name(r)} failed; the end of its log:\n{r['log_tail']}")
    found = targets(rows)
    if found:
        print("\nTargets:")
        for what, value, bar, passed in found:
            print(f"- {what}: {value} (target {bar}) {'PASS' if passed else 'MISS'}")
        print(f"- {GPU_ANCHORS}")
    print(f"\n{meta['card']}, torch {meta['torch']}, torchao {meta['torchao']}, {meta['date']}; MFU against"
          f" {H200_BF16_FLOPS / 1e12:.0f} TFLOP/s; written to {out}")
    print("| size | batch | precision | compile | optimizer | path | tokens/s | MFU | ours/hand | fp8/bf16 | peak GB |"
          " compile s | syncs | loss (first, last) | status |")
    print("|" + "---|" * 15)
    for r in rows:
        ok = r["status"] == "ok"
        status = r["status"] + (" (expected)" if r.get("expect_oom") and r["status"] == "OOM" else "")
        if not ok and r.get("error") and r["status"] != "OOM":
            status += f": {r['error'][:80]}"
        losses = r.get("losses") or []
        engine = " ZeRO-2" if r.get("strategy") == "ZERO2" else ""
        print(f"| {r['size']} | {batch_label(r)} | {r['precision']} | {'per block' if r['compile'] else 'eager'} | {r['optimizer']} |"
              f" {'giga-train' + engine if r['path'] == 'giga' else 'hand-written'} |"
              f" {_fmt(r.get('tokens_per_s'), '{:,.0f}')} | {_fmt(r.get('mfu'), '{:.1%}')} |"
              f" {_fmt(r.get('ours_over_hand'), '{:.3f}')} | {_fmt(r.get('fp8_over_bf16'), '{:.2f}x')} |"
              f" {_fmt(r.get('peak_gb'), '{:.1f}')} | {_fmt(r.get('compile_s') if r['compile'] else None, '{:.1f}')} |"
              f" {_fmt(r.get('syncs'), '{}')} | {f'{losses[0]:.4f}, {losses[-1]:.4f}' if losses else ''} | {status} |")


def meta_info():
    cuda = torch.cuda.is_available()
    try:
        import torchao
        torchao_version = torchao.__version__
    except ImportError:
        torchao_version = "not installed"
    return dict(card=torch.cuda.get_device_name() if cuda else "CPU", torch=torch.__version__,
                torchao=torchao_version, date=datetime.date.today().isoformat(),
                gpu_memory_gb=torch.cuda.get_device_properties(0).total_memory / 1e9 if cuda else None,
                command="python3 bench/throughput.py " + " ".join(sys.argv[1:]), peak_flops=H200_BF16_FLOPS,
                lr=LR, weight_decay=WEIGHT_DECAY, seed=SEED)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=("h200",), help="the whole H200 table (overrides the row options)")
    parser.add_argument("--size", default="1b", help="tiny, 1b, 8b, 8b8, 13b")
    parser.add_argument("--paths", default="giga,hand", help="giga, hand, or both (comma-separated)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--compile", action="store_true", help="compile each Block (train.dynamo_config)")
    parser.add_argument("--precision", default="bf16", choices=("no", "bf16", "fp8"))
    parser.add_argument("--optimizer", default="adamw", help="adamw, came8bit, or both (comma-separated)")
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per optimizer step")
    parser.add_argument("--strategies", default="NO", help="the giga path's engines: NO, ZERO2 (comma-separated)")
    parser.add_argument("--batch", type=int, default=None, help="sequences per micro-batch (default: the size's)")
    parser.add_argument("--metrics", action="store_true",
                        help="giga path: log tokens/s, MFU (one step's FLOPs counted) and peak memory")
    parser.add_argument("--log-with", default="none",
                        help="giga path's trackers: tensorboard, jsonl, wandb (comma-separated)")
    parser.add_argument("--log-interval", type=int, default=None,
                        help="giga path's steps between log steps (default: one, after the timed steps)")
    parser.add_argument("--eval-interval", type=int, default=None,
                        help=f"giga path: validate every N steps on {VAL_BATCHES} held-out micro-batches")
    parser.add_argument("--steps", type=int, default=30, help="steps timed up to (warm-up included)")
    parser.add_argument("--warmup", type=int, default=5, help="first steps left out of the timing")
    parser.add_argument("--profile", type=int, nargs="?", const=3, default=0,
                        help="profile N steps after the timed ones and list the top kernels (default 3)")
    parser.add_argument("--budget", type=float, default=None, help="seconds for all rows (suite: 540)")
    parser.add_argument("--row-timeout", type=float, default=300)
    parser.add_argument("--cold-compile", action="store_true", help="a fresh inductor cache for each row")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "throughput.json"))
    parser.add_argument("--logs", help="folder for each row's log (default: a temporary folder)")
    parser.add_argument("--row", help=argparse.SUPPRESS)       # internal: run one row (JSON) here
    parser.add_argument("--row-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.row:
        return child_main(args.row, args.row_out)
    if args.suite:
        specs, budget = h200_suite(), args.budget or 540
    else:
        if args.size not in SHAPES:
            parser.error(f"--size: {args.size!r} is not one of {', '.join(SHAPES)}")
        if not 1 <= args.warmup < args.steps:
            parser.error("need 1 <= --warmup < --steps")
        specs = [row_spec(args.size, path.strip(), device=args.device, compile=args.compile, precision=args.precision,
                          optimizer=optimizer.strip(), steps=args.steps, warmup=args.warmup, profile_steps=args.profile,
                          accumulate=args.accumulate, batch=args.batch, strategy=strategy.strip(),
                          metrics=args.metrics, log_with=args.log_with, log_interval=args.log_interval,
                          eval_interval=args.eval_interval)
                 for optimizer in args.optimizer.split(",") for path in args.paths.split(",")
                 for strategy in (args.strategies.split(",") if path.strip() == "giga" else ["NO"])]
        budget = args.budget
    meta = meta_info()
    rows = run_rows(specs, budget, args.row_timeout, args.cold_compile, args.out, meta, args.logs)
    report(rows, meta, args.out)
    return 0


if __name__ == "__main__":
    from bench.throughput import main as _main  # one copy of this module: the config's runner names it
    sys.exit(_main())
