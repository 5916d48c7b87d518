"""Wan2.2-TI2V-5B fine-tuning on one GPU: seconds per step and peak memory through our Trainer and through
the real GigaTrain 1.1.0, side by side.

    python bench/wan.py                         # CUDA: the 5B architecture at random init, 480x832, 49 frames
    python bench/wan.py --tiny --device cpu     # every code path on a tiny architecture (CPU, seconds)
    python bench/wan.py --tiny --device cpu --simulate-oom-above 17   # the OOM row and frame fallback
    python bench/wan.py --gigatrain-path DIR --rows gigatrain:ZeRO-2:CAME8Bit ZeRO-2:CAME8Bit
        # DIR: a folder holding GigaTrain 1.1.0 (pip install --target DIR giga-train==1.1.0 ...); or
        # --gigatrain-python: an interpreter whose site-packages has it (its venv)

A row is [gigatrain:]STRATEGY:OPTIMIZER: with the prefix it runs through GigaTrain (bench/wan_gigatrain.py: the
same model, objective, files and settings, written as a GigaTrain project), else through giga-train. Steps are
timed the same way on both sides (bench/step_clock.py: a synchronised timestamp at each step's end).

Each (strategy, optimizer) row runs in a fresh process: the synthetic dataset of the row's shape
(examples/wan/scripts/build_dataset.py --synthetic), the 5B config (examples/wan/configs/wan_5b_t2v_ft.py)
at one GPU with bf16 autocast over fp32 parameters and activation checkpointing per WanTransformerBlock,
batch 1. Seconds per step: the mean over the second half of the steps. Peak: the row's
torch.cuda.max_memory_allocated (peak RSS on CPU). An out-of-memory row is reported as a row and the
row is retried with fewer frames (49 -> 33 -> 17 -> 9 -> 1). A time budget (--budget-s) skips what no
longer fits. Prints a markdown table last and writes JSON (bench/wan.json)."""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.results import end_row_child, failed_row, print_table_header, run_meta, write_results  # noqa: E402
from bench.step_clock import TimedSteps, memory_fields  # noqa: E402
from examples.wan.trainer import WanTrainer  # noqa: E402

FRAME_FALLBACK = (49, 33, 17, 9, 1)
SIMULATE_OOM = "WAN_BENCH_SIMULATE_OOM_ABOVE"  # frames above which a row raises OutOfMemoryError (tests)
TINY_ARCH = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4,
                 out_channels=4, text_dim=32, freq_dim=16, ffn_dim=48, num_layers=2, cross_attn_norm=True,
                 qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=64)
STRATEGIES = {
    "NO": dict(distributed_type="NO"),
    "ZeRO-2": dict(distributed_type="DEEPSPEED",
                   deepspeed_config=dict(deepspeed_config_file="accelerate_configs/zero2.json")),
    "FSDP2": dict(distributed_type="FSDP", fsdp_config=dict(
        fsdp_version=2, fsdp_transformer_layer_cls_to_wrap="WanTransformerBlock")),
}
# Under ZeRO the engine holds bf16 weights with fp32 master copies in the optimizer instead of fp32 weights +
# autocast. The seed's settings are ZeRO-2 + CAME8Bit: GigaTrain's rows run when it is given (--gigatrain-*).
DEFAULT_ROWS = ("NO:AdamW", "NO:CAME8Bit", "ZeRO-2:AdamW", "ZeRO-2:CAME8Bit", "FSDP2:CAME8Bit")
GIGATRAIN_ROWS = ("gigatrain:ZeRO-2:CAME8Bit", "ZeRO-2:CAME8Bit", "gigatrain:NO:CAME8Bit", "NO:CAME8Bit",
                  "gigatrain:ZeRO-2:AdamW", "ZeRO-2:AdamW")


def optimizer_config(name, device):
    if name == "AdamW":  # torch's fused kernel on CUDA: the fastest AdamW there is
        return dict(type="AdamW", lr=1e-5, weight_decay=0.01, **({"fused": True} if device == "cuda" else {}))
    if name == "CAME8Bit":
        return dict(type="CAME8Bit", lr=1e-5, weight_decay=0.01)
    raise SystemExit(f"bench/wan.py: unknown optimizer {name!r} (AdamW or CAME8Bit)")


AUTO_LINE = "activation checkpointing 'auto': "
EXPLODED_GRAD_NORM = 1e3  # eager 5B rows log 3-11 (max_grad_norm=1 clips; the norm logged is before clipping)


class BenchWanTrainer(TimedSteps, WanTrainer):
    """The example's trainer, timed (bench/step_clock.py); checkpoints are not written. The grad norm and
    the NaN guard's skips of each log line are kept: a row whose steps were skipped or whose grad norm
    exploded is not "ok"."""

    def backward_owner(self):
        return self.strategy

    def print_step(self):
        before = getattr(self, "last_metrics", None)
        super().print_step()
        metrics = getattr(self, "last_metrics", None)
        if metrics is not None and metrics is not before:  # a log line was written at this step
            self.grad_norms = getattr(self, "grad_norms", []) + [metrics.get("grad_norm")]
            self.nan_skipped = getattr(self, "nan_skipped", 0) + int(metrics.get("nan_skipped") or 0)

    def print(self, msg, *args, **kwargs):
        if str(msg).startswith(AUTO_LINE):  # activation_checkpointing="auto": how many blocks it chose, and why
            self.auto_checkpointing = str(msg)
        return super().print(msg, *args, **kwargs)

    def result(self):
        row = super().result()
        if getattr(self, "auto_checkpointing", None):
            row = dict(row, auto_checkpointing=self.auto_checkpointing,
                       checkpointed_blocks=int(self.auto_checkpointing[len(AUTO_LINE):].split()[0]))
        return training_verdict(row, getattr(self, "grad_norms", []), getattr(self, "nan_skipped", 0))

    def forward_step(self, batch_dict):
        limit = os.environ.get(SIMULATE_OOM)
        frames = (batch_dict["latents"].shape[2] - 1) * 4 + 1
        if limit and frames > int(limit):
            import torch
            raise torch.OutOfMemoryError(f"CUDA out of memory (simulated above {limit} frames)")
        return super().forward_step(batch_dict)

    def save_checkpoint(self):  # the one at the end of training
        pass


def training_verdict(row, grad_norms, nan_skipped, exploded=EXPLODED_GRAD_NORM):
    """The row with its grad norms (one per log line) and skipped steps; status "nan_skipped" or "exploded"
    (a non-finite grad norm, or one above `exploded`) instead of "ok" when the training went wrong."""
    row = dict(row, grad_norms=grad_norms, nan_skipped=nan_skipped)
    finite = [g for g in grad_norms if g is not None and math.isfinite(g)]
    if nan_skipped:
        return dict(row, status="nan_skipped", error=f"the NaN guard skipped {nan_skipped} steps")
    if len(finite) < len([g for g in grad_norms if g is not None]) or any(g > exploded for g in finite):
        return dict(row, status="exploded", error=f"grad norms {grad_norms} (eager 5B rows: 3-11)")
    return row


def is_oom(error):
    import torch
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()


def row_config(spec, data_dir, project_dir):
    from giga_train import load_config
    cfg = load_config(os.path.join(ROOT, "examples/wan/configs/wan_5b_t2v_ft.py"))
    cfg.runners = ["bench.wan.BenchWanTrainer"]
    cfg.project_dir = project_dir
    cfg.launch = row_launch(spec)
    cfg.dataloaders.train.update(num_workers=0, data_or_config=dict(
        _class_name="WanLatentDataset", root=data_dir, text_len=spec["text_shape"][0]))
    cfg.models = dict(transformer=row_arch(spec), flow_shift=5.0)
    cfg.optimizers = optimizer_config(spec["optimizer"], spec["device"])
    steps = spec["steps"]
    cfg.train.update(max_steps=steps, log_interval=max(steps // 2, 1), checkpoint_interval=None,
                     checkpoint_total_limit=None, resume=False, progress_bar=False, log_with="none")
    cfg.train.update(spec.get("train") or {})  # a row's own train settings (bench/video_speed.py)
    return cfg


def row_launch(spec):
    return dict(STRATEGIES[spec["strategy"]], gpu_ids=[0] if spec["device"] == "cuda" else None)


def row_arch(spec):
    from examples.wan.model import WAN22_TI2V_5B
    return TINY_ARCH if spec["tiny"] else WAN22_TI2V_5B


def row_latent_shape(spec):
    from examples.wan.model import latent_shape
    return latent_shape(spec["frames"], spec["height"], spec["width"], channels=row_arch(spec)["in_channels"])


def row_data(spec, folder):
    """The row's synthetic samples (the same files for both sides: same shapes, same seed)."""
    from examples.wan.samples import write_synthetic_dataset
    write_synthetic_dataset(folder, 2, row_latent_shape(spec), spec["text_shape"], seed=0)


def run_row(spec, result_path):
    """In the row's own process: build the data, train, write the row as JSON."""
    from giga_train import launch_from_config
    with tempfile.TemporaryDirectory(prefix="wan_bench_") as tmp:
        data_dir = os.path.join(tmp, "data")
        row_data(spec, data_dir)
        cfg = row_config(spec, data_dir, os.path.join(tmp, "project"))
        try:
            row = launch_from_config(cfg).result()
        except Exception as error:  # OOM and anything else: a row that says what happened
            row = dict(status="oom" if is_oom(error) else "error",
                       error=f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300]}",
                       **memory_fields(spec["device"]))
    with open(result_path, "w") as f:
        json.dump(row, f)


def gigatrain_config(spec, data_dir, project_dir, launch, optimizer, arch):
    """The row as a GigaTrain project's config (bench/wan_gigatrain.py's trainer): row_config's settings."""
    steps = spec["steps"]
    return dict(
        runners=["wan_gigatrain.GigaTrainWanTrainer"], project_dir=project_dir, launch=launch,
        dataloaders=dict(train=dict(root=data_dir, text_len=spec["text_shape"][0], batch_size_per_gpu=1,
                                    num_workers=0)),
        models=dict(transformer=arch, flow_shift=5.0), optimizers=optimizer,
        schedulers=dict(type="ConstantScheduler"),
        train=dict(max_steps=steps, gradient_accumulation_steps=1, max_grad_norm=1.0, mixed_precision="bf16",
                   activation_checkpointing=True, activation_class_names=["WanTransformerBlock"],
                   log_interval=max(steps // 2, 1), log_cpu_memory=False, seed=42))


def gigatrain_command(spec, tmp, args):
    """The command and environment of a GigaTrain row: bench/wan_gigatrain.py under GigaTrain's giga_train
    (args.gigatrain_path first on PYTHONPATH, our checkout off it) with the row's data and config."""
    data_dir = os.path.join(tmp, "data")
    row_data(spec, data_dir)
    launch = dict(row_launch(spec), gpu_ids=[0])  # GigaTrain's Launcher needs GPU ids even on CPU
    config = gigatrain_config(spec, data_dir, os.path.join(tmp, "project"), launch,
                              optimizer_config(spec["optimizer"], spec["device"]), row_arch(spec))
    env = dict(os.environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != ROOT]
    env["PYTHONPATH"] = os.pathsep.join(([args.gigatrain_path] if args.gigatrain_path else []) + paths)
    python = args.gigatrain_python or sys.executable
    env["PATH"] = os.pathsep.join([os.path.dirname(python), env.get("PATH", "")])  # its `accelerate`
    if python != sys.executable:  # another torch: its JIT-built DeepSpeed ops must not replace (and lock) ours
        ours = env.get("TORCH_EXTENSIONS_DIR") or os.path.join(tempfile.gettempdir(), "torch_extensions")
        env["TORCH_EXTENSIONS_DIR"] = ours.rstrip(os.sep) + "-gigatrain"
    command = [python, os.path.join(ROOT, "bench", "wan_gigatrain.py"),
               "--row", json.dumps(dict(spec=spec, config=config))]
    return command, env


def spawn_row(spec, timeout, args):
    """Run one row in a fresh interpreter (GigaTrain's rows under GigaTrain); a crash or timeout is a row too."""
    base = dict(path=spec["path"], strategy=spec["strategy"], optimizer=spec["optimizer"], frames=spec["frames"])
    with tempfile.TemporaryDirectory(prefix="wan_row_") as tmp:
        result_path = os.path.join(tmp, "row.json")
        if spec["path"] == "gigatrain":  # not from our checkout: accelerate's child would import our giga_train
            (command, env), cwd = gigatrain_command(spec, tmp, args), tmp
        else:
            command, env, cwd = [sys.executable, os.path.abspath(__file__), "--row", json.dumps(spec)], None, ROOT
        try:
            run = subprocess.run(command + ["--row-result", result_path], cwd=cwd, env=env, capture_output=True,
                                 text=True, timeout=timeout)
            row = finished_row(result_path)
            if row is None:  # no row written (GigaTrain's Launcher may even exit 0 then)
                return failed_row(base, run, tail=80)
            if row["status"] == "error":
                print("\n".join((run.stdout + run.stderr).strip().splitlines()[-20:]), file=sys.stderr)
        except subprocess.TimeoutExpired:
            row = finished_row(result_path)  # the row may have finished and only the process's exit hung
            if row is None:
                return dict(base, status="timeout", error=f"killed after {timeout:.0f} s (time budget)")
    return dict(base, **row, **row_shape(spec))


def finished_row(path):
    """The row a process wrote, or None where it wrote none."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return None
    with open(path) as f:
        return json.load(f)


def row_shape(spec):
    shape = row_latent_shape(spec)
    return dict(latents=list(shape), tokens=shape[1] * (shape[2] // 2) * (shape[3] // 2))


def add_row_arguments(p, steps, row_timeout_s, out):
    """The arguments of bench/wan.py and bench/sequence_parallel.py alike (--row: the child process of one row)."""
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="a 2-block architecture instead of the 5B one")
    p.add_argument("--steps", type=int, default=steps, help="steps per row; the second half is timed")
    p.add_argument("--row-timeout-s", type=float, default=row_timeout_s)
    p.add_argument("--out", default=out)
    p.add_argument("--row", help=argparse.SUPPRESS)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_row_arguments(p, steps=8, row_timeout_s=150, out=os.path.join(ROOT, "bench/wan.json"))
    p.add_argument("--rows", nargs="*", help="[gigatrain:]STRATEGY:OPTIMIZER, in order (default: ours, or"
                   " GigaTrain's beside ours with --gigatrain-*)")
    p.add_argument("--gigatrain-path", help="a folder holding GigaTrain 1.1.0 (first on its rows' PYTHONPATH)")
    p.add_argument("--gigatrain-python", help="the interpreter for GigaTrain's rows (default: this one)")
    p.add_argument("--frames", type=int, default=49, help="frames to try first (4k+1)")
    p.add_argument("--height", type=int, default=None, help="default 480 (64 with --tiny)")
    p.add_argument("--width", type=int, default=None, help="default 832 (64 with --tiny)")
    p.add_argument("--budget-s", type=float, default=330, help="wall-clock budget for all rows")
    p.add_argument("--no-fallback", action="store_true", help="an out-of-memory row is not retried with fewer"
                   " frames (where the optimizer step is what does not fit, fewer frames do not help)")
    p.add_argument("--simulate-oom-above", type=int, help="rows raise OutOfMemoryError above this many frames")
    p.add_argument("--row-train", type=json.loads, default=None, help="JSON of train settings for every row"
                   " (e.g. '{\"activation_checkpointing\": false, \"dynamo_config\": {\"backend\": \"inductor\"}}')")
    p.add_argument("--row-result", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.row:
        run_row(json.loads(args.row), args.row_result)
        end_row_child()
    if args.rows is None:
        args.rows = list(GIGATRAIN_ROWS if args.gigatrain_path or args.gigatrain_python else DEFAULT_ROWS)
    if args.simulate_oom_above is not None:
        os.environ[SIMULATE_OOM] = str(args.simulate_oom_above)
    height = args.height or (64 if args.tiny else 480)
    width = args.width or (64 if args.tiny else 832)
    text_shape = (16, 32) if args.tiny else (512, 4096)
    deadline = time.monotonic() + args.budget_s
    frames_to_try = [f for f in FRAME_FALLBACK if f <= args.frames] or [args.frames]
    if args.no_fallback:
        frames_to_try = [args.frames]
    rows = []
    for entry in args.rows:
        path, strategy, optimizer = parse_row(entry)
        if path == "gigatrain" and not (args.gigatrain_path or args.gigatrain_python):
            raise SystemExit(f"bench/wan.py: row {entry!r} needs --gigatrain-path or --gigatrain-python")
        optimizer_config(optimizer, args.device)
        for frames in frames_to_try:
            remaining = deadline - time.monotonic()
            if remaining < 20:
                rows.append(dict(path=path, strategy=strategy, optimizer=optimizer, frames=frames,
                                 status="skipped", error=f"time budget of {args.budget_s:.0f} s spent"))
                break
            spec = dict(path=path, strategy=strategy, optimizer=optimizer, frames=frames, height=height,
                        width=width, text_shape=text_shape, steps=args.steps, tiny=args.tiny, device=args.device,
                        train=args.row_train)
            row = spawn_row(spec, min(remaining, args.row_timeout_s), args)
            rows.append(row)
            print(f"[bench/wan] {summary(row)}", file=sys.stderr, flush=True)
            if row["status"] != "oom":
                break
    report(rows, args, height, width)


def parse_row(entry):
    """'[gigatrain:]STRATEGY:OPTIMIZER' -> (path, strategy, optimizer)."""
    parts = entry.split(":")
    path = parts.pop(0) if len(parts) == 3 else "giga-train"
    if path not in ("gigatrain", "giga-train") or len(parts) != 2 or parts[0] not in STRATEGIES:
        raise SystemExit(f"bench/wan.py: row {entry!r}: expected [gigatrain:]STRATEGY:OPTIMIZER with STRATEGY"
                         f" one of {', '.join(STRATEGIES)}")
    return path, parts[0], parts[1]


def summary(row):
    name = f"{row['path']} {row['strategy']} {row['optimizer']} {row['frames']} frames"
    if row["status"] == "ok":
        return f"{name}: {row['step_s']:.3f} s/step, peak {row['peak_gib']:.2f} GiB"
    return f"{name}: {row['status']}: {row.get('error', '')}"


def comparisons(rows):
    """(strategy, optimizer, GigaTrain's row, ours) for each pair that both finished at the same frames."""
    ok = {(r["path"], r["strategy"], r["optimizer"], r["frames"]): r for r in rows if r["status"] == "ok"}
    return [(s, o, ok[("gigatrain", s, o, f)], ours) for (path, s, o, f), ours in ok.items()
            if path == "giga-train" and ("gigatrain", s, o, f) in ok]


def report(rows, args, height, width):
    import torch
    try:
        import diffusers
        diffusers_version = diffusers.__version__
    except ImportError:
        diffusers_version = None
    card = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    params = next((r["params"] for r in rows if "params" in r), None)
    meta = run_meta("bench/wan.py", card=card, torch=torch.__version__,
                    diffusers=diffusers_version, arch="tiny" if args.tiny else "Wan2.2-TI2V-5B (random init)",
                    params=params, height=height, width=width, steps=args.steps, batch=1,
                    precision="bf16: autocast over fp32 parameters; under DeepSpeed bf16 weights + fp32 master copies",
                    activation_checkpointing="WanTransformerBlock")
    write_results(args.out, meta=meta, rows=rows, giga_train_vs_gigatrain=[
        dict(strategy=s, optimizer=o, step_rate_ratio=theirs["step_s"] / ours["step_s"],
             peak_ratio=ours["peak_gib"] / theirs["peak_gib"]) for s, o, theirs, ours in comparisons(rows)])
    peak = "peak GiB (max allocated)" if args.device == "cuda" else "peak RSS GiB"
    print(f"\n{meta['date']}, {card}, torch {meta['torch']}, diffusers {diffusers_version}, {meta['arch']}"
          f"{f' ({params / 1e9:.3f}B params)' if params else ''}, {height}x{width}, batch 1, {meta['precision']},"
          f" activation checkpointing per WanTransformerBlock, {args.steps} steps")
    print_table_header("trainer", "strategy", "optimizer", "frames (latents)", "tokens", "s/step", peak, "init s", "loss",
                       "note")
    for r in rows:
        shape = f"{r['frames']} ({'x'.join(map(str, r['latents']))})" if "latents" in r else str(r["frames"])
        if r["status"] == "ok":
            norms = ", ".join(f"{g:.3g}" for g in r.get("grad_norms", []) if g is not None)
            print(f"| {r['path']} | {r['strategy']} | {r['optimizer']} | {shape} | {r['tokens']} | {r['step_s']:.3f} |"
                  f" {r['peak_gib']:.2f} | {r['init_s']:.1f} | {r['loss']:.4f} | grad norms {norms}; nan_skipped"
                  f" {r.get('nan_skipped', 0)} |")
        else:
            peak_value = f"{r['peak_gib']:.2f}" if "peak_gib" in r else ""
            step_value = f"{r['step_s']:.3f}" if "step_s" in r else ""  # timed, but the training went wrong
            note = r["status"].upper() + (f": {r['error']}" if r.get("error") else "")
            print(f"| {r['path']} | {r['strategy']} | {r['optimizer']} | {shape} | {r.get('tokens', '')} | {step_value} |"
                  f" {peak_value} | | | {note.replace('|', '/')} |")
    pairs = comparisons(rows)
    if pairs:
        print()
        print_table_header("strategy", "optimizer", "giga-train step rate / GigaTrain's", "giga-train peak / GigaTrain's")
        for strategy, optimizer, theirs, ours in pairs:
            print(f"| {strategy} | {optimizer} | {theirs['step_s'] / ours['step_s']:.2f}x |"
                  f" {ours['peak_gib'] / theirs['peak_gib']:.2f} |")


if __name__ == "__main__":
    main()
