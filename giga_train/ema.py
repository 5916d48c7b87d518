"""Exponential moving average of the trainable weights, kept in fp32."""
import torch
from torch.distributed.tensor import DTensor, distribute_tensor


class EMA:
    def __init__(self, module, decay):
        self.decay = decay
        self.names = [n for n, p in module.named_parameters() if p.requires_grad]
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.shadow = [p.detach().float().clone() for p in self.params]

    @torch.no_grad()
    def update(self, skip=None):
        """`skip`: None, or a 0-dim device tensor that is 1.0 when this step was skipped on the device;
        the update then has weight 0 (a no-op) without the host reading the flag."""
        current = [p.detach().float() if p.dtype != torch.float32 else p.detach() for p in self.params]
        if skip is None:
            torch._foreach_lerp_(self.shadow, current, 1.0 - self.decay)
        else:
            weight = torch.where(skip > 0, 0.0, 1.0 - self.decay).to(torch.float32)
            torch._foreach_lerp_(self.shadow, current, [weight] * len(self.shadow))

    def state_dict(self, module):
        """The module's full state with the averaged weights in place of the trained ones."""
        state = {k: v.detach() for k, v in module.state_dict().items()}
        state.update({n: s for n, s in zip(self.names, self.shadow)})
        return state

    def load_state_dict(self, state):
        for name, shadow in zip(self.names, self.shadow):
            full = state[name].to(shadow.device)
            if isinstance(shadow, DTensor):  # sharded (FSDP2): keep this rank's shard of the whole tensor
                full = distribute_tensor(full, shadow.device_mesh, shadow.placements)
            shadow.copy_(full)
