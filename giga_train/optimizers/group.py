"""OptimizerGroup: several optimizers stepped as one, e.g. CAME8Bit for the large matrices and FusedAdam
for the rest (the seeds' advice), when get_optimizers returns more than one.

The engine, the NaN guard and the checkpoints see one torch Optimizer: its param groups are the members'
own group dicts, in order (so a member's scheduler changing its lr is what the group steps with), its
state is a view of the members' states, and its state_dict numbers the parameters across the members in
that order: torch.distributed.checkpoint's state-dict helpers read and write it like any optimizer's.
`found_inf` (the NaN guard's device-side skip) is handed to every member, which must all honour it."""
from collections.abc import Mapping

import torch

from .closure import closure_loss
from .found_inf import supports_found_inf


class _States(Mapping):
    """The members' `state` dicts as one read-only mapping (parameter -> its state)."""

    def __init__(self, optimizers):
        self.optimizers = optimizers

    def __getitem__(self, param):
        for optimizer in self.optimizers:
            if param in optimizer.state:
                return optimizer.state[param]
        raise KeyError(param)

    def __iter__(self):
        return (param for optimizer in self.optimizers for param in optimizer.state)

    def __len__(self):
        return sum(len(optimizer.state) for optimizer in self.optimizers)


class OptimizerGroup(torch.optim.Optimizer):
    def __init__(self, optimizers):
        self.optimizers = list(optimizers)
        if len(self.optimizers) < 2:
            raise ValueError("OptimizerGroup: give two or more optimizers")
        # The members' group dicts themselves (add_param_group keeps the dict it is given).
        super().__init__([group for optimizer in self.optimizers for group in optimizer.param_groups], {})
        self.state = _States(self.optimizers)

    @property
    def supports_found_inf(self):
        return all(supports_found_inf(optimizer) for optimizer in self.optimizers)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        found_inf = getattr(self, "found_inf", None)
        for optimizer in self.optimizers:
            if found_inf is not None:
                optimizer.found_inf = found_inf
            try:
                optimizer.step()
            finally:
                if found_inf is not None:
                    del optimizer.found_inf
        return loss

    def zero_grad(self, set_to_none=True):
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def load_state_dict(self, state_dict):
        """Each member gets its groups and the state of its parameters (numbered across the members)."""
        groups, first = state_dict["param_groups"], 0
        for optimizer in self.optimizers:
            mine = groups[first:first + len(optimizer.param_groups)]
            first += len(optimizer.param_groups)
            ids = {i for group in mine for i in group["params"]}
            optimizer.load_state_dict({"state": {i: s for i, s in state_dict["state"].items() if i in ids},
                                       "param_groups": mine})
        self.param_groups = [group for optimizer in self.optimizers for group in optimizer.param_groups]
