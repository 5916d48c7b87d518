"""Wan2.2-TI2V-5B fine-tuning on one GPU: seconds per step and peak memory through the real Trainer.

    python bench/wan.py                         # CUDA: the 5B architecture at random init, 480x832, 49 frames
    python bench/wan.py --tiny --device cpu     # every code path on a tiny architecture (CPU, seconds)
    python bench/wan.py --tiny --device cpu --simulate-oom-above 17   # the OOM row and frame fallback

Each (strategy, optimizer) row runs in a fresh process: the synthetic dataset of the row's shape
(examples/wan/scripts/build_dataset.py --synthetic), the 5B config (examples/wan/configs/wan_5b_t2v_ft.py)
at one GPU with bf16 autocast over fp32 parameters and activation checkpointing per WanTransformerBlock,
batch 1. Seconds per step: the trainer's mean over the second half of the steps. Peak: the row's
torch.cuda.max_memory_allocated (peak RSS on CPU). An out-of-memory row is reported as a row and the
row is retried with fewer frames (49 -> 33 -> 17 -> 9 -> 1). A time budget (--budget-s) skips what no
longer fits. Prints a markdown table last and writes JSON (bench/wan.json)."""
import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from examples.wan.trainer import WanTrainer  # noqa: E402

FRAME_FALLBACK = (49, 33, 17, 9, 1)
SIMULATE_OOM = "WAN_BENCH_SIMULATE_OOM_ABOVE"  # frames above which a row raises OutOfMemoryError (tests)
TINY_ARCH = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4,
                 out_channels=4, text_dim=32, freq_dim=16, ffn_dim=48, num_layers=2, cross_attn_norm=True,
                 qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=64)
STRATEGIES = {
    "NO": dict(distributed_type="NO"),
    "ZeRO-2": dict(distributed_type="DEEPSPEED", deepspeed_config=dict(deepspeed_config_file="zero2.json")),
    "FSDP2": dict(distributed_type="FSDP", fsdp_config=dict(
        fsdp_version=2, fsdp_transformer_layer_cls_to_wrap="WanTransformerBlock")),
}
# ZeRO-2 with AdamW: CAME8Bit is refused on ZeRO's flat partitions (it needs 2-D shapes); under ZeRO the
# engine holds bf16 weights with fp32 master copies in the optimizer instead of fp32 weights + autocast.
DEFAULT_ROWS = ("NO:AdamW", "NO:CAME8Bit", "ZeRO-2:AdamW", "FSDP2:CAME8Bit")


def optimizer_config(name, device):
    if name == "AdamW":  # torch's fused kernel on CUDA: the fastest AdamW there is
        return dict(type="AdamW", lr=1e-5, weight_decay=0.01, **({"fused": True} if device == "cuda" else {}))
    if name == "CAME8Bit":
        return dict(type="CAME8Bit", lr=1e-5, weight_decay=0.01)
    raise SystemExit(f"bench/wan.py: unknown optimizer {name!r} (AdamW or CAME8Bit)")


class BenchWanTrainer(WanTrainer):
    """The example's trainer, timed; checkpoints are not written (a 5B checkpoint with AdamW state is
    60 GB of disk and minutes of I/O that are not the step being measured)."""

    @classmethod
    def load(cls, config):
        start = time.perf_counter()
        trainer = super().load(config)
        trainer.init_seconds = time.perf_counter() - start
        return trainer

    def get_models(self, model_config):
        model = super().get_models(model_config)
        self.num_params = sum(p.numel() for p in model.parameters())
        return model

    def forward_step(self, batch_dict):
        limit = os.environ.get(SIMULATE_OOM)
        frames = (batch_dict["latents"].shape[2] - 1) * 4 + 1
        if limit and frames > int(limit):
            import torch
            raise torch.OutOfMemoryError(f"CUDA out of memory (simulated above {limit} frames)")
        return super().forward_step(batch_dict)

    def save_checkpoint(self):
        pass


def peak_memory_gib(device):
    import torch
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def is_oom(error):
    import torch
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()


def row_config(spec, data_dir, project_dir):
    from examples.wan.model import WAN22_TI2V_5B
    from giga_train import load_config
    cfg = load_config(os.path.join(ROOT, "examples/wan/configs/wan_5b_t2v_ft.py"))
    cfg.runners = ["bench.wan.BenchWanTrainer"]
    cfg.project_dir = project_dir
    cfg.launch = dict(STRATEGIES[spec["strategy"]], gpu_ids=[0] if spec["device"] == "cuda" else None)
    cfg.dataloaders.train.update(num_workers=0, data_or_config=dict(
        _class_name="WanLatentDataset", root=data_dir, text_len=spec["text_shape"][0]))
    cfg.models = dict(transformer=TINY_ARCH if spec["tiny"] else WAN22_TI2V_5B, flow_shift=5.0)
    cfg.optimizers = optimizer_config(spec["optimizer"], spec["device"])
    steps = spec["steps"]
    cfg.train.update(max_steps=steps, log_interval=max(steps // 2, 1), checkpoint_interval=None,
                     checkpoint_total_limit=None, resume=False, progress_bar=False, log_with="none")
    return cfg


def run_row(spec, result_path):
    """In the row's own process: build the data, train, write the row as JSON."""
    import torch

    from examples.wan.data import write_synthetic_dataset
    from examples.wan.model import latent_shape
    from giga_train import launch_from_config
    arch = TINY_ARCH if spec["tiny"] else None
    shape = latent_shape(spec["frames"], spec["height"], spec["width"],
                         channels=arch["in_channels"] if arch else 48)
    row = dict(strategy=spec["strategy"], optimizer=spec["optimizer"], frames=spec["frames"],
               latents=list(shape), tokens=shape[1] * (shape[2] // 2) * (shape[3] // 2))
    with tempfile.TemporaryDirectory(prefix="wan_bench_") as tmp:
        data_dir = os.path.join(tmp, "data")
        write_synthetic_dataset(data_dir, 2, shape, spec["text_shape"], seed=0)
        cfg = row_config(spec, data_dir, os.path.join(tmp, "project"))
        try:
            trainer = launch_from_config(cfg)
            metrics = trainer.last_metrics
            row.update(status="ok", step_s=metrics["step_time"], loss=metrics["total_loss"],
                       init_s=trainer.init_seconds, params=trainer.num_params)
        except Exception as error:  # OOM and anything else: a row that says what happened
            row.update(status="oom" if is_oom(error) else "error",
                       error=f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300]}")
        row["peak_gib"] = peak_memory_gib(spec["device"])
        if spec["device"] == "cuda":
            row["reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    with open(result_path, "w") as f:
        json.dump(row, f)


def spawn_row(spec, timeout):
    """Run one row in a fresh interpreter; a crash or timeout becomes a row too."""
    base = dict(strategy=spec["strategy"], optimizer=spec["optimizer"], frames=spec["frames"])
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result_path = f.name
    try:
        run = subprocess.run([sys.executable, os.path.abspath(__file__), "--row", json.dumps(spec),
                              "--row-result", result_path], cwd=ROOT, capture_output=True, text=True,
                             timeout=timeout)
        output = (run.stdout + run.stderr).strip().splitlines()
        if os.path.getsize(result_path) == 0:
            print("\n".join(output[-20:]), file=sys.stderr)
            return dict(base, status="error", error=f"exit {run.returncode}: {output[-1] if output else ''}"[:300])
        with open(result_path) as f:
            row = json.load(f)
        if row["status"] == "error":
            print("\n".join(output[-20:]), file=sys.stderr)
        return row
    except subprocess.TimeoutExpired:
        if os.path.getsize(result_path) > 0:  # the row finished; only the process's exit hung
            with open(result_path) as f:
                return json.load(f)
        return dict(base, status="timeout", error=f"killed after {timeout:.0f} s (time budget)")
    finally:
        os.remove(result_path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="a 2-block architecture instead of the 5B one")
    p.add_argument("--rows", nargs="*", default=list(DEFAULT_ROWS), help="STRATEGY:OPTIMIZER, in order")
    p.add_argument("--frames", type=int, default=49, help="frames to try first (4k+1)")
    p.add_argument("--height", type=int, default=None, help="default 480 (64 with --tiny)")
    p.add_argument("--width", type=int, default=None, help="default 832 (64 with --tiny)")
    p.add_argument("--steps", type=int, default=8, help="steps per row; the second half is timed")
    p.add_argument("--budget-s", type=float, default=330, help="wall-clock budget for all rows")
    p.add_argument("--row-timeout-s", type=float, default=150)
    p.add_argument("--simulate-oom-above", type=int, help="rows raise OutOfMemoryError above this many frames")
    p.add_argument("--out", default=os.path.join(ROOT, "bench/wan.json"))
    p.add_argument("--row", help=argparse.SUPPRESS)
    p.add_argument("--row-result", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.row:
        run_row(json.loads(args.row), args.row_result)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # the row is written: skip interpreter teardown (NCCL/gloo threads can hang or abort there)
    if args.simulate_oom_above is not None:
        os.environ[SIMULATE_OOM] = str(args.simulate_oom_above)
    height = args.height or (64 if args.tiny else 480)
    width = args.width or (64 if args.tiny else 832)
    text_shape = (16, 32) if args.tiny else (512, 4096)
    deadline = time.monotonic() + args.budget_s
    frames_to_try = [f for f in FRAME_FALLBACK if f <= args.frames] or [args.frames]
    rows = []
    for entry in args.rows:
        strategy, _, optimizer = entry.partition(":")
        if strategy not in STRATEGIES:
            raise SystemExit(f"bench/wan.py: unknown strategy {strategy!r} ({', '.join(STRATEGIES)})")
        optimizer_config(optimizer, args.device)
        for frames in frames_to_try:
            remaining = deadline - time.monotonic()
            if remaining < 20:
                rows.append(dict(strategy=strategy, optimizer=optimizer, frames=frames, status="skipped",
                                 error=f"time budget of {args.budget_s:.0f} s spent"))
                break
            spec = dict(strategy=strategy, optimizer=optimizer, frames=frames, height=height, width=width,
                        text_shape=text_shape, steps=args.steps, tiny=args.tiny, device=args.device)
            row = spawn_row(spec, min(remaining, args.row_timeout_s))
            rows.append(row)
            print(f"[bench/wan] {summary(row)}", file=sys.stderr, flush=True)
            if row["status"] != "oom":
                break
    report(rows, args, height, width)


def summary(row):
    if row["status"] == "ok":
        return (f"{row['strategy']} {row['optimizer']} {row['frames']} frames: {row['step_s']:.3f} s/step,"
                f" peak {row['peak_gib']:.2f} GiB")
    return f"{row['strategy']} {row['optimizer']} {row['frames']} frames: {row['status']}: {row.get('error', '')}"


def report(rows, args, height, width):
    import torch
    try:
        import diffusers
        diffusers_version = diffusers.__version__
    except ImportError:
        diffusers_version = None
    card = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    params = next((r["params"] for r in rows if "params" in r), None)
    meta = dict(date=datetime.date.today().isoformat(), card=card, torch=torch.__version__,
                diffusers=diffusers_version, arch="tiny" if args.tiny else "Wan2.2-TI2V-5B (random init)",
                params=params, height=height, width=width, steps=args.steps, batch=1,
                precision="bf16 autocast, fp32 parameters", activation_checkpointing="WanTransformerBlock",
                command=" ".join(["python", "bench/wan.py", *sys.argv[1:]]))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=2)
    peak = "peak GiB (max allocated)" if args.device == "cuda" else "peak RSS GiB"
    print(f"\n{meta['date']}, {card}, torch {meta['torch']}, diffusers {diffusers_version}, {meta['arch']}"
          f"{f' ({params / 1e9:.3f}B params)' if params else ''}, {height}x{width}, batch 1, bf16 autocast"
          f" over fp32 parameters, activation checkpointing per WanTransformerBlock, {args.steps} steps")
    print(f"| strategy | optimizer | frames (latents) | tokens | s/step | {peak} | init s | loss | note |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        shape = f"{r['frames']} ({'x'.join(map(str, r['latents']))})" if "latents" in r else str(r["frames"])
        if r["status"] == "ok":
            print(f"| {r['strategy']} | {r['optimizer']} | {shape} | {r['tokens']} | {r['step_s']:.3f} |"
                  f" {r['peak_gib']:.2f} | {r['init_s']:.1f} | {r['loss']:.4f} | |")
        else:
            peak_value = f"{r['peak_gib']:.2f}" if "peak_gib" in r else ""
            note = r["status"].upper() + (f": {r['error']}" if r.get("error") else "")
            print(f"| {r['strategy']} | {r['optimizer']} | {shape} | {r.get('tokens', '')} | | {peak_value} | | |"
                  f" {note.replace('|', '/')} |")


if __name__ == "__main__":
    main()
