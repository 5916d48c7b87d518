"""Samples at validation: a few Euler steps of the flow-matching ODE from noise to latents, then frames:
decoded by the Wan VAE of a local diffusers folder (models.vae), else the latents' first three channels,
each scaled to [0, 1] (enough to see the model learn structure without a VAE on disk).

dx/dsigma is the velocity the model predicts (x_sigma = (1 - sigma) x0 + sigma noise), so from sigma=1
(pure noise) each step adds (sigma_next - sigma) * velocity, over Wan's shifted schedule."""
import torch

from .flow_matching import shift_sigmas, timesteps_from_sigmas
from .model import local_component, missing_weights_message


@torch.no_grad()
def generate_latents(model, text_embeds, latent_shape, shift, steps, dtype):
    """Latents [B, C, F, H, W] for `text_embeds` [B, L, D]: `steps` Euler steps from noise (torch's RNG)."""
    x = torch.randn((text_embeds.shape[0], *latent_shape), device=text_embeds.device)
    sigmas = shift_sigmas(torch.linspace(1.0, 0.0, steps + 1, device=x.device), shift)
    for sigma, sigma_next in zip(sigmas[:-1], sigmas[1:]):
        timestep = timesteps_from_sigmas(sigma.expand(x.shape[0]))
        velocity = model(hidden_states=x.to(dtype), timestep=timestep, encoder_hidden_states=text_embeds.to(dtype),
                         return_dict=False)[0]
        x = x + (sigma_next - sigma) * velocity.float()
    return x


def load_vae(path, device):
    """The AutoencoderKLWan of a local diffusers folder (or its vae/ subfolder), fp32, in eval mode."""
    from diffusers import AutoencoderKLWan
    folder = local_component(path, "vae")
    if folder is None:
        raise FileNotFoundError(missing_weights_message("models.vae", path, "vae"))
    return AutoencoderKLWan.from_pretrained(folder, torch_dtype=torch.float32).to(device).eval()


@torch.no_grad()
def latents_to_frames(latents, vae=None):
    """Frames [F, 3, H, W] in [0, 1] of one clip's normalised latents [C, F, H, W]."""
    if vae is None:
        frames = latents[:3].float().transpose(0, 1)  # F, 3, H, W
        low = frames.amin(dim=(1, 2, 3), keepdim=True)
        high = frames.amax(dim=(1, 2, 3), keepdim=True)
        return (frames - low) / (high - low).clamp_min(1e-6)
    config = vae.config
    mean = torch.tensor(config.latents_mean, device=latents.device).view(-1, 1, 1, 1)
    std = torch.tensor(config.latents_std, device=latents.device).view(-1, 1, 1, 1)
    video = vae.decode((latents.float() * std + mean)[None], return_dict=False)[0][0]  # 3, F, H, W in [-1, 1]
    return ((video.clamp(-1, 1) + 1) / 2).transpose(0, 1)
