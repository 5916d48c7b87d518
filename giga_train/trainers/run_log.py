"""The training run's log, one object per train(): the trackers and progress bar (MetricLogger), throughput
and FLOPs (PerfMeter), the profiler (train.profile), and the scalars of each log line."""
import os

from ..errors import ConfigError
from ..tracking import MetricLogger, PerfMeter, StepProfiler, hparams


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
