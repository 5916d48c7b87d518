"""launch.parallelism_config: the mesh sizes (Accelerate's ParallelismConfig names) checked against the world
size and the engine (each engine class says which dimensions it takes), and the heads of the models section
against the sequence-parallel size where the config names them. Normalised in place to every size filled."""
from ..config import Config
from ..errors import ConfigError
from ..engine.mesh import WHERE, check_heads, parse_parallel_dims
from ..registry import STRATEGIES

HEAD_KEYS = ("heads", "num_heads", "n_heads", "n_head", "num_attention_heads", "attention_heads")


def strategy_class(launch):
    """The engine class that launch.distributed_type (already normalised) runs."""
    built = STRATEGIES.get(launch.distributed_type)
    pick = getattr(built, "strategy_class", None)  # "FSDP" picks FSDP1 or FSDP2 by fsdp_version
    return pick(launch) if pick is not None else built


def check_parallelism(launch, models, world_size):
    """Validate and normalise launch.parallelism_config (left None when absent)."""
    if launch.get("parallelism_config") is None:
        return None
    cls = strategy_class(launch)
    name = launch.distributed_type + (f" (fsdp_version={launch.fsdp_config.fsdp_version})"
                                      if launch.distributed_type == "FSDP" else "")
    dims = parse_parallel_dims(launch.parallelism_config, world_size, name, cls.PARALLEL_DIMS, cls.FILLS_DIM,
                               note=cls.PARALLEL_NOTE)
    refusal = cls.parallel_refusal(dims)
    if refusal:
        raise ConfigError(f"{WHERE}: {refusal}")
    check_heads(_head_counts(models), dims)
    launch.parallelism_config = Config(dims.as_config())
    return dims


def _head_counts(section, prefix="models"):
    """{dotted key: int} of every key in the models section that names a number of attention heads."""
    found = {}
    if isinstance(section, dict):
        for key, value in section.items():
            where = f"{prefix}.{key}"
            if key in HEAD_KEYS and isinstance(value, int) and not isinstance(value, bool):
                found[where[len("models."):]] = value
            elif isinstance(value, dict):
                found.update(_head_counts(value, where))
    return found
