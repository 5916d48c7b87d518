"""CAME8Bit against fp32 CAME (came-pytorch) on the CPU demo: the char-LM's final loss at the same lr.

    python bench/came_quality.py [--steps 400] [--lr 1e-3] [--out bench/came_quality.json]

Both runs train examples/char_lm/configs/cpu.py (same data order, init and schedule) with only the
optimizer swapped; the final loss is the trainer's mean over the last log interval. Prints a table
last and writes JSON. The target (issue 4): CAME8Bit within 1% of fp32 CAME."""
import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from giga_train import OPTIMIZERS, launch_from_config, load_config  # noqa: E402

CONFIG = "examples/char_lm/configs/cpu.py"


def register_reference():
    from came_pytorch import CAME
    if "CAMEfp32" not in OPTIMIZERS:
        OPTIMIZERS.register(CAME, name="CAMEfp32")


def final_loss(optimizer, steps, lr):
    cfg = load_config(CONFIG)
    with tempfile.TemporaryDirectory() as project:
        cfg.project_dir = project
        cfg.optimizers = dict(type=optimizer, lr=lr, weight_decay=0.01)
        cfg.train.update(max_steps=steps, resume=False, log_with="none", progress_bar=False,
                         checkpoint_interval=None, checkpoint_total_limit=None)
        cfg.schedulers.decay_steps = steps
        start = time.perf_counter()
        trainer = launch_from_config(cfg)
        return trainer.last_metrics["total_loss"], time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--out", default="bench/came_quality.json")
    args = parser.parse_args()
    register_reference()
    rows = []
    for name, optimizer in [("came-pytorch CAME (fp32)", "CAMEfp32"), ("giga CAME8Bit", "CAME8Bit")]:
        loss, seconds = final_loss(optimizer, args.steps, args.lr)
        rows.append(dict(optimizer=name, final_loss=loss, seconds=seconds))
    reference = rows[0]["final_loss"]
    for row in rows:
        row["vs_fp32"] = row["final_loss"] / reference - 1
    with open(args.out, "w") as f:
        json.dump(dict(config=CONFIG, steps=args.steps, lr=args.lr, rows=rows), f, indent=1)
    print(f"\nchar-LM CPU demo, {args.steps} steps, lr {args.lr}\n")
    print("| optimizer | final loss | vs fp32 CAME | s |\n|---|---|---|---|")
    for row in rows:
        print(f"| {row['optimizer']} | {row['final_loss']:.4f} | {row['vs_fp32']:+.2%} | {row['seconds']:.0f} |")


if __name__ == "__main__":
    main()
