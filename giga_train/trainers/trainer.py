"""The Trainer: GigaTrain's surface (its constructor, properties and hooks, called at the same points) over
our engine. Subclass it, write get_models and forward_step; the config does the rest.

    load(config)   -> Trainer(project_dir, **config.train); prepare(dataloaders.train, models, optimizers,
                      schedulers): get_dataloaders, get_models, apply_activation_checkpointing, apply_fp8,
                      (compile, shard: the strategy) get_optimizers, set_ema_models, get_schedulers
    train()        -> print_before_train; per step: per micro-batch forward_step, parse_losses,
                      backward_step (the last one steps the optimizers); validate_if_due (validate():
                      validation_step per batch of dataloaders.val); print_step; save_checkpoint_step;
                      then print_after_train
"""
import contextlib
import logging
import math
import os
import random
import time

import numpy as np
import torch

from ..checkpoint.checkpointer import Checkpointer
from ..data import as_stream, build_stream
from ..engine.activation_checkpointing import apply_activation_checkpointing
from ..engine.meta_start import building_context, default_init_weights, rank0_loading
from ..engine.parallelize import parallelize
from ..distributed.preemption import PreemptionSignals
from .ema import EMA
from ..errors import ConfigError
from ..engine.fp8 import convert_to_float8
from ..optimizers import build_optimizer
from ..optimizers.group import OptimizerGroup
from .. import engine  # noqa: F401  (registers the strategies)
from ..registry import STRATEGIES
from ..schedulers import SCHEDULERS
from ..schema.train import train_kwargs
from ..tracking import MetricLogger, PerfMeter, StepProfiler, hparams
from ..tracking.metrics import MetricSums
from .best_checkpoint import BestCheckpoint
from .gigatrain_attributes import GigaTrainAttributes
from .checkpointing import CheckpointHooks
from .epochs import EpochClock, max_steps_by_epochs
from .nan_guard import NanGuard, SchedulerRewind
from . import random_streams
from ..compat.utils import as_list
from .runner import Runner
from .validation import Validator

log = logging.getLogger("giga_train")

# GigaTrain's named Trainer arguments; every other key of the `train` section is in self.kwargs.
TRAINER_KEYWORDS = (
    "max_epochs", "max_steps", "gradient_accumulation_steps", "mixed_precision", "dynamo_config", "ddp_config",
    "fp8_config", "data_parallel_size", "log_with", "log_interval", "log_cpu_memory", "checkpoint_interval",
    "checkpoint_total_limit", "checkpoint_keeps", "checkpoint_save_optimizer", "checkpoint_safe_serialization",
    "checkpoint_strict", "activation_checkpointing", "activation_class_names", "with_ema", "allow_tf32", "seed",
    "logging_dir")


def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Trainer(GigaTrainAttributes, CheckpointHooks, Runner):
    """Runs the `train` part of a config. Override `get_models` and `forward_step`; any hook below."""
    SECTION, OWN_KEYWORDS, LOG_NAME = "train", TRAINER_KEYWORDS, "train.log"

    def __init__(self, project_dir, **train):
        super().__init__(project_dir, **train)
        self.train_config = self.options
        self.strategy = STRATEGIES.get(self.config.launch.distributed_type)(
            self.env, self.config.launch, self.train_config,
            micro_batch_size=self.config.dataloaders.train.batch_size_per_gpu)
        if self.train_config.get("allow_tf32", True) and torch.cuda.is_available():
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        self.step = 0  # optimizer steps completed (cur_step is GigaTrain's, 1-based inside a step)
        self.epoch_clock = EpochClock()  # epochs by the samples seen (a resume may change the batch)
        self._stepping = False
        self._optimizers, self._schedulers, self.ema = [], [], None
        self.preempted = False  # set when SIGTERM/SIGUSR1 (on any rank) stops the run after a checkpoint
        self._logged_metrics = self._metric_sink = MetricSums(self.device)  # log_metric's, until the next log
        self.validator = self.best_checkpoint = None
        self._val_results = None  # the validation of this step, logged with its scalars
        seed_everything(self.train_config.seed)  # every rank builds the same initial weights

    def extra_options(self, options):
        return train_kwargs(options)

    @property
    def mixed_precision(self):
        """As GigaTrain's Trainer: None without mixed precision."""
        mode = self.options.get("mixed_precision")
        return None if mode in (None, "no") else mode

    def prepare_arguments(self, config):
        models = config.models
        return dict(dataloaders=config.dataloaders.train, models=models.train if "train" in models else models,
                    optimizers=config.optimizers, schedulers=config.schedulers)

    # -- building (GigaTrain's prepare and its hooks) -------------------------------------------
    def prepare(self, dataloaders, models, optimizers, schedulers):
        train = self.train_config
        self._dataloaders = as_list(self.get_dataloaders(dataloaders))
        self._stream = as_stream(self.dataloader, self.device)  # what the loop reads; checkpoints its position
        with building_context(self.config.launch, self.process_index):  # meta off rank 0 under rank-0 loading
            self._models = as_list(self.get_models(models))
        self._built_rng = random_streams.capture()  # GigaTrain's stream goes on from here
        self._built_dtypes = {n: p.dtype for n, p in self._models[0].named_parameters()}  # the EMA's (GigaTrain's)
        if len(self._models) != 1:
            raise ConfigError(f"get_models returned {len(self._models)} models: giga-train trains one module;"
                              " put several in a giga_train.ModuleDict (GigaTrain's checkpoints also hold one)")

        def make_optimizers(module):  # called by the engine with the module whose parameters it steps
            self._models = [module]
            self._optimizers = as_list(self.get_optimizers(optimizers))
            return self._optimizers[0] if len(self._optimizers) == 1 else OptimizerGroup(self._optimizers)

        self._models[0], _ = parallelize(  # the engine's optimizer (one, or an OptimizerGroup) is the strategy's
            self._models[0], self.strategy, train, self.config.launch.fsdp_config, make_optimizers,
            checkpoint=lambda model: self.apply_activation_checkpointing([model]),
            float8=lambda model: self.apply_fp8([model]),
            init_weights=None if type(self).init_weights is Trainer.init_weights else self.init_weights,
            from_rank0=rank0_loading(self.config.launch))
        self.set_ema_models()
        self._schedulers = as_list(self.get_schedulers(schedulers))
        self.checkpoints = Checkpointer(self.strategy, self.model_dir, train, self.ema,
                                        model_name=getattr(self, "model_name", "model"),  # GigaTrain's attribute
                                        rank_state=self._stream if getattr(self._stream, "per_rank_state", False)
                                        else None)
        max_nan = train.max_nan_steps if train.max_nan_steps is not None else float("inf")  # None: never stop
        self.nan_guard = NanGuard(train.nan_policy, max_nan, self.is_main_process, self.checkpoints.latest_finite,
                                  max_overflow=train.max_overflow_steps or float("inf"))
        self._scheduler_rewind = SchedulerRewind(self.schedulers, self.optimizers)
        val = self.config.dataloaders.get("val")
        if train.eval_interval and val is not None:
            self.validator = Validator(val, self.env)
        elif train.eval_interval:  # a GigaTrain fork's own key too: its trainer may validate by self.kwargs
            self.print("train.eval_interval without dataloaders.val: giga-train validates nothing")
        elif val is not None:
            self.print("dataloaders.val is not used: set train.eval_interval to validate every N steps")
        if train.checkpoint_best:
            self.best_checkpoint = BestCheckpoint(train.checkpoint_best, self.checkpoints.folders,
                                                  self.is_main_process)
        # data ranks differ from here (dropout, noise); data rank 0 goes on with GigaTrain's stream
        random_streams.continue_after_build(self._built_rng, train.seed, self.strategy.data_rank,
                                            shared=self.strategy.data_world_size != self.num_processes)

    def get_dataloaders(self, data_config):
        """The training data: micro-batches on the device, resumable to the exact sample."""
        rank, world = self.data_rank_and_world  # an SP group's ranks read the same samples
        return build_stream(data_config, self.train_config.seed, rank, world,
                            self.device, accumulation=self.gradient_accumulation_steps,
                            data_parallel_size=self.train_config.get("data_parallel_size") or 1)

    def get_models(self, model_config):
        """Return an nn.Module, or a ModuleDict of several (called with `config.models`)."""
        raise NotImplementedError(f"{type(self).__name__} must define get_models(self, model_config)")

    def init_weights(self, model):
        """Fill a model that get_models built on the meta device, once sharded (FSDP2) or partitioned (ZeRO-3):
        each rank's piece is allocated, uninitialised. Default: the model's init_weights(), else each module's
        reset_parameters() (under ZeRO-3 as each module is materialised). Pretrained weights:
        giga_train.load_safetensors_shards(model, path) reads each rank's rows or partition only. Under ZeRO-3
        change a parameter in place inside deepspeed.zero.GatheredParameters(params, modifier_rank=0)."""
        default_init_weights(model)

    def set_ema_models(self):
        """With train.with_ema: the moving average of the trainable weights (sharded as the model is)."""
        if self.train_config.with_ema:
            # GigaTrain's decay warm-up, min((1 + s) / (10 + s), ema_decay): the first update copies the weights
            self.ema = EMA(self.unwrapped_model, self.train_config.ema_decay, warmup=True,
                           dtypes=getattr(self, "_built_dtypes", None))

    def apply_activation_checkpointing(self, models=None):
        train = self.train_config
        if train.activation_checkpointing and train.activation_class_names:
            for model in models or self.models:
                apply_activation_checkpointing(model, train.activation_class_names)

    def apply_fp8(self, models=None):
        if self.mixed_precision == "fp8":
            for model in models or self.models:
                convert_to_float8(model, self.train_config.fp8_config, fsdp2=self.strategy.gathers_float8_weights())

    def get_trainable_parameters(self, model):
        """The parameters the optimizer updates (default: those with requires_grad)."""
        return [p for p in model.parameters() if p.requires_grad]

    def get_optimizers(self, optimizers):
        """One optimizer over all models, or one per model (GigaTrain's rule), from config dicts."""
        optimizers = as_list(optimizers)
        if len(optimizers) not in (1, len(self.models)):
            raise ConfigError(f"optimizers: {len(optimizers)} configs for {len(self.models)} models (give one, or"
                              " one per model)")
        built = []
        for i, cfg in enumerate(optimizers):
            if not isinstance(cfg, dict):
                built.append(cfg)  # an optimizer object the config or an override already built
                continue
            models = self.models if len(optimizers) == 1 else [self.models[i]]
            built.append(build_optimizer(cfg, [p for m in models for p in self.get_trainable_parameters(m)]))
        return built

    def get_schedulers(self, schedulers):
        """One scheduler per optimizer, from config dicts (given epoch_size, max_epochs and max_steps when
        the scheduler takes them); one config serves every optimizer."""
        schedulers = as_list(schedulers)
        if len(schedulers) == 1 and len(self.optimizers) > 1:
            schedulers = schedulers * len(self.optimizers)
        if len(schedulers) != len(self.optimizers):
            raise ConfigError(f"schedulers: {len(schedulers)} configs for {len(self.optimizers)} optimizers")
        extras = dict(epoch_size=self.epoch_size, max_epochs=self.max_epochs, max_steps=self.max_steps)
        return [SCHEDULERS.build(cfg, optimizer, **extras) if isinstance(cfg, dict) else cfg
                for cfg, optimizer in zip(schedulers, self.optimizers)]

    # -- GigaTrain's properties -----------------------------------------------------------------
    @property
    def unwrapped_model(self):
        return self.strategy.unwrap()

    @property
    def optimizers(self):
        return self._optimizers

    @property
    def optimizer(self):
        return self._optimizers[0]

    @property
    def schedulers(self):
        return self._schedulers

    @property
    def scheduler(self):
        return self._schedulers[0]

    @property
    def gradient_accumulation_steps(self):
        return self.train_config.gradient_accumulation_steps

    @property
    def sync_gradients(self):
        """True in the last micro-batch of a step: its backward syncs the gradients and steps."""
        return self._micro == self.gradient_accumulation_steps - 1

    @property
    def batch_size(self):
        """Samples per optimizer step, all ranks together."""
        per_rank = getattr(self.dataloader, "batch_size", None) or 1
        parallel = self.train_config.get("data_parallel_size") or 1
        return per_rank * self.data_rank_and_world[1] * self.gradient_accumulation_steps // parallel

    @property
    def data_rank_and_world(self):
        """(this rank's data-parallel coordinate, the data-parallel ranks): the rank and world size without
        sequence parallelism; without an engine (the offline tools) the process's."""
        strategy = getattr(self, "strategy", None)
        return (strategy.data_rank, strategy.data_world_size) if strategy else (self.process_index, self.num_processes)

    @property
    def epoch_size(self):
        """Optimizer steps per epoch. A stream without a length (an IterableDataset) counts the whole run
        as one epoch for what is counted in epochs (the schema requires max_steps for it)."""
        if not hasattr(self.dataloader, "__len__"):
            return self.train_config.max_steps
        return int(math.ceil(len(self.dataloader) / self.gradient_accumulation_steps))

    @property
    def max_epochs(self):
        max_epochs = self.train_config.max_epochs or 0
        return max_epochs if max_epochs > 0 else int(math.ceil(self.max_steps / self.epoch_size))

    @property
    def max_steps(self):
        max_steps = self.train_config.max_steps or 0
        return max_steps if max_steps > 0 else max_steps_by_epochs(self.train_config.max_epochs, self.epoch_size,
                                                                   self.epoch_clock)

    @property
    def cur_step(self):
        """GigaTrain's step counter: the step being computed (1-based) inside a step, else the steps done."""
        return self.step + 1 if self._stepping else self.step

    @property
    def cur_epoch(self):
        return int(math.ceil(self.epoch_clock.steps(self.cur_step) / self.epoch_size))

    @property
    def epoch(self):
        """The epoch the data stream is in (0-based)."""
        return self._stream.epoch

    @property
    def rank(self):
        return self.process_index

    @property
    def world_size(self):
        return self.num_processes

    # -- the loop -------------------------------------------------------------------------------
    def train(self):
        if self.step >= self.max_steps:
            log.info("already at step %d of %d: nothing to train", self.step, self.max_steps)
            return self._finish()
        train = self.train_config
        # FLOPs are counted in the run's first step, or its second when compiling (the first compiles)
        self._perf = PerfMeter(train, self.device, self.num_processes, self.batch_size,
                               count_at_step=self.step + (2 if train.dynamo_config else 1))
        self._metrics = MetricLogger(self.logging_dir, train.log_with, self.is_main_process, self.step,
                                     self.max_steps, self.batch_size, show_bar=train.progress_bar,
                                     run_name=os.path.basename(self.project_dir), config=self.config.to_dict(),
                                     hparams=hparams(self.config, batch_size=self.batch_size,
                                                     world_size=self.num_processes), perf=self._perf)
        self._profiler = train.profile and StepProfiler(train.profile, self.logging_dir, self.process_index,
                                                        self.device, self.step)
        self.print_before_train()
        self.model.train()
        self._sums, self._counted = {}, 0  # losses of the updated steps, summed on the device since the last log
        self.preemption = PreemptionSignals()
        try:
            with self.preemption:
                while self.step < self.max_steps:
                    with self._perf.counting(self.step + 1):
                        result = self.train_step()
                    self.step += 1
                    if self._profiler:
                        self._profiler.step()
                    self.nan_guard.record(self.step, result)
                    self._settle_skips()  # the flags that have reached the host; never waits
                    self._add_losses(self._step_losses, result)
                    self._metrics.advance(self.step)
                    self.validate_if_due()
                    self.print_step()
                    self.save_checkpoint_step()
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
            if self._profiler:
                self._profiler.close()
            self._metrics.close()
        self.print_after_train()
        return self._finish()

    def train_step(self):
        """One optimizer step over `gradient_accumulation_steps` micro-batches, each through forward_step,
        parse_losses and backward_step. Returns the step's StepResult."""
        self._stepping, self._step_losses = True, {}
        try:
            for self._micro in range(self.gradient_accumulation_steps):
                batch = next(self._stream)
                # The trainer owns the accumulation boundary: only the last micro-step syncs gradients.
                with self.strategy.accumulating(not self.sync_gradients):
                    with self.strategy.autocast():
                        losses = self.forward_step(batch)
                    self.backward_step(self.parse_losses(losses))
        finally:
            self._stepping = False
        return self._result

    def forward_step(self, batch_dict):
        """Return a loss tensor (per-sample losses are averaged), or a dict of named losses."""
        return self.model(batch_dict)

    def validation_step(self, batch_dict):
        """One batch of dataloaders.val (no gradients, eval mode): a tensor (logged as val/loss), a dict of
        named scalars (val/<name>), or None; self.log_metric(name, value) works here too. Each value is
        averaged over every sample of every rank. Default: forward_step's losses."""
        return self.forward_step(batch_dict)

    # -- metrics that are not trained ---------------------------------------------------------------
    def log_metric(self, name, value):
        """Log a scalar that is not trained (a tensor, its mean, or a number) from anywhere in a step:
        summed on the device, averaged over the calls since the last log step and over the ranks there.
        Inside validation_step: a validation result (val/<name>)."""
        self._metric_sink.add(name, value)

    def log_metrics(self, values):
        for name, value in values.items():
            self.log_metric(name, value)

    @contextlib.contextmanager
    def metrics_into(self, sums):
        """While inside: log_metric adds to `sums` (a MetricSums) instead of the training log's."""
        saved, self._metric_sink = self._metric_sink, sums
        try:
            yield sums
        finally:
            self._metric_sink = saved

    # -- validation -----------------------------------------------------------------------------
    def validate(self):
        """validation_step over dataloaders.val (every rank its part, on the EMA weights with
        train.eval_ema); returns {'val/<name>': float}, the same on every rank. A collective: every rank
        calls it."""
        if self.validator is None:
            raise ConfigError("validate(): set train.eval_interval and dataloaders.val")
        return self.validator.run(self, on_ema=self.train_config.eval_ema)

    def validate_if_due(self):
        """After every step: validate every train.eval_interval steps and at the last; the results are
        logged with this step's scalars, and with train.checkpoint_best may make this step's checkpoint
        the best."""
        every = self.train_config.eval_interval
        if self.validator is None or (self.step % every and self.step != self.max_steps):
            return
        self._val_results = self.validate()
        if self.best_checkpoint is not None:
            self.best_checkpoint.update(self.step, self._val_results)

    def parse_losses(self, losses):
        """The loss to train from forward_step's output: each entry's mean, summed; each (and their sum,
        `total_loss`) is logged, averaged over the log interval and the ranks, without a host read."""
        named = losses if isinstance(losses, dict) else {}
        if named and "total_loss" in named:
            raise ConfigError("forward_step: a loss named 'total_loss' (the name of their sum): rename it")
        means = {name: value.mean() for name, value in named.items()}
        loss = sum(means.values()) if named else losses.mean()
        scale = 1.0 / self.gradient_accumulation_steps
        for name, value in {**means, "total_loss": loss}.items():
            self._step_losses[name] = self._step_losses.get(name, 0) + value.detach().float() * scale
        return loss

    def backward_step(self, loss):
        """Backward of one micro-batch; the last of a step clips, steps the optimizer (or skips the step
        everywhere when the NaN guard says so), the scheduler and the EMA."""
        accumulation = self.gradient_accumulation_steps
        self.strategy.backward(loss / accumulation)
        self._trained = loss.detach() / accumulation + (self._trained if self._micro else 0)
        if self.sync_gradients:
            self._result = self._optimizer_step(self._trained)

    def _optimizer_step(self, trained):
        """Returns the StepResult. A step the NaN guard skips leaves the optimizer, the scheduler and the
        EMA untouched (where the skip is decided on the device, the scheduler is rewound when the step is
        settled)."""
        train, strategy = self.train_config, self.strategy
        result = strategy.step(train.max_grad_norm, measure=(self.step + 1) % train.log_interval == 0,
                               verdict=self.nan_guard.verdict(strategy, trained))
        if result.skipped and result.nonfinite_names:  # read on the host: nothing else moves
            return result
        if result.found_inf is not None:  # the host learns later whether this step was skipped
            self._scheduler_rewind.remember(self.step + 1)
        for scheduler in self.schedulers:
            scheduler.step()
        if self.ema is not None:
            self.ema.update(skip=result.found_inf)  # a no-op on the device for a skipped step
        return result

    # -- logging (GigaTrain's print hooks) ------------------------------------------------------
    def print_before_train(self):
        self.print("%s: %d parameters (%d trained)", type(self.unwrapped_model).__name__,
                   sum(p.numel() for p in self.unwrapped_model.parameters()),
                   sum(p.numel() for p in self.get_trainable_parameters(self.unwrapped_model)))
        self.print("num_processes: %d, process_index: %d, data_size: %s, batch_size: %d, epoch_size: %d",
                   self.num_processes, self.process_index, self.data_size, self.batch_size, self.epoch_size)
        self.print("training %s from step %d to %d (%d samples/step) on %s; checkpoints in %s, logs in %s",
                   type(self.unwrapped_model).__name__, self.step, self.max_steps, self.batch_size, self.device,
                   self.model_dir, self.logging_dir)
        self._start_time = time.perf_counter()

    def print_step(self):
        """Every log_interval steps (and at the last): the averaged losses, lr, grad norm and timing, on the
        main process's log, tracker and progress bar. The one place the loop waits for the device."""
        validated, self._val_results = self._val_results, None
        if self.step % self.train_config.log_interval and self.step != self.max_steps and validated is None:
            return
        self._settle_skips(wait=True)
        scalars = self._scalars(self._sums, self._counted, self._result.grad_norm)
        for name, value in {**self._logged_metrics.average(cpu_group=self.env.cpu_group), **(validated or {})}.items():
            if name in scalars:
                raise ConfigError(f"log_metric: {name!r} is already logged (a loss, or one of lr, grad_norm):"
                                  " give the metric another name")
            scalars[name] = value
        self.last_metrics = self._metrics.log_step(self.step, scalars)
        self._sums, self._counted = {}, 0

    def print_after_train(self):
        self.print("total time: %.1f s", time.perf_counter() - getattr(self, "_start_time", time.perf_counter()))

    def _add_losses(self, losses, result):
        """Add a step's losses to the sums since the last log, leaving out a skipped step's (so one NaN
        does not hide the others'): masked on the device by its flag when the skip was decided there."""
        if result.found_inf is not None:
            skipped = result.found_inf > 0
            for name, value in losses.items():
                self._sums[name] = self._sums.get(name, 0) + torch.where(skipped, 0.0, value)
            self._counted = self._counted + (1.0 - result.found_inf)  # a device count
        elif not result.nonfinite_names:
            for name, value in losses.items():
                self._sums[name] = self._sums.get(name, 0) + value
            self._counted += 1

    def _scalars(self, sums, counted, grad_norm):
        """Host values for logging. `counted`: the steps in `sums` (skipped steps are left out, so one NaN
        does not hide the loss of the others); a device tensor where the skips were decided on the device."""
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

    def _settle_skips(self, wait=False):
        """Settle the NaN guard's pending steps (NanGuard.settle); never waits unless `wait`."""
        self.nan_guard.settle(self.step, wait, self._scheduler_rewind.settled)

    def save_checkpoint(self):
        super().save_checkpoint()
        if self.best_checkpoint is not None:
            self.best_checkpoint.saved(self.step, self.cur_epoch)

    def state_dict(self):
        state = super().state_dict()
        if self.best_checkpoint is not None:
            state["best"] = self.best_checkpoint.state_dict()
        return state

    def load_state_dict(self, state):
        super().load_state_dict(state)
        if self.best_checkpoint is not None:
            self.best_checkpoint.load_state_dict(state.get("best"))

    def abandon(self):
        self.strategy.close()

    def _finish(self):
        self.wait_for_checkpoint()
        loss = getattr(self, "last_metrics", {}).get("total_loss")
        where = self.checkpoints.latest()
        if self.preempted:
            log.info("preempted (%s) at step %d of %d: saved %s; rerun with train.resume=True to continue",
                     self.preemption.signal_name or "a signal on another rank", self.step, self.max_steps, where)
        else:
            log.info("done at step %d%s; checkpoint: %s; TensorBoard: tensorboard --logdir %s", self.step,
                     f", final loss {loss:.4f}" if loss is not None else "", where, self.logging_dir)
        self.strategy.close()
        return self
