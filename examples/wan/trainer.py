"""The Wan text-to-video fine-tuning Trainer: flow matching on precomputed latents and text embeddings."""
import torch

from giga_train import Trainer

from . import data  # noqa: F401  (registers WanLatentDataset)
from .flow_matching import (flow_matching_loss, noisy_latents, sample_sigmas, timesteps_from_sigmas,
                            velocity_target)
from .model import build_transformer


class WanTrainer(Trainer):
    """models: pretrained=<local diffusers folder> or transformer=<architecture dict>; flow_shift (5.0),
    timestep_sampling ("uniform" | "discrete")."""

    def get_models(self, model_config):
        self.flow_shift = float(model_config.get("flow_shift", 5.0))
        self.timestep_sampling = model_config.get("timestep_sampling", "uniform")
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
