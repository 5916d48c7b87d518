"""The strategies whose optimizer is a torch optimizer we step ourselves (NO, DDP, FSDP1, FSDP2): loss
scaling, clipping, the NaN guard's skip, and optimizer state through torch.distributed.checkpoint."""
import os

import torch

from ..checkpoint.safe_unpickle import load_dcp
from ..optimizers.found_inf import supports_found_inf
from .protocol import OVERFLOW, StepResult, Strategy

OPTIMIZER_DCP, PRECISION_FILE = "optimizer_dcp", "precision.pt"


class TorchOptimizerStrategy(Strategy):
    # -- one step -------------------------------------------------------------------------------
    def backward(self, loss):
        if self.mesh is not None and self.mesh.dims.sp > 1 and not getattr(self, "_split_seen", False):
            self._split_seen = self.require_sequence_split()
        scaler = self.precision.scaler
        (scaler.scale(loss) if scaler is not None else loss).backward()

    def honours_found_inf(self):
        return self.precision.scaler is None and supports_found_inf(self.optimizer)

    def step(self, max_grad_norm=None, measure=False, verdict=None):
        """Under fp16 the gradients are unscaled before clipping, and a skip for an inf gradient is the
        loss scaler's own; a device-side verdict (found_inf) is handed to the optimizer, a host-side one
        that says skip drops the gradients."""
        scaler = self.precision.scaler
        norm = None
        if max_grad_norm is not None or measure or (verdict is not None and scaler is None):
            if scaler is not None:
                scaler.unscale_(self.optimizer)
            norm = self.clip_grad_norm(max_grad_norm)
        decided = verdict(norm) if verdict is not None else None
        if decided is not None and decided.found_inf is not None:
            self.optimizer.found_inf = decided.found_inf
            try:
                self.optimizer.step()
            finally:
                del self.optimizer.found_inf  # as GradScaler does: a later step must not see it
            self.optimizer.zero_grad(set_to_none=True)
            return StepResult(norm, found_inf=decided.found_inf, flags=decided.flags, names=decided.names)
        if decided is not None and decided.nonfinite_names:
            self.optimizer.zero_grad(set_to_none=True)
            if scaler is not None and norm is not None:
                scaler.update()  # unscale_ ran: update() closes this step for the scaler
            return StepResult(norm, decided.nonfinite_names, skipped=True)
        if scaler is not None:
            lowered = self.precision.scaled_step(self.optimizer)
            self.optimizer.zero_grad(set_to_none=True)
            if lowered is not None:  # the scaler skipped the update: counted as a skipped step
                return StepResult(norm, (OVERFLOW,), skipped=True, loss_scale=lowered)
            return StepResult(norm)
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(norm)

    @property
    def norm_type(self):
        """train.grad_norm_type (GigaTrain's key): the p of the clipped gradient norm (2 by default)."""
        return float(self.train.get("grad_norm_type") or 2.0)

    def clip_grad_norm(self, max_norm):
        """The total gradient norm before clipping; clips to max_norm unless it is None."""
        grads = [p.grad for p in self.unwrap().parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads, self.norm_type)
        if max_norm is not None:
            torch.nn.utils.clip_grads_with_norm_(self.unwrap().parameters(), max_norm, norm)
        return norm

    # -- state ----------------------------------------------------------------------------------
    def full_state_dict(self, state):
        return {k: v.detach().cpu() for k, v in state.items()}

    def load_model_state(self, state, strict):
        self.unwrap().load_state_dict(state, strict=strict)

    def optimizer_state_options(self):
        """StateDictOptions for the optimizer state in checkpoints (None: torch's default, sharded as held)."""
        return None

    def state_snapshot(self, copy=False):
        """The optimizer state keyed by parameter name (this rank's shards under FSDP2) and the loss
        scaler's; `copy`: pinned host copies on CUDA."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        from ..checkpoint.host_copy import host_copy
        state = dict(optimizer=get_optimizer_state_dict(self.model, self.optimizer,
                                                        options=self.optimizer_state_options()),
                     precision=self.precision.state_dict())
        return host_copy(state, pinned=self.device.type == "cuda") if copy else state

    def write_state(self, folder, state, process_group=None):
        """The optimizer state through torch.distributed.checkpoint (each rank writes its shards, replicated
        tensors once), so any strategy at any world size can read it; the loss-scaler state beside it."""
        import torch.distributed.checkpoint as dcp
        dcp.save({"optimizer": state["optimizer"]}, checkpoint_id=os.path.join(folder, OPTIMIZER_DCP),
                 process_group=process_group)
        if self.env.is_main:
            torch.save({"precision": state["precision"]}, os.path.join(folder, PRECISION_FILE))

    def load_state(self, folder):
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict
        source = os.path.join(folder, OPTIMIZER_DCP)
        if not os.path.isdir(source):
            return False
        options = self.optimizer_state_options()
        state = {"optimizer": get_optimizer_state_dict(self.model, self.optimizer, options=options)}
        load_dcp(state, source)  # .metadata through the allow-list, not plain pickle
        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"], options=options)
        precision = os.path.join(folder, PRECISION_FILE)
        if os.path.isfile(precision):
            self.precision.load_state_dict(torch.load(precision, map_location="cpu", weights_only=True)["precision"])
        return True

    def load_full_state(self, weights, optimizer_state):
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)
        if weights is not None:
            set_model_state_dict(self.model, weights, options=StateDictOptions(full_state_dict=True, strict=False))
        set_optimizer_state_dict(self.model, self.optimizer, optimizer_state,
                                 options=StateDictOptions(full_state_dict=True))
