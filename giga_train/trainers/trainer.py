"""The Trainer: GigaTrain's surface (constructor, properties, hooks called at the same points) over our
engine; subclass it, write get_models and forward_step. Built by load(config), or directly (then train());
building opens nothing, prepare makes the engine. The loop and the hooks are here, the work in the parts:
the engine (`strategy`), checkpointing.py, losses.py, nan_guard.py, stepping.py, evaluation.py, run_log.py,
building.py. The hooks, in the order they are called: docs/guide.md."""
import logging
import math
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from ..compat.utils import as_list
from ..data import as_stream
from ..distributed.preemption import PreemptionSignals
from ..engine.attention import attention_backend
from ..engine.cpu_conv3d import guard_cpu_conv3d
from ..engine.sequence_parallel import sequence_group
from ..engine.step import StepResult
from ..engine.meta_start import building_context, default_init_weights
from ..optimizers.group import OptimizerGroup
from ..schema.train import train_kwargs
from .building import (TRAINER_KEYWORDS, allow_tf32, build_optimizers, build_parts, build_schedulers, build_strategy,
                       checkpoint_blocks, float8_linears, parallelize_model, seed_everything, the_one_model,
                       train_loaders, train_prepare_arguments, train_stream)
from .checkpointing import load_model_folders, write_config
from .ema import EMA
from .epochs import EpochClock, max_steps_by_epochs, samples_per_step, steps_per_epoch
from .evaluation import Evaluation
from .losses import LossBook
from .lora import with_lora
from .run_log import RunLog, log_end
from .flop_count import model_flops_per_sample
from .gigatrain_attributes import GigaTrainAttributes
from . import random_streams
from .runner import Runner
from .stepping import optimizer_step
from .validation import ema_weights

log = logging.getLogger("giga_train")

class Trainer(GigaTrainAttributes, Runner):
    """Runs the `train` part of a config. Override `get_models` and `forward_step`; any hook below."""
    SECTION, OWN_KEYWORDS, LOG_NAME = "train", TRAINER_KEYWORDS, "train.log"

    def __init__(self, project_dir=None, *, config=None, **train):
        super().__init__(project_dir, config=config, **train)
        self.train_config = self.options
        self.strategy = None  # the engine: made by prepare (it opens the process group)
        allow_tf32(self.train_config)
        self.step = 0  # optimizer steps completed (cur_step is GigaTrain's, 1-based inside a step)
        self.epoch_clock = EpochClock()  # epochs by the samples seen (a resume may change the batch)
        self._stepping, self._micro_step = False, 0  # inside a step; the micro-batch of it being computed
        self._optimizers, self._schedulers, self.ema = [], [], None
        self.preempted = False  # set when SIGTERM/SIGUSR1 (on any rank) stops the run after a checkpoint
        self.evaluation = Evaluation(self.device)  # log_metric's sums; the validator (made by prepare)
        self.losses_book = LossBook(self.gradient_accumulation_steps, self.train_config.loss_normalization)
        seed_everything(self.train_config.seed)  # every rank builds the same initial weights

    extra_options = staticmethod(train_kwargs)  # self.kwargs: the train section's keys GigaTrain does not name
    prepare_arguments = staticmethod(train_prepare_arguments)  # prepare()'s, from the config's sections

    # -- building (GigaTrain's prepare and its hooks) -------------------------------------------
    def prepare(self, dataloaders, models, optimizers, schedulers) -> None:
        """The engine, then the building hooks in GigaTrain's order (docs/guide.md), then the parts."""
        self.start_job()
        self.strategy = build_strategy(self)
        self._dataloaders = train_loaders(self, dataloaders)  # a dataset returned: our stream over it
        self._stream = as_stream(self.dataloader, self.device)  # what the loop reads; checkpoints its position
        with building_context(self.config.launch, self.process_index):  # meta off rank 0 under rank-0 loading
            self._models = [with_lora(the_one_model(self.get_models(models)), self.train_config.get("lora"))]
        self._built_rng = random_streams.capture()  # GigaTrain's stream goes on from here
        self._built_dtypes = {n: t.dtype for n, t in self._models[0].state_dict().items() if torch.is_tensor(t)}  # the EMA's
        self._onednn_off = guard_cpu_conv3d(self._models[0], self.device, self.train_config.mixed_precision)

        def make_optimizers(module):  # called by the engine with the module whose parameters it steps
            self._models = [module]
            self._optimizers = as_list(self.get_optimizers(optimizers))
            return self._optimizers[0] if len(self._optimizers) == 1 else OptimizerGroup(self._optimizers)
        own_init = None if type(self).init_weights is Trainer.init_weights else self.init_weights
        self._models[0] = parallelize_model(self, make_optimizers, own_init)
        self.set_ema_models()
        self._schedulers = as_list(self.get_schedulers(schedulers))
        self.checkpoints, self.checkpointing, self.nan_guard = build_parts(self, self._stream)
        self.evaluation.prepare(self)
        # data ranks differ from here (dropout, noise); data rank 0 goes on with GigaTrain's stream
        random_streams.continue_after_build(self._built_rng, self.train_config.seed, self.strategy.data_rank,
                                            group=sequence_group())
        self.prepared = True

    def get_dataloaders(self, data_config) -> Iterator:
        """The training data: micro-batches on the device, resumable to the exact sample."""
        return train_stream(self, data_config)

    def get_models(self, model_config) -> nn.Module:
        """Return an nn.Module, or a ModuleDict of several (called with `config.models`)."""
        raise NotImplementedError(f"{type(self).__name__} must define get_models(self, model_config)")

    def init_weights(self, model) -> None:
        """Fill a model get_models built on the meta device, once sharded (docs/guide.md, "Large models")."""
        default_init_weights(model)

    def set_ema_models(self) -> None:
        """With train.with_ema: the moving average of the trainable weights (sharded as the model is), with
        GigaTrain's decay warm-up, min((1 + s) / (10 + s), ema_decay): the first update copies the weights."""
        if self.train_config.with_ema:
            self.ema = EMA(self.unwrapped_model, self.train_config.ema_decay, warmup=True,
                           dtypes=getattr(self, "_built_dtypes", None))

    def apply_activation_checkpointing(self, models=None) -> None:
        checkpoint_blocks(self, models or self.models)

    def apply_fp8(self, models=None) -> None:
        float8_linears(self, models or self.models)

    def get_trainable_parameters(self, model) -> list:
        """The parameters the optimizer updates (default: those with requires_grad)."""
        return [p for p in model.parameters() if p.requires_grad]

    def get_optimizers(self, optimizers) -> list:
        """One optimizer over all models, or one per model (GigaTrain's rule), from config dicts."""
        return build_optimizers(optimizers, self.models, self.get_trainable_parameters)

    def get_schedulers(self, schedulers) -> list:
        """One scheduler per optimizer (one config serves all), from config dicts."""
        return build_schedulers(schedulers, self.optimizers, epoch_size=self.epoch_size, max_epochs=self.max_epochs,
                                max_steps=self.max_steps)

    # -- GigaTrain's properties, and ours (unwrapped_model, sync_gradients, data_rank_and_world, epoch) -------
    @property
    def mixed_precision(self) -> str | None:  # as GigaTrain's Trainer: the config's value, None when unset
        return self.options.get("mixed_precision")

    unwrapped_model = property(lambda self: self.strategy.unwrap())  # the model without the engine's wrapper
    optimizers = property(lambda self: self._optimizers)
    optimizer = property(lambda self: self._optimizers[0])
    schedulers = property(lambda self: self._schedulers)
    scheduler = property(lambda self: self._schedulers[0])
    gradient_accumulation_steps = property(lambda self: self.train_config.gradient_accumulation_steps)
    rank = property(lambda self: self.process_index)
    world_size = property(lambda self: self.num_processes)
    # True in the last micro-batch of a step: its backward syncs the gradients and steps
    sync_gradients = property(lambda self: self._micro_step == self.gradient_accumulation_steps - 1)
    # GigaTrain's step counter: the step being computed (1-based) inside a step, else the steps done
    cur_step = property(lambda self: self.step + 1 if self._stepping else self.step)
    cur_epoch = property(lambda self: int(math.ceil(self.epoch_clock.steps(self.cur_step) / self.epoch_size)))
    epoch = property(lambda self: self._stream.epoch)  # the epoch the data stream is in (0-based)

    @property
    def batch_size(self) -> int:  # samples per optimizer step, all ranks together
        return samples_per_step(self.dataloader, self.data_rank_and_world[1], self.gradient_accumulation_steps,
                                self.train_config.get("data_parallel_size") or 1)

    @property
    def data_rank_and_world(self) -> tuple[int, int]:  # (data-parallel rank, data-parallel ranks); without an engine the process's
        strategy = getattr(self, "strategy", None)
        return (strategy.data_rank, strategy.data_world_size) if strategy else (self.process_index, self.num_processes)

    @property
    def epoch_size(self) -> int:  # optimizer steps per epoch (an IterableDataset's run: one epoch of max_steps)
        return steps_per_epoch(self.dataloader, self.gradient_accumulation_steps, self.train_config.max_steps)

    @property
    def max_epochs(self) -> int:
        max_epochs = self.train_config.max_epochs or 0
        return max_epochs if max_epochs > 0 else int(math.ceil(self.max_steps / self.epoch_size))

    @property
    def max_steps(self) -> int:
        steps, train = self.train_config.max_steps or 0, self.train_config
        return steps if steps > 0 else max_steps_by_epochs(train.max_epochs, self.epoch_size, self.epoch_clock)

    # -- the loop -------------------------------------------------------------------------------
    def train(self) -> "Trainer":
        if not self.prepared:  # built directly: prepare from the config's sections
            self.prepare(**self.prepare_arguments(self.config))
        if self.step >= self.max_steps:
            log.info("already at step %d of %d: nothing to train", self.step, self.max_steps)
            return self._finish()
        if self.checkpointing.stopped_early():  # resumed the stop of an early-stopped run (said so: early_stopping.py)
            return self._finish()
        self.run_log = RunLog(self)
        self.run_log.perf.use_flops_per_sample(model_flops_per_sample(self))
        self.print_before_train()
        self.model.train()
        # the losses since the last log line
        self.losses_book = LossBook(self.gradient_accumulation_steps, self.train_config.loss_normalization)
        self.preemption = PreemptionSignals()
        try:
            with self.preemption:
                while self.step < self.max_steps:
                    with self.run_log.counting(self.step + 1), attention_backend(self.train_config.attention_backend):
                        result = self.train_step()
                    self.step += 1
                    self.run_log.step_done(self.step)
                    self.nan_guard.step_done(self.step, result)
                    self.losses_book.end_step(result)
                    self.validate_if_due()
                    self.print_step()
                    self.save_checkpoint_step()
                    if self.checkpointing.stopped_early():  # train.early_stopping: this step's checkpoint saved
                        break
                    if self.nan_guard.agreed_preemption(self.preemption, self.env, self.step):
                        self.preempted = True
                        break
                self.nan_guard.settle(self.step, wait=True)  # also after a preemption: every rank is here
                self.checkpointing.save_last()
        except BaseException:
            self.wait_for_checkpoint(raise_errors=False)  # what was taken before the error still lands
            raise
        finally:
            self.run_log.close()
        self.print_after_train()
        return self._finish()

    def train_step(self) -> StepResult:
        """One optimizer step: forward_step, parse_losses, backward_step per micro-batch; its StepResult."""
        self._stepping = True
        self.losses_book.start_step()
        try:
            for self._micro_step in range(self.gradient_accumulation_steps):
                batch = next(self._stream)
                with self.strategy.accumulating(not self.sync_gradients):  # only the last micro-step syncs
                    with self.strategy.autocast():
                        losses = self.forward_step(batch)
                    self.backward_step(self.parse_losses(losses))
        finally:
            self._stepping = False
        return self._last_result

    def forward_step(self, batch_dict) -> Any:
        """Return a loss tensor (per-sample losses are averaged), or a dict of named losses."""
        return self.model(batch_dict)

    def validation_step(self, batch_dict) -> Any:
        """One batch of dataloaders.val: a tensor (val/loss), a dict (val/<name>) or None; default forward_step."""
        return self.forward_step(batch_dict)

    def parse_losses(self, losses) -> torch.Tensor:
        """The loss to train from forward_step's output: each entry's mean, summed; each logged (LossBook)."""
        return self.losses_book.parse(losses)

    def backward_step(self, loss) -> None:
        """Backward of one micro-batch; the last of a step clips and steps the optimizers, schedulers and EMA."""
        share = self.losses_book.divisor  # the accumulation (by tokens: 1, the step scales: token_normalization.py)
        self.strategy.backward(loss / share)
        self._step_loss = loss.detach() / share + (self._step_loss if self._micro_step else 0)
        if self.sync_gradients:  # skipped everywhere when the NaN guard says so (stepping.py)
            self._last_result = optimizer_step(self, self._step_loss)

    # -- metrics that are not trained, validation, the log (the evaluation part and the run's log do the work) --
    def log_metric(self, name, value) -> None:
        """Log a scalar that is not trained, anywhere in a step (inside validation_step: val/<name>)."""
        self.evaluation.add(name, value)

    def log_metrics(self, values) -> None:
        for name, value in values.items():
            self.log_metric(name, value)

    def ema_weights(self) -> AbstractContextManager:
        """A context: inside, the model holds the EMA weights (train.with_ema); the trained ones come back after."""
        return ema_weights(self.ema)

    def sample_step(self, batch_dict) -> dict | None:
        """At each validation, on every rank: {name: image or video} from a validation batch, logged as samples/<name>."""
    sample_step.default_hook = True  # not overridden: no sampling

    def metrics_into(self, sums) -> AbstractContextManager:
        """A context: while inside, log_metric adds to `sums` (a MetricSums) instead of the training log's."""
        return self.evaluation.into(sums)

    def validate(self) -> dict:
        """validation_step over dataloaders.val; {'val/<name>': float}, the same on every rank (a collective)."""
        return self.evaluation.validate(self)

    def validate_if_due(self) -> None:
        """After every step: validate every train.eval_interval steps and at the last (train.checkpoint_best)."""
        if self.evaluation.due(self.step, self.train_config.eval_interval, self.max_steps):
            self.checkpointing.validated(self.step, self.evaluation.keep(self.validate()))

    def print_before_train(self) -> None:  # the model's size, the ranks and batches, where things go; the clock starts
        self.run_log.before_train(self)

    def print_step(self) -> None:
        """Every log_interval steps, at the last and after a validation: the step's line (the loop's one wait)."""
        validated = self.evaluation.take_results()
        if self.step % self.train_config.log_interval and self.step != self.max_steps and validated is None:
            return
        self.nan_guard.settle(self.step, wait=True)
        self.last_metrics = self.run_log.line(
            self.step, self.losses_book.take_averages(self.strategy.reduce_mean, self._last_result.grad_norm),
            self.scheduler.get_last_lr()[0], self.nan_guard.take_window(),
            self.evaluation.logged.average(cpu_group=self.env.cpu_group), validated or {})

    def print_after_train(self) -> None:
        self.run_log.after_train(self)

    # -- checkpoints (GigaTrain's hooks; the checkpointing part does the work) ----------------------
    def save_checkpoint_step(self) -> None:
        """After every step: save when train.checkpoint_interval says, at the last step, or at a new best."""
        if self.checkpointing.due():
            self.save_checkpoint()

    def save_checkpoint(self) -> None:
        """Write a checkpoint of this step; the NaN guard settles first, so a stop comes before anything is written."""
        self.checkpointing.save()

    def wait_for_checkpoint(self, raise_errors=True) -> None:
        """Return once no checkpoint is being written in the background (train.checkpoint_async)."""
        self.checkpoints.wait(raise_errors)

    def resume(self, checkpoint=None) -> None:
        """Continue from `checkpoint` (a folder, or its name under model_dir; None: the newest), ours or GigaTrain's."""
        self.checkpointing.resume(None if checkpoint is None else self._checkpoint_path(checkpoint))

    def resume_gigatrain(self, folder) -> None:
        """Continue a run of the real GigaTrain 1.1 from its checkpoint `folder`."""
        self.checkpointing.resume_gigatrain(folder)

    def load_checkpoint(self, checkpoint, models, strict=True) -> None:
        """Load model folders of `checkpoint` (get_checkpoint's forms) into `models`, by the class each names."""
        if checkpoint is not None:
            load_model_folders(self.get_checkpoint(checkpoint), models, strict, say=self.print)

    def remove_checkpoint(self, total_limit=None) -> None:
        """The rolling limit (train.checkpoint_total_limit, or `total_limit`) on model_dir, main process."""
        if self.is_main_process:
            self.checkpoints.clean_up(total_limit)

    def save_config(self, config) -> None:
        """The run's config as project_dir/config.json (main process), which load_config(project_dir) reads."""
        if self.is_main_process:
            write_config(config, self.project_dir)

    def state_dict(self) -> dict:
        """The trainer's own state in a checkpoint (training_state.pt)."""
        return self.checkpointing.trainer_state()

    def load_state_dict(self, state_dict) -> None:
        self.checkpointing.load_trainer_state(state_dict)

    def checkpoint_meta(self) -> dict:
        """What meta.json records beside the files."""
        return self.checkpointing.meta()

    def abandon(self) -> None:
        if self.strategy is not None:
            self.strategy.close()
        self._close_process_settings()

    def _finish(self):
        self.wait_for_checkpoint()
        log_end(self, self.checkpoints.latest())
        self.strategy.close()
        self._close_process_settings()
        return self

    def _close_process_settings(self):
        """What this run changed in the process for itself comes back (oneDNN: engine/cpu_conv3d.py)."""
        if getattr(self, "_onednn_off", False):
            torch.backends.mkldnn.enabled, self._onednn_off = True, False
