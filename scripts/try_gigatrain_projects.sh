#!/bin/bash
# Train a public GigaTrain project's own trainer and config with giga-train, on CPU, with tiny stand-in
# weights and data (made by scripts/gigatrain_projects/tiny_<project>.py), then kill -9 it after a
# checkpoint, resume, and compare its per-step losses with an uninterrupted run. Results:
# docs/GIGATRAIN_PROJECTS.md. The projects' code stays in their clones: nothing of it is copied here.
#
#   scripts/try_gigatrain_projects.sh giga-world-0 CLONE GIGA_MODELS_CLONE WORK_DIR
#
# CLONE: a clone of github.com/open-gigaai/giga-world-0; GIGA_MODELS_CLONE: one of open-gigaai/giga-models
# (the project's model library). PYTHON (default: python) must hold the projects' dependencies (diffusers,
# peft, einops, giga-datasets, decord, imageio-ffmpeg, tensorboard, deepspeed); this checkout comes
# first on PYTHONPATH, so its giga_train is the one that runs.
set -euo pipefail
project=$1 clone=$(realpath "$2") models=$(realpath "$3") work=$(realpath -m "$4")
here=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python}
export PYTHONPATH=$here:$clone:$models PYTHONUNBUFFERED=1
mkdir -p "$work"

case $project in
giga-world-0)
  config=configs/giga_world_0_video.py
  # What had to change, all config values: no GPUs; the tiny stand-ins; no DataLoader workers (a
  # 2-core machine); a short job in steps with a checkpoint mid-epoch (4 videos, batch 1).
  mapfile -t values < <("$PY" -W ignore "$here/scripts/gigatrain_projects/tiny_giga_world_0.py" "$work/tiny" | grep =)
  values+=(launch.gpu_ids=None dataloaders.train.num_workers=0
           train.max_epochs=None train.max_steps=6 train.checkpoint_interval=3)
  kill_at=checkpoint_epoch_1_step_3
  ;;
*) echo "unknown project '$project' (known: giga-world-0)" >&2; exit 2 ;;
esac

train() { # project_dir: the project's config under `giga-train train`, run from its clone
  local sets=() v
  for v in "${values[@]}" "project_dir=$1"; do sets+=(--set "$v"); done
  (cd "$clone" && exec "$PY" -W ignore -m giga_train train $config "${sets[@]}")
}
rm -rf "$work/full" "$work/killed"
echo "== uninterrupted run"; train "$work/full" > "$work/full.log" 2>&1
echo "== run killed (SIGKILL) once $kill_at is written"
train "$work/killed" > "$work/killed.log" 2>&1 &
pid=$!
until [ -f "$work/killed/models/$kill_at/meta.json" ]; do
  kill -0 $pid 2>/dev/null || { echo "the run ended before $kill_at" >&2; exit 1; }; sleep 0.2
done
pkill -9 -P $pid; kill -9 $pid; wait $pid 2>/dev/null || true  # the subshell and its python
echo "== resumed"; train "$work/killed" > "$work/resumed.log" 2>&1
grep -h "resumed from\|done at" "$work"/*.log | sed 's/.*\[giga-train\] //'
for tag in total_loss grad_norm; do
  "$PY" "$here/scripts/gigatrain_projects/compare_losses.py" "train/$tag" "$work/full" "$work/killed" 2>/dev/null
done
# the final weights and EMA weights, tensor for tensor
final=$(basename "$(ls -d "$work"/full/models/checkpoint_*_step_* | sort -t_ -k5 -n | tail -1)")
"$PY" "$here/scripts/gigatrain_projects/compare_losses.py" --weights "$work/full/models/$final" "$work/killed/models/$final"
