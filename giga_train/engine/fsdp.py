"""distributed_type="FSDP": FSDP2 (fsdp2.py) or FSDP1 (fsdp1.py), as launch.fsdp_config.fsdp_version says."""
from ..registry import STRATEGIES
from .fsdp1 import FSDP1Strategy
from .fsdp2 import FSDP2Strategy


@STRATEGIES.register(name="FSDP")
def fsdp_strategy(env, launch, train, **kwargs):
    return strategy_class(launch)(env, launch, train, **kwargs)


def strategy_class(launch):
    return FSDP1Strategy if launch.fsdp_config.fsdp_version == 1 else FSDP2Strategy


fsdp_strategy.strategy_class = strategy_class
