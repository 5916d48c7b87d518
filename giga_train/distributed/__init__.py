from . import strategies  # noqa: F401  (registers the strategies)
from .env import Environment, setup_environment
from .launch import launch_from_config

__all__ = ["Environment", "launch_from_config", "setup_environment"]
