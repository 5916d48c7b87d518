"""The sample file format: one .safetensors file per clip with `latents` [C, F, H, W] (the Wan VAE's
normalised latents) and `text_embeds` [L, 4096] (UMT5 states, L <= text_len; padded with zeros when read, as
Wan's pipelines pad the prompt to 512 tokens). Plain torch and safetensors: bench/wan_gigatrain.py reads the
same files under the real GigaTrain, where our `giga_train` package is not importable."""
import os

import torch
from safetensors.torch import load_file, save_file

LATENTS, TEXT = "latents", "text_embeds"


def write_sample(path, latents, text_embeds, dtype=torch.bfloat16):
    """Write one sample, atomically: a reader never sees half a file."""
    if latents.dim() != 4 or text_embeds.dim() != 2:
        raise ValueError(f"latents must be [C, F, H, W] and text_embeds [L, D], got {tuple(latents.shape)}"
                         f" and {tuple(text_embeds.shape)}")
    tmp = path + ".tmp"
    save_file({LATENTS: latents.detach().to("cpu", dtype).contiguous(),
               TEXT: text_embeds.detach().to("cpu", dtype).contiguous()}, tmp)
    os.replace(tmp, path)


def read_sample(path, text_len):
    """{"latents": fp32 [C, F, H, W], "text_embeds": fp32 [text_len, D]} of one sample file."""
    tensors = load_file(path)
    missing = [k for k in (LATENTS, TEXT) if k not in tensors]
    if missing:
        raise KeyError(f"{path}: no '{missing[0]}' tensor (has {', '.join(sorted(tensors))})")
    text = tensors[TEXT].float()
    if text.shape[0] > text_len:
        raise ValueError(f"{path}: {text.shape[0]} text tokens, more than text_len={text_len}")
    text = torch.cat([text, text.new_zeros(text_len - text.shape[0], text.shape[1])])
    return {LATENTS: tensors[LATENTS].float(), TEXT: text}


def write_synthetic_dataset(out, num_samples, latent_shape, text_shape, seed=0, dtype=torch.bfloat16,
                            progress=False):
    """Random latents and text embeddings of the given shapes: stands in for encoded clips when the
    Wan VAE and UMT5 weights are not on local disk (benchmarks, tests, smoke runs)."""
    from tqdm import tqdm
    os.makedirs(out, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    paths = []
    for i in tqdm(range(num_samples), desc="writing samples", disable=not progress):
        path = os.path.join(out, f"sample_{i:06d}.safetensors")
        write_sample(path, torch.randn(latent_shape, generator=generator),
                     torch.randn(text_shape, generator=generator), dtype)
        paths.append(path)
    return paths
