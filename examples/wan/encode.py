"""Encoding clips for training: read frames, resize/crop, Wan VAE latents, UMT5 prompt embeddings.

Clips are read without new dependencies: a folder of images is one clip (frames in name order), an
image is a one-frame clip, and a video file is decoded with torchcodec or torchvision when one of them
is installed (neither is required: video decoders pull in FFmpeg, which a training node may not want)."""
import os

import numpy as np
import torch

IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
VIDEO_EXTS = (".mp4", ".mov", ".webm", ".mkv", ".avi")


def find_clips(root):
    """(clip path, caption) for every image, image folder or video under `root` with a same-stem .txt."""
    clips, missing = [], []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        stem, ext = os.path.splitext(name)
        if not (os.path.isdir(path) or ext.lower() in IMAGE_EXTS + VIDEO_EXTS):
            continue
        caption_file = os.path.join(root, (name if os.path.isdir(path) else stem) + ".txt")
        if not os.path.isfile(caption_file):
            missing.append(caption_file)
            continue
        with open(caption_file, encoding="utf-8") as f:
            clips.append((path, " ".join(f.read().split())))
    return clips, missing


def _decode_video(path):
    """[F, 3, H, W] uint8 frames, by whichever decoder is installed."""
    try:
        from torchcodec.decoders import VideoDecoder
        return VideoDecoder(path)[:]
    except ImportError:
        pass
    try:
        from torchvision.io import read_video
        return read_video(path, pts_unit="sec", output_format="TCHW")[0]
    except ImportError:
        raise RuntimeError(f"{path}: decoding video needs torchcodec or torchvision (neither is installed);"
                           " or extract its frames into a folder of images") from None


def read_frames(path):
    """[F, 3, H, W] uint8 frames of a clip (a video, a folder of images, or one image)."""
    from PIL import Image
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path) if n.lower().endswith(IMAGE_EXTS))
        if not names:
            raise ValueError(f"{path}: a clip folder with no images")
        images = [Image.open(os.path.join(path, n)) for n in names]
    elif path.lower().endswith(VIDEO_EXTS):
        return _decode_video(path)
    else:
        images = [Image.open(path)]
    return torch.stack([torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1) for im in images])


def prepare_clip(frames, num_frames, height, width, temporal_stride=4):
    """[3, F, H, W] in [-1, 1]: the first 4k+1 frames (at most num_frames), resized to cover height x width
    and centre-cropped."""
    count = min(num_frames, frames.shape[0])
    count = (count - 1) // temporal_stride * temporal_stride + 1
    x = frames[:count].float() / 127.5 - 1
    scale = max(height / x.shape[-2], width / x.shape[-1])
    size = (max(height, round(x.shape[-2] * scale)), max(width, round(x.shape[-1] * scale)))
    x = torch.nn.functional.interpolate(x, size=size, mode="bilinear", antialias=True, align_corners=False)
    top, left = (size[0] - height) // 2, (size[1] - width) // 2
    return x[:, :, top:top + height, left:left + width].permute(1, 0, 2, 3).clamp(-1, 1)


class WanEncoders:
    """The Wan VAE and UMT5 text encoder from local diffusers folders (already checked to exist)."""

    def __init__(self, vae_folder, text_encoder_folder, tokenizer_folder, device, dtype=torch.bfloat16,
                 text_len=512):
        from diffusers import AutoencoderKLWan
        from transformers import AutoTokenizer, UMT5EncoderModel
        self.device, self.dtype, self.text_len = device, dtype, text_len
        self.vae = AutoencoderKLWan.from_pretrained(vae_folder, torch_dtype=torch.float32,
                                                    local_files_only=True).to(device).eval()
        self.text_encoder = UMT5EncoderModel.from_pretrained(text_encoder_folder, torch_dtype=dtype,
                                                             local_files_only=True).to(device).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder, local_files_only=True)
        cfg = self.vae.config
        self.latents_mean = torch.tensor(cfg.latents_mean).view(-1, 1, 1, 1)
        self.latents_std = torch.tensor(cfg.latents_std).view(-1, 1, 1, 1)

    @torch.no_grad()
    def encode_clip(self, clip):
        """[C, F', H', W'] normalised latents ((z - mean) / std, as Wan's pipelines expect) of one clip."""
        z = self.vae.encode(clip.unsqueeze(0).to(self.device)).latent_dist.mode()[0].float().cpu()
        return (z - self.latents_mean) / self.latents_std

    @torch.no_grad()
    def encode_prompt(self, prompt):
        """[L, D] UMT5 states of the prompt's real tokens (the dataset pads them back to text_len)."""
        tokens = self.tokenizer([prompt], padding="max_length", max_length=self.text_len, truncation=True,
                                add_special_tokens=True, return_attention_mask=True, return_tensors="pt")
        mask = tokens.attention_mask.to(self.device)
        states = self.text_encoder(tokens.input_ids.to(self.device), mask).last_hidden_state
        return states[0, :int(mask.sum())].float().cpu()
