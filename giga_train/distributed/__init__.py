from . import strategies  # noqa: F401  (registers the strategies)
from .env import Environment, setup_environment

__all__ = ["Environment", "setup_environment"]
