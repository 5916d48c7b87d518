"""Every error type a user sees. The lowest layer: it imports nothing of ours, so everyone can import it."""


class ConfigError(ValueError):
    """Bad input. The message is one line that names the key, file or value at fault."""


class RegistryError(ValueError):
    """An unknown name, or arguments a registered class does not take. The message is one line."""


class TrainingStopped(RuntimeError):
    """A run stopped on purpose, with a one-line reason; the launcher reports it once and never retries."""


class CheckpointError(Exception):
    """A checkpoint (or the project_dir holding them) cannot be used as it is: one line naming the file
    or folder. Answered with exit 1; raising it changes nothing on disk."""

    def __str__(self):
        return str(self.args[0]) if self.args else ""  # the line; further args (the folder) are for code


class UnsafeCheckpointError(CheckpointError):
    """A pickled checkpoint file names a Python object outside the allow-list: it is not loaded."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint file is missing, truncated or does not match the checksum recorded at its save."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint, or a folder made from one (convert, export), could not be written: a full disk, a
    quota, a file-size limit, permissions. One line naming the folder; nothing half-written is left."""


class ProjectLockedError(CheckpointError):
    """Another live run holds the project_dir, or it cannot be written."""


class RankFailed(RuntimeError):
    """A rank of a launched job failed (its own traceback, for an error in the user's code, is above;
    a collective that timed out is the watchdog's): the launcher's one line."""
