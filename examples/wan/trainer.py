"""The Wan text-to-video fine-tuning Trainer: flow matching on precomputed latents and text embeddings."""
import torch

from giga_train import Trainer

from . import data  # noqa: F401  (registers WanLatentDataset)
from .flow_matching import (flow_matching_loss, noisy_latents, sample_sigmas, timesteps_from_sigmas,
                            velocity_target)
from .model import build_transformer
from .sampling import generate_latents, latents_to_frames, load_vae


class WanTrainer(Trainer):
    """models: pretrained=<local diffusers folder> or transformer=<architecture dict>; flow_shift (5.0),
    timestep_sampling ("uniform" | "discrete"); sample_steps (4) and vae (a local diffusers folder, optional)
    for the clip sample_step logs at each validation (train.eval_interval with dataloaders.val)."""

    def get_models(self, model_config):
        self.flow_shift = float(model_config.get("flow_shift", 5.0))
        self.timestep_sampling = model_config.get("timestep_sampling", "uniform")
        self.sample_steps, self.vae_path, self.vae = int(model_config.get("sample_steps", 4)), model_config.get("vae"), None
        return build_transformer(model_config, device=self.device)

    def forward_step(self, batch_dict):
        x0 = batch_dict["latents"].float()
        noise = torch.randn_like(x0)
        sigmas = sample_sigmas(x0.shape[0], self.flow_shift, self.timestep_sampling, device=x0.device)
        # Inputs in the weights' dtype: fp32 under autocast, bf16 where the engine (DeepSpeed) holds bf16
        # weights and runs without autocast. The noising and the target stay in fp32.
        dtype = next(self.unwrapped_model.parameters()).dtype
        prediction = self.model(hidden_states=noisy_latents(x0, noise, sigmas).to(dtype),
                                timestep=timesteps_from_sigmas(sigmas),
                                encoder_hidden_states=batch_dict["text_embeds"].to(dtype), return_dict=False)[0]
        return flow_matching_loss(prediction, velocity_target(x0, noise))

    def sample_step(self, batch_dict):
        """A clip from the first validation prompt: every rank runs the transformer (FSDP2 and ZeRO-3 gather
        weights in each forward), the main rank alone decodes and returns it (logged as samples/clip)."""
        text = batch_dict["text_embeds"][:1]
        dtype = next(self.unwrapped_model.parameters()).dtype
        latents = generate_latents(self.model, text, batch_dict["latents"].shape[1:], self.flow_shift,
                                   self.sample_steps, dtype)
        if not self.is_main_process:
            return None
        if self.vae_path and self.vae is None:
            self.vae = load_vae(self.vae_path, self.device)
        return {"clip": latents_to_frames(latents[0], self.vae)}
