"""Every error type a user sees. The lowest layer: it imports nothing of ours, so everyone can import it."""


class ConfigError(ValueError):
    """Bad input. The message is one line that names the key, file or value at fault."""


class RegistryError(ValueError):
    """An unknown name, or arguments a registered class does not take. The message is one line."""


class TrainingStopped(RuntimeError):
    """A run stopped on purpose, with a one-line reason; the launcher reports it once and never retries."""
