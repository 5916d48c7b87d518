"""The Wan transformer: diffusers' WanTransformer3DModel at random init from an architecture dict, or
from a local diffusers folder. Weights are never downloaded: a missing folder is a one-line error."""
import os

from giga_train.config import ConfigError

# Wan2.2-TI2V-5B's transformer (the diffusers config of Wan-AI/Wan2.2-TI2V-5B-Diffusers; dim 3072 =
# 24 heads x 128). Its VAE compresses 4x in time and 16x in space into 48 channels.
WAN22_TI2V_5B = dict(
    patch_size=(1, 2, 2), num_attention_heads=24, attention_head_dim=128, in_channels=48, out_channels=48,
    text_dim=4096, freq_dim=256, ffn_dim=14336, num_layers=30, cross_attn_norm=True,
    qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
WAN22_VAE_STRIDE = (4, 16, 16)  # (time, height, width)
WAN22_LATENT_CHANNELS = 48


def latent_shape(frames, height, width, channels=WAN22_LATENT_CHANNELS, stride=WAN22_VAE_STRIDE):
    """[C, F, H, W] of the latents of a clip: Wan's VAE keeps the first frame and packs 4 per latent after."""
    if (frames - 1) % stride[0] or height % stride[1] or width % stride[2]:
        raise ValueError(f"{frames} frames of {height}x{width}: frames must be 4k+1 and sides multiples of"
                         f" {stride[1]}")
    return (channels, (frames - 1) // stride[0] + 1, height // stride[1], width // stride[2])


def offline_hub():
    """Make huggingface_hub refuse the network before diffusers/transformers import it: weights here
    come from local disk only (an explicit HF_HUB_OFFLINE=0 from the user is respected)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def local_component(path, subfolder, marker="config.json"):
    """The folder holding `marker`: `path/subfolder` (a diffusers root) or `path` itself; else None."""
    for candidate in (os.path.join(path, subfolder), path):
        if os.path.isfile(os.path.join(candidate, marker)):
            return candidate
    return None


def missing_weights_message(what, path, subfolder):
    return (f"{what}: no local diffusers folder at {path} (looked for {subfolder}/config.json and config.json;"
            f" weights are never downloaded: point it at a folder on disk)")


def build_transformer(model_config, device=None):
    """WanTransformer3DModel from `model_config.pretrained` (a local folder) or `model_config.transformer`
    (an architecture dict, random init). Random init runs on `device` directly: a 5B model is built in
    seconds on a GPU rather than a minute on the CPU."""
    offline_hub()
    from diffusers import WanTransformer3DModel
    pretrained = model_config.get("pretrained")
    if pretrained:
        folder = local_component(pretrained, "transformer")
        if folder is None:
            raise ConfigError(missing_weights_message("models.pretrained", pretrained, "transformer"))
        return WanTransformer3DModel.from_pretrained(folder, local_files_only=True)
    arch = model_config.get("transformer")
    if not arch:
        raise ConfigError("models: give pretrained=<local diffusers folder> or transformer=<architecture dict>")
    import torch
    with torch.device(device or "cpu"):
        return WanTransformer3DModel(**dict(arch))
