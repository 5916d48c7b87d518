"""Host copies of checkpoint state that the training can no longer change (train.checkpoint_async):
the loop pays for these copies, a background thread writes them."""
import copy

import torch
from torch.distributed.tensor import DTensor


def host_copy(state, pinned=False):
    """`state` (nested dicts, lists and tuples of tensors, DTensors and plain values) with every tensor
    copied into host memory of its own. `pinned` (CUDA): device tensors go to pinned memory without
    blocking, then one stream sync; freed pinned blocks stay in torch's host cache, so the next save
    reuses them. DTensors keep their mesh and placements: DCP still writes each rank's shard."""
    copied = _copy(state, pinned)
    if pinned:
        torch.cuda.current_stream().synchronize()
    return copied


def _copy(value, pinned):
    if isinstance(value, DTensor):
        return DTensor(_tensor(value._local_tensor, pinned), value._spec, requires_grad=False)
    if isinstance(value, torch.Tensor):
        return _tensor(value, pinned)
    if isinstance(value, dict):
        return type(value)((k, _copy(v, pinned)) for k, v in value.items())
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(_copy(v, pinned) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_copy(v, pinned) for v in value)
    return copy.deepcopy(value)


def _tensor(tensor, pinned):
    tensor = tensor.detach()
    if tensor.device.type == "cpu":
        return tensor.clone()  # may be the live tensor itself (a CPU run's parameters, Adam's step count)
    if not pinned:
        return tensor.to("cpu")
    out = torch.empty_like(tensor, device="cpu", pin_memory=True)
    return out.copy_(tensor, non_blocking=True)
