"""The Strategy protocol, and its single-process form ("NO").

The trainer talks to the engine only through these methods; each engine (DDP, FSDP, DeepSpeed) is
one subclass in a file of its own. The trainer owns the accumulation boundary and tells the strategy
whether gradients of this micro-step must be synchronised."""
import contextlib
import os

import torch

from ...checkpoint.state import load_weights, save_weights
from ...module_dict import ModuleDict
from ...precision import Precision
from ...registry import STRATEGIES


@STRATEGIES.register(name="NO")
class Strategy:
    def __init__(self, env, launch, train):
        self.env, self.launch, self.train = env, launch, train
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

    def _grads(self):
        return [p.grad for p in self.unwrap().parameters() if p.grad is not None]

    def _unscale(self):
        scaler = self.precision.scaler
        if scaler is not None and not getattr(self, "_unscaled", False):
            scaler.unscale_(self.optimizer)
            self._unscaled = True

    def clip_grad_norm(self, max_norm):
        """Clip to max_norm (None: only measure). Returns the pre-clip total norm, on the device."""
        self._unscale()
        grads = self._grads()
        if max_norm is None:
            return torch.nn.utils.get_total_norm(grads)
        norm = torch.nn.utils.get_total_norm(grads)
        torch.nn.utils.clip_grads_with_norm_(self.unwrap().parameters(), max_norm, norm)
        return norm

    def step(self):
        scaler = self.precision.scaler
        if scaler is not None:
            scaler.step(self.optimizer)
            scaler.update()
            self._unscaled = False
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    # -- state --------------------------------------------------------------------------------
    def model_state_dict(self):
        """The full, unsharded model state on the CPU (on the main rank; others may get None)."""
        return {k: v.detach().cpu() for k, v in self.unwrap().state_dict().items()}

    def save_model(self, folder, safe):
        state = self.model_state_dict()
        if self.env.is_main:
            members = isinstance(self.unwrap(), ModuleDict)
            save_weights(folder, state, members=members, safe=safe)

    def load_model(self, folder, strict):
        members = isinstance(self.unwrap(), ModuleDict)
        state = load_weights(folder, members=members)
        missing, unexpected = self.unwrap().load_state_dict(state, strict=strict)
        return missing, unexpected

    def save_state(self, folder):
        """Optimizer and loss-scaler state (this engine's part of the training state)."""
        if self.env.is_main:
            torch.save({"optimizer": self.optimizer.state_dict(), "precision": self.precision.state_dict()},
                       os.path.join(folder, "optimizer.pt"))

    def load_state(self, folder):
        state = torch.load(os.path.join(folder, "optimizer.pt"), map_location="cpu", weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.precision.load_state_dict(state["precision"])

    # -- collectives (identity in one process) -------------------------------------------------
    def reduce_mean(self, tensor):
        return tensor

    def barrier(self):
        pass

    def close(self):
        pass
