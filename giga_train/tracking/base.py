"""The interface every tracker of `train.log_with` implements."""


class Tracker:
    """Receives the run's resolved config once, then the scalars of every log step."""

    def log_config(self, config, hparams):
        """`config`: the whole resolved config (JSON-safe); `hparams`: a flat name -> scalar view of it."""

    def log(self, step, scalars):
        """`scalars`: name -> float, already reduced over ranks."""

    def close(self):
        pass
