"""Tiny stand-ins for open-gigaai/giga-world-policy's GigaWorld-Policy-0 training job (its own trainer
world_action_model.CasualWATrainer and config configs/giga_world_policy_0_agilex_finetune.py) on a CPU:
a Wan VAE with its config shrunk under WAN/vae (the config's `pretrained` folder), the project's
CasualWorldActionTransformer built from the config's own `models.transformer` values shrunk and saved as
a safetensors file, and a 2-episode LeRobot dataset written with lerobot's own writer (3 cameras, 14-dim
state and action, robot_type agilex) with the per-episode T5 embedding files and the norm-stats JSON the
config expects.

    python tiny_giga_world_policy.py OUT_DIR     (the project and giga_models importable)
Prints the environment variables and `--set` values (one a line) that point the project's config at OUT_DIR."""
import json
import os
import sys

import numpy as np
import torch
from diffusers.models import AutoencoderKLWan
from lerobot.datasets.lerobot_dataset import LeRobotDataset
from safetensors.torch import save_file

from world_action_model.models import CasualWorldActionTransformer

Z_DIM, TEXT_DIM, TEXT_LEN, DOF, SIZE, EPISODE = 48, 8, 4, 14, 32, 56
# models.transformer values overridden (the rest are the config's own); in/out_channels stay 48 = the VAE's z_dim
TRANSFORMER = dict(attention_head_dim=8, num_attention_heads=2, ffn_dim=32, num_layers=2, text_dim=TEXT_DIM, freq_dim=16)
CAMERAS = ["observation.images.cam_high", "observation.images.cam_left_wrist", "observation.images.cam_right_wrist"]


def config_transformer():
    """The shipped config's models.transformer, read from the config module itself (so nothing is copied)."""
    os.environ.setdefault("GWP_AGILEX_DATA_PATHS", "/nonexistent")
    os.environ.setdefault("GWP0_TRANSFORMER_PRETRAINED", "/nonexistent")
    os.environ.setdefault("GWP_NORM_STATS_PATH", "/nonexistent")
    import importlib.util
    spec = importlib.util.spec_from_file_location("cfg", "configs/giga_world_policy_0_agilex_finetune.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.config["models"]["transformer"])


def make_models(out):
    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=8, z_dim=Z_DIM, dim_mult=[1, 1, 1, 1], num_res_blocks=1, attn_scales=[],
                           temperal_downsample=[False, True, True], latents_mean=[0.0] * Z_DIM, latents_std=[1.0] * Z_DIM)
    vae.save_pretrained(os.path.join(out, "wan", "vae"))
    transformer = CasualWorldActionTransformer(**{**config_transformer(), **TRANSFORMER})
    os.makedirs(os.path.join(out, "transformer"), exist_ok=True)
    save_file({k: v.contiguous() for k, v in transformer.state_dict().items()},
              os.path.join(out, "transformer", "model.safetensors"))


def make_data(out):
    root = os.path.join(out, "agilex")
    features = {"observation.state": dict(dtype="float32", shape=(DOF,), names=None),
                "action": dict(dtype="float32", shape=(DOF,), names=None)}
    features.update({cam: dict(dtype="video", shape=(SIZE, SIZE, 3), names=["height", "width", "channels"])
                     for cam in CAMERAS})
    dataset = LeRobotDataset.create("agilex", fps=16, features=features, root=root, robot_type="agilex",
                                    vcodec="h264")
    rng = np.random.default_rng(0)
    os.makedirs(os.path.join(root, "t5_embedding"))
    for episode in range(2):
        for _ in range(EPISODE):
            frame = {"observation.state": rng.standard_normal(DOF, dtype=np.float32),
                     "action": rng.standard_normal(DOF, dtype=np.float32), "task": f"tiny task {episode}"}
            frame.update({cam: rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8) for cam in CAMERAS})
            dataset.add_frame(frame)
        dataset.save_episode()
        torch.save({"t5_embedding": torch.from_numpy(rng.standard_normal((TEXT_LEN, TEXT_DIM), dtype=np.float32))},
                   os.path.join(root, "t5_embedding", f"episode_{episode:06d}.pt"))
    dataset.finalize()
    stats = {k: dict(mean=[0.0] * DOF, std=[1.0] * DOF, q01=[-2.0] * DOF, q99=[2.0] * DOF, min=[-3.0] * DOF,
                     max=[3.0] * DOF) for k in ("observation.state", "action")}
    with open(os.path.join(out, "norm_stats.json"), "w") as f:
        json.dump({"norm_stats": stats}, f)
    return root


if __name__ == "__main__":
    out = os.path.abspath(sys.argv[1])
    make_models(out)
    root = make_data(out)
    # the config's own environment variables (GWP_*), then `--set` values, one a line
    for value in [f"GWP_AGILEX_DATA_PATHS={root}", f"GWP0_TRANSFORMER_PRETRAINED={out}/transformer",
                  f"GWP_WAN_PRETRAINED={out}/wan", f"GWP_NORM_STATS_PATH={out}/norm_stats.json",
                  "GWP_NUM_WORKERS=0", "GWP_BATCH_SIZE_PER_GPU=1"]:
        print("env", value)
    for key, value in TRANSFORMER.items():
        print(f"models.transformer.{key}={value}")
    print(f"dataloaders.train.transform.dst_size=({SIZE},{SIZE})")
