#!/usr/bin/env bash
# Builds the reference environment: the real GigaTrain 1.1.0 and giga-datasets 1.1.0 from the package
# registry, in a venv of its own (never beside our package: both are imported as `giga_train`).
#
#   bash tests/reference/setup.sh [VENV]        (default: .venv-gigatrain at the repository root)
#
# Nothing installed is patched. Choices, and why (docs/GIGATRAIN.md, "The reference environment"):
# - torch 2.14.1 + torchvision 0.29.1, not the CPU torch 2.13.0 our own venv uses: giga_datasets imports
#   torchvision at import time (its evaluators: lpips, pytorch_fid, torchvision.transforms), and the
#   registry's torchvision wheels for Linux x86_64 are built against the CUDA torch (their _C.so needs
#   libtorch_cuda.so), so none of them loads beside a CPU torch ("operator torchvision::nms does not
#   exist"); the registry has no torchvision sdist to build against the CPU torch. The CUDA builds run
#   on the CPU. On aarch64 the registry's wheels are CPU builds, and torch 2.9.1 + torchvision 0.24.1 are
#   used there (the pair this workplace has seen import together).
# - giga-datasets without lerobot: giga-datasets 1.1.0 requires lerobot==0.4.4, which requires
#   torch<2.11 and torchvision<0.26 (so no torch of 2.11+ can satisfy it); giga_datasets imports lerobot
#   only when it is installed (utils/import_utils.py, is_lerobot_available), for LeRobotDataset alone.
#   Every other declared dependency of giga-datasets is installed.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${1:-$root/.venv-gigatrain}"
py="${PYTHON:-python3}"
start=$(date +%s)

case "$(uname -m)" in
  aarch64|arm64) TORCH_PAIR="torch==2.9.1 torchvision==0.24.1" ;;
  *) TORCH_PAIR="torch==2.14.1 torchvision==0.29.1" ;;
esac
# constraints.txt pins every other package to the versions this was checked with (reproducible builds).
PIP_FLAGS=(-q --disable-pip-version-check -c "$here/constraints.txt")

rm -rf "$venv"
"$py" -m venv "$venv"
vpy="$venv/bin/python"
"$vpy" -m pip install "${PIP_FLAGS[@]}" $TORCH_PAIR
# giga-train with its declared dependencies (accelerate, deepspeed, diffusers, nvidia-ml-py, paramiko,
# transformers, tyro); deepspeed builds from its sdist with no ops compiled ahead (as in our Makefile).
DS_BUILD_OPS=0 "$vpy" -m pip install "${PIP_FLAGS[@]}" giga-train==1.1.0 $TORCH_PAIR
# giga-datasets, then its declared dependencies less lerobot (see above).
"$vpy" -m pip install "${PIP_FLAGS[@]}" --no-deps giga-datasets==1.1.0
"$vpy" -m pip install "${PIP_FLAGS[@]}" $TORCH_PAIR \
  beautifulsoup4 decord ftfy imageio lmdb lpips opencv-python pytorch-fid scikit-image terminaltables transformers tyro
# tensorboard: the client logs with log_with='tensorboard' (Accelerate's tracker needs the package).
"$vpy" -m pip install "${PIP_FLAGS[@]}" tensorboard
# The check runs outside the repository: our own giga_train/ there would shadow the reference's.
(cd / && "$vpy" - <<'PY'
import giga_datasets, giga_train, torch, torchvision
assert giga_train.__version__ == '1.1.0' and giga_datasets.__version__ == '1.1.0', (giga_train.__version__, giga_datasets.__version__)
print('reference venv ok: giga_train', giga_train.__version__, 'giga_datasets', giga_datasets.__version__,
      'torch', torch.__version__, 'torchvision', torchvision.__version__)
PY
)
"$vpy" -m pip freeze > "$venv/freeze.txt"
end=$(date +%s)
size=$(du -sm "$venv" | cut -f1)
echo "reference venv built in $((end - start)) s, ${size} MiB: $venv"
touch "$venv/.installed"
