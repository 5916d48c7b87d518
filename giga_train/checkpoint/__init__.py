from ..errors import CheckpointError, CorruptCheckpointError, ProjectLockedError, UnsafeCheckpointError
from .formats.model_layout import read_weights
from .manager import CheckpointManager, disk_error, free_bytes, is_complete, list_checkpoints, read_meta, verify
from .host_copy import host_copy
from .formats.weights import load_weights, rng_state, save_weights, set_rng_state

__all__ = ["CheckpointError", "CorruptCheckpointError", "ProjectLockedError", "UnsafeCheckpointError", "verify",
           "CheckpointManager", "disk_error", "free_bytes", "is_complete", "list_checkpoints", "read_meta", "host_copy",
           "load_weights", "read_weights", "rng_state", "save_weights", "set_rng_state"]
