"""The errors of checkpoint files and folders: each says, in one line, which file or folder and why.
The CLI answers them in that one line and exits 1; nothing on disk is changed by raising them."""


class CheckpointError(Exception):
    """A checkpoint (or the project_dir holding them) cannot be used as it is."""


class UnsafeCheckpointError(CheckpointError):
    """A pickled checkpoint file names a Python object outside the allow-list: it is not loaded."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint file is missing, truncated or does not match the checksum recorded at its save."""

    def __init__(self, message, path=None):
        super().__init__(message)
        self.path = path


class ProjectLockedError(CheckpointError):
    """Another live run holds the project_dir."""
