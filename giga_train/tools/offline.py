"""The config's Trainer without a run: its own hooks (get_models, get_optimizers, get_dataloaders,
forward_step) on a device of our choosing, with no engine, process group, log file or project folder.
`giga-train plan` builds the model on the meta device (no memory, no time), `giga-train export` builds it
there and assigns the checkpoint's tensors."""
import contextlib
import logging

import torch

from ..config import load_config
from ..distributed.env import Environment
from ..engine.single import SingleProcessStrategy
from ..errors import ConfigError
from ..launch.runners import runner_classes
from ..schema.validate import validate_config
from ..trainers import Trainer
from ..trainers.building import the_one_model
from ..trainers.lora import with_lora


def offline_trainer(config, overrides=(), device="meta"):
    """The config's first Trainer class, built (which opens no engine nor process group) to run in one rank
    on `device`; never prepared."""
    cfg = load_config(config, overrides)
    if isinstance(cfg.get("launch"), dict):
        cfg.launch.pop("gpu_ids", None)  # a GPU job is planned or exported on any machine: no GPU is used here
    # The job runs on its GPU, not here: fp8's need of a CUDA GPU is checked where it runs (torchao's float8
    # Linears still trace on fake CPU tensors), so the schema is filled as for bf16 and fp8 put back.
    fp8 = isinstance(cfg.get("train"), dict) and cfg["train"].get("mixed_precision") == "fp8"
    if fp8:
        cfg["train"]["mixed_precision"] = "bf16"
    cfg = validate_config(cfg)  # fills the schema's defaults
    if fp8:
        cfg.train.mixed_precision = "fp8"
    cls = next((c for c in runner_classes(cfg) if issubclass(c, Trainer)), None)
    if cls is None:
        raise ConfigError(f"runners: {', '.join(map(str, cfg.runners))}: none is a Trainer (nothing to build a model from)")
    trainer = cls(config=cfg, **cfg.train)
    trainer.env = Environment(rank=0, local_rank=0, world_size=1, device=torch.device(device))
    trainer.logger = logging.getLogger("giga_train")  # no log file: nothing runs
    # One process's engine, never set up: what unwrapped_model and the data rank are read from (build_model)
    trainer.strategy = SingleProcessStrategy(trainer.env, cfg.launch, trainer.train_config)
    return trainer


def build_model(trainer, fake=None):
    """trainer.get_models(config.models) with every tensor made on the trainer's device (meta), or inside
    `fake` (a FakeTensorMode: tensors that say 'cpu', so that CPU autocast applies, and hold no memory)."""
    models = trainer.prepare_arguments(trainer.config)["models"]
    with fake if fake is not None else torch.device(trainer.env.device), _quiet_meta_init():
        model = trainer.get_models(models)
    model = with_lora(the_one_model(model), trainer.train_config.get("lora"))
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
