"""The training loop. Subclass Trainer, write get_models and forward_step; the config does the rest."""
import logging
import os
import random
import shutil
import time

import numpy as np
import torch

from ..checkpoint import (CheckpointManager, disk_error, free_bytes, host_copy, is_complete, load_weights, read_meta,
                          rng_state, set_rng_state)
from ..compile import compile_model
from ..config import ConfigError, load_config
from ..data import DataStream
from ..distributed.activation_checkpointing import apply_activation_checkpointing
from ..distributed.env import setup_environment
from ..distributed.preemption import PreemptionSignals
from ..ema import EMA
from ..fp8 import convert_to_float8, precompute_scales_after_step
from ..logging import MetricLogger, text_logger
from ..module_dict import ModuleDict
from ..optimizers import build_optimizer
from ..registry import SCHEDULERS, STRATEGIES
from ..schema import validate_config
from .async_checkpoint import AsyncCheckpoint
from .nan_guard import NanGuard, TrainingStopped

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
        self.train_config = t = cfg.train
        self.env = setup_environment(cfg.launch)
        self.device = self.env.device
        self.project_dir = cfg.project_dir
        self.model_dir = os.path.join(cfg.project_dir, "models")
        self.log_dir = os.path.join(cfg.project_dir, "logs")
        text_logger(self.log_dir, self.env.is_main)
        self.strategy = STRATEGIES.get(cfg.launch.distributed_type)(
            self.env, cfg.launch, t, micro_batch_size=cfg.dataloaders.train.batch_size_per_gpu)
        self.dtype = self.strategy.precision.dtype or torch.float32

        seed_everything(t.seed)  # every rank builds the same initial weights
        model = self.get_models(cfg.models)
        if t.mixed_precision == "fp8":
            convert_to_float8(model, t.fp8_config, fsdp2=self.strategy.shards_parameters_as_dtensors)
        if t.activation_checkpointing:
            apply_activation_checkpointing(model, t.activation_class_names)
        compile_model(model, t.dynamo_config, t.activation_class_names, cfg.launch.fsdp_config)
        self.model, self.optimizer = self.strategy.setup(
            model, lambda m: build_optimizer(cfg.optimizers, self.get_trainable_parameters(m)))
        if t.mixed_precision == "fp8":
            precompute_scales_after_step(self.unwrapped_model, self.optimizer)
        self.scheduler = SCHEDULERS.build(cfg.schedulers, self.optimizer)
        self.ema = EMA(self.unwrapped_model, t.ema_decay) if t.with_ema else None

        self.data = DataStream(cfg.dataloaders.train, t.seed, self.env.rank, self.env.world_size, self.device)
        self.accumulation = t.gradient_accumulation_steps
        self.max_steps = t.max_steps or max(t.max_epochs * len(self.data) // self.accumulation, 1)
        self.checkpoints = CheckpointManager(self.model_dir, t.checkpoint_total_limit, t.checkpoint_keeps)
        self.async_checkpoint = None  # train.checkpoint_async: the writer in the background
        if t.checkpoint_async and self.strategy.writes_checkpoints_async:
            self.async_checkpoint = AsyncCheckpoint(self)
        elif t.checkpoint_async:
            log.info("train.checkpoint_async has no effect under %s: its engine writes checkpoints synchronously",
                     cfg.launch.distributed_type)
        self.step = 0
        self._scheduler_before = {}  # step -> scheduler state before it, for steps whose skip is in flight
        self.preempted = False  # set when SIGTERM/SIGUSR1 (on any rank) stops the run after a checkpoint
        seed_everything(t.seed + self.env.rank)  # ranks differ from here on (dropout, noise)
        self._resume(t.resume)

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
        t = self.train_config
        if self.step >= self.max_steps:
            log.info("already at step %d of %d: nothing to train", self.step, self.max_steps)
            return self._finish()
        samples_per_step = self.data.batch_size * self.env.world_size * self.accumulation
        metrics = MetricLogger(self.log_dir, t.log_with, self.env.is_main, self.step, self.max_steps,
                               samples_per_step, show_bar=t.progress_bar)
        log.info("training %s from step %d to %d (%d samples/step) on %s; checkpoints in %s, logs in %s",
                 type(self.unwrapped_model).__name__, self.step, self.max_steps, samples_per_step,
                 self.device, self.model_dir, self.log_dir)
        self.model.train()
        sums, counted = {}, 0  # named losses of the updated steps, summed on the device since the last log
        self.nan_guard = NanGuard(t.nan_policy, t.max_nan_steps, self.env.is_main, self.checkpoints.latest)
        self.preemption = PreemptionSignals()
        try:
            with self.preemption:
                while self.step < self.max_steps:
                    losses, result = self.train_step()
                    self.step += 1
                    self.nan_guard.record(self.step, result)
                    self._settle_nan_guard()  # the flags that have reached the host; never waits
                    sums, counted = self._add_losses(sums, counted, losses, result)
                    metrics.advance(self.step)
                    if self.step % t.log_interval == 0 or self.step == self.max_steps:
                        self._settle_nan_guard(wait=True)
                        scalars = self._scalars(sums, counted, result.grad_norm)
                        self.last_metrics = metrics.log_step(self.step, scalars)
                        sums, counted = {}, 0
                    if t.checkpoint_interval and self.step % t.checkpoint_interval == 0:
                        self.save_checkpoint()
                    # the same step on every rank; so is a stop that one rank's settle found first
                    preempted, stopping = self.preemption.agreed(self.env, self.nan_guard.stopping is not None)
                    if stopping:
                        self._settle_nan_guard(wait=True)  # raises TrainingStopped, the same on every rank
                    if preempted:
                        self.preempted = True
                        break
                self._settle_nan_guard(wait=True)  # also after a preemption: every rank is here
                self.wait_for_checkpoint()  # latest() must see the save in flight
                if not self.checkpoints.latest() or read_meta(self.checkpoints.latest())["step"] != self.step:
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
        t, strategy = self.train_config, self.strategy
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
        result = strategy.step(t.max_grad_norm, measure=(self.step + 1) % t.log_interval == 0,
                               loss=trained if t.nan_policy != "off" else None)
        if result.skipped and result.nonfinite:  # read on the host: nothing else moves
            return totals, result
        if result.found_inf is not None:  # the host learns later whether this step was skipped
            self._scheduler_before[self.step + 1] = self._scheduler_state()
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
        if not result.nonfinite:
            for name, value in losses.items():
                sums[name] = sums.get(name, 0) + value
            counted += 1
        return sums, counted

    def _settle_nan_guard(self, wait=False):
        guard = getattr(self, "nan_guard", None)
        if guard is not None:
            guard.settle(self.step, wait, self._settled)

    def _settled(self, flags):
        """A step whose skip was decided on the device is settled: if it was skipped, take back the
        scheduler step it made. The steps taken while its flag was in flight may have used a one-step-later
        lr (per skipped step among them); from here on the lr is the host path's."""
        if not flags.on_device:
            return
        before = self._scheduler_before.pop(flags.step)
        if not flags.skipped:
            return
        self._set_scheduler_state(before)
        for later in self._scheduler_before:  # steps still in flight (in order): replay their scheduler steps
            self._scheduler_before[later] = self._scheduler_state()
            self.scheduler.step()

    def _scheduler_state(self):
        return self.scheduler.state_dict(), [group["lr"] for group in self.optimizer.param_groups]

    def _set_scheduler_state(self, state):
        scheduler_state, lrs = state
        self.scheduler.load_state_dict(scheduler_state)
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group["lr"] = lr

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
        """Write checkpoint (epoch, step); a full disk stops the run with one line, keeping every
        complete checkpoint and removing what this one had written. With train.checkpoint_async the
        loop only takes the state into host memory; a thread writes it (AsyncCheckpoint)."""
        self._settle_nan_guard(wait=True)  # a stop must come before anything is written
        self.wait_for_checkpoint()  # at most one save in flight: its error surfaces here
        tmp = self.checkpoints.tmp_path(self.epoch, self.step)
        try:
            start = time.perf_counter()
            if self.env.is_main:
                self.checkpoints.begin(self.epoch, self.step)
            self.strategy.barrier()  # the folder exists before any rank writes into it
            if self.async_checkpoint is not None:
                parts = self._checkpoint_parts(tmp, copy=True, process_group=self.async_checkpoint.group)
                self.async_checkpoint.save(tmp, parts, self._checkpoint_meta(), start)
            else:
                self._write_checkpoint(tmp, start)
        except Exception as e:
            disk = disk_error(e)
            if disk is None:
                raise
            raise self._stopped_by_full_disk(self.step, tmp, disk) from None

    def wait_for_checkpoint(self, raise_errors=True):
        """Return once no checkpoint is being written in the background (train.checkpoint_async)."""
        if self.async_checkpoint is not None:
            self.async_checkpoint.wait(raise_errors)

    def _write_checkpoint(self, tmp, start):
        for take, write in self._checkpoint_parts(tmp):
            write(take())
        self.strategy.barrier()
        if self.env.is_main:
            final = self.checkpoints.commit(tmp, self._checkpoint_meta())
            log.info("saved %s (%.1f s)", final, time.perf_counter() - start)
        self.strategy.barrier()

    def _checkpoint_parts(self, tmp, copy=False, process_group=None):
        """What a checkpoint holds, as (take, write) pairs. take() runs on the training thread (the
        collectives, the device->host copies; `copy`: into host memory the training no longer changes);
        write(taken) only writes files into `tmp` (in a thread with checkpoint_async; `process_group`
        for write_state's collectives). One list for both modes: their files are the same."""
        strategy, safe = self.strategy, self.train_config.checkpoint_safe_serialization
        join = os.path.join
        parts = [(lambda: strategy.model_snapshot(copy=copy),
                  lambda state: strategy.write_model(join(tmp, "model"), state, safe))]
        if self.ema is not None:
            parts.append((lambda: strategy.model_snapshot(self.ema.state_dict(self.unwrapped_model), copy=copy),
                          lambda state: strategy.write_model(join(tmp, "model_ema"), state, safe)))
        parts.append((lambda: strategy.state_snapshot(copy=copy),
                      lambda state: strategy.write_state(tmp, state, process_group)))
        rng_file = join(tmp, f"random_states_{self.env.rank}.pt")
        parts.append((rng_state, lambda state: torch.save(state, rng_file)))  # rng_state() is a fresh copy
        if self.env.is_main:
            def training_state():
                state = {"scheduler": self.scheduler.state_dict(), "data": self.data.state_dict(), "step": self.step}
                return host_copy(state) if copy else state
            parts.append((training_state, lambda state: torch.save(state, join(tmp, "training_state.pt"))))
        return parts

    def _checkpoint_meta(self):
        return dict(step=self.step, epoch=self.epoch, samples_seen=self.data.samples_seen,
                    world_size=self.env.world_size, distributed_type=self.config.launch.distributed_type,
                    mixed_precision=self.train_config.mixed_precision, ema=self.ema is not None,
                    config=self.config.to_dict())

    def _stopped_by_full_disk(self, step, tmp, disk):
        """The one line that stops the run when the disk cannot hold checkpoint `step`; removes what
        it had written (`tmp`), so the newest complete checkpoint stays the newest."""
        if self.env.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        return TrainingStopped(
            f"checkpoint at step {step}: {os.strerror(disk.errno)} writing {disk.filename or tmp}"
            f" ({free_bytes(self.model_dir) / 2**30:.2f} GiB free there); nothing of it was kept, the"
            f" newest complete checkpoint is {self.checkpoints.latest() or 'none yet'}")

    def _resume(self, resume):
        if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
            resume = resume or True  # the elastic agent restarted us: continue from the newest checkpoint
        if not resume:
            return
        if resume is True:
            path = self.checkpoints.latest()
            if path is None:
                log.info("resume: no checkpoint in %s yet; starting from step 0", self.model_dir)
                return
        else:
            path = resume
            if not is_complete(path):
                raise ConfigError(f"train.resume: {path} is not a complete checkpoint folder")
        self.load_checkpoint(path)

    def load_checkpoint(self, path):
        self.wait_for_checkpoint()
        strict = self.train_config.checkpoint_strict
        self.strategy.load_model(os.path.join(path, "model"), strict)
        self.strategy.load_state(path)
        state = torch.load(os.path.join(path, "training_state.pt"), map_location="cpu", weights_only=True)
        self.scheduler.load_state_dict(state["scheduler"])
        self.data.load_state_dict(state["data"])
        self.step = int(state["step"])
        if self.ema is not None:
            members = isinstance(self.unwrapped_model, ModuleDict)
            self.ema.load_state_dict(load_weights(os.path.join(path, "model_ema"), members=members))
        rng_file = os.path.join(path, f"random_states_{self.env.rank}.pt")
        if os.path.isfile(rng_file):
            set_rng_state(torch.load(rng_file, map_location="cpu", weights_only=True))
        log.info("resumed from %s at step %d (epoch %d, batch %d)", path, self.step, self.data.epoch,
                 self.data.batch_in_epoch)
