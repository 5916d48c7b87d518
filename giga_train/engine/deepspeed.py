"""DEEPSPEED: the real DeepSpeed engine (ZeRO-0..3) around our model, optimizer and accumulation.

The trainer still owns the accumulation boundary: every micro-batch is backward then engine.step()
(DeepSpeed requires both per micro-batch), and the engine's gradient_accumulation_steps is ours, so
its boundary and the trainer's agree. Clipping, loss scaling and bf16/fp16 weights are the engine's; the
forward runs under the same autocast as every other strategy."""
import contextlib
import os

import torch

from ..errors import ConfigError
from ..registry import STRATEGIES
from .deepspeed_config import resolve_deepspeed_config
from ..distributed.env import init_process_group, world_size_of
from ..checkpoint.formats.full_state import DEEPSPEED_DIR, DEEPSPEED_TAG, deepspeed_meta, write_deepspeed_meta
from ..checkpoint.safe_unpickle import safe_torch_loads
from .protocol import OVERFLOW, StepResult, Strategy
from .deepspeed_state import set_full_state
from ..checkpoint.formats.adapters import WRAPPED


@STRATEGIES.register(name="DEEPSPEED")
class DeepSpeedStrategy(Strategy):
    # DeepSpeed 0.19.8 has Ulysses of its own (deepspeed.sequence.layer.DistributedAttention; ALST's
    # UlyssesSPAttentionHF for transformers models), its engine reducing gradients over a sequence-data-parallel
    # group handed to initialize() through `mpu`: not wired to the mesh here.
    PARALLEL_DIMS = ("dp_shard",)
    FILLS_DIM = "dp_shard"
    PARALLEL_NOTE = ("sequence parallelism and replicas run under distributed_type='FSDP' (fsdp_version=2) or"
                     " 'MULTI_GPU' here; DeepSpeed's own Ulysses is not wired to the mesh")
    state_snapshot_detached = False  # engine.save_checkpoint takes the engine's state itself, synchronously

    @classmethod
    def check_config(cls, config):
        """The DeepSpeed JSON resolved against the train config (deepspeed_config.py), and what ZeRO-3 refuses.
        None for a config that does not train (a Tester alone: no dataloaders.train)."""
        if "train" not in config.dataloaders:
            return None
        ds_config = resolve_deepspeed_config(config.launch.deepspeed_config, config.train,
                                             config.dataloaders.train.batch_size_per_gpu, world_size_of(config.launch))
        if _stage(ds_config) == 3 and config.train.with_ema:
            raise ConfigError("train.with_ema: not available under ZeRO-3 (parameters are partitioned);"
                              " use FSDP (fsdp_version=2) or ZeRO-0/1/2")
        return ds_config

    def __init__(self, env, launch, train, settings=None, **kwargs):
        super().__init__(env, launch, train, **kwargs)
        init_process_group(env)
        self.precision.scaler = None  # the engine scales fp16 losses itself
        self._accumulating = False
        self.ds_config = settings  # check_config's resolved JSON
        self.stage = _stage(self.ds_config)

    @property
    def starts_from_meta(self):
        return self.stage == 3  # partitioned module by module as it is materialised (meta_start.py)

    def setup(self, model, make_optimizer, meta_start=None):
        """`meta_start` (a MetaStart, ZeRO-3): the model is on the meta device; it is materialised and
        partitioned module by module before the engine is built."""
        import deepspeed
        self._added_env = _set_launcher_variables(self.env)  # deepspeed.zero.Init reads them too
        if meta_start is None:
            model.to(self.device)
        else:
            meta_start.fill_by_module(model, self.device, self._zero3_partition())
        optimizer = make_optimizer(model)
        if len(getattr(optimizer, "optimizers", ())) > 1:  # an OptimizerGroup
            raise ConfigError("get_optimizers: DeepSpeed steps one optimizer; give one optimizer several param"
                              " groups, or use FSDP (fsdp_version=2) or DDP for several optimizers")
        check = getattr(type(optimizer), "check_zero_compatible", None)
        if check is not None:
            try:
                check(self.stage, torch.bfloat16 if self.train.mixed_precision == "bf16" else torch.float32)
            except ValueError as e:
                raise ConfigError(f"optimizers: {e}") from None
        # The layout before the engine swaps in flat partitions (the groups' own lists: those change too).
        self.model, self.optimizer = model, optimizer  # the torch optimizer: our scheduler sets its groups' lr
        names, groups = super().optimizer_layout()
        self._layout = names, [dict(g, params=list(g["params"])) for g in groups]
        self.model, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=self.ds_config,
                                                   dist_init_required=False)
        bind = getattr(optimizer, "bind_deepspeed", None)  # CAME8Bit: which weight pieces each flat partition holds
        if bind is not None:
            bind(self.model.optimizer, model.named_parameters())
        return self.model, self.optimizer

    def _zero3_partition(self):
        """partition(params): parameters made ZeRO-3 ones as deepspeed.initialize makes those of a model built
        whole: cast to the engine's dtype, rank 0's values broadcast, each rank keeping its partition. Made
        through deepspeed.zero.Init(module=...), which also swaps in ZeRO-3's memory-efficient F.linear as
        initialize does, so both starts run the same ops; the engine then takes the converted parameters as
        they are (its `ds_id` check)."""
        import deepspeed
        from deepspeed.accelerator import get_accelerator
        # as initialize does first: DeepSpeed's comm over our process group (its config reads the world size)
        deepspeed.init_distributed(get_accelerator().communication_backend_name(), dist_init_required=False)
        init = deepspeed.zero.Init(module=torch.nn.Module(), config_dict_or_path=self.ds_config)

        def partition(params):
            for p in params:
                if p.is_floating_point():
                    p.data = p.data.to(init.dtype)
            init._convert_to_zero_parameters(params)  # what Init(module=m) runs over m.parameters()
        return partition

    def unwrap(self):
        return getattr(self.model, "module", self.model)  # the module itself until deepspeed.initialize

    def optimizer_layout(self):
        return self._layout

    # autocast(): the base's, as under every other strategy. The engine holds the module's weights in
    # bf16/fp16 itself; autocast casts float inputs to them at each matmul/conv, so a forward_step written
    # for NO/DDP/FSDP (float inputs) runs here unchanged, and losses and norms are computed in fp32.

    def accumulating(self, accumulating):
        self._accumulating = accumulating
        return contextlib.nullcontext()

    def backward(self, loss):
        self.model.backward(loss, scale_wrt_gas=False)  # the trainer already divided by the accumulation
        if self._accumulating:
            self.model.step()  # not a boundary: the engine only counts the micro-step

    def step(self, max_grad_norm=None, measure=False, verdict=None):
        """The engine's step (it clips and scales itself). With a `verdict`: the loss is judged before the
        step (read on the host: the engine cannot skip on the device for us); the engine itself skips an
        update whose gradient norm is non-finite (ZeRO-1/2/3, and bf16 with check_grad_overflow, its
        default), read back with was_step_applied(). It cannot be told to skip for a non-finite loss with
        finite gradients, nor at ZeRO-0 in fp32: then the result says not skipped and the trainer stops."""
        bad_loss = verdict(None).nonfinite_names if verdict is not None else ()
        self.model.step()
        norm = self.model.get_global_grad_norm()
        if norm is not None:
            norm = (norm.detach().float() if torch.is_tensor(norm) else torch.tensor(float(norm))).to(self.device)
        if verdict is None:
            return StepResult(norm)
        skipped = not self.model.was_step_applied()
        # fp16: a skipped step is the loss scaler's overflow skip (counted as such; DeepSpeed stops at its floor)
        fp16 = self.train.mixed_precision == "fp16"
        bad_grad = ((OVERFLOW,) if fp16 else ("grad_norm",)) if skipped else ()
        if not skipped and norm is not None and not bool(torch.isfinite(norm)):  # global: the same on all ranks
            bad_grad = ("grad_norm",)
        return StepResult(norm, bad_loss + bad_grad, skipped=skipped)

    def close(self):
        for key in getattr(self, "_added_env", []):
            os.environ.pop(key, None)
        super().close()
        # DeepSpeed caches the groups it made in module globals; with ours destroyed they would be stale for
        # a later run in this process ("Group ... is not registered"): drop them, as its own destroy does.
        from deepspeed.utils import groups
        release = getattr(groups, "_release_process_group_references", None)
        if release is not None:
            release(None)
        _restore_torch_linear()

    # -- state --------------------------------------------------------------------------------
    def model_state_dict(self, keys=None):
        """The whole weights in the engine module's dtype (bf16/fp16 under mixed precision; partitioned under
        ZeRO-3, gathered here), as GigaTrain writes the model folders under DeepSpeed: the fp32 master weights
        rounded as the engine rounds them into its module. The masters themselves stay in DeepSpeed's own
        files, which resume (any strategy, any world size), export and convert read. A collective. `keys`:
        only those (a PEFT adapter's)."""
        from deepspeed.utils import safe_get_full_fp32_param
        state = {}
        for key, value in self.unwrap().state_dict(keep_vars=True).items():
            if keys is not None and key not in keys:
                continue
            full = safe_get_full_fp32_param(value) if isinstance(value, torch.nn.Parameter) else None
            if full is None and hasattr(value, "ds_id"):  # a frozen ZeRO-3 parameter: gather it
                import deepspeed
                with deepspeed.zero.GatheredParameters([value]):
                    full = value.detach().clone()
            full = (value if full is None else full).detach().cpu()
            state[key] = full.to(value.dtype) if full.is_floating_point() else full
        return state

    def full_state_dict(self, state):
        return {k: v.detach().cpu() for k, v in state.items()}

    def load_model_state(self, state, strict):
        self._weights = state  # applied in load_full_state, unless the engine's own files restore them

    def state_snapshot(self, copy=False):
        return None  # the engine reads its own state when it writes

    def write_state(self, folder, state=None, process_group=None):
        client = {"universal_checkpoint_info": {"universal_checkpoint_version": 0.2}}
        adapters = self._adapters_only()
        with frozen_left_out(self.unwrap()) if adapters else contextlib.nullcontext():
            self.model.save_checkpoint(os.path.join(folder, DEEPSPEED_DIR), tag=DEEPSPEED_TAG, client_state=client,
                                       exclude_frozen_parameters=adapters)
        if self.env.is_main:
            write_deepspeed_meta(folder, self.stage, self.env.world_size)
        if self.env.is_main and adapters:
            # DeepSpeed copies its zero_to_fp32.py and zero_to_torch.py into every checkpoint (41 KB), which
            # rebuild the whole model from ZeRO's partitions: here those hold the adapter alone, whose weights
            # model/ has in PEFT's format (giga-train convert/export read DeepSpeed's files without them)
            for script in RECOVERY_SCRIPTS:
                path = os.path.join(folder, DEEPSPEED_DIR, script)
                if os.path.isfile(path):
                    os.remove(path)

    def load_state(self, folder):
        """The engine's own files, when the same ZeRO stage at the same world size wrote them."""
        if deepspeed_meta(folder) != dict(stage=self.stage, world_size=self.env.world_size):
            return False
        with safe_torch_loads():  # DeepSpeed's own torch.load(weights_only=False) calls, allow-listed
            path, _ = self.model.load_checkpoint(os.path.join(folder, DEEPSPEED_DIR), tag=DEEPSPEED_TAG,
                                                 load_module_strict=self.train.checkpoint_strict
                                                 and not self._adapters_only())
        if path is None:
            raise FileNotFoundError(f"{folder}/deepspeed: no DeepSpeed checkpoint to resume from")
        return True

    def _adapters_only(self):
        """Whether the model's checkpoints hold PEFT adapters only (checkpoint/formats/adapters.py): then
        DeepSpeed's own files leave the frozen base out too (get_models rebuilds it)."""
        from ..checkpoint.formats.adapters import adapter_layout
        from ..checkpoint.formats.model_layout import model_folders
        return bool(adapter_layout((f, m) for f, _, m in model_folders(self.unwrap())))

    def load_full_state(self, weights, optimizer_state):
        """Whole fp32 weights (DeepSpeed's master weights where it wrote them, else those load_model_state
        was given) and optimizer state into the engine, each rank keeping its partition."""
        set_full_state(self, weights if weights is not None else self._weights, optimizer_state)

RECOVERY_SCRIPTS = ("zero_to_fp32.py", "zero_to_torch.py")


@contextlib.contextmanager
def frozen_left_out(module):
    """While DeepSpeed writes its files: `module`'s state dict without its frozen parameters, under every name each
    has. DeepSpeed's exclude_frozen_parameters drops the names named_parameters() lists, which gives a tied weight
    (an embedding shared with the head) under its first name only: its second name kept the whole tensor."""
    frozen = {n.replace(WRAPPED, "") for n, p in module.named_parameters(remove_duplicate=False) if not p.requires_grad}

    def drop(_module, state, prefix, _metadata):
        for name in frozen:
            state.pop(prefix + name, None)
    handle = module.register_state_dict_post_hook(drop)
    try:
        yield
    finally:
        handle.remove()


def _stage(ds_config):
    return int(ds_config.get("zero_optimization", {}).get("stage", 0))


def _set_launcher_variables(env):
    """DeepSpeed reads LOCAL_RANK & co. throughout, also in one process started without a launcher.
    Returns the names it set, which close() removes, so this process is not taken for a launched rank."""
    values = {"LOCAL_RANK": env.local_rank, "RANK": env.rank, "WORLD_SIZE": env.world_size}
    added = [k for k in values if k not in os.environ]
    os.environ.update({k: str(values[k]) for k in added})
    return added


def _restore_torch_linear():
    """ZeRO-3 (deepspeed.initialize, zero.Init) swaps torch.nn.functional.linear for its own memory-efficient
    one for good ("This will persist unless manually reset"): torch's comes back when the run closes, so that
    a later run, a plan or a model in this process computes (and saves for backward) as torch does."""
    from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses as patcher
    original = getattr(patcher, "linear_bk", None)
    if original is not None:
        torch.nn.functional.linear = original
