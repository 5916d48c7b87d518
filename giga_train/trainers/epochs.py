"""Epochs counted by the samples seen: after a resume with another global batch (batch_size_per_gpu, the
world size or the accumulation changed), the steps taken before it count by the data they consumed, so
max_epochs trains the epochs asked for and the checkpoint names match the data's epochs. `offset` is the
steps of the current batch the position stands for, minus the steps taken; it is saved with the trainer's
state, so a later resume keeps it. Beside it, the sizes the Trainer's epoch_size and batch_size give."""
import logging
import math

log = logging.getLogger("giga_train")


class EpochClock:
    def __init__(self):
        self.offset = 0.0

    def steps(self, step):
        """The step `step` stands for in epochs of the current epoch size."""
        return step + self.offset

    def crossed(self, step, every):
        """Whether step `step` reached a multiple of `every` (steps of the current epoch size): the step
        % every of a run that never changed its batch."""
        return math.floor(self.steps(step) / every) > math.floor(self.steps(step - 1) / every)

    def state_dict(self):
        return self.offset

    def resumed(self, trainer, data_state, saved_offset):
        """After the data stream's position was restored from `data_state` (the trainer's step too)."""
        self.offset = float(saved_offset or 0.0)
        stream = trainer._stream
        saved_batch = data_state.get("global_batch")
        changed = saved_batch is not None and saved_batch != stream.global_batch and hasattr(stream, "__len__")
        if changed:
            position = stream.epoch * len(stream) + stream.batch_in_epoch  # micro-batches, in the current batch
            self.offset = position / trainer.gradient_accumulation_steps - trainer.step
        if not self.offset:
            return
        max_steps = trainer.max_steps
        for scheduler in trainer.schedulers:  # a value scheduler's horizon (the trainer passed max_steps)
            for function in getattr(scheduler, "lr_lambdas", []):
                values = getattr(function, "__self__", None)
                if getattr(values, "max_steps", None) is not None:
                    values.max_steps = max_steps
        if changed:
            log.warning("resume: global batch %d -> %d samples; step %d stands at epoch %.2f of the data, and the"
                        " run counts epochs from the samples seen (train.max_epochs=%s: until step %d)", saved_batch,
                        stream.global_batch, trainer.step, self.steps(trainer.step) / trainer.epoch_size,
                        trainer.train_config.max_epochs, max_steps)


def steps_per_epoch(stream, accumulation, max_steps):
    """Optimizer steps per epoch of `stream`. A stream without a length (an IterableDataset) counts the whole
    run, `max_steps` (the schema requires it for one), as one epoch for what is counted in epochs."""
    if not hasattr(stream, "__len__"):
        return max_steps
    return int(math.ceil(len(stream) / accumulation))


def samples_per_step(stream, data_world_size, accumulation, data_parallel_size):
    """Samples per optimizer step, all ranks together (`stream`'s batch_size per rank, 1 without one)."""
    per_rank = getattr(stream, "batch_size", None) or 1
    return per_rank * data_world_size * accumulation // data_parallel_size


def max_steps_by_epochs(max_epochs, epoch_size, clock):
    return int(math.ceil(max_epochs * epoch_size - clock.offset))
