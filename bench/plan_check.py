"""`giga-train plan` against the peaks the benches measured (`torch.cuda.max_memory_allocated` on one H200):
one line per measured bf16 row of the giga path of the throughput bench (bench/throughput*.json, Llama
shapes), then one per measured Wan2.2-5B row (bench/video_speed*.json: NO + CAME8Bit at the file's shape,
the rows' own train settings; bench/sequence_parallel.json: its one-GPU row, 1280x704x121 under FSDP2).

    python3 bench/plan_check.py [--json bench/throughput.json ...] [--wan-json bench/video_speed.json ...]
        [--only llama|wan]

The plan is made here on the CPU (the model on the meta device, activations on fake tensors; the Wan rows
on a one-sample synthetic dataset of the row's shape); a row that ran compiled is counted as inductor's
partitioner saves it, an fp8 row with torchao's float8 Linears (left out where torchao is not installed)."""
import argparse
import glob
import importlib.util
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from giga_train.tools.plan import plan  # noqa: E402

WAN_JSON = [os.path.join(ROOT, "bench", name)
            for name in ("video_speed.json", "video_speed_720p.json", "sequence_parallel.json")]
PLAN_ROW = {"NO": "NO", "FSDP2": "FSDP", "ZeRO-2": "ZERO2"}


def measured_rows(paths):
    seen = {}
    for path in paths:
        data = json.load(open(path))
        for run in ([data] if "rows" in data else list(data.values())):
            for row in run.get("rows", []) if isinstance(run, dict) else []:
                if row["path"] == "giga" and row["precision"] == "bf16" and row.get("peak_gb"):
                    key = (row["size"], row.get("strategy", "NO"), row["optimizer"], row.get("batch"),
                           row.get("accumulate") or 1, row["compile"])
                    seen[key] = dict(row, status=row["status"])
    return seen


def llama_table(paths):
    print("| size | engine | optimizer | micro-batch x acc. | compiled | measured GB | plan GB | error | plan fits |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (size, strategy, optimizer, batch, accumulate, compiled), row in sorted(measured_rows(paths).items()):
        overrides = [f"train.gradient_accumulation_steps={accumulate}"]
        if optimizer == "came8bit":
            overrides.append("optimizers.type=CAME8Bit")
        if batch:
            overrides.append(f"dataloaders.train.batch_size_per_gpu={batch}")
        result = plan(f"bench.plan_configs.llama_{size}", overrides, gpus=(1,))
        name = "ZERO2" if strategy == "ZERO2" else "NO"
        planned = next(r for r in result["rows"] if r["strategy"] == name)
        measured = row["peak_gb"] * 1e9
        oom = row["status"] != "ok"
        error = "(OOM)" if oom else f"{(planned['peak'] - measured) / measured:+.1%}"
        print(f"| {size} | {strategy} | {optimizer} | {batch or result['micro_batch']} x {accumulate} |"
              f" {'yes' if compiled else 'no'} | {measured / 1e9:.1f}{' OOM' if oom else ''} |"
              f" {planned['peak'] / 1e9:.1f} | {error} | {'yes' if planned['fits'] else 'no'} |", flush=True)


def wan_rows(paths):
    """(spec for bench/wan.py's row_config, the measured row) of each measured Wan row."""
    for path in paths:
        data = json.load(open(path))
        meta = data.get("meta", {})
        for row in data.get("rows", []):
            if row.get("status") != "ok" or not row.get("peak_gib"):
                continue
            train = dict(row.get("train") or {})
            if train.get("mixed_precision", "bf16") == "fp8" and importlib.util.find_spec("torchao") is None:
                print(f"(left out: {row.get('setting')}, fp8 is counted with torchao, not installed here)")
                continue
            if "sp" in row:  # bench/sequence_parallel.py: FSDP2, checkpointing per block; its one-GPU row
                if row["gpus"] != 1:
                    continue
                spec = dict(strategy="FSDP2", frames=row["frames"], height=meta.get("height", 704),
                            width=meta.get("width", 1280), setting="checkpointing every block (FSDP2, 1 GPU)")
            else:  # bench/video_speed.py: its meta names the shape (480x832 before it took --height/--width)
                spec = dict(strategy=row.get("strategy", "NO"), frames=row["frames"],
                            height=meta.get("height", 480), width=meta.get("width", 832),
                            setting=row.get("setting", ""))
            spec.update(optimizer=row.get("optimizer", "CAME8Bit"), train=train, device="cpu", tiny=False,
                        steps=2, text_shape=(512, 4096))
            yield spec, row


def wan_table(paths):
    """One line per Wan row. An "auto" row is planned at the blocks its run checkpointed (the row's
    checkpointed_blocks, else the choice of the count those runs made: the config planned eagerly in bf16),
    and the last column is what "auto" chooses now, with its planned peak."""
    from bench.wan import row_config, row_latent_shape
    from examples.wan.samples import write_synthetic_dataset
    print("| video | engine | setting | compiled | measured GiB | plan GiB | error | plan activations GiB |"
          " blocks checkpointed | 'auto' now: blocks, plan GiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="plan_check_wan_") as folder:
        for spec, row in wan_rows(paths):
            data = os.path.join(folder, f"data_{spec['frames']}_{spec['height']}x{spec['width']}")
            if not os.path.isdir(data):
                write_synthetic_dataset(data, 1, row_latent_shape(spec), spec["text_shape"], seed=0)
            config = row_config(spec, data, os.path.join(folder, "project"))
            result = plan(config, gpus=(1,))
            planned = next(r for r in result["rows"] if r["strategy"] == PLAN_ROW[spec["strategy"]])
            measured = row["peak_gib"] * 2**30
            compiled = "dynamo_config" in spec["train"]
            blocks, peak, act, now = planned["checkpointed_blocks"], planned["peak"], planned["activations"], "-"
            if spec["train"].get("activation_checkpointing") == "auto" and planned["activations"] is not None:
                now = f"{blocks}, {peak / 2**30:.2f}"
                blocks = row.get("checkpointed_blocks")
                if blocks is None:  # the count those runs made: eager autograd's saves, the Linears in bf16
                    train = {k: v for k, v in spec["train"].items() if k != "dynamo_config"}
                    if train.get("mixed_precision") == "fp8":
                        train["mixed_precision"] = "bf16"
                    eager = row_config(dict(spec, train=train), data, os.path.join(folder, "project"))
                    blocks = next(r for r in plan(eager, gpus=(1,))["rows"]
                                  if r["strategy"] == PLAN_ROW[spec["strategy"]])["checkpointed_blocks"]
                peak, act = peak_at(result, planned, blocks)
            print(f"| {spec['width']}x{spec['height']}x{spec['frames']} | {spec['strategy']} | {spec['setting']} |"
                  f" {'yes' if compiled else 'no'} | {row['peak_gib']:.2f} | {peak / 2**30:.2f} |"
                  f" {(peak - measured) / measured:+.1%} |"
                  f" {'-' if act is None else f'{act / 2**30:.2f}'} | {blocks} | {now} |", flush=True)


def peak_at(result, row, blocks):
    """(the planned peak, the activations) of a plan row with its first `blocks` checkpointed (plan's rule)."""
    from giga_train.trainers.memory_counts import ActivationCount
    act = ActivationCount(**result["activations"]["torch"])
    states = sum(v for k, v in row.items() if k in ("params", "optimizer", "master", "buffers"))
    accumulation = result["gradient_accumulation_steps"]
    return states + act.backward_peak(blocks, row["grads"], accumulation, row["sp"]), act.with_first_checkpointed(blocks)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", nargs="*", default=sorted(glob.glob(os.path.join(ROOT, "bench", "throughput*.json"))))
    parser.add_argument("--wan-json", nargs="*", default=[p for p in WAN_JSON if os.path.exists(p)])
    parser.add_argument("--only", choices=("llama", "wan"))
    args = parser.parse_args()
    if args.only != "wan":
        llama_table(args.json)
    if args.only != "llama":
        print()
        wan_table(args.wan_json)


if __name__ == "__main__":
    main()
