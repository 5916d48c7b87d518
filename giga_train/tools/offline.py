"""The config's Trainer without a run: its own hooks (get_models, get_optimizers, get_dataloaders,
forward_step) on a device of our choosing, with no engine, process group, log file or project folder.
`giga-train plan` builds the model on the meta device (no memory, no time), `giga-train export` builds it
there and assigns the checkpoint's tensors."""
import contextlib
import logging

import torch

from ..config import Config, load_config
from ..distributed.env import Environment
from ..engine.single import SingleProcessStrategy
from ..errors import ConfigError
from ..launch.runners import validated_runners
from ..trainers import Trainer
from ..trainers.epochs import EpochClock


def offline_trainer(config, overrides=(), device="meta"):
    """The config's first Trainer class, instantiated without its constructor (which starts the engine) and
    given what its hooks read: config, train options, kwargs, environment (one rank on `device`)."""
    cfg = load_config(config, overrides)
    if isinstance(cfg.get("launch"), dict):
        cfg.launch.pop("gpu_ids", None)  # a GPU job is planned or exported on any machine: no GPU is used here
    classes = validated_runners(cfg)  # fills the schema's defaults
    cls = next((c for c in classes if issubclass(c, Trainer)), None)
    if cls is None:
        raise ConfigError(f"runners: {', '.join(cfg.runners)}: none is a Trainer (nothing to build a model from)")
    trainer = cls.__new__(cls)
    trainer.config, trainer.options = cfg, Config(cfg.train)
    trainer.train_config, trainer.kwargs = trainer.options, trainer.extra_options(cfg.train)
    trainer.env = Environment(rank=0, local_rank=0, world_size=1, device=torch.device(device))
    trainer._project_dir = trainer._logging_dir = str(cfg.project_dir)
    trainer.logger = logging.getLogger("giga_train")
    trainer._dataloaders, trainer._models, trainer._optimizers, trainer._schedulers = [], [], [], []
    trainer.step, trainer.ema, trainer._stepping = 0, None, False
    # One process's engine, never set up: what unwrapped_model and the data rank are read from (build_model)
    trainer.strategy = SingleProcessStrategy(trainer.env, cfg.launch, trainer.train_config)
    trainer.epoch_clock = EpochClock()
    return trainer


def build_model(trainer, fake=None):
    """trainer.get_models(config.models) with every tensor made on the trainer's device (meta), or inside
    `fake` (a FakeTensorMode: tensors that say 'cpu', so that CPU autocast applies, and hold no memory)."""
    models = trainer.prepare_arguments(trainer.config)["models"]
    with fake if fake is not None else torch.device(trainer.env.device), _quiet_meta_init():
        model = trainer.get_models(models)
    if isinstance(model, (list, tuple)):
        if len(model) != 1:
            raise ConfigError(f"get_models returned {len(model)} models: giga-train trains one module")
        model = model[0]
    trainer._models = [model]
    trainer.strategy.model = model
    return model


@contextlib.contextmanager
def _quiet_meta_init():
    """transformers warns about weights it cannot initialise on the meta device: they are assigned later."""
    logger = logging.getLogger("transformers.modeling_utils")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
