from .manager import CheckpointManager, is_complete, list_checkpoints, read_meta
from .state import load_weights, rng_state, save_weights, set_rng_state

__all__ = ["CheckpointManager", "is_complete", "list_checkpoints", "read_meta", "load_weights", "rng_state",
           "save_weights", "set_rng_state"]
