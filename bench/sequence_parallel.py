"""Wan2.2-TI2V-5B at 720p x 121 frames under sequence parallelism: tokens/s per GPU and peak memory per GPU at
SP 1/2/4/8 on N GPUs (FSDP2 over the dp_shard x sp ranks), through our Trainer.

    python bench/sequence_parallel.py --gpus 8               # SP 1, 2, 4, 8 on 8 GPUs
    python bench/sequence_parallel.py --gpus 1               # one GPU: the SP=1 row only
    python bench/sequence_parallel.py --tiny --device cpu --gpus 2 --height 64 --width 64 --frames 9
        # every code path on a tiny architecture (CPU ranks over gloo)

Each SP size is a row run in a fresh process: the synthetic dataset of the shape
(examples/wan/samples.py), the 5B architecture at random init, bf16 autocast over fp32 parameters,
activation checkpointing per WanTransformerBlock, CAME8Bit, batch 1 per data-parallel rank (N / sp samples
per step), launch.parallelism_config=dict(dp_shard_size=N/sp, sp_size=sp) under FSDP2; the launcher starts
the N ranks itself. Steps are timed as bench/wan.py times them (bench/step_clock.py: the mean of the second
half). tokens/s per GPU = tokens per sample x samples per step / s per step / N. Peak: the highest
torch.cuda.max_memory_allocated over the ranks (peak RSS on CPU). Writes bench/sequence_parallel.json and
prints a markdown table."""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.results import end_row_child, failed_row, print_table_header, run_meta, write_results  # noqa: E402
from bench.wan import TINY_ARCH, BenchWanTrainer, add_row_arguments, optimizer_config  # noqa: E402

ROW_DIR = "SP_BENCH_ROW_DIR"  # where each rank writes its row


class SequenceParallelBenchTrainer(BenchWanTrainer):
    """bench/wan.py's timed trainer; every rank writes its row at the end (the launcher returns no trainer)."""

    def save_checkpoint(self):
        folder = os.environ.get(ROW_DIR)
        if folder:
            with open(os.path.join(folder, f"row_rank_{self.process_index}.json"), "w") as f:
                json.dump(self.result(), f)


def row_config(spec, data_dir, project_dir):
    from giga_train import load_config
    from examples.wan.model import WAN22_TI2V_5B
    cfg = load_config(os.path.join(ROOT, "examples/wan/configs/wan_5b_t2v_ft.py"))
    gpus, sp = spec["gpus"], spec["sp"]
    cfg.runners = ["bench.sequence_parallel.SequenceParallelBenchTrainer"]
    cfg.project_dir = project_dir
    cfg.launch = dict(distributed_type="FSDP", fsdp_config=dict(
        fsdp_version=2, fsdp_transformer_layer_cls_to_wrap="WanTransformerBlock"),
        parallelism_config=dict(dp_shard_size=gpus // sp, sp_size=sp))
    if spec["device"] == "cuda":
        cfg.launch["gpu_ids"] = list(range(gpus))
    else:
        cfg.launch["num_processes"] = gpus
    cfg.dataloaders.train.update(num_workers=0, data_or_config=dict(
        _class_name="WanLatentDataset", root=data_dir, text_len=spec["text_shape"][0]))
    cfg.models = dict(transformer=TINY_ARCH if spec["tiny"] else WAN22_TI2V_5B, flow_shift=5.0)
    cfg.optimizers = optimizer_config("CAME8Bit", spec["device"])
    steps = spec["steps"]
    cfg.train.update(max_steps=steps, log_interval=max(steps // 2, 1), checkpoint_interval=None,
                     checkpoint_total_limit=None, resume=False, progress_bar=False, log_with="none")
    return cfg


def latent_shape(spec):
    from examples.wan.model import latent_shape as shape_of
    channels = (TINY_ARCH if spec["tiny"] else {}).get("in_channels", 48)
    return shape_of(spec["frames"], spec["height"], spec["width"], channels=channels)


def tokens_per_sample(spec):
    c, f, h, w = latent_shape(spec)
    return f * (h // 2) * (w // 2)  # the transformer's 1x2x2 patches


def run_row(spec, folder):
    """In the row's own process: the data, then the N ranks (started by our launcher), each writing its row."""
    from examples.wan.samples import write_synthetic_dataset
    from giga_train import launch_from_config
    data_dir = os.path.join(folder, "data")
    samples = max(2 * spec["gpus"] // spec["sp"], 2)
    write_synthetic_dataset(data_dir, samples, latent_shape(spec), spec["text_shape"], seed=0)
    os.environ[ROW_DIR] = folder
    launch_from_config(row_config(spec, data_dir, os.path.join(folder, "project")))


def spawn_row(spec, timeout):
    base = dict(gpus=spec["gpus"], sp=spec["sp"], frames=spec["frames"], tokens=tokens_per_sample(spec))
    with tempfile.TemporaryDirectory(prefix="sp_row_") as folder:
        command = [sys.executable, os.path.abspath(__file__), "--row", json.dumps(spec), "--row-dir", folder]
        try:
            run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            run = None
        ranks = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(folder, "row_rank_*.json")))]
    if len(ranks) != spec["gpus"]:
        if run is None:
            return dict(base, status="timeout", error=f"killed after {timeout:.0f} s")
        return failed_row(base, run, tail=60)
    step_s = max(r["step_s"] for r in ranks)  # the ranks step together; the slowest clock is the step
    samples = spec["gpus"] // spec["sp"]
    return dict(base, status="ok", step_s=step_s, samples_per_step=samples,
                tokens_per_s_per_gpu=base["tokens"] * samples / step_s / spec["gpus"],
                peak_gib=max(r["peak_gib"] for r in ranks), loss=ranks[0]["loss"], params=ranks[0]["params"],
                init_s=ranks[0]["init_s"])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gpus", type=int, default=None, help="ranks (default: every visible GPU)")
    p.add_argument("--sp", default="1,2,4,8", help="SP sizes to run (those that divide --gpus)")
    add_row_arguments(p, steps=6, row_timeout_s=540, out=os.path.join(ROOT, "bench/sequence_parallel.json"))
    p.add_argument("--frames", type=int, default=121)
    p.add_argument("--height", type=int, default=704)
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--row-dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.row:
        run_row(json.loads(args.row), args.row_dir)
        end_row_child()
    import torch
    gpus = args.gpus or (torch.cuda.device_count() if args.device == "cuda" else 1)
    text_shape = (16, 32) if args.tiny else (512, 4096)
    rows = []
    for sp in [int(s) for s in args.sp.split(",") if s.strip()]:
        if gpus % sp:
            continue
        spec = dict(gpus=gpus, sp=sp, frames=args.frames, height=args.height, width=args.width,
                    text_shape=text_shape, steps=args.steps, tiny=args.tiny, device=args.device)
        row = spawn_row(spec, args.row_timeout_s)
        rows.append(row)
        done = (f"{row['tokens_per_s_per_gpu']:.0f} tokens/s/GPU, peak {row['peak_gib']:.2f} GiB"
                if row["status"] == "ok" else f"{row['status']}: {row.get('error', '')}")
        print(f"[bench/sequence_parallel] {gpus} GPUs, SP={sp}: {done}", file=sys.stderr, flush=True)
    card = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    meta = run_meta("bench/sequence_parallel.py", card=card, torch=torch.__version__, gpus=gpus,
                    arch="tiny" if args.tiny else "Wan2.2-TI2V-5B (random init)", frames=args.frames,
                    height=args.height, width=args.width, steps=args.steps,
                    setting="FSDP2 over dp_shard x sp, Ulysses, bf16 autocast, CAME8Bit, checkpointing per block")
    write_results(args.out, meta=meta, rows=rows)
    print(f"\n{meta['date']}, {card}, torch {meta['torch']}, {meta['arch']}, {args.height}x{args.width} x"
          f" {args.frames} frames, {gpus} GPUs, {meta['setting']}, {args.steps} steps")
    print_table_header("sp", "dp_shard", "tokens/sample", "samples/step", "s/step", "tokens/s per GPU",
                       "peak GiB per GPU", "note")
    for r in rows:
        if r["status"] == "ok":
            print(f"| {r['sp']} | {gpus // r['sp']} | {r['tokens']} | {r['samples_per_step']} | {r['step_s']:.3f} |"
                  f" {r['tokens_per_s_per_gpu']:.0f} | {r['peak_gib']:.2f} | |")
        else:
            print(f"| {r['sp']} | {gpus // r['sp']} | {r['tokens']} | | | | |"
                  f" {r['status'].upper()}: {r.get('error', '').replace('|', '/')} |")


if __name__ == "__main__":
    main()
