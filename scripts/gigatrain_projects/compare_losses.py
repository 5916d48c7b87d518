"""Print each run's per-step losses (from its TensorBoard events) and whether the runs agree exactly.
    python compare_losses.py TAG RUN_DIR RUN_DIR [...]   (exit 1 when a step both have differs)
    python compare_losses.py --weights CHECKPOINT CHECKPOINT   (every weight tensor, bitwise)"""
import glob
import os
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


def load(path):
    import torch
    from safetensors.torch import load_file
    return load_file(path) if path.endswith(".safetensors") else torch.load(path, map_location="cpu", weights_only=True)


def same_weights(a, b):
    """Tensor for tensor in every weight file of the checkpoint's model folders (the engine's own state
    aside): the files' bytes may differ, safetensors writes its metadata in any order; .bin files are
    checkpoint_safe_serialization=False's."""
    import torch
    files = sorted(os.path.relpath(p, a) for p in glob.glob(f"{a}/**/*", recursive=True)
                   if p.endswith((".safetensors", ".bin")) and "/deepspeed/" not in p)
    assert files, f"no weight files in {a}"
    counts = []
    for name in files:
        x, y = load(os.path.join(a, name)), load(os.path.join(b, name))
        if not x:  # a file of no tensors would compare equal: a checkpoint that lost its weights
            print(f"{name}: holds no tensors")
            return False
        if x.keys() != y.keys() or any(not torch.equal(x[k], y[k]) for k in x):
            print(f"{name}: differ")
            return False
        counts.append(f"{name}: {len(x)}")
    print(f"{len(files)} weight files ({', '.join(counts)} tensors): every tensor identical")
    return True


if __name__ == "__main__":
    if sys.argv[1] == "--weights":
        sys.exit(0 if same_weights(sys.argv[2], sys.argv[3]) else 1)
    tag, runs = sys.argv[1], sys.argv[2:]
    series = [losses(r, tag) for r in runs]
    for run, s in zip(runs, series):
        print(run, " ".join(f"{k}:{v!r}" for k, v in sorted(s.items())))
    common = set(series[0]).intersection(*series[1:])
    differ = sorted(k for k in common if len({s[k] for s in series}) > 1)
    print(f"{tag}: {len(common)} common steps, {'identical' if not differ and common else f'differ at {differ}'}")
    sys.exit(1 if differ or not common else 0)
