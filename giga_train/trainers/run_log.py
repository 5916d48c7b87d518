"""The training run's log, one object per train(): the trackers and progress bar (MetricLogger), throughput
and FLOPs (PerfMeter), the profiler (train.profile), the lines before and after training (GigaTrain's
print_before_train and print_after_train) and the scalars of each log line; the run's last line."""
import logging
import os
import time

from ..errors import ConfigError
from ..tracking import MetricLogger, PerfMeter, StepProfiler, hparams

log = logging.getLogger("giga_train")


class RunLog:
    def __init__(self, trainer):
        train, step = trainer.train_config, trainer.step
        # FLOPs are counted in the run's first step, or its second when compiling (the first compiles)
        self.perf = PerfMeter(train, trainer.device, trainer.num_processes, trainer.batch_size,
                              count_at_step=step + (2 if train.dynamo_config else 1))
        self.metrics = MetricLogger(trainer.logging_dir, train.log_with, trainer.is_main_process, step,
                                    trainer.max_steps, trainer.batch_size, show_bar=train.progress_bar,
                                    run_name=os.path.basename(trainer.project_dir), config=trainer.config.to_dict(),
                                    hparams=hparams(trainer.config, batch_size=trainer.batch_size,
                                                    world_size=trainer.num_processes), perf=self.perf)
        self.profiler = train.profile and StepProfiler(train.profile, trainer.logging_dir, trainer.process_index,
                                                       trainer.device, step)
        self.start = None  # when training started (print_before_train)

    def before_train(self, trainer):
        """The model's size, the ranks and batches, where checkpoints and logs go (trainer.print); the clock."""
        model = trainer.unwrapped_model
        trainer.print("%s: %d parameters (%d trained)", type(model).__name__,
                      sum(p.numel() for p in model.parameters()),
                      sum(p.numel() for p in trainer.get_trainable_parameters(model)))
        trainer.print("num_processes: %d, process_index: %d, data_size: %s, batch_size: %d, epoch_size: %d",
                      trainer.num_processes, trainer.process_index, trainer.data_size, trainer.batch_size,
                      trainer.epoch_size)
        trainer.print("training %s from step %d to %d (%d samples/step) on %s; checkpoints in %s, logs in %s",
                      type(model).__name__, trainer.step, trainer.max_steps, trainer.batch_size, trainer.device,
                      trainer.model_dir, trainer.logging_dir)
        self.start = time.perf_counter()

    def after_train(self, trainer):
        now = time.perf_counter()
        trainer.print("total time: %.1f s", now - (now if self.start is None else self.start))

    def counting(self, step):
        """Context of step `step`'s work (its time, and its FLOPs when this is the step they are counted in)."""
        return self.perf.counting(step)

    def step_done(self, step):
        if self.profiler:
            self.profiler.step()
        self.metrics.advance(step)

    def line(self, step, losses, lr, nan_skipped, *more):
        """Log step `step`'s line: `losses` (LossBook.take_averages), lr, the NaN guard's skips since the
        last line (None when it is off) and `more` dicts of named scalars (log_metric's, validation's), whose
        names must be new. Returns what was logged."""
        scalars = dict(losses, lr=lr)
        if nan_skipped is not None:
            scalars["nan_skipped"] = nan_skipped
        for name, value in {k: v for extra in more for k, v in extra.items()}.items():
            if name in scalars:
                raise ConfigError(f"log_metric: {name!r} is already logged (a loss, or one of lr, grad_norm):"
                                  " give the metric another name")
            scalars[name] = value
        return self.metrics.log_step(step, scalars)

    def close(self):
        if self.profiler:
            self.profiler.close()
        self.metrics.close()


def log_end(trainer, checkpoint):
    """The run's last line: where it stopped (and the signal that stopped it: trainer.preempted), the final
    loss and the newest `checkpoint`."""
    if trainer.preempted:
        log.info("preempted (%s) at step %d of %d: saved %s; rerun with train.resume=True to continue",
                 trainer.preemption.signal_name or "a signal on another rank", trainer.step, trainer.max_steps,
                 checkpoint)
        return
    loss = getattr(trainer, "last_metrics", {}).get("total_loss")
    if trainer.train_config.get("dry_run"):  # it wrote nothing: an earlier run's checkpoint is not its own
        log.info("done at step %d%s (dry run)", trainer.step, f", final loss {loss:.4f}" if loss is not None else "")
        return
    log.info("done at step %d%s; checkpoint: %s; %s", trainer.step,
             f", final loss {loss:.4f}" if loss is not None else "", checkpoint, where_the_logs_are(trainer))


def where_the_logs_are(trainer):
    """The end line's pointer to what the run logged: TensorBoard's command, else the JSONL file, else the log."""
    names, folder = trainer.train_config.log_with, trainer.logging_dir
    if "tensorboard" in names:
        return f"TensorBoard: tensorboard --logdir {folder}"
    if "jsonl" in names:
        return f"metrics: {os.path.join(folder, 'metrics.jsonl')}"
    return f"log: {os.path.join(folder, 'train.log')}"
