"""The Strategy protocol: everything the trainer and the checkpointer ask of a training engine.

One subclass per engine, each in a file of its own, registered in STRATEGIES under its
`launch.distributed_type` name; adding an engine is one file plus its registry line. The trainer owns
the accumulation boundary and tells the strategy whether this micro-step must sync gradients; the NaN
guard decides whether a step is skipped, the strategy knows how to skip it in its engine."""
import abc
import contextlib

import torch
import torch.distributed as dist

from .precision import Precision
from .step import OVERFLOW, StepResult, Verdict  # noqa: F401  (the protocol's types)


class Strategy(abc.ABC):
    # Whether state_snapshot(copy=True) returns host copies that write_state can write from another thread
    # (train.checkpoint_async). An engine that takes its own state while writing says False.
    state_snapshot_detached = True
    # Whether setup() takes a model on the meta device (setup's `meta_start`, distributed/meta_start.py).
    starts_from_meta = False
    # launch.parallelism_config (mesh.py): the mesh dimensions this engine can size above 1, the one that takes
    # the ranks the config leaves unsized, and what the refusal of another dimension adds.
    PARALLEL_DIMS = ()
    FILLS_DIM = None
    PARALLEL_NOTE = ""

    @classmethod
    def parallel_refusal(cls, dims):
        """Why this engine cannot run these ParallelDims (None: it can); asked by `giga-train check`."""
        return None

    @classmethod
    def check_config(cls, config):
        """Refuse, in one line (a ConfigError), what this engine would refuse at set-up, from the validated
        config alone: the schema calls it before any rank starts, so `giga-train check` says it. Returns what
        the engine derived from the config (given back to its constructor as `settings`), or None."""
        return None

    def __init__(self, env, launch, train, micro_batch_size=1, settings=None):
        self.env, self.launch, self.train = env, launch, train
        self.micro_batch_size = micro_batch_size
        self.device = env.device
        self.precision = Precision(train.mixed_precision, env.device)
        self.model = self.optimizer = None
        self.mesh = None  # a Mesh (mesh.py) when launch.parallelism_config sizes one

    def build_mesh(self):
        """The job's DeviceMesh from launch.parallelism_config (after the process group exists); hands its SP
        group to the sequence-parallel attention."""
        from .mesh import build_mesh
        block = self.launch.get("parallelism_config") if hasattr(self.launch, "get") else None
        self.mesh = build_mesh(block, self.env)
        if self.mesh is not None and self.mesh.dims.sp > 1:
            from .sequence_parallel import set_sequence_group
            set_sequence_group(self.mesh.sp_group, mode=self.mesh.dims.sp_backend)
        return self.mesh

    def require_sequence_split(self):
        """Under SP the gradients of an SP group are summed: a forward that never split its sequence
        (shard_sequence) would count each sample sp times. Asked at the first backward."""
        from ..errors import ConfigError
        from .sequence_parallel import sequence_length
        if sequence_length() is None:
            raise ConfigError(f"launch.parallelism_config.sp_size={self.mesh.dims.sp}: the model's forward never split"
                              " its sequence (giga_train.engine.sequence_parallel.shard_sequence, or a model hook);"
                              " every rank of an SP group would compute the whole sample")
        return True

    @property
    def data_rank(self):
        """The loader's rank: this rank's data-parallel coordinate (every rank of an SP group reads the same
        samples, and draws the same noise)."""
        return self.mesh.data_rank if self.mesh is not None else self.env.rank

    @property
    def data_world_size(self):
        """Ranks reading different samples: the world size without sequence parallelism."""
        return self.mesh.data_world_size if self.mesh is not None else self.env.world_size

    # -- set-up ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def setup(self, model, make_optimizer):
        """Place/wrap the model and build the optimizer with `make_optimizer(module)` over the parameters
        the engine steps. Returns (model, optimizer)."""

    @abc.abstractmethod
    def unwrap(self):
        """The user's module (its parameter names, without the engine's wrapper)."""

    def gathers_float8_weights(self):
        """Whether this engine all-gathers torchao float8 weights (decided before the model is converted)."""
        return False

    # -- one step -------------------------------------------------------------------------------
    def autocast(self):
        return self.precision.autocast()

    def accumulating(self, accumulating):
        """Context for a micro-step; `accumulating=True` means no gradient sync is needed yet."""
        return contextlib.nullcontext()

    @abc.abstractmethod
    def backward(self, loss):
        """Backward of this micro-step's loss (already divided by the accumulation)."""

    @abc.abstractmethod
    def step(self, max_grad_norm=None, measure=False, verdict=None):
        """Clip to max_grad_norm, step, zero the gradients. Returns a StepResult.

        `verdict(grad_norm)`: the NaN guard's decision for this step (a Verdict, see nan_guard.py), asked
        once the gradient norm is known (None where the engine knows it only after its step); the strategy
        skips the update as it says. `measure`: compute the pre-clip norm even without clipping."""

    def honours_found_inf(self):
        """Whether step() can skip on the device through the optimizer's `found_inf` (no host read)."""
        return False

    def finiteness_flags(self, **values):
        """(names, flags): 1.0 in `flags` (a float32 device tensor) where that value is non-finite on any
        rank. One all-reduce (MAX) and no host read: under NCCL the collective only orders streams."""
        names = tuple(name for name, value in values.items() if value is not None)
        flags = torch.stack([(~torch.isfinite(values[n].detach().float())).any().float() for n in names])
        if dist.is_initialized() and self.env.world_size > 1:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return names, flags

    # -- state (the checkpointer's side) ----------------------------------------------------------
    @abc.abstractmethod
    def full_state_dict(self, state):
        """Whole tensors on the CPU from a state dict of the model (possibly sharded); a collective."""

    def model_state_dict(self, keys=None):
        """The full model state on the CPU (on the main rank; others may get None); a collective. `keys`: only
        those (a PEFT adapter's: the frozen base is not gathered)."""
        state = self.unwrap().state_dict()
        return self.full_state_dict(state if keys is None else {k: v for k, v in state.items() if k in keys})

    @abc.abstractmethod
    def load_model_state(self, state, strict):
        """Set the model's weights from a full state dict (every rank passes the same)."""

    @property
    def sharded_checkpoints(self):
        """Whether checkpoints hold the model as each rank's shards instead of gathered whole (FSDP with
        launch.fsdp_config.fsdp_state_dict_type='SHARDED_STATE_DICT')."""
        return False

    def model_shards(self, state=None):
        """This rank's part of the model state (or of `state`, another state dict of the model such as
        EMA's), as torch.distributed.checkpoint writes it; no collective, nothing gathered."""
        raise NotImplementedError(f"{type(self).__name__} checkpoints the model whole")

    def load_model_shards(self, folder, strict):
        """Set the model's weights from the DCP folder `folder` (shards written at any world size). Here the
        whole model is read; a sharding engine reads only its own part."""
        from ..checkpoint.formats.model_layout import SHARDS_KEY
        from ..checkpoint.formats.full_state import read_dcp_whole
        self.load_model_state(read_dcp_whole(folder, SHARDS_KEY), strict)

    @abc.abstractmethod
    def state_snapshot(self, copy=False):
        """This rank's optimizer (and loss-scaler) state for write_state. `copy`: host copies the training
        can no longer change (train.checkpoint_async)."""

    @abc.abstractmethod
    def write_state(self, folder, state, process_group=None):
        """Write what state_snapshot took into `folder` in the engine's own form; collective over
        `process_group` (None: the default group)."""

    @abc.abstractmethod
    def load_state(self, folder):
        """Read the state write_state wrote; False when `folder` holds another engine's form (then the
        checkpointer reads it whole and calls load_full_state)."""

    @abc.abstractmethod
    def load_full_state(self, weights, optimizer_state):
        """Set the full optimizer state (keyed by parameter name) and, when given, fp32 `weights`."""

    def optimizer_layout(self):
        """((name, shape) of each parameter the optimizer steps, in its order; its param groups)."""
        by_id = {id(p): (n, tuple(p.shape)) for n, p in self.unwrap().named_parameters()}
        groups = self.optimizer.param_groups
        return [by_id[id(p)] for g in groups for p in g["params"]], groups

    # -- collectives (identity in one process) ----------------------------------------------------
    def reduce_mean(self, tensor):
        if not dist.is_initialized() or self.env.world_size == 1:
            return tensor
        tensor = tensor.clone()
        dist.all_reduce(tensor)  # SUM: gloo has no AVG
        return tensor / self.env.world_size

    def barrier(self):
        if dist.is_initialized() and self.env.world_size > 1:
            dist.barrier()

    def close(self):
        if self.mesh is not None and self.mesh.dims.sp > 1:
            from .sequence_parallel import set_sequence_group
            set_sequence_group(None)
        if dist.is_initialized() and self.env.world_size == 1:
            dist.destroy_process_group()  # the one-rank group this process made for itself
