"""What Trainer and Tester share (GigaTrain's runner surface): built by `load(config)` from the config
section named by `SECTION`, given as keyword arguments, with the whole validated config as `config=`; or
directly, `MyTrainer(config=a_dict)`; where the job runs; the properties a project reads; the logger; media to
the trackers (a Trainer's run log, a Tester's test.log_with)."""
import contextlib
import logging
from typing import Any
import os

import torch

from ..checkpoint import list_checkpoints
from ..config import Config, load_config
from ..distributed.env import init_process_group, read_environment
from ..errors import ConfigError
from ..engine.precision import AUTOCAST_DTYPES
from ..schema.validate import ValidConfig, validated
from ..schema.train import resolve_logging_dir
from ..tracking import text_logger
from .media_log import log_media

log = logging.getLogger("giga_train")


class Runner:
    SECTION = "train"      # the config section that holds the constructor's keyword arguments
    OWN_KEYWORDS = ()      # GigaTrain's named constructor arguments; other keys of the section -> self.kwargs

    @classmethod
    def load(cls, config_or_path) -> "Runner":
        """Build the runner from a config (a dict, a file, a module path, or a project folder holding the
        config.json a run saved) and prepare it, as GigaTrain's load does."""
        config = validated(load_config(config_or_path))
        runner = cls(project_dir=config.project_dir, config=config, **config.get(cls.SECTION, {}))
        try:
            runner.prepare(**runner.prepare_arguments(config))
        except BaseException:
            with contextlib.suppress(Exception):  # the error being raised is the one to report
                runner.abandon()
            raise
        runner.prepared = True
        return runner

    @classmethod
    def check_config(cls, config) -> None:
        """The runner's own rules for a validated config, asked by the schema before any rank starts (so
        `giga-train check` says them); raise a ConfigError. A project's subclass may add some."""

    def abandon(self) -> None:
        """After an error: release what the runner opened (a process group, the engine's environment), so
        that this process can run another job."""

    def __init__(self, project_dir=None, *, config=None, **options):
        """`config`: the whole config (a dict, or what load() validated); `options`: this runner's section
        (load passes it; built directly, the config's section, updated by any given). Opens no process group
        and no engine: prepare() does."""
        if config is None:
            raise ConfigError(f"{type(self).__name__}(...): give config= (the whole config: launch, data, models)"
                              f" or build it with {type(self).__name__}.load(config)")
        if not isinstance(config, ValidConfig):  # not validated yet: built directly, from this config
            config = load_config(config)
            config.setdefault(self.SECTION, {}).update(options)
            config = validated(config, runners=[type(self)])
            options = config[self.SECTION]
        self.config = config
        self.options = Config(options)  # this runner's section as given (defaults filled by the schema)
        self.kwargs = self.extra_options(options)
        self.env = read_environment(config.launch)
        self._project_dir = os.path.normpath(project_dir or config.project_dir)
        self._logging_dir = resolve_logging_dir(self._project_dir, options.get("logging_dir"))
        self._logger = None  # opened by start_job (or at the first use)
        self._dataloaders, self._models = [], []
        self.prepared = False  # set by prepare (and load)

    def start_job(self) -> None:
        """Open the log and join the job's process group when it has several ranks: prepare calls it first."""
        self.logger  # noqa: B018  (opens it)
        if self.env.distributed:
            init_process_group(self.env, self.config.launch)

    @property
    def logger(self) -> logging.Logger:
        """The `giga_train` logger: the console and logging_dir/LOG_NAME on the main rank, silent elsewhere."""
        if self._logger is None:
            self._logger = text_logger(self._logging_dir, self.env.is_main, self.LOG_NAME)
        return self._logger

    @logger.setter
    def logger(self, logger) -> None:
        self._logger = logger

    def prepare_arguments(self, config) -> dict:
        raise NotImplementedError

    def extra_options(self, options) -> dict:
        """GigaTrain's self.kwargs: the keys of this runner's section that are not its constructor's."""
        raise NotImplementedError

    # -- where the job runs ---------------------------------------------------------------------
    @property
    def project_dir(self) -> str:
        return self._project_dir

    @property
    def logging_dir(self) -> str:
        return self._logging_dir

    @property
    def model_dir(self) -> str:
        return os.path.join(self._project_dir, "models")

    @property
    def distributed_type(self) -> str:
        return self.config.launch.distributed_type

    @property
    def num_processes(self) -> int:
        return self.env.world_size

    @property
    def process_index(self) -> int:
        return self.env.rank

    @property
    def local_process_index(self) -> int:
        return self.env.local_rank

    @property
    def is_main_process(self) -> bool:
        return self.env.is_main

    @property
    def is_local_main_process(self) -> bool:
        return self.env.local_rank == 0

    @property
    def is_last_process(self) -> bool:
        return self.env.rank == self.env.world_size - 1

    @property
    def device(self) -> torch.device:
        return self.env.device

    @property
    def mixed_precision(self) -> str:
        return self.options.get("mixed_precision") or "no"

    @property
    def dtype(self) -> torch.dtype:
        """The autocast dtype (float32 without mixed precision)."""
        return AUTOCAST_DTYPES.get(self.mixed_precision) or torch.float32

    # -- what it holds --------------------------------------------------------------------------
    @property
    def dataloaders(self) -> list:
        return self._dataloaders

    @property
    def dataloader(self) -> Any:
        return self._dataloaders[0]

    @property
    def models(self) -> list:
        return self._models

    @property
    def model(self) -> torch.nn.Module:
        return self._models[0]

    @property
    def data_size(self) -> int | None:
        """Samples in the dataset; None for a stream without a length (an IterableDataset)."""
        dataset = self.dataloader.dataset
        return len(dataset) if hasattr(dataset, "__len__") else None

    def get_checkpoint(self, checkpoint=None) -> str | list | None:
        """A checkpoint folder: `checkpoint` itself (a name starting with 'checkpoint' is looked up under
        model_dir; a list gives a list), or the newest complete one (None when there is none)."""
        if checkpoint is None:
            found = list_checkpoints(self.model_dir)
            return found[-1][1] if found else None
        paths = [self._checkpoint_path(c) for c in (checkpoint if isinstance(checkpoint, (list, tuple)) else [checkpoint])]
        missing = [p for p in paths if not os.path.exists(p)]
        if missing:
            from ..checkpoint.formats.model_layout import sharded_folder_hint
            raise ConfigError(f"checkpoint {missing[0]}: no such folder{sharded_folder_hint(missing[0])}")
        return paths if isinstance(checkpoint, (list, tuple)) else paths[0]

    def _checkpoint_path(self, checkpoint):
        """A checkpoint given by name ('checkpoint_...': under model_dir) or by path."""
        return os.path.join(self.model_dir, checkpoint) if str(checkpoint).startswith("checkpoint") else str(checkpoint)

    def print(self, msg, *args, **kwargs) -> None:
        """Log on the main process only."""
        if self.is_main_process:
            self.logger.info(msg, *args, **kwargs)

    # -- media to the trackers (media_log.py: the main rank writes, no collective) ---------------------------
    def log_image(self, name, image, step=None) -> None:
        """An image (tensor CHW/HWC, float in [0, 1] or uint8; numpy; PIL) at `step` (None: cur_step) to every tracker."""
        log_media(self, "image", name, image, step=step)

    def log_video(self, name, frames, fps=8, step=None) -> None:
        """A video (T,C,H,W or T,H,W,C frames, or a list of images), as log_image."""
        log_media(self, "video", name, frames, fps=fps, step=step)

    def log_figure(self, name, figure, step=None) -> None:
        """A matplotlib figure (anything with savefig), rendered to PNG, as log_image."""
        log_media(self, "image", name, figure, step=step)
