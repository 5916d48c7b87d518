"""`giga-train plan` against the peaks the throughput bench measured (bench/throughput*.json,
`torch.cuda.max_memory_allocated` on one H200): one line per measured bf16 row of the giga path.

    python3 bench/plan_check.py [--json bench/throughput.json ...]

The plan is made here on the CPU (the model on the meta device, activations on fake tensors); a row
that ran compiled is marked: the plan counts what eager autograd saves."""
import argparse
import glob
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from giga_train.tools.plan import plan  # noqa: E402


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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", nargs="*", default=sorted(glob.glob(os.path.join(ROOT, "bench", "throughput*.json"))))
    args = parser.parse_args()
    print("| size | engine | optimizer | micro-batch x acc. | compiled | measured GB | plan GB | error | plan fits |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (size, strategy, optimizer, batch, accumulate, compiled), row in sorted(measured_rows(args.json).items()):
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


if __name__ == "__main__":
    main()
