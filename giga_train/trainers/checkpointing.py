"""The Trainer's checkpointing part, on our Checkpointer: when a step saves, what to resume from (ours, or
the real GigaTrain 1.1's checkpoints), and the data position a GigaTrain step gives; beside it, loading
model folders into models and the saved config (GigaTrain's load_checkpoint and save_config, which need no
run). The Trainer's GigaTrain hooks (save_checkpoint, resume, state_dict, checkpoint_meta, ...) delegate
here; the best checkpoint (train.checkpoint_best) and early stopping (train.early_stopping) are this part's."""
import json
import logging
import os

from ..checkpoint import set_rng_state
from ..compat.gigatrain_checkpoint import (is_gigatrain_checkpoint, latest_gigatrain_checkpoint,
                                            read_gigatrain_checkpoint)
from ..checkpoint.manager import check_intact
from ..checkpoint.formats.model_layout import class_name as module_class_name, folder_class_name
from ..errors import ConfigError
from ..schema.train import checkpoint_steps
from ..compat.utils import load_state_dict
from .best_checkpoint import BestCheckpoint
from .early_stopping import EarlyStopping
from .resume_config import config_applies

log = logging.getLogger("giga_train")


class TrainerCheckpoints:
    """`trainer`'s checkpoints in `checkpointer` (a Checkpointer); `stream`: the data stream it reads.
    Reads the trainer's public surface only (step, its hooks, strategy, optimizers, ema)."""

    def __init__(self, trainer, checkpointer, stream):
        self.trainer, self.checkpointer, self.stream = trainer, checkpointer, stream
        best = trainer.train_config.checkpoint_best
        self.best = BestCheckpoint(best, checkpointer.folders, trainer.is_main_process) if best else None
        stopping = trainer.train_config.get("early_stopping")
        self.early_stopping = EarlyStopping(stopping, checkpointer.folders) if stopping else None

    def due(self):
        """Whether this step saves: train.checkpoint_interval (steps; epochs when training by epochs, a
        float being a fraction of one), the last step, as GigaTrain does; or the best validation so far
        (train.checkpoint_best) was this step's; or the run stops early here."""
        trainer, best = self.trainer, self.best
        every = checkpoint_steps(trainer.train_config, trainer.epoch_size)
        return bool((every and trainer.epoch_clock.crossed(trainer.step, every))
                    or trainer.step == trainer.max_steps or (best is not None and best.due == trainer.step)
                    or self.stopped_early())

    def validated(self, step, results):
        """After a validation at `step`: with train.checkpoint_best, its results may make this step the best."""
        if self.best is not None:
            self.best.update(step, results)
        if self.early_stopping is not None:
            self.early_stopping.update(step, results)

    def stopped_early(self):
        """Whether the run stops at this step (train.early_stopping): this run decided it, or it resumed the
        checkpoint of a run that did (and the config's patience is not higher)."""
        return self.early_stopping is not None and self.early_stopping.stopped(self.trainer.step)

    def save(self):
        """Write a checkpoint of this step once the NaN guard has settled it (so a stop comes before anything is
        written), at most one save in flight (the one before is waited for, and its error surfaces, first);
        then the best checkpoint's record."""
        trainer = self.trainer
        if trainer.train_config.get("dry_run"):
            return  # a dry run writes no checkpoint (launch/dry_run.py)
        trainer.nan_guard.settle(trainer.step, wait=True)
        trainer.wait_for_checkpoint()
        # GigaTrain's name: checkpoint_epoch_{cur_epoch}_step_{cur_step}, cur_epoch = ceil(step / epoch_size)
        self.checkpointer.save(trainer.step, trainer.cur_epoch, trainer.checkpoint_meta(), trainer.state_dict)
        if self.best is not None:
            self.best.saved(trainer.step, trainer.cur_epoch)

    def save_last(self):
        """At the end of training (or a preemption): a checkpoint of this step unless the newest is one; all
        written when it returns."""
        trainer = self.trainer
        trainer.wait_for_checkpoint()  # latest_step() must see the save in flight
        if self.checkpointer.latest_step() != trainer.step:
            trainer.save_checkpoint()
        trainer.wait_for_checkpoint()

    def trainer_state(self):
        """The trainer's own state in a checkpoint (training_state.pt): schedulers, data position, step, the
        epoch clock's offset, and the best checkpoint's record."""
        trainer = self.trainer
        state = {"schedulers": [s.state_dict() for s in trainer.schedulers], "data": self.stream.state_dict(),
                 "step": trainer.step, "epoch_offset": trainer.epoch_clock.state_dict()}
        if self.best is not None:
            state["best"] = self.best.state_dict()
        if self.early_stopping is not None:
            state["early_stopping"] = self.early_stopping.state_dict()
        return state

    def load_trainer_state(self, state):
        """Restore what trainer_state returned (or a GigaTrain checkpoint's training state)."""
        trainer = self.trainer
        for scheduler, saved in zip(trainer.schedulers, state.get("schedulers") or [state["scheduler"]]):
            scheduler.load_state_dict(saved)
        self.stream.load_state_dict(state["data"])
        trainer.step = int(state["step"])
        trainer.epoch_clock.resumed(trainer, state["data"], state.get("epoch_offset"))
        if self.best is not None:
            self.best.load_state_dict(state.get("best"))
        if self.early_stopping is not None:
            self.early_stopping.load_state_dict(state.get("early_stopping"))

    def meta(self):
        """What meta.json records beside the files."""
        trainer = self.trainer
        return dict(step=trainer.step, epoch=trainer.epoch, samples_seen=getattr(self.stream, "samples_seen", None),
                    world_size=trainer.num_processes, distributed_type=trainer.distributed_type,
                    mixed_precision=trainer.mixed_precision, ema=trainer.ema is not None,
                    config=trainer.config.to_dict())

    def resume(self, named):
        """Continue from the checkpoint folder `named` (None: the newest complete one), written by any
        strategy at any world size, or by the real GigaTrain 1.1."""
        trainer = self.trainer
        if named is None and self.checkpointer.latest() is None:  # none of ours: a GigaTrain job moved here?
            named = latest_gigatrain_checkpoint(trainer.model_dir)
        if named is not None and is_gigatrain_checkpoint(named):
            return trainer.resume_gigatrain(named)
        # the newest intact checkpoint, or the one named; checksums verified (one line for a damaged file)
        path = self.checkpointer.resume_path(True if named is None else named)
        if path is None:
            return  # the checkpoint manager said so, in one line
        with config_applies(trainer, path):  # the config's hyper-parameters apply; a state that cannot fit: one line
            self.checkpointer.load(path, trainer.load_state_dict)
        # the epoch as the folder names it (GigaTrain's cur_epoch), not the 0-based epoch the stream is in
        log.info("resumed from %s at step %d (epoch %d)", path, trainer.step, trainer.cur_epoch)

    def resume_gigatrain(self, folder):
        """Continue a run of the real GigaTrain 1.1 from its checkpoint `folder` (gigatrain_checkpoint.py):
        weights, optimizer state (CAME8Bit's converted), schedulers, step, the data position the step
        gives, EMA and RNG, through the same strategy calls as our own checkpoints."""
        from ..module_dict import ModuleDict
        trainer = self.trainer
        trainer.wait_for_checkpoint()
        module, strategy = trainer.unwrapped_model, trainer.strategy
        state = read_gigatrain_checkpoint(
            folder, strategy.optimizer_layout(), trainer.optimizers,
            members=list(module.keys()) if isinstance(module, ModuleDict) else None, rank=trainer.process_index,
            data_position=self.data_position)
        with config_applies(trainer, folder):  # as for our checkpoints: the config's hyper-parameters apply
            strategy.load_model_state(state.weights, trainer.train_config.checkpoint_strict)
            if state.optimizer is not None:
                strategy.load_full_state(None, state.optimizer)
            trainer.load_state_dict(state.training_state)
        if trainer.ema is not None:
            if state.ema_weights is None:
                log.warning("resume: %s holds no EMA (GigaTrain ran without with_ema); the average starts from"
                            " the weights", folder)
            trainer.ema.load_state_dict(state.ema_weights or state.weights, state.ema_step,
                                        trainer.train_config.checkpoint_strict, folder)
        if state.precision is not None and getattr(strategy, "precision", None) is not None:
            strategy.precision.load_state_dict(state.precision)
        if state.rng is not None:
            set_rng_state(state.rng)
        log.info("resumed GigaTrain's checkpoint %s at step %d (epoch %d)", folder, trainer.step, trainer.cur_epoch)

    def data_position(self, step):
        """The data stream's state after `step` optimizer steps from the start (GigaTrain's rule)."""
        micro = step * self.trainer.gradient_accumulation_steps
        epoch, batch_in_epoch = divmod(micro, len(self.stream))
        state = dict(epoch=epoch, batch_in_epoch=batch_in_epoch)
        if hasattr(self.stream, "global_batch"):
            state.update(samples_seen=micro * self.stream.global_batch, global_batch=self.stream.global_batch)
        return state


def load_model_folders(folders, models, strict=True, say=log.info):
    """Load model folders (`<checkpoint>/<name>/`, a diffusers or transformers folder) into the model among
    `models` whose class the folder's config.json names (`_class_name`, or transformers' `architectures`),
    as GigaTrain's load_checkpoint does between the stages of a project. A folder without config.json (a
    plain module's) goes into the one model given."""
    models = list(models) if isinstance(models, (list, tuple)) else [models]
    for folder in folders if isinstance(folders, list) else [folders]:
        try:
            class_name = folder_class_name(folder)
        except (OSError, ValueError) as e:
            raise ConfigError(f"{os.path.join(folder, 'config.json')}: cannot read the model's class ({e})") from None
        if class_name is None and len(models) != 1:
            raise ConfigError(f"{folder}: no config.json naming the model's class, and {len(models)} models"
                              " given (give a model folder, e.g. <checkpoint>/<model_name>, or one model)")
        model = models[0] if class_name is None else next(
            (m for m in models if module_class_name(m) == class_name), None)
        if model is None:
            raise ConfigError(f"{folder}: holds a {class_name}, and no model given is one (No model loaded)")
        check_intact(folder, "loaded")  # inside a checkpoint of ours: its checksums, as resume
        try:
            state = load_state_dict(folder)
        except (OSError, ValueError) as e:  # names the folder or file
            raise ConfigError(f"load_checkpoint: {e}") from None
        result = model.load_state_dict(state, strict=strict)
        say("loaded %s from %s%s", class_name or module_class_name(model), folder, "" if strict else f" ({result})")


def write_config(config, project_dir):
    """The run's config as project_dir/config.json, which load_config(project_dir) reads."""
    os.makedirs(project_dir, exist_ok=True)
    with open(os.path.join(project_dir, "config.json"), "w") as f:
        json.dump(config.to_dict() if hasattr(config, "to_dict") else dict(config), f, indent=4, default=repr)
