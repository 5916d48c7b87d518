"""What FSDP1 and FSDP2 share: the process group (also at world size 1: FSDP needs one), the fsdp_config, and
the model's state through torch.distributed.checkpoint's state-dict API (gathered whole on the main rank, or
each rank's shards with fsdp_state_dict_type='SHARDED_STATE_DICT', read back at any world size). Each engine
wraps the model, syncs gradients and clips in its own file (fsdp1.py, fsdp2.py)."""
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.tensor import DTensor

from .fp8 import plain_tensors
from ..distributed.env import init_process_group
from .torch_optimizer import TorchOptimizerStrategy


class FSDPStrategyBase(TorchOptimizerStrategy):
    def __init__(self, env, launch, train, **kwargs):
        super().__init__(env, launch, train, **kwargs)
        init_process_group(env)  # also at world size 1: FSDP needs a group
        self.fsdp = launch.fsdp_config

    def full_state_dict(self, state):
        """Gathers every sharded (DTensor) tensor: a collective, all ranks call it."""
        state = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu() for k, v in state.items()}
        return plain_tensors(state)

    def model_state_dict(self, keys=None):
        # cpu_offload on a CPU run makes FSDP1 clone freed unsharded storage (a segfault, torch 2.13)
        options = StateDictOptions(full_state_dict=True, cpu_offload=self.device.type == "cuda")
        state = plain_tensors(get_model_state_dict(self.model, options=options))
        return state if keys is None else {k: v for k, v in state.items() if k in keys}

    def load_model_state(self, state, strict):
        set_model_state_dict(self.model, state, options=StateDictOptions(full_state_dict=True, strict=strict))

    @property
    def sharded_checkpoints(self):
        return self.fsdp.fsdp_state_dict_type == "SHARDED_STATE_DICT"

    def model_shards(self, state=None):
        """DTensors (FSDP1: its sharded state dict) holding this rank's shards only."""
        return plain_tensors(get_model_state_dict(self.model)) if state is None else state

    def load_model_shards(self, folder, strict):
        """Each rank reads the pieces of its own shards (DCP reshards from any world size)."""
        from torch.distributed.checkpoint import DefaultLoadPlanner

        from ..checkpoint.formats.model_layout import SHARDS_KEY
        from ..checkpoint.safe_unpickle import load_dcp
        state = {SHARDS_KEY: plain_tensors(get_model_state_dict(self.model))}  # read into the weights' storage
        load_dcp(state, folder, planner=DefaultLoadPlanner(allow_partial_load=not strict))
        set_model_state_dict(self.model, state[SHARDS_KEY], options=StateDictOptions(strict=strict))
