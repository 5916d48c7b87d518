"""Print each run's per-step losses (from its TensorBoard events) and whether the runs agree exactly.
    python compare_losses.py TAG RUN_DIR RUN_DIR [...]   (exit 1 when a step both have differs)"""
import glob
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def losses(run_dir, tag):
    """{step: value} over all event files of run_dir/logs (a resumed run appends a new file)."""
    out = {}
    for path in sorted(glob.glob(f"{run_dir}/logs/events.out.tfevents.*")):
        acc = EventAccumulator(path, size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            out.update({e.step: e.value for e in acc.Scalars(tag)})
    return out


if __name__ == "__main__":
    tag, runs = sys.argv[1], sys.argv[2:]
    series = [losses(r, tag) for r in runs]
    for run, s in zip(runs, series):
        print(run, " ".join(f"{k}:{v!r}" for k, v in sorted(s.items())))
    common = set(series[0]).intersection(*series[1:])
    differ = sorted(k for k in common if len({s[k] for s in series}) > 1)
    print(f"{tag}: {len(common)} common steps, {'identical' if not differ and common else f'differ at {differ}'}")
    sys.exit(1 if differ or not common else 0)
