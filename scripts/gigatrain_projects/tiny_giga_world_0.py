"""Tiny stand-ins for open-gigaai/giga-world-0's training job, so that its own trainer runs on a CPU:
a Wan VAE and a GigaWorld0 transformer with their configs shrunk (saved with save_pretrained, read back
by the project's from_pretrained), and a 4-video dataset written with giga_datasets' own writers, laid
out as the project's scripts/pack_data.py lays it out (labels + videos + prompt embeddings).

Run in an environment holding the project's dependencies, with giga_models importable:
    python tiny_giga_world_0.py OUT_DIR
Prints the `--set` values (one a line) that point the project's config at OUT_DIR."""
import os
import sys

import numpy as np
import torch
from diffusers.models import AutoencoderKLWan
from giga_datasets import Dataset, FileWriter, PklWriter, load_dataset
from PIL import Image

from giga_models import GigaWorld0Transformer3DModel

Z_DIM, TEXT_DIM, TEXT_LEN = 4, 8, 6
FRAMES, HEIGHT, WIDTH = 5, 32, 32  # 5 frames -> 2 latent frames (the VAE keeps 1 + (n-1)/4); 32 px -> 4 latent px


def make_models(out):
    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=8, z_dim=Z_DIM, dim_mult=[1, 1, 1, 1], num_res_blocks=1, attn_scales=[],
                           temperal_downsample=[False, True, True], latents_mean=[0.0] * Z_DIM, latents_std=[1.0] * Z_DIM)
    vae.save_pretrained(os.path.join(out, "vae"))
    # in_channels: the latents plus the reference mask the trainer concatenates (the padding mask is added inside)
    transformer = GigaWorld0Transformer3DModel(
        max_img_h=HEIGHT // 8, max_img_w=WIDTH // 8, max_frames=1 + (FRAMES - 1) // 4, in_channels=Z_DIM + 1,
        out_channels=Z_DIM, patch_spatial=2, patch_temporal=1, model_channels=32, num_blocks=2, num_heads=2,
        crossattn_emb_channels=TEXT_DIM, adaln_lora_dim=8)
    transformer.save_pretrained(os.path.join(out, "transformer"))


def make_data(out, num_videos=4):
    rng = np.random.default_rng(0)
    labels, videos, prompts = (os.path.join(out, "data", name) for name in ("labels", "videos", "prompts"))
    label_writer, video_writer, prompt_writer = PklWriter(labels), FileWriter(videos), FileWriter(prompts)
    for idx in range(num_videos):
        frames = [Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)) for _ in range(8)]
        label_writer.write_dict(dict(data_index=idx, prompt=f"tiny video {idx}"))
        video_writer.write_video(idx, frames, fps=8)
        prompt_writer.write_dict(idx, dict(prompt_embeds=torch.from_numpy(rng.standard_normal((TEXT_LEN, TEXT_DIM), dtype=np.float32))))
    for writer in (label_writer, video_writer, prompt_writer):
        writer.write_config()
        writer.close()
    Dataset([load_dataset(labels), load_dataset(videos), load_dataset(prompts)]).save(os.path.join(out, "data"))


if __name__ == "__main__":
    out = os.path.abspath(sys.argv[1])
    make_models(out)
    make_data(out)
    for value in [f"dataloaders.train.data_or_config=['{out}/data']", f"models.vae_model_path={out}/vae",
                  f"models.transformer_model_path={out}/transformer", f"dataloaders.train.transform.num_frames={FRAMES}",
                  f"dataloaders.train.transform.height={HEIGHT}", f"dataloaders.train.transform.width={WIDTH}"]:
        print(value)  # one `--set` value a line
