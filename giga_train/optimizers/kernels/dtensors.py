"""The local tensor of a possibly sharded (FSDP2 DTensor) parameter: what every optimizer kernel steps."""
try:
    from torch.distributed.tensor import DTensor
except ImportError:  # torch without DTensor: nothing can be sharded
    DTensor = None


def is_dtensor(t):
    return DTensor is not None and isinstance(t, DTensor)


def local(t):
    return t._local_tensor if is_dtensor(t) else t
