"""The training loop. Subclass Trainer, write get_models and forward_step; the config does the rest."""
import logging
import os
import random

import numpy as np
import torch

from ..checkpoint.checkpointer import Checkpointer
from ..config import load_config
from ..data import DataStream
from ..distributed.env import setup_environment
from ..distributed.parallelize import parallelize
from ..distributed.preemption import PreemptionSignals
from ..ema import EMA
from ..optimizers import build_optimizer
from ..registry import SCHEDULERS, STRATEGIES
from ..schema import validate_config
from ..tracking import MetricLogger, text_logger
from .nan_guard import NanGuard, SchedulerRewind

log = logging.getLogger("giga_train")


def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Trainer:
    """Runs the whole job described by a config. Override `get_models` and `forward_step`."""

    # -- what a user writes ---------------------------------------------------------------------
    def get_models(self, model_config):
        """Return an nn.Module, or a ModuleDict of several (called with `config.models`)."""
        raise NotImplementedError(f"{type(self).__name__} must define get_models(self, model_config)")

    def forward_step(self, batch_dict):
        """Return the loss tensor, or a dict of named losses (each logged; their sum is trained)."""
        raise NotImplementedError(f"{type(self).__name__} must define forward_step(self, batch_dict)")

    def get_trainable_parameters(self, model):
        """The parameters the optimizer updates (default: those with requires_grad)."""
        return [p for p in model.parameters() if p.requires_grad]

    # -- set-up ---------------------------------------------------------------------------------
    def __init__(self, config):
        self.config = cfg = load_config(config)
        validate_config(cfg)
        self.train_config = train = cfg.train
        self.env = setup_environment(cfg.launch)
        self.device = self.env.device
        self.project_dir = cfg.project_dir
        self.model_dir = os.path.join(cfg.project_dir, "models")
        self.log_dir = os.path.join(cfg.project_dir, "logs")
        text_logger(self.log_dir, self.env.is_main)
        self.strategy = STRATEGIES.get(cfg.launch.distributed_type)(
            self.env, cfg.launch, train, micro_batch_size=cfg.dataloaders.train.batch_size_per_gpu)
        self.dtype = self.strategy.precision.dtype or torch.float32

        seed_everything(train.seed)  # every rank builds the same initial weights
        self.model, self.optimizer = parallelize(
            self.get_models(cfg.models), self.strategy, train, cfg.launch.fsdp_config,
            lambda module: build_optimizer(cfg.optimizers, self.get_trainable_parameters(module)))
        self.scheduler = SCHEDULERS.build(cfg.schedulers, self.optimizer)
        self.ema = EMA(self.unwrapped_model, train.ema_decay) if train.with_ema else None

        self.data = DataStream(cfg.dataloaders.train, train.seed, self.env.rank, self.env.world_size, self.device)
        self.accumulation = train.gradient_accumulation_steps
        self.max_steps = train.max_steps or max(train.max_epochs * len(self.data) // self.accumulation, 1)
        self.checkpoints = Checkpointer(self.strategy, self.model_dir, train, self.ema)
        self.step = 0
        self.nan_guard = NanGuard(train.nan_policy, train.max_nan_steps, self.env.is_main, self.checkpoints.latest)
        self._scheduler_rewind = SchedulerRewind(self.scheduler, self.optimizer)
        self.preempted = False  # set when SIGTERM/SIGUSR1 (on any rank) stops the run after a checkpoint
        seed_everything(train.seed + self.env.rank)  # ranks differ from here on (dropout, noise)
        path = self.checkpoints.resume_path(train.resume)
        if path is not None:
            self.load_checkpoint(path)

    @property
    def unwrapped_model(self):
        return self.strategy.unwrap()

    @property
    def epoch(self):
        return self.data.epoch

    @property
    def is_main_process(self):
        return self.env.is_main

    @property
    def rank(self):
        return self.env.rank

    @property
    def world_size(self):
        return self.env.world_size

    # -- the loop -------------------------------------------------------------------------------
    def train(self):
        train = self.train_config
        if self.step >= self.max_steps:
            log.info("already at step %d of %d: nothing to train", self.step, self.max_steps)
            return self._finish()
        samples_per_step = self.data.batch_size * self.env.world_size * self.accumulation
        metrics = MetricLogger(self.log_dir, train.log_with, self.env.is_main, self.step, self.max_steps,
                               samples_per_step, show_bar=train.progress_bar)
        log.info("training %s from step %d to %d (%d samples/step) on %s; checkpoints in %s, logs in %s",
                 type(self.unwrapped_model).__name__, self.step, self.max_steps, samples_per_step,
                 self.device, self.model_dir, self.log_dir)
        self.model.train()
        sums, counted = {}, 0  # named losses of the updated steps, summed on the device since the last log
        self.preemption = PreemptionSignals()
        try:
            with self.preemption:
                while self.step < self.max_steps:
                    losses, result = self.train_step()
                    self.step += 1
                    self.nan_guard.record(self.step, result)
                    self._settle_skips()  # the flags that have reached the host; never waits
                    sums, counted = self._add_losses(sums, counted, losses, result)
                    metrics.advance(self.step)
                    if self.step % train.log_interval == 0 or self.step == self.max_steps:
                        self._settle_skips(wait=True)
                        scalars = self._scalars(sums, counted, result.grad_norm)
                        self.last_metrics = metrics.log_step(self.step, scalars)
                        sums, counted = {}, 0
                    if train.checkpoint_interval and self.step % train.checkpoint_interval == 0:
                        self.save_checkpoint()
                    # the same step on every rank; so is a stop that one rank's settle found first
                    preempted, stopping = self.preemption.agreed(self.env, self.nan_guard.stopping is not None)
                    if stopping:
                        self._settle_skips(wait=True)  # raises TrainingStopped, the same on every rank
                    if preempted:
                        self.preempted = True
                        break
                self._settle_skips(wait=True)  # also after a preemption: every rank is here
                self.wait_for_checkpoint()  # latest() must see the save in flight
                if self.checkpoints.latest_step() != self.step:
                    self.save_checkpoint()
                self.wait_for_checkpoint()
        except BaseException:
            self.wait_for_checkpoint(raise_errors=False)  # what was taken before the error still lands
            raise
        finally:
            metrics.close()
        return self._finish()

    def train_step(self):
        """One optimizer step over `gradient_accumulation_steps` micro-batches.

        Returns (named losses averaged over the micro-batches, as device tensors; the StepResult).
        A step the NaN guard skips leaves the optimizer, the scheduler and the EMA untouched (where the
        skip is decided on the device, the scheduler is rewound when the step is settled)."""
        train, strategy = self.train_config, self.strategy
        totals, trained = {}, 0
        for micro in range(self.accumulation):
            batch = next(self.data)
            # The trainer owns the accumulation boundary: only the last micro-step syncs gradients.
            with strategy.accumulating(micro < self.accumulation - 1):
                with strategy.autocast():
                    output = self.forward_step(batch)
                losses = output if isinstance(output, dict) else {"loss": output}
                loss = sum(losses.values()) / self.accumulation
                strategy.backward(loss)
            trained = trained + loss.detach()
            for name, value in losses.items():
                totals[name] = totals.get(name, 0) + value.detach().float() / self.accumulation
            if len(losses) > 1:
                total_name = "total_loss" if "loss" in losses else "loss"
                totals[total_name] = totals.get(total_name, 0) + loss.detach().float()
        result = strategy.step(train.max_grad_norm, measure=(self.step + 1) % train.log_interval == 0,
                               verdict=self.nan_guard.verdict(strategy, trained))
        if result.skipped and result.nonfinite_names:  # read on the host: nothing else moves
            return totals, result
        if result.found_inf is not None:  # the host learns later whether this step was skipped
            self._scheduler_rewind.remember(self.step + 1)
        self.scheduler.step()
        if self.ema is not None:
            self.ema.update(skip=result.found_inf)  # a no-op on the device for a skipped step
        return totals, result

    # -- the NaN guard's host side --------------------------------------------------------------
    @staticmethod
    def _add_losses(sums, counted, losses, result):
        """Add a step's losses to the sums since the last log, leaving out a skipped step's (so one NaN
        does not hide the others'): masked on the device by its flag when the skip was decided there."""
        if result.found_inf is not None:
            skipped = result.found_inf > 0
            for name, value in losses.items():
                sums[name] = sums.get(name, 0) + torch.where(skipped, 0.0, value)
            return sums, counted + (1.0 - result.found_inf)  # a device count
        if not result.nonfinite_names:
            for name, value in losses.items():
                sums[name] = sums.get(name, 0) + value
            counted += 1
        return sums, counted

    def _settle_skips(self, wait=False):
        """Settle the NaN guard's pending steps (NanGuard.settle); never waits unless `wait`."""
        self.nan_guard.settle(self.step, wait, self._scheduler_rewind.settled)

    def _scalars(self, sums, counted, grad_norm):
        """Host values for logging: the one place the loop waits for the device. `counted`: the steps
        in `sums` (skipped steps are left out, so one NaN does not hide the loss of the others); a
        device tensor where the skips were decided on the device."""
        names = sorted(sums)
        on_device = torch.is_tensor(counted)
        values = [sums[n] / (counted.clamp(min=1) if on_device else counted) for n in names]
        values += ([counted.float()] if on_device else []) + ([grad_norm.float()] if grad_norm is not None else [])
        values = self.strategy.reduce_mean(torch.stack(values)).tolist() if values else []
        scalars = dict(zip(names, values))
        if on_device and values[len(names)] == 0:  # every step since the last log was skipped
            scalars = {}
        if grad_norm is not None:
            scalars["grad_norm"] = values[-1]
        scalars["lr"] = self.scheduler.get_last_lr()[0]
        if self.nan_guard.enabled:
            scalars["nan_skipped"] = self.nan_guard.take_window()
        return scalars

    def _finish(self):
        self.wait_for_checkpoint()
        loss = getattr(self, "last_metrics", {}).get("loss")
        where = self.checkpoints.latest()
        if self.preempted:
            log.info("preempted (%s) at step %d of %d: saved %s; rerun with train.resume=True to continue",
                     self.preemption.signal_name or "a signal on another rank", self.step, self.max_steps, where)
        else:
            log.info("done at step %d%s; checkpoint: %s; TensorBoard: tensorboard --logdir %s", self.step,
                     f", final loss {loss:.4f}" if loss is not None else "", where, self.log_dir)
        self.strategy.close()
        return self

    # -- checkpoints ----------------------------------------------------------------------------
    def save_checkpoint(self):
        """Write a checkpoint of this step (see Checkpointer.save); the NaN guard settles first, so that a
        stop comes before anything is written."""
        self._settle_skips(wait=True)
        self.wait_for_checkpoint()  # at most one save in flight: its error surfaces here
        self.checkpoints.save(self.step, self.epoch, self.checkpoint_meta(), self.state_dict)

    def wait_for_checkpoint(self, raise_errors=True):
        """Return once no checkpoint is being written in the background (train.checkpoint_async)."""
        self.checkpoints.wait(raise_errors)

    def load_checkpoint(self, path):
        """Continue from checkpoint folder `path`, written by any strategy at any world size."""
        self.checkpoints.load(path, self.load_state_dict)
        log.info("resumed from %s at step %d (epoch %d, batch %d)", path, self.step, self.data.epoch,
                 self.data.batch_in_epoch)

    def state_dict(self):
        """The trainer's own state in a checkpoint (training_state.pt)."""
        return {"scheduler": self.scheduler.state_dict(), "data": self.data.state_dict(), "step": self.step}

    def load_state_dict(self, state):
        self.scheduler.load_state_dict(state["scheduler"])
        self.data.load_state_dict(state["data"])
        self.step = int(state["step"])

    def checkpoint_meta(self):
        """What meta.json records beside the files."""
        return dict(step=self.step, epoch=self.epoch, samples_seen=self.data.samples_seen,
                    world_size=self.env.world_size, distributed_type=self.config.launch.distributed_type,
                    mixed_precision=self.train_config.mixed_precision, ema=self.ema is not None,
                    config=self.config.to_dict())
