#!/bin/bash
# Train a public GigaTrain project's own trainer and config with giga-train, on CPU, with tiny stand-in
# weights and data (made by scripts/gigatrain_projects/tiny_<project>.py), then kill -9 it after a
# checkpoint, resume, and compare its per-step losses with an uninterrupted run. Results:
# docs/GIGATRAIN_PROJECTS.md. The projects' code stays in their clones: nothing of it is copied here.
#
#   scripts/try_gigatrain_projects.sh giga-world-0 CLONE GIGA_MODELS_CLONE WORK_DIR
#   scripts/try_gigatrain_projects.sh giga-world-0-lora CLONE GIGA_MODELS_CLONE WORK_DIR
#   scripts/try_gigatrain_projects.sh giga-world-policy CLONE - WORK_DIR
#
# giga-world-0-lora: the same job in the LoRA mode its config offers (commented out there):
# models.train_mode=lora, models.lora_rank (4 for the tiny transformer; the config's 64).
#
# CLONE: a clone of github.com/open-gigaai/giga-world-0 (GIGA_MODELS_CLONE: one of open-gigaai/giga-models,
# its model library) or of open-gigaai/giga-world-policy (it carries its own giga_models and giga_datasets).
# PYTHON (default: python) must hold the projects' dependencies (diffusers, peft, einops, giga-datasets,
# decord, imageio-ffmpeg, lerobot, tensorboard, deepspeed); this checkout comes first on PYTHONPATH, so
# its giga_train is the one that runs. RANKS=2 runs every job at two gloo ranks.
set -euo pipefail
project=$1 clone=$(realpath "$2") models=$(realpath -m "$3") work=$(realpath -m "$4")
here=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python}
export PYTHONPATH=$here:$clone:$models PYTHONUNBUFFERED=1
rm -rf "$work/tiny"; mkdir -p "$work"
entry=(-m giga_train)  # the `giga-train` command of this checkout

case $project in
giga-world-0|giga-world-0-lora)
  config=configs/giga_world_0_video.py
  # What had to change, all config values: no GPUs; the tiny stand-ins; no DataLoader workers (a
  # 2-core machine); a short job in steps with a checkpoint mid-epoch (4 videos, batch 1).
  mapfile -t values < <("$PY" -W ignore "$here/scripts/gigatrain_projects/tiny_giga_world_0.py" "$work/tiny" 2> "$work/tiny.log" | grep =)
  values+=(launch.gpu_ids=None dataloaders.train.num_workers=0
           train.max_epochs=None train.max_steps=6 train.checkpoint_interval=3 launch.num_processes=${RANKS:-1})
  if [ "$project" = giga-world-0-lora ]; then values+=(models.train_mode=lora models.lora_rank=4); fi
  kill_at=step_3
  ;;
giga-world-policy)  # GigaWorld-Policy-0; its own copies of giga-datasets and giga-models (third_party/)
  config=configs/giga_world_policy_0_agilex_finetune.py
  export PYTHONPATH=$here:$clone:$clone/third_party/giga-datasets:$clone/third_party/giga-models
  # its scripts/train.py imports these before launch_from_config (they register the dataset and transforms)
  entry=(-c "import sys, world_action_model.datasets, world_action_model.trainer, world_action_model.transforms
from giga_train.cli import main
sys.exit(main(sys.argv[1:]))")
  mapfile -t lines < <(cd "$clone" && "$PY" -W ignore "$here/scripts/gigatrain_projects/tiny_giga_world_policy.py" "$work/tiny" 2> "$work/tiny.log" | grep =)
  values=()
  for line in "${lines[@]}"; do
    case $line in env\ *) export "${line#env }" ;; *) values+=("$line") ;; esac
  done
  # by hand, all config values: its model_action_dim=32 does not fit its in_action_channels=16 (a
  # RuntimeError in the action projector's bmm), so 16 (the data has 14 dofs); until_completion off, so
  # that an error ends the run instead of relaunching it every 10 s; resume on (the config has it off)
  values+=(launch.gpu_ids=None launch.until_completion=False dataloaders.train.transform.model_action_dim=16
           train.resume=True train.max_steps=6 train.checkpoint_interval=3 train.log_interval=1
           launch.num_processes=${RANKS:-1})
  kill_at=step_3
  ;;
*) echo "unknown project '$project' (known: giga-world-0, giga-world-0-lora, giga-world-policy)" >&2; exit 2 ;;
esac

train() { # project_dir: the project's config under `giga-train train`, run from its clone
  local sets=() v
  for v in "${values[@]}" "project_dir=$1"; do sets+=(--set "$v"); done
  (cd "$clone" && exec "$PY" -W ignore "${entry[@]}" train $config "${sets[@]}")
}
check() { # the config with the run's values (check reads the model folders and the data the values name)
  local sets=() v
  for v in "${values[@]}" "project_dir=$work/check"; do sets+=(--set "$v"); done
  (cd "$clone" && "$PY" -W ignore "${entry[@]}" check $config "${sets[@]}" 2>&1 | tail -1)
}
echo "== giga-train check $config with the values above"; check
rm -rf "$work/full" "$work/killed"
echo "== uninterrupted run"; train "$work/full" > "$work/full.log" 2>&1
echo "== run killed (SIGKILL) once the checkpoint of $kill_at is written"
train "$work/killed" > "$work/killed.log" 2>&1 &
pid=$!
until compgen -G "$work/killed/models/checkpoint_epoch_*_$kill_at/meta.json" > /dev/null; do
  kill -0 $pid 2>/dev/null || { echo "the run ended before $kill_at" >&2; exit 1; }; sleep 0.2
done
kill_tree() { local child; for child in $(pgrep -P "$1"); do kill_tree "$child"; done; kill -9 "$1" 2>/dev/null || true; }
kill_tree $pid; wait $pid 2>/dev/null || true  # the run's python and, at 2 ranks, its workers
echo "== resumed"; train "$work/killed" > "$work/resumed.log" 2>&1
grep -h "resumed from\|done at" "$work"/*.log | sed 's/.*\[giga-train\] //'
grep -q "resumed from .*_$kill_at at step" "$work/resumed.log" \
  || { echo "the resumed run did not start from the killed run's $kill_at checkpoint" >&2; exit 1; }
for tag in total_loss grad_norm; do
  "$PY" "$here/scripts/gigatrain_projects/compare_losses.py" "train/$tag" "$work/full" "$work/killed" 2>/dev/null
done
# the final weights and EMA weights, tensor for tensor
final=$(basename "$(ls -d "$work"/full/models/checkpoint_*_step_* | sort -t_ -k5 -n | tail -1)")
"$PY" "$here/scripts/gigatrain_projects/compare_losses.py" --weights "$work/full/models/$final" "$work/killed/models/$final"
