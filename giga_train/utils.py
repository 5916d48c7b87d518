"""GigaTrain's import path `giga_train.utils` (`from giga_train import utils`): its helpers, in compat/utils.py."""
from .compat.utils import *  # noqa: F401,F403
