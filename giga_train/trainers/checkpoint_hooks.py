"""GigaTrain's checkpoint hooks of the Trainer, on our Checkpointer: when to save, what to resume from,
loading model folders into models, the rolling limit, the saved config, the trainer's own state."""
import json
import logging
import os

from ..checkpoint.layout import class_name as module_class_name, folder_class_name
from ..errors import ConfigError
from ..schema import checkpoint_steps
from ..utils import load_state_dict

log = logging.getLogger("giga_train")


class CheckpointHooks:
    def save_checkpoint_step(self):
        """After every step: save when train.checkpoint_interval says (steps; epochs when training by
        epochs, a float being a fraction of one), and at the last step, as GigaTrain does."""
        every = checkpoint_steps(self.train_config, self.epoch_size)
        if (every and self.step % every == 0) or self.step == self.max_steps:
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
        complete one), written by any strategy at any world size."""
        # the newest intact checkpoint, or the one named; checksums verified (one line for a damaged file)
        path = self.checkpoints.resume_path(True if checkpoint is None else self._checkpoint_path(checkpoint))
        if path is None:
            return  # the checkpoint manager said so, in one line
        self.checkpoints.load(path, self.load_state_dict)
        # the epoch as the folder names it (GigaTrain's cur_epoch), not the 0-based epoch the stream is in
        log.info("resumed from %s at step %d (epoch %d)", path, self.step, self.cur_epoch)

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
                "step": self.step}

    def load_state_dict(self, state):
        for scheduler, saved in zip(self.schedulers, state.get("schedulers") or [state["scheduler"]]):
            scheduler.load_state_dict(saved)
        self._stream.load_state_dict(state["data"])
        self.step = int(state["step"])

    def checkpoint_meta(self):
        """What meta.json records beside the files."""
        return dict(step=self.step, epoch=self.epoch, samples_seen=getattr(self._stream, "samples_seen", None),
                    world_size=self.num_processes, distributed_type=self.distributed_type,
                    mixed_precision=self.mixed_precision, ema=self.ema is not None, config=self.config.to_dict())
