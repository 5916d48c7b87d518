"""The Trainer's optimizer step, after the last micro-batch's backward: the engine's step (clipping, the NaN
guard's verdict), then the schedulers and the EMA. A step the NaN guard skips leaves them as they were
(where the skip is decided on the device, the scheduler step is taken back when the step is settled:
SchedulerRewind)."""


def optimizer_step(trainer, step_loss):
    """The StepResult of step `trainer.step + 1`, whose loss on this rank (its micro-batches' sum) is
    `step_loss`. Reads the trainer's public surface: train_config, strategy, nan_guard, schedulers, ema."""
    train, strategy, nan_guard, step = trainer.train_config, trainer.strategy, trainer.nan_guard, trainer.step + 1
    step_loss = step_loss * trainer.losses_book.normalize_tokens(strategy, trainer.unwrapped_model)  # by tokens
    result = strategy.step(train.max_grad_norm, measure=step % train.log_interval == 0,
                           verdict=nan_guard.verdict(strategy, step_loss))
    if result.skipped and result.nonfinite_names:  # read on the host: nothing else moves
        return result
    nan_guard.before_scheduler_step(step, result)
    for scheduler in trainer.schedulers:
        scheduler.step()
    if trainer.ema is not None:
        trainer.ema.update(skip=result.found_inf)  # a no-op on the device for a skipped step
    return result
