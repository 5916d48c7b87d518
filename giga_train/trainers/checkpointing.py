"""GigaTrain's checkpoint hooks of the Trainer, on our Checkpointer: when to save, what to resume from,
loading model folders into models, the rolling limit, the saved config, the trainer's own state."""
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
from .resume_config import config_applies

log = logging.getLogger("giga_train")


class CheckpointHooks:
    def save_checkpoint_step(self):
        """After every step: save when train.checkpoint_interval says (steps; epochs when training by
        epochs, a float being a fraction of one), and at the last step, as GigaTrain does; also when this
        step's validation is the best so far (train.checkpoint_best)."""
        every = checkpoint_steps(self.train_config, self.epoch_size)
        best = getattr(self, "best_checkpoint", None)
        if (every and self.epoch_clock.crossed(self.step, every)) or self.step == self.max_steps or \
                (best and best.due == self.step):
            self.save_checkpoint()

    def save_checkpoint(self):
        """Write a checkpoint of this step (Checkpointer.save); the NaN guard settles first, so that a stop
        comes before anything is written."""
        self._settle_skips(wait=True)
        self.wait_for_checkpoint()  # at most one save in flight: its error surfaces here
        # GigaTrain's name: checkpoint_epoch_{cur_epoch}_step_{cur_step}, cur_epoch = ceil(step / epoch_size)
        self.checkpoints.save(self.step, self.cur_epoch, self.checkpoint_meta(), self.state_dict)

    def wait_for_checkpoint(self, raise_errors=True):
        """Return once no checkpoint is being written in the background (train.checkpoint_async)."""
        self.checkpoints.wait(raise_errors)

    def resume(self, checkpoint=None):
        """Continue from `checkpoint` (a checkpoint folder, or its name under model_dir; None: the newest
        complete one), written by any strategy at any world size, or by the real GigaTrain 1.1."""
        named = None if checkpoint is None else self._checkpoint_path(checkpoint)
        if named is None and self.checkpoints.latest() is None:  # none of ours: a GigaTrain job moved here?
            named = latest_gigatrain_checkpoint(self.model_dir)
        if named is not None and is_gigatrain_checkpoint(named):
            return self.resume_gigatrain(named)
        # the newest intact checkpoint, or the one named; checksums verified (one line for a damaged file)
        path = self.checkpoints.resume_path(True if named is None else named)
        if path is None:
            return  # the checkpoint manager said so, in one line
        with config_applies(self, path):  # the config's hyper-parameters apply; a state that cannot fit: one line
            self.checkpoints.load(path, self.load_state_dict)
        # the epoch as the folder names it (GigaTrain's cur_epoch), not the 0-based epoch the stream is in
        log.info("resumed from %s at step %d (epoch %d)", path, self.step, self.cur_epoch)

    def resume_gigatrain(self, folder):
        """Continue a run of the real GigaTrain 1.1 from its checkpoint `folder` (gigatrain_import.py):
        weights, optimizer state (CAME8Bit's converted), schedulers, step, the data position the step
        gives, EMA and RNG, through the same strategy calls as our own checkpoints."""
        from ..module_dict import ModuleDict
        self.wait_for_checkpoint()
        module, strategy = self.unwrapped_model, self.strategy
        state = read_gigatrain_checkpoint(
            folder, strategy.optimizer_layout(), self.optimizers,
            members=list(module.keys()) if isinstance(module, ModuleDict) else None, rank=self.process_index,
            data_position=self._data_position)
        strategy.load_model_state(state.weights, self.train_config.checkpoint_strict)
        if state.optimizer is not None:
            strategy.load_full_state(None, state.optimizer)
        self.load_state_dict(state.training_state)
        if self.ema is not None:
            if state.ema_weights is None:
                log.warning("resume: %s holds no EMA (GigaTrain ran without with_ema); the average starts from"
                            " the weights", folder)
            self.ema.load_state_dict(state.ema_weights or state.weights, state.ema_step,
                                  self.train_config.checkpoint_strict, folder)
        if state.precision is not None and getattr(strategy, "precision", None) is not None:
            strategy.precision.load_state_dict(state.precision)
        if state.rng is not None:
            set_rng_state(state.rng)
        log.info("resumed GigaTrain's checkpoint %s at step %d (epoch %d)", folder, self.step, self.cur_epoch)

    def _data_position(self, step):
        """The data stream's state after `step` optimizer steps from the start (GigaTrain's rule)."""
        micro = step * self.gradient_accumulation_steps
        epoch, batch_in_epoch = divmod(micro, len(self._stream))
        state = dict(epoch=epoch, batch_in_epoch=batch_in_epoch)
        if hasattr(self._stream, "global_batch"):
            state.update(samples_seen=micro * self._stream.global_batch, global_batch=self._stream.global_batch)
        return state

    def load_checkpoint(self, checkpoint, models, strict=True):
        """Load model folders (`<checkpoint>/<name>/`, a diffusers or transformers folder) into the model
        among `models` whose class the folder's config.json names (`_class_name`, or transformers'
        `architectures`), as GigaTrain does between the stages of a project. A folder without config.json
        (a plain module's) goes into the one model given."""
        if checkpoint is None:
            return
        folders = self.get_checkpoint(checkpoint)
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
            self.print("loaded %s from %s%s", class_name or module_class_name(model), folder,
                       "" if strict else f" ({result})")

    def remove_checkpoint(self, total_limit=None):
        """GigaTrain's clean-up of model_dir, on the main process: the rolling limit (train.checkpoint_total_limit,
        or `total_limit`) over this run's own checkpoints, and with checkpoint_save_optimizer=False their
        optimizer state dropped from all but the two newest (Checkpointer.clean_up). Saves call it too."""
        if self.is_main_process:
            self.checkpoints.clean_up(total_limit)

    def save_config(self, config):
        """The run's config as project_dir/config.json (main process), which load_config(project_dir) reads."""
        if not self.is_main_process:
            return
        os.makedirs(self.project_dir, exist_ok=True)
        with open(os.path.join(self.project_dir, "config.json"), "w") as f:
            json.dump(config.to_dict() if hasattr(config, "to_dict") else dict(config), f, indent=4, default=repr)

    def state_dict(self):
        """The trainer's own state in a checkpoint (training_state.pt): scheduler, data position, step."""
        return {"schedulers": [s.state_dict() for s in self.schedulers], "data": self._stream.state_dict(),
                "step": self.step, "epoch_offset": self.epoch_clock.state_dict()}

    def load_state_dict(self, state):
        for scheduler, saved in zip(self.schedulers, state.get("schedulers") or [state["scheduler"]]):
            scheduler.load_state_dict(saved)
        self._stream.load_state_dict(state["data"])
        self.step = int(state["step"])
        self.epoch_clock.resumed(self, state["data"], state.get("epoch_offset"))

    def checkpoint_meta(self):
        """What meta.json records beside the files."""
        return dict(step=self.step, epoch=self.epoch, samples_seen=getattr(self._stream, "samples_seen", None),
                    world_size=self.num_processes, distributed_type=self.distributed_type,
                    mixed_precision=self.mixed_precision, ema=self.ema is not None, config=self.config.to_dict())
