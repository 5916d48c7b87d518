"""Step time and peak memory of the char-LM GPU config (bf16) under each strategy at world size 1.

    python bench/strategies.py [--steps 200] [--out bench/strategies.json]

One process per strategy run in turn; the step time is the mean over the second half of the run
(after warm-up), as the trainer logs it. Prints a table last and writes JSON."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from giga_train import launch_from_config, load_config  # noqa: E402

STRATEGIES = {
    "NO": dict(distributed_type="NO"),
    "DDP": dict(distributed_type="DDP"),
    "FSDP2": dict(distributed_type="FSDP", fsdp_config=dict(fsdp_version=2, fsdp_transformer_layer_cls_to_wrap="Block")),
    "FSDP1": dict(distributed_type="FSDP", fsdp_config=dict(fsdp_version=1, fsdp_transformer_layer_cls_to_wrap="Block")),
    **{f"ZeRO-{s}": dict(distributed_type="DEEPSPEED", deepspeed_config=dict(deepspeed_config_file=f"zero{s}.json"))
       for s in range(4)},
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", default="bench/strategies.json")
    parser.add_argument("--only", nargs="*", help="strategy names to run (default: all)")
    args = parser.parse_args()
    if not args.only:  # each strategy in a fresh process: engines cache process groups (DeepSpeed)
        rows = []
        for name in STRATEGIES:
            out = f"{args.out}.{name}"
            run = subprocess.run([sys.executable, __file__, "--steps", str(args.steps), "--out", out, "--only", name])
            if run.returncode != 0:
                rows.append(dict(strategy=name, failed=run.returncode))
                continue
            with open(out) as f:
                rows += json.load(f)["rows"]
            os.remove(out)
        return report(rows, args)
    rows = []
    for name, launch in STRATEGIES.items():
        if name not in args.only:
            continue
        cfg = load_config("examples/char_lm/configs/gpu.py")
        cfg.launch = dict(launch, gpu_ids=[0])
        cfg.project_dir = tempfile.mkdtemp(prefix=f"bench_{name}_")
        cfg.train.update(max_steps=args.steps, log_interval=args.steps // 2, checkpoint_interval=None,
                         checkpoint_total_limit=None, resume=False, progress_bar=False, log_with="none")
        torch.cuda.reset_peak_memory_stats()
        trainer = launch_from_config(cfg)
        metrics = trainer.last_metrics
        rows.append(dict(strategy=name, step_ms=1000 * metrics["step_time"], loss=metrics["total_loss"],
                         peak_gib=torch.cuda.max_memory_allocated() / 2**30,
                         samples_per_sec=metrics["samples_per_sec"]))
    report(rows, args)


def report(rows, args):
    meta = dict(card=torch.cuda.get_device_name(), torch=torch.__version__, steps=args.steps,
                config="examples/char_lm/configs/gpu.py (19M params, batch 64 x 256 tokens, bf16)")
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=2)
    print(f"\n{meta['card']}, torch {meta['torch']}, {meta['config']}, {args.steps} steps")
    print("| strategy | step ms | samples/s | peak GiB | loss at end |")
    print("|---|---|---|---|---|")
    for r in rows:
        if "failed" in r:
            print(f"| {r['strategy']} | failed (exit {r['failed']}) | | | |")
            continue
        print(f"| {r['strategy']} | {r['step_ms']:.2f} | {r['samples_per_sec']:.0f} | {r['peak_gib']:.2f} | {r['loss']:.3f} |")


if __name__ == "__main__":
    main()
