"""Where this process runs (env: ranks, groups, devices from torchrun's or SLURM's variables) and
preemption (SIGTERM/SIGUSR1 agreed by every rank)."""
from .env import Environment, setup_environment

__all__ = ["Environment", "setup_environment"]
