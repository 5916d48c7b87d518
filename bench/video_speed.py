"""Wan2.2-TI2V-5B on one GPU in one run: first compiled against eager gradients (bench/compile_check.py: the
transformer at 4 layers, at 5k/11k/27k tokens), then the speed rows of the full 5B fine-tune (bench/wan.py's job: random
init, NO + CAME8Bit, batch 1) with train-section changes only, side by side.

    python bench/video_speed.py                      # CUDA, ~8 minutes
    python bench/video_speed.py --tiny --device cpu  # every code path on the tiny Wan (CPU)

Speed rows (--rows; each in its own process, 8 steps, the second half timed): "ac-eager" (checkpointing on every
block, eager: the example's), "ac-compile", "ac10-compile" (checkpointing on the first 10 of 30 blocks),
"compile" (no checkpointing), "fp8-compile", "fp8-ac10-compile", "auto60-compile" / "auto-compile" (and their fp8-)
(activation_checkpointing="auto" within 60 GiB / 88% of the free memory), "sac-compile" (selective checkpointing of
every block: matmul and attention outputs kept); a "+cudnn" suffix (or +flash, +efficient) pins SDPA's kernel. A row whose steps the NaN guard skipped or whose grad norm
exploded fails (bench/wan.py). MFU: model FLOPs (every matmul of the 30 blocks, attention included, forward and
backward = 3x forward) per second against 989 TFLOP/s dense bf16. Prints the tables last; writes JSON."""
import argparse
import datetime
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

PEAK_FLOPS = 989e12
ROW_TRAIN = {
    "ac-eager": dict(),
    "ac-compile": dict(dynamo_config=dict(backend="inductor")),
    "ac10-compile": dict(activation_class_names=["WanTransformerBlock__##__10"], dynamo_config=dict(backend="inductor")),
    "compile": dict(activation_checkpointing=False, dynamo_config=dict(backend="inductor")),
    "fp8-compile": dict(activation_checkpointing=False, mixed_precision="fp8", dynamo_config=dict(backend="inductor")),
    "fp8-ac10-compile": dict(mixed_precision="fp8", activation_class_names=["WanTransformerBlock__##__10"],
                             dynamo_config=dict(backend="inductor")),
    # activation_checkpointing="auto": the first blocks a peak of 60 GiB needs (the target), or 88% of free
    "auto60-compile": dict(activation_checkpointing="auto", checkpointing_memory_budget="60GiB",
                           dynamo_config=dict(backend="inductor")),
    "auto-compile": dict(activation_checkpointing="auto", dynamo_config=dict(backend="inductor")),
    "sac-compile": dict(activation_checkpointing="selective", dynamo_config=dict(backend="inductor")),
    "fp8-auto-compile": dict(activation_checkpointing="auto", mixed_precision="fp8", dynamo_config=dict(backend="inductor")),
    "fp8-auto60-compile": dict(activation_checkpointing="auto", checkpointing_memory_budget="60GiB",
                               mixed_precision="fp8", dynamo_config=dict(backend="inductor")),
}
DEFAULT_ROWS = ("ac-eager", "compile", "ac10-compile", "fp8-compile")


def wan_step_flops(arch, tokens, text_len=512):
    """Model FLOPs of one training step (forward + backward = 3x forward) of the Wan blocks at `tokens`:
    every Linear of the blocks, the self-attention's two S x S matmuls and the cross-attention's against the
    text. (The embedders and the head are < 0.1% at these shapes and left out.)"""
    d, f, layers = arch["num_attention_heads"] * arch["attention_head_dim"], arch["ffn_dim"], arch["num_layers"]
    per_token = 2 * (4 * d * d + 2 * d * d + 2 * d * f)  # self q,k,v,o; cross q,o; the two FFN Linears
    text = 2 * (2 * d * d) * text_len                      # cross-attention k, v over the text
    attention = 2 * 2 * tokens * tokens * d + 2 * 2 * tokens * text_len * d
    return 3 * layers * (per_token * tokens + text + attention)


def row_train(name):
    """A row's train settings: ROW_TRAIN's, with train.attention_backend for a '+BACKEND' suffix."""
    base, _, backend = name.partition("+")
    return dict(ROW_TRAIN[base], **({"attention_backend": backend} if backend else {}))


def speed_rows(args, deadline):
    rows = []
    for name in args.rows:
        train = row_train(name)
        remaining = deadline - time.monotonic()
        if remaining < 30:
            rows.append(dict(setting=name, status="skipped", error="time budget spent"))
            continue
        command = [sys.executable, os.path.join(ROOT, "bench/wan.py"), "--rows", f"{args.strategy}:CAME8Bit",
                   "--no-fallback", "--steps", str(args.steps), "--frames", str(args.frames),
                   "--height", str(args.height), "--width", str(args.width), "--budget-s", str(min(remaining, args.row_timeout_s)),
                   "--row-timeout-s", str(min(remaining, args.row_timeout_s)), "--device", args.device,
                   "--row-train", json.dumps(train), "--out", args.out + f".{name}.json"]
        if args.tiny:
            command.append("--tiny")
        run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        try:
            with open(args.out + f".{name}.json") as f:
                row = json.load(f)["rows"][0]
        except (OSError, ValueError, IndexError):
            row = dict(status="error", error=(run.stderr.strip().splitlines() or ["no output"])[-1][:300])
        row = dict(setting=name, train=train, **row)
        if "step_s" in row and "tokens" in row:
            flops = wan_step_flops(args.arch, row["tokens"])
            row.update(model_tflop_per_step=flops / 1e12, tflops=flops / row["step_s"] / 1e12,
                       mfu=flops / row["step_s"] / PEAK_FLOPS, tokens_per_s=row["tokens"] / row["step_s"])
        rows.append(row)
        print(f"[video_speed] {name}: {row['status']} {row.get('step_s', '')} s/step, peak {row.get('peak_gib', '')},"
              f" {row.get('error', '')}", file=sys.stderr, flush=True)
    return rows


def grad_rows(args):
    if not args.grad_shapes or args.tiny:
        return []
    out = args.out + ".grads.json"
    command = [sys.executable, os.path.join(ROOT, "bench/compile_check.py"), "--out", out, "--shapes", *args.grad_shapes]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    sys.stderr.write("\n".join(line for line in run.stderr.splitlines() if "[compile_check]" in line) + "\n")
    try:
        with open(out) as f:
            return json.load(f)["rows"]
    except (OSError, ValueError):
        return [dict(status="error", error=(run.stderr.strip().splitlines() or ["no output"])[-1][:300])]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--rows", nargs="*", default=list(DEFAULT_ROWS),
                   help=f"of {', '.join(ROW_TRAIN)}; NAME+cudnn (or +flash, ...) pins train.attention_backend")
    p.add_argument("--grad-shapes", nargs="*", default=["480x832x49", "1280x704x49", "480x832x121", "1280x704x121"],
                   help="compile_check's videos (HEIGHTxWIDTHxFRAMES); none with --tiny")
    p.add_argument("--frames", type=int, default=49)
    p.add_argument("--height", type=int, default=None, help="default 480 (64 with --tiny)")
    p.add_argument("--width", type=int, default=None, help="default 832 (64 with --tiny)")
    p.add_argument("--strategy", default="NO", help="bench/wan.py's strategy name (NO, ZeRO-2, FSDP2, ...)")
    p.add_argument("--row-timeout-s", type=float, default=200)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--budget-s", type=float, default=500, help="for everything (grads first)")
    p.add_argument("--out", default=os.path.join(ROOT, "bench/video_speed.json"))
    args = p.parse_args()
    for name in args.rows:
        if name.partition("+")[0] not in ROW_TRAIN:
            p.error(f"--rows: unknown row {name!r} (known: {', '.join(ROW_TRAIN)})")
    args.height = args.height or (64 if args.tiny else 480)
    args.width = args.width or (64 if args.tiny else 832)
    from examples.wan.model import WAN22_TI2V_5B
    from bench.wan import TINY_ARCH
    args.arch = TINY_ARCH if args.tiny else WAN22_TI2V_5B
    deadline = time.monotonic() + args.budget_s
    grads = grad_rows(args)
    rows = speed_rows(args, deadline)
    meta = dict(date=datetime.date.today().isoformat(), command=" ".join(["python", "bench/video_speed.py", *sys.argv[1:]]),
                arch="tiny" if args.tiny else "Wan2.2-TI2V-5B (random init)", optimizer="CAME8Bit", strategy=args.strategy,
                frames=args.frames, height=args.height, width=args.width, steps=args.steps, peak_flops=PEAK_FLOPS)
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, grads=grads, rows=rows), f, indent=2)
    print(f"\n{meta['date']} {meta['arch']}: compiled vs eager gradients (4 layers; bf16 tolerance 1e-2)")
    print("| video | tokens | variant | status | grad norm | rel. grad error |")
    print("|---|---|---|---|---|---|")
    for r in grads:
        print(f"| {r.get('shape', '')} | {r.get('tokens', '')} | {r.get('variant', '')} | {r['status']} |"
              f" {r.get('grad_norm', float('nan')):.4g} | {r.get('rel_err', float('nan')):.3g} |")
    print(f"\nspeed, {args.strategy} + CAME8Bit, batch 1, {args.height}x{args.width}x{args.frames}, {args.steps} steps (second half timed)")
    print("| setting | status | s/step | tokens/s | TFLOP/s | MFU | peak GiB | grad norms | nan_skipped |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        step = f"{r['step_s']:.3f}" if "step_s" in r else ""
        perf = (f"{r['tokens_per_s']:.0f} | {r['tflops']:.0f} | {100 * r['mfu']:.1f}%" if "mfu" in r else " | | ")
        norms = ", ".join(f"{g:.3g}" for g in r.get("grad_norms", []) if g is not None)
        note = "" if r["status"] == "ok" else f" ({r.get('error', '')})".replace("|", "/")
        print(f"| {r['setting']} | {r['status']}{note} | {step} | {perf} | {r.get('peak_gib', float('nan')):.2f} |"
              f" {norms} | {r.get('nan_skipped', '')} |")


if __name__ == "__main__":
    main()
