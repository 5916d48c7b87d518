"""The global random streams (python, numpy, torch) around building: data rank 0 continues from where
get_models left them, as GigaTrain's does (its one set_seed at construction, nothing reseeded after), so the
same seed gives GigaTrain's noise in forward_step; what our engine draws while wrapping the model is undone;
every other data rank is reseeded with seed + data rank, so that ranks draw different noise (GigaTrain's
ranks all draw the same stream: docs/GIGATRAIN.md)."""
import random

import numpy as np
import torch


def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def capture():
    """The three global RNG states (CPU torch; CUDA is seeded by torch.manual_seed only)."""
    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def continue_after_build(state, seed, rank, group=None):
    """At the end of prepare: data rank 0 back to `state` (captured right after get_models), others reseeded
    seed + rank. `group`: the processes that share this data rank (a sequence-parallel group, not in
    GigaTrain), which must draw the same noise: data rank 0's take the state of the group's first process
    (their get_models may have drawn differently: one built the weights, the others on the meta device)."""
    if rank:
        seed_everything(seed + rank)
        return
    if group is not None:
        import torch.distributed as dist
        box = [state]
        dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
        state = box[0]
    random.setstate(state[0])
    np.random.set_state(state[1])
    torch.set_rng_state(state[2])
