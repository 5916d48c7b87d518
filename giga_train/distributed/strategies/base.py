"""The Strategy protocol, and its single-process form ("NO").

The trainer talks to the engine only through these methods; each engine (DDP, FSDP, DeepSpeed) is
one subclass in a file of its own. The trainer owns the accumulation boundary and tells the strategy
whether gradients of this micro-step must be synchronised."""
import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ...checkpoint.snapshot import host_copy
from ...checkpoint.state import load_weights, save_weights
from ...module_dict import ModuleDict
from ...precision import Precision
from ...registry import STRATEGIES

OPTIMIZER_DCP, PRECISION_FILE = "optimizer_dcp", "precision.pt"


@dataclass
class StepResult:
    grad_norm: object = None  # the pre-clip gradient norm (a device tensor), or None when not computed
    nonfinite: tuple = ()     # read on the host: what was non-finite on some rank ("loss", "grad_norm")
    skipped: bool = False     # read on the host: the update was not applied (the guard's skip, or the engine's)
    # The skip decided on the device (an optimizer that honours `found_inf`): nothing was read on the host.
    found_inf: object = None  # 0-dim float32 device tensor, 1.0 when this step was skipped on every rank
    flags: object = None      # the all-reduced per-name flags (a device tensor), for the host to settle later
    names: tuple = ()         # the names of `flags`


def supports_found_inf(optimizer):
    """Whether optimizer.step() skips on the device when `optimizer.found_inf` (a 0-dim float32 device
    tensor) is 1.0, leaving parameters and all state (step counts too) untouched: torch's Adam/AdamW
    with fused=True (the attribute GradScaler sets), or an optimizer class with `supports_found_inf = True`."""
    declared = getattr(optimizer, "supports_found_inf", None)
    if declared is not None:
        return bool(declared)
    return isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)) and all(
        g.get("fused") for g in optimizer.param_groups)


@STRATEGIES.register(name="NO")
class Strategy:
    shards_parameters_as_dtensors = False  # FSDP2: parameters become DTensors (float8 all-gather applies)
    optimizer_options = None  # StateDictOptions of the optimizer state in checkpoints (None: torch's default)
    writes_checkpoints_async = True  # train.checkpoint_async: state_snapshot copies, write_state only writes

    def __init__(self, env, launch, train, micro_batch_size=1):
        self.env, self.launch, self.train = env, launch, train
        self.micro_batch_size = micro_batch_size
        self.device = env.device
        self.precision = Precision(train.mixed_precision, env.device)
        self.model = self.optimizer = None

    # -- set-up -------------------------------------------------------------------------------
    def setup(self, model, make_optimizer):
        """Move/wrap the model and build the optimizer over the parameters the engine will step."""
        self.model = model.to(self.device)
        self.optimizer = make_optimizer(self.model)
        return self.model, self.optimizer

    def unwrap(self):
        return self.model

    # -- one step -----------------------------------------------------------------------------
    def autocast(self):
        return self.precision.autocast()

    def accumulating(self, accumulating):
        """Context for a micro-step; `accumulating=True` means no gradient sync is needed yet."""
        return contextlib.nullcontext()

    def backward(self, loss):
        scaler = self.precision.scaler
        (scaler.scale(loss) if scaler is not None else loss).backward()

    def step(self, max_grad_norm=None, measure=False, loss=None):
        """Unscale (fp16), clip to max_grad_norm, step the optimizer, zero the gradients.

        With `loss` (this rank's loss of the step) the step is guarded: when the loss or the gradient norm
        is non-finite on any rank, the update is skipped on all (gradients zeroed, optimizer untouched).
        With an optimizer that honours `found_inf` (supports_found_inf) the skip happens on the device and
        nothing is read on the host (the result's `found_inf` and `flags`); else, and under fp16 (the
        loss scaler reads its own flag anyway), the flags are read on the host first (one sync).
        Under fp16 only the loss counts: an inf gradient is the loss scaler's own, normal skip.
        The pre-clip gradient norm (a device tensor) comes back when clipping, `measure` or guarding."""
        scaler = self.precision.scaler
        guard = loss is not None
        norm = None
        if max_grad_norm is not None or measure or (guard and scaler is None):
            if scaler is not None:
                scaler.unscale_(self.optimizer)
            norm = self.clip_grad_norm(max_grad_norm)
        if guard:
            names, flags = self.finiteness_flags(loss=loss, grad_norm=norm if scaler is None else None)
            if scaler is None and supports_found_inf(self.optimizer):
                found_inf = flags.amax()  # exactly 0.0 or 1.0: torch's fused kernels skip on == 1.0
                self.optimizer.found_inf = found_inf
                try:
                    self.optimizer.step()
                finally:
                    del self.optimizer.found_inf  # as GradScaler does: a later step must not see it
                self.optimizer.zero_grad(set_to_none=True)
                return StepResult(norm, found_inf=found_inf, flags=flags, names=names)
            nonfinite = tuple(name for name, bad in zip(names, flags.tolist()) if bad)  # the host read
            if nonfinite:
                self.optimizer.zero_grad(set_to_none=True)
                if scaler is not None and norm is not None:
                    scaler.update()  # unscale_ ran: update() closes this step for the scaler
                return StepResult(norm, nonfinite, skipped=True)
        if scaler is not None:
            scaler.step(self.optimizer)
            scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(norm)

    def finiteness_flags(self, **values):
        """(names, flags): 1.0 in `flags` (a float32 device tensor) where that value is non-finite on any
        rank. One all-reduce (MAX) and no host read: under NCCL the collective only orders streams."""
        names = tuple(name for name, value in values.items() if value is not None)
        flags = torch.stack([(~torch.isfinite(values[n].detach().float())).any().float() for n in names])
        if dist.is_initialized() and self.env.world_size > 1:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return names, flags

    def nonfinite(self, **values):
        """Names of the given device tensors that are non-finite on any rank: finiteness_flags and one
        host read."""
        names, flags = self.finiteness_flags(**values)
        return tuple(name for name, bad in zip(names, flags.tolist()) if bad)

    def clip_grad_norm(self, max_norm):
        """The total gradient norm before clipping; clips to max_norm unless it is None."""
        grads = [p.grad for p in self.unwrap().parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads)
        if max_norm is not None:
            torch.nn.utils.clip_grads_with_norm_(self.unwrap().parameters(), max_norm, norm)
        return norm

    # -- state --------------------------------------------------------------------------------
    def full_state_dict(self, state):
        """Whole tensors on the CPU from a (possibly sharded) state dict; collective under sharding."""
        return {k: v.detach().cpu() for k, v in state.items()}

    def model_state_dict(self):
        """The full, unsharded model state on the CPU (on the main rank; others may get None)."""
        return self.full_state_dict(self.unwrap().state_dict())

    def model_snapshot(self, state=None, copy=False):
        """What `model/` holds: the full model state (or `state`, another state dict of the model, e.g.
        EMA's) on the host, on the main rank (None elsewhere); a collective under sharding. `copy`: tensors
        the training can no longer change (train.checkpoint_async). Off the CPU the full state already is
        a fresh host copy; on a CPU run `.cpu()` returns the live tensors, so they are cloned."""
        state = self.full_state_dict(state) if state is not None else self.model_state_dict()
        if not self.env.is_main:
            return None  # only the main rank writes `model/`
        return host_copy(state) if copy and self.device.type == "cpu" else state

    def write_model(self, folder, state, safe):
        """Write what model_snapshot took (files only: safe in a background thread)."""
        if self.env.is_main:
            members = isinstance(self.unwrap(), ModuleDict)
            save_weights(folder, state, members=members, safe=safe)

    def save_model(self, folder, safe, state=None):
        """Full weights as safetensors in `folder` (`state`: another state dict of the model, e.g. EMA)."""
        self.write_model(folder, self.model_snapshot(state), safe)

    def load_model(self, folder, strict):
        members = isinstance(self.unwrap(), ModuleDict)
        state = load_weights(folder, members=members)
        missing, unexpected = self.unwrap().load_state_dict(state, strict=strict)
        return missing, unexpected

    def state_snapshot(self, copy=False):
        """The optimizer state keyed by parameter name (this rank's shards under FSDP) and the loss
        scaler's. `copy`: as host copies the training can no longer change (train.checkpoint_async;
        pinned on CUDA)."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
        state = dict(optimizer=get_optimizer_state_dict(self.model, self.optimizer, options=self.optimizer_options),
                     precision=self.precision.state_dict())
        return host_copy(state, pinned=self.device.type == "cuda") if copy else state

    def write_state(self, folder, state, process_group=None):
        """Write what state_snapshot took: the optimizer state through torch.distributed.checkpoint (each
        rank writes its shards, replicated tensors once), so any strategy at any world size can read it;
        the loss-scaler state beside it. Collective over `process_group` (None: the default group)."""
        import torch.distributed.checkpoint as dcp
        dcp.save({"optimizer": state["optimizer"]}, checkpoint_id=os.path.join(folder, OPTIMIZER_DCP),
                 process_group=process_group)
        if self.env.is_main:
            torch.save({"precision": state["precision"]}, os.path.join(folder, PRECISION_FILE))

    def save_state(self, folder):
        self.write_state(folder, self.state_snapshot())

    def load_state(self, folder):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict
        source = os.path.join(folder, OPTIMIZER_DCP)
        if not os.path.isdir(source):  # written under DeepSpeed: its universal form, fp32 weights included
            from torch.distributed.checkpoint.state_dict import set_model_state_dict
            from ..portable import read_deepspeed, trainable_names
            weights, optim = read_deepspeed(folder, trainable_names(self.unwrap(), self.optimizer),
                                            self.optimizer.param_groups)
            if weights is not None:
                set_model_state_dict(self.model, weights, options=_full_options(strict=False))
            set_optimizer_state_dict(self.model, self.optimizer, optim, options=_full_options())
        else:
            state = {"optimizer": get_optimizer_state_dict(self.model, self.optimizer, options=self.optimizer_options)}
            dcp.load(state, checkpoint_id=source)
            set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"], options=self.optimizer_options)
        precision = os.path.join(folder, PRECISION_FILE)
        if os.path.isfile(precision):
            self.precision.load_state_dict(torch.load(precision, map_location="cpu", weights_only=True)["precision"])

    # -- collectives (identity in one process) -------------------------------------------------
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
        if dist.is_initialized() and self.env.world_size == 1:
            dist.destroy_process_group()  # the one-rank group this process made for itself


def _full_options(**extra):
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    return StateDictOptions(full_state_dict=True, **extra)
