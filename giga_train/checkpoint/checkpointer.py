"""The Checkpointer: save (in the loop or in the background), rotate, resume and load, for every strategy.

A checkpoint folder `models/checkpoint_epoch_E_step_S/` holds the weights in GigaTrain's model layout
(layout.py: a folder per model, `<name>_ema/` and `ema_config.json` with EMA; written by the main rank; with
fsdp_state_dict_type SHARDED_STATE_DICT each rank's shards in `model_dcp/`, `ema_dcp/`), the
engine's optimizer state (`optimizer_dcp/` + `precision.pt`, or `deepspeed/`), `random_states_R.pt` per
rank (and `data_state_R.pt`: streaming data's position), `training_state.pt` (the trainer's state_dict: scheduler, data position, step) and, written last,
`meta.json`. The strategy takes and writes its own state; all the
rest (folders, files, order, errors) is here, so the trainer calls save/resume in one line each."""
import json
import logging
import os
import shutil
import time
from copy import deepcopy

import torch

from ..errors import TrainingStopped
from .async_writer import AsyncWriter
from .formats.model_layout import (EMA_SUFFIX, SHARDS_KEY, is_sharded, layout_meta, model_folders, read_weights,
                                   shards_folder, write_live, write_model_folders, write_shards)
from .formats.adapters import all_adapters, check_adapter_fit, only, saved_keys
from .manager import CheckpointManager, disk_error, free_bytes, read_meta
from .formats.full_state import deepspeed_meta, read_dcp, read_deepspeed
from .safe_unpickle import load_dcp
from .host_copy import host_copy
from .formats.weights import rng_state, set_rng_state

log = logging.getLogger("giga_train")
TRAINING_STATE, EMA_CONFIG = "training_state.pt", "ema_config.json"
ENGINE_STATE = ("optimizer_dcp", "precision.pt", "deepspeed")  # what train.checkpoint_save_optimizer=False drops
# With checkpoint_save_optimizer=False the newest rolling checkpoints keeping their optimizer state: two, as
# GigaTrain (its clean-up runs before each save and spares the newest), so a fallback resume has it too.
OPTIMIZER_KEPT = 2


class Checkpointer:
    def __init__(self, strategy, model_dir, train, ema=None, model_name="model", rank_state=None):
        """`train`: the train config (checkpoint_* keys); `ema`: the EMA whose weights go into `<name>_ema/`;
        `model_name`: the folder of a model that is not a ModuleDict (GigaTrain's trainer attribute);
        `rank_state`: what has a state of its own on each rank (state_dict/load_state_dict: a streaming data
        position), saved per rank as data_state_R.pt."""
        self.strategy, self.env, self.model_dir, self.ema = strategy, strategy.env, model_dir, ema
        self.model_name, self.rank_state = model_name, rank_state
        self.safe, self.strict = train.checkpoint_safe_serialization, train.checkpoint_strict
        self.keep_old_optimizer_state = train.get("checkpoint_save_optimizer", True)
        # GigaTrain's checkpoint_keeps are epochs when training by epochs
        self.folders = CheckpointManager(model_dir, train.checkpoint_total_limit, train.checkpoint_keeps,
                                         keeps_by_epoch=train.get("max_epochs") is not None)
        self.async_writer = None
        if train.checkpoint_async and strategy.state_snapshot_detached:
            self.async_writer = AsyncWriter(self)
        elif train.checkpoint_async:
            log.info("train.checkpoint_async has no effect under %s: its engine writes checkpoints synchronously",
                     type(strategy).__name__)

    def latest(self):
        """The newest complete checkpoint folder, or None."""
        return self.folders.latest()

    def latest_finite(self):
        """The newest complete checkpoint whose weights are finite, or None (what a stop calls good)."""
        return self.folders.latest_finite()

    def latest_step(self):
        """The step of the newest complete checkpoint, or None."""
        latest = self.latest()
        return read_meta(latest)["step"] if latest else None

    @property
    def in_flight(self):
        """Whether a checkpoint is being written in the background (train.checkpoint_async)."""
        return self.async_writer is not None and self.async_writer.in_flight

    # -- save -----------------------------------------------------------------------------------
    def save(self, step, epoch, meta, training_state):
        """Write checkpoint (epoch, step); `training_state()` gives the trainer's state, `meta` goes into
        meta.json. A full disk stops the run with one line, keeping every complete checkpoint and removing
        what this one had written. In the background with train.checkpoint_async: the loop only takes the
        state into host memory."""
        self.wait()  # at most one save in flight: its error surfaces here
        meta = dict(meta, layout=layout_meta(self.strategy.unwrap(), self.model_name, self.ema is not None,
                                             sharded=self.sharded))
        tmp = self.folders.tmp_path(epoch, step)
        try:
            start = time.perf_counter()
            if self.env.is_main:
                self.folders.begin(epoch, step)
            self.strategy.barrier()  # the folder exists before any rank writes into it
            if self.async_writer is not None:
                parts = self.parts(tmp, training_state, copy=True, process_group=self.async_writer.group)
                self.async_writer.save(tmp, parts, meta, start)
            else:
                for take, write in self.parts(tmp, training_state):
                    write(take())
                self.strategy.barrier()
                if self.env.is_main:
                    log.info("saved %s (%.1f s)", self.commit(tmp, meta), time.perf_counter() - start)
                self.strategy.barrier()
        except BaseException as e:  # torch's CheckpointException is a BaseException
            disk = disk_error(e)
            if disk is None:
                raise
            raise self.stopped_by_full_disk(step, tmp, disk) from None

    def commit(self, tmp, meta):
        """Put the written folder `tmp` in place (main rank; the manager applies the rolling limit), then
        drop old optimizer state (drop_old_optimizer_state)."""
        final = self.folders.commit(tmp, meta)
        self.drop_old_optimizer_state()
        return final

    def clean_up(self, total_limit=None):
        """GigaTrain's remove_checkpoint: the rolling limit (`total_limit`, else train.checkpoint_total_limit),
        then drop_old_optimizer_state."""
        self.folders.rotate(total_limit)
        self.drop_old_optimizer_state()

    def drop_old_optimizer_state(self):
        """With train.checkpoint_save_optimizer=False: the engine state dropped from the rolling checkpoints
        of this run's history but the OPTIMIZER_KEPT newest (checkpoint_keeps keep theirs, as in GigaTrain)."""
        if not self.keep_old_optimizer_state:
            for path in self.folders.rolling()[OPTIMIZER_KEPT:]:
                self.folders.strip(path, ENGINE_STATE)

    def wait(self, raise_errors=True):
        """Return once no checkpoint is being written in the background."""
        if self.async_writer is not None:
            self.async_writer.wait(raise_errors)

    def parts(self, tmp, training_state, copy=False, process_group=None):
        """What a checkpoint holds, as (take, write) pairs. take() runs on the training thread (the
        collectives, the device->host copies; `copy`: into host memory the training no longer changes);
        write(taken) only writes files into `tmp` (in a thread with checkpoint_async; `process_group`
        for write_state's collectives). One list for both modes: their files are the same."""
        strategy, join = self.strategy, os.path.join
        if self.sharded:  # each rank writes its own shards: no gather of the model
            parts = [(lambda: self.model_shards(copy=copy),
                      lambda state: write_shards(shards_folder(tmp), state, process_group))]
            if self.ema is not None:
                parts.append((lambda: self.model_shards(self.ema.state_dict(strategy.unwrap()), copy=copy),
                              lambda state: write_shards(shards_folder(tmp, ema=True), state, process_group)))
        else:
            parts = [(lambda: self.model_snapshot(copy=copy), lambda state: self.write_model(tmp, state))]
            if self.ema is not None:
                parts.append((lambda: self.model_snapshot(self.ema.state_dict(strategy.unwrap()), copy=copy),
                              lambda state: self.write_model(tmp, state, ema=True)))
        if self.ema is not None:
            if self.env.is_main:  # GigaTrain's ema_config.json: the decay and the updates made so far
                parts.append((lambda: dict(self.ema.config), lambda config: _write_json(join(tmp, EMA_CONFIG), config)))
        parts.append((lambda: strategy.state_snapshot(copy=copy),
                      lambda state: strategy.write_state(tmp, state, process_group)))
        rng_file = join(tmp, f"random_states_{self.env.rank}.pt")
        parts.append((rng_state, lambda state: torch.save(state, rng_file)))  # rng_state() is a fresh copy
        if self.rank_state is not None:
            data_file = join(tmp, f"data_state_{self.env.rank}.pt")
            parts.append((lambda: deepcopy(self.rank_state.state_dict()),
                          lambda state: torch.save(state, data_file)))
        if self.env.is_main:
            parts.append((lambda: host_copy(training_state()) if copy else training_state(),
                          lambda state: torch.save(state, join(tmp, TRAINING_STATE))))
        return parts

    def model_snapshot(self, state=None, copy=False):
        """The full model state (or `state`, another state dict of the model, e.g. EMA's) on the host, on
        the main rank (None elsewhere); a collective under sharding. `copy`: tensors the training can no
        longer change. Off the CPU the full state already is a fresh host copy; on a CPU run `.cpu()`
        returns the live tensors, so they are cloned."""
        strategy, keys = self.strategy, self.saved_keys()  # a PEFT adapter: its own tensors only (adapters.py)
        if state is not None:
            state = strategy.full_state_dict(only(state, keys))
        else:
            state = strategy.model_state_dict() if keys is None else strategy.model_state_dict(keys)
        if not self.env.is_main:
            return None
        return host_copy(state) if copy and strategy.device.type == "cpu" else state

    def model_shards(self, state=None, copy=False):
        """This rank's shards of the model state (or of `state`), for write_shards; `copy`: host copies."""
        state = only(self.strategy.model_shards(state), self.saved_keys())
        return host_copy(state, pinned=self.strategy.device.type == "cuda") if copy else state

    @property
    def sharded(self):
        """Whether the model goes into each rank's shards (fsdp_state_dict_type='SHARDED_STATE_DICT'): not when
        every member is a PEFT adapter, whose tensors alone are gathered (they are small; the base never is) and
        written in PEFT's format, loadable as they are. A ModuleDict that also has other members is sharded, the
        adapters' tensors alone for theirs."""
        return self.strategy.sharded_checkpoints and not all_adapters(model_folders(self.strategy.unwrap(),
                                                                                    self.model_name))

    def saved_keys(self):
        """The model's keys a checkpoint holds: with PEFT adapters, theirs (not the frozen base); else None (all)."""
        return saved_keys(model_folders(self.strategy.unwrap(), self.model_name))

    def write_model(self, tmp, state, ema=False):
        """Write what model_snapshot took into checkpoint folder `tmp` in GigaTrain's layout: the live
        weights, or with `ema` the `<name>_ema/` folders (files only: safe in a background thread)."""
        if not self.env.is_main:
            return
        module = self.strategy.unwrap()
        if ema:
            write_model_folders(tmp, module, state, self.model_name, self.safe, suffix=EMA_SUFFIX)
        else:
            write_live(tmp, module, state, self.model_name, self.ema is not None, self.safe)

    def stopped_by_full_disk(self, step, tmp, disk):
        """The one line that stops the run when the disk cannot hold checkpoint `step`; removes what it had
        written (`tmp`), so the newest complete checkpoint stays the newest."""
        if self.env.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        return TrainingStopped(
            f"checkpoint at step {step}: {os.strerror(disk.errno)} writing {disk.filename or tmp}"
            f" ({free_bytes(self.model_dir) / 2**30:.2f} GiB free there); nothing of it was kept, the"
            f" newest complete checkpoint is {self.latest() or 'none yet'}")

    # -- resume ---------------------------------------------------------------------------------
    def resume_path(self, resume):
        """The folder `resume` names (True: the newest complete and verified one), or None to start afresh;
        checksums verified, the run's lineage noted for rotation."""
        return self.folders.resume_path(resume, self.env)

    def load(self, path, load_training_state):
        """Restore every rank from checkpoint `path`, written by any strategy at any world size:
        weights, engine state, `load_training_state(state)` with the trainer's state, EMA, RNG."""
        self.wait()
        strategy, meta = self.strategy, read_meta(path)
        adapters = bool((meta.get("layout") or {}).get("adapters"))  # PEFT adapters only: the base is get_models'
        if is_sharded(meta) and not adapters:
            strategy.load_model_shards(shards_folder(path), self.strict)
        else:  # an adapter's shards are read whole (it is small), its tensors only
            state = read_weights(path, meta)
            if adapters:
                check_adapter_fit(strategy.unwrap(), state, path)
            strategy.load_model_state(state, self.strict and not adapters)
        if not any(os.path.exists(os.path.join(path, name)) for name in ENGINE_STATE):
            log.warning("resume: %s holds no optimizer state (train.checkpoint_save_optimizer=False dropped it);"
                        " the optimizer starts afresh", path)
        elif not strategy.load_state(path):  # another engine's form: read it whole
            strategy.load_full_state(*read_full_state(path, *strategy.optimizer_layout()))
        load_training_state(torch.load(os.path.join(path, TRAINING_STATE), map_location="cpu", weights_only=True))
        if self.ema is not None:
            config = os.path.join(path, EMA_CONFIG)
            step = json.load(open(config))["optimization_step"] if os.path.isfile(config) else None
            if is_sharded(meta) and not adapters:
                self.load_ema_shards(shards_folder(path, ema=True), step)
            else:
                self.ema.load_state_dict(read_weights(path, meta, ema=True), step, self.strict, path)
        data_file = os.path.join(path, f"data_state_{self.env.rank}.pt")
        if self.rank_state is not None and os.path.isfile(data_file):
            self.rank_state.load_state_dict(torch.load(data_file, map_location="cpu", weights_only=True))
        rng_file = os.path.join(path, f"random_states_{self.env.rank}.pt")
        if os.path.isfile(rng_file):
            set_rng_state(torch.load(rng_file, map_location="cpu", weights_only=True))

    def load_ema_shards(self, folder, step):
        """The averaged weights straight into the EMA's own tensors (each rank reads its shards' pieces)."""
        from torch.distributed.checkpoint import DefaultLoadPlanner
        shadows = {SHARDS_KEY: dict(zip(self.ema.keys, self.ema.shadow))}  # buffers: the live model's
        load_dcp(shadows, folder, planner=DefaultLoadPlanner(allow_partial_load=True))
        if step is not None:
            self.ema.optimization_step = step


def _write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f, indent=2)


def read_full_state(folder, names, param_groups):
    """(fp32 weights or None, the full optimizer state keyed by parameter name) of any strategy's checkpoint:
    DeepSpeed's universal form (which carries its fp32 master weights), else torch.distributed.checkpoint's."""
    if deepspeed_meta(folder) is not None:
        return read_deepspeed(folder, names, param_groups)
    return None, read_dcp(folder)
