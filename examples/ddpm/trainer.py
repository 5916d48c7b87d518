"""A small diffusers project: a UNet2DModel trained with DDPM's noise-prediction loss, and a grid of images
sampled with DDIM at each validation (sample_step), on the EMA weights when train.eval_ema."""
import torch
import torch.nn.functional as F

from giga_train import Trainer

from . import data  # noqa: F401  (registers ColouredSquares)


class DDPMTrainer(Trainer):
    """models: the UNet2DModel's arguments, plus sample_steps (DDIM steps, 10) and num_samples (4, a grid)."""

    def get_models(self, model_config):
        from diffusers import DDPMScheduler, UNet2DModel
        unet_args = dict(model_config)
        self.sample_steps = int(unet_args.pop("sample_steps", 10))
        self.num_samples = int(unet_args.pop("num_samples", 4))
        self.noise_scheduler = DDPMScheduler(num_train_timesteps=1000)
        return UNet2DModel(**unet_args)

    def forward_step(self, batch_dict):
        images = batch_dict["images"]
        noise = torch.randn_like(images)
        timesteps = torch.randint(0, self.noise_scheduler.config.num_train_timesteps, (images.shape[0],),
                                  device=images.device)
        prediction = self.model(self.noise_scheduler.add_noise(images, noise, timesteps), timesteps).sample
        return F.mse_loss(prediction.float(), noise.float())

    def sample_step(self, batch_dict):
        """DDIM from noise on every rank (a sharded model gathers its weights in each forward); the main
        rank returns the images as one grid (logged as samples/grid)."""
        from diffusers import DDIMScheduler
        scheduler = DDIMScheduler.from_config(self.noise_scheduler.config)
        scheduler.set_timesteps(self.sample_steps)
        x = torch.randn((self.num_samples, *batch_dict["images"].shape[1:]), device=self.device)
        for t in scheduler.timesteps:
            x = scheduler.step(self.model(x, t).sample, t, x).prev_sample
        if not self.is_main_process:
            return None
        images = ((x.float().clamp(-1, 1) + 1) / 2)  # N, 3, H, W in [0, 1]
        return {"grid": torch.cat(list(images), dim=2)}  # side by side: 3, H, N*W
