"""Wan's flow-matching objective: shifted noise levels, the noisy input, the velocity target, the loss.

x_t = (1 - sigma) * x0 + sigma * noise, the model predicts the velocity noise - x0, and sees the
timestep sigma * 1000. Wan shifts sigma towards the noisy end, as its FlowMatchEulerDiscreteScheduler
does: sigma' = shift * s / (1 + (shift - 1) * s) (shift 5.0 for the 480p/720p models)."""
import torch
import torch.nn.functional as F

NUM_TRAIN_TIMESTEPS = 1000


def shift_sigmas(s, shift):
    """The scheduler's shift of noise levels s in [0, 1]: 0 and 1 stay put, the middle moves up."""
    return shift * s / (1 + (shift - 1) * s)


def sample_sigmas(batch_size, shift, sampling="uniform", device=None, num_train_timesteps=NUM_TRAIN_TIMESTEPS):
    """One shifted noise level per sample, drawn from the global RNG (so checkpoints resume it exactly).

    `uniform`: s ~ U(0, 1); `discrete`: s = k / 1000 with k uniform in 1..1000, the scheduler's grid."""
    if sampling == "uniform":
        s = torch.rand(batch_size, device=device)
    elif sampling == "discrete":
        k = torch.randint(1, num_train_timesteps + 1, (batch_size,), device=device)
        s = k.float() / num_train_timesteps
    else:
        raise ValueError(f"timestep sampling must be 'uniform' or 'discrete', got {sampling!r}")
    return shift_sigmas(s, shift)


def noisy_latents(x0, noise, sigmas):
    """x_t = (1 - sigma) x0 + sigma noise, sigma broadcast over every non-batch dimension."""
    sigma = sigmas.view(-1, *([1] * (x0.dim() - 1))).to(x0.dtype)
    return (1 - sigma) * x0 + sigma * noise


def velocity_target(x0, noise):
    return noise - x0


def flow_matching_loss(prediction, target):
    """Mean squared error in fp32, whatever the autocast dtype of the prediction."""
    return F.mse_loss(prediction.float(), target.float())


def timesteps_from_sigmas(sigmas, num_train_timesteps=NUM_TRAIN_TIMESTEPS):
    """What the transformer's time embedding is given: sigma * 1000 (a float, as Wan's pipelines pass)."""
    return sigmas * num_train_timesteps
