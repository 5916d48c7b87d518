"""The device mesh: launch.parallelism_config's sizes (Accelerate's ParallelismConfig names) as one torch
DeviceMesh over every rank, with named dimensions dp_replicate x dp_shard x sp, outermost first.

The sequence-parallel ranks are the innermost dimension, so they are neighbours (one machine: the all-to-all
of every attention layer stays on NVLink); replicas are outermost (across machines: one all-reduce of the
gradients per step). The engines take from it the groups they need: the data-parallel coordinate (the
loader's rank and world: every rank of an SP group reads the same samples), the flattened dp_shard x sp mesh
FSDP2 shards over, the dp_replicate x (dp_shard x sp) mesh of HSDP, and the SP group that the sequence-
parallel attention runs over."""
from dataclasses import dataclass

from ..errors import ConfigError

DIMS = ("dp_replicate", "dp_shard", "sp")
SP_BACKENDS = ("ulysses", "ring")
# Accelerate's sp_backend is "deepspeed" (DeepSpeed's ALST, which is Ulysses): the same algorithm here.
SP_BACKEND_ALIASES = {"deepspeed": "ulysses", "alst": "ulysses"}
KEYS = ("dp_replicate_size", "dp_shard_size", "sp_size", "sp_backend", "tp_size", "cp_size", "cp_backend",
        "cp_comm_strategy")
WHERE = "launch.parallelism_config"


@dataclass(frozen=True)
class ParallelDims:
    dp_replicate: int = 1
    dp_shard: int = 1
    sp: int = 1
    sp_backend: str = "ulysses"

    @property
    def world_size(self):
        return self.dp_replicate * self.dp_shard * self.sp

    @property
    def data_parallel_size(self):
        """Ranks that read different samples (every rank of an SP group reads the same ones)."""
        return self.dp_replicate * self.dp_shard

    @property
    def shard_size(self):
        """Ranks each weight is sharded over under FSDP2: dp_shard x sp (an SP group holds one sample, so its
        ranks can share the weights' shards as data-parallel ranks do)."""
        return self.dp_shard * self.sp

    @property
    def trivial(self):
        return self.dp_replicate == 1 and self.sp == 1

    def as_config(self):
        return dict(dp_replicate_size=self.dp_replicate, dp_shard_size=self.dp_shard, sp_size=self.sp,
                    sp_backend=self.sp_backend)


def _size(block, key):
    value = block.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{WHERE}.{key}: expected a whole number >= 1, got {value!r}")
    return value


def parse_parallel_dims(block, world_size, engine, takes, fills, note=""):
    """ParallelDims from the config block (None: the engine's plain data parallelism), checked against the
    world size and what `engine` takes: `takes` the dims it can size above 1, `fills` the one that takes the
    ranks the block leaves unsized (None: none); `note` ends the line that refuses a dim. Accelerate's
    prefixed spelling (parallelism_config_sp_size, as its YAML and launch flags write it) is read too."""
    from ..registry import did_you_mean
    block = {(k[len("parallelism_config_"):] if isinstance(k, str) and k.startswith("parallelism_config_") else k): v
             for k, v in dict(block or {}).items()}
    for key in block:
        if key not in KEYS:
            raise ConfigError(f"{WHERE}.{key}: unknown key{did_you_mean(str(key), KEYS)} (known: {', '.join(KEYS)})")
    if (_size(block, "tp_size") or 1) > 1:
        raise ConfigError(f"{WHERE}.tp_size={block['tp_size']}: tensor parallelism is not built (docs/parallelism.md"
                          " says why); shard the weights with dp_shard_size instead")
    if (_size(block, "cp_size") or 1) > 1:
        raise ConfigError(f"{WHERE}.cp_size={block['cp_size']}: torch's context_parallel is not used here; split the"
                          " sequence with sp_size (sp_backend='ulysses' or 'ring')")
    backend = block.get("sp_backend") or "ulysses"
    backend = SP_BACKEND_ALIASES.get(str(backend).lower(), str(backend).lower())
    if backend not in SP_BACKENDS:
        raise ConfigError(f"{WHERE}.sp_backend: unknown {block['sp_backend']!r} (choose from {', '.join(SP_BACKENDS)})")
    sizes = {dim: _size(block, f"{dim}_size") for dim in DIMS}
    for dim, size in sizes.items():
        if size is not None and size > 1 and dim not in takes:
            taken = " x ".join(takes) if takes else "none of them"
            raise ConfigError(f"{WHERE}.{dim}_size={size}: {engine} does not take {dim} (it takes {taken})"
                              + (f"; {note}" if note else ""))
    known = 1
    for size in sizes.values():
        known *= size or 1
    if world_size % known:
        raise ConfigError(f"{WHERE}: the sizes multiply to {known}, which does not divide the world size"
                          f" {world_size}")
    free = [dim for dim, size in sizes.items() if size is None and dim == fills]
    if free:
        sizes[free[0]] = world_size // known
    dims = ParallelDims(*(sizes[d] or 1 for d in DIMS), sp_backend=backend)
    if dims.world_size != world_size:
        sized = " x ".join(f"{d}_size={getattr(dims, d)}" for d in DIMS)
        raise ConfigError(f"{WHERE}: {sized} = {dims.world_size} ranks, but the job has {world_size}")
    return dims


def check_heads(heads, dims, where="models"):
    """Ulysses hands each SP rank whole heads: their number must divide by sp_size (ring attention splits no
    heads). `heads`: {key: value} found in the models section (each an int)."""
    if dims.sp == 1 or dims.sp_backend != "ulysses":
        return
    for key, value in heads.items():
        if value % dims.sp:
            raise ConfigError(f"{where}.{key}={value}: Ulysses sequence parallelism gives each of the"
                              f" sp_size={dims.sp} ranks whole heads, so {key} must divide by {dims.sp}"
                              " (or use sp_backend='ring')")


class Mesh:
    """One DeviceMesh over the job (dims dp_replicate x dp_shard x sp, rank = (r * dp_shard + s) * sp + p) and
    the meshes and groups cut from it."""

    def __init__(self, dims, device_type):
        from torch.distributed.device_mesh import init_device_mesh
        self.dims, self.device_type = dims, device_type
        self.device_mesh = init_device_mesh(device_type, (dims.dp_replicate, dims.dp_shard, dims.sp),
                                            mesh_dim_names=DIMS)
        self._fsdp_mesh = None

    @property
    def data_rank(self):
        """This rank's coordinate among the data-parallel ranks (the loader's rank; its SP group shares it)."""
        r, s, _ = self.device_mesh.get_coordinate()
        return r * self.dims.dp_shard + s

    @property
    def data_world_size(self):
        return self.dims.data_parallel_size

    @property
    def sp_rank(self):
        return self.device_mesh["sp"].get_local_rank()

    @property
    def sp_group(self):
        return self.device_mesh.get_group("sp")

    def fsdp_mesh(self):
        """What fully_shard takes: the dp_shard x sp ranks as one dimension (1-D: FSDP), or with replicas the
        2-D dp_replicate x (dp_shard x sp) mesh (HSDP: shards inside a replica, gradients all-reduced across).
        A mesh of its own over the same rank layout (torch deprecates slicing a flattened dim off the root)."""
        if self._fsdp_mesh is None:
            from torch.distributed.device_mesh import init_device_mesh
            d = self.dims
            if d.dp_replicate == 1:
                self._fsdp_mesh = init_device_mesh(self.device_type, (d.shard_size,), mesh_dim_names=("dp_shard_sp",))
            else:
                self._fsdp_mesh = init_device_mesh(self.device_type, (d.dp_replicate, d.shard_size),
                                                   mesh_dim_names=("dp_replicate", "dp_shard_sp"))
        return self._fsdp_mesh


def build_mesh(block, env):
    """The job's Mesh from the validated launch.parallelism_config (None without one, or when every size is 1
    but the data-parallel ones: the engine's own group is that mesh)."""
    if not block:
        return None
    dims = ParallelDims(block["dp_replicate_size"], block["dp_shard_size"], block["sp_size"], block["sp_backend"])
    if dims.world_size != env.world_size:
        raise ConfigError(f"{WHERE}: the sizes multiply to {dims.world_size} but {env.world_size} ranks started")
    return Mesh(dims, env.device.type)
