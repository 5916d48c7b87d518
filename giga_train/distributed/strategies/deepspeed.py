"""DEEPSPEED: the real DeepSpeed engine (ZeRO-0..3) around our model, optimizer and accumulation.

The trainer still owns the accumulation boundary: every micro-batch is backward then engine.step()
(DeepSpeed requires both per micro-batch), and the engine's gradient_accumulation_steps is ours, so
its boundary and the trainer's agree. Clipping, loss scaling and bf16/fp16 are the engine's."""
import contextlib
import os

import logging

import torch

from ...checkpoint.state import load_weights
from ...config import ConfigError
from ...module_dict import ModuleDict
from ...registry import STRATEGIES
from ..deepspeed_config import resolve_deepspeed_config
from ..env import init_process_group
from ..portable import (DEEPSPEED_DIR, DEEPSPEED_TAG, deepspeed_meta, read_dcp, read_deepspeed, trainable_names,
                        write_deepspeed_meta)
from .base import StepResult, Strategy

log = logging.getLogger("giga_train")


@STRATEGIES.register(name="DEEPSPEED")
class DeepSpeedStrategy(Strategy):
    writes_checkpoints_async = False  # engine.save_checkpoint is synchronous: no snapshot to hand to a thread

    def __init__(self, env, launch, train, **kwargs):
        super().__init__(env, launch, train, **kwargs)
        init_process_group(env)
        self.precision.scaler = None  # the engine scales fp16 losses itself
        self._accumulating = False

    def setup(self, model, make_optimizer):
        import deepspeed
        self.ds_config = resolve_deepspeed_config(self.launch.deepspeed_config, self.train,
                                                  self.micro_batch_size, self.env.world_size)
        self.stage = int(self.ds_config.get("zero_optimization", {}).get("stage", 0))
        if self.stage == 3 and self.train.with_ema:
            raise ConfigError("train.with_ema: not available under ZeRO-3 (parameters are partitioned);"
                              " use FSDP (fsdp_version=2) or ZeRO-0/1/2")
        model.to(self.device)
        optimizer = make_optimizer(model)
        check = getattr(type(optimizer), "check_zero_compatible", None)
        if check is not None:
            try:
                check(self.stage, torch.bfloat16 if self.train.mixed_precision == "bf16" else torch.float32)
            except ValueError as e:
                raise ConfigError(f"optimizers: {e}") from None
        self._names = trainable_names(model, optimizer)  # before the engine swaps in flat partitions
        self._groups = [dict(g, params=list(g["params"])) for g in optimizer.param_groups]
        self._added_env = _set_launcher_variables(self.env)
        self.model, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=self.ds_config,
                                                   dist_init_required=False)
        bind = getattr(optimizer, "bind_deepspeed", None)  # CAME8Bit: which weight pieces each flat partition holds
        if bind is not None:
            bind(self.model.optimizer, model.named_parameters())
        self.optimizer = optimizer  # the torch optimizer: our scheduler sets its param groups' lr
        return self.model, self.optimizer

    def unwrap(self):
        return self.model.module

    def autocast(self):
        return contextlib.nullcontext()  # the engine runs the module in bf16/fp16 itself

    def accumulating(self, accumulating):
        self._accumulating = accumulating
        return contextlib.nullcontext()

    def backward(self, loss):
        self.model.backward(loss, scale_wrt_gas=False)  # the trainer already divided by the accumulation
        if self._accumulating:
            self.model.step()  # not a boundary: the engine only counts the micro-step

    def step(self, max_grad_norm=None, measure=False, loss=None):
        """The engine's step. Guarded (`loss` given): the engine itself skips an update whose gradient
        norm is non-finite (ZeRO-1/2/3, and bf16 with check_grad_overflow, its default), which we read
        back with was_step_applied(); it cannot be told to skip for a non-finite loss with finite
        gradients, nor at ZeRO-0 in fp32: then the result says not skipped and the trainer stops."""
        bad_loss = self.nonfinite(loss=loss) if loss is not None else ()
        self.model.step()
        norm = self.model.get_global_grad_norm()
        if norm is not None:
            norm = (norm.detach().float() if torch.is_tensor(norm) else torch.tensor(float(norm))).to(self.device)
        if loss is None:
            return StepResult(norm)
        skipped = not self.model.was_step_applied()
        # fp16: a skipped step is the loss scaler's normal overflow skip, not a NaN step.
        bad_grad = ("grad_norm",) if skipped and self.train.mixed_precision != "fp16" else ()
        if not skipped and norm is not None and not bool(torch.isfinite(norm)):  # global: the same on all ranks
            bad_grad = ("grad_norm",)
        return StepResult(norm, bad_loss + bad_grad, skipped=skipped)

    def close(self):
        for key in getattr(self, "_added_env", []):
            os.environ.pop(key, None)
        super().close()

    # -- state --------------------------------------------------------------------------------
    def model_state_dict(self):
        """The fp32 master weights, whole (the engine's module may hold bf16/fp16 copies, partitioned
        under ZeRO-3): the same `model/` file as every other strategy writes. A collective."""
        from deepspeed.utils import safe_get_full_fp32_param
        state = {}
        for key, value in self.unwrap().state_dict(keep_vars=True).items():
            full = safe_get_full_fp32_param(value) if isinstance(value, torch.nn.Parameter) else None
            if full is None and hasattr(value, "ds_id"):  # a frozen ZeRO-3 parameter: gather it
                import deepspeed
                with deepspeed.zero.GatheredParameters([value]):
                    full = value.detach().clone()
            full = (value if full is None else full).detach().cpu()
            state[key] = full.float() if full.is_floating_point() else full
        return state

    def load_model(self, folder, strict):
        self._weights_folder = folder  # applied in load_state, unless the engine's own files restore them
        return [], []

    def state_snapshot(self, copy=False):
        return None  # the engine reads its own state when it writes

    def write_state(self, folder, state=None, process_group=None):
        client = {"universal_checkpoint_info": {"universal_checkpoint_version": 0.2}}
        self.model.save_checkpoint(os.path.join(folder, DEEPSPEED_DIR), tag=DEEPSPEED_TAG, client_state=client)
        if self.env.is_main:
            write_deepspeed_meta(folder, self.stage, self.env.world_size)

    def load_state(self, folder):
        saved = deepspeed_meta(folder)
        if saved == dict(stage=self.stage, world_size=self.env.world_size):
            path, _ = self.model.load_checkpoint(os.path.join(folder, DEEPSPEED_DIR), tag=DEEPSPEED_TAG,
                                                 load_module_strict=self.train.checkpoint_strict)
            if path is None:
                raise FileNotFoundError(f"{folder}/deepspeed: no DeepSpeed checkpoint to resume from")
            return
        if saved is not None:
            log.info("resume: %s was written under ZeRO-%d at %d ranks; reading DeepSpeed's universal form",
                     folder, saved["stage"], saved["world_size"])
            weights, optim = read_deepspeed(folder, self._names, self._groups)
        else:
            weights, optim = None, read_dcp(folder)
        if weights is None:
            weights = load_weights(self._weights_folder, members=isinstance(self.unwrap(), ModuleDict))
        self._set_full_state(weights, optim)

    def _set_full_state(self, weights, optim):
        """Whole fp32 weights and optimizer state into the engine, each rank keeping its partition."""
        import deepspeed
        from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state
        module = self.unwrap()
        missing = [k for k, _ in list(module.named_parameters()) + list(module.named_buffers()) if k not in weights]
        if missing and self.train.checkpoint_strict:
            raise KeyError(f"checkpoint weights lack {missing[0]} (and {len(missing) - 1} more)")
        load_full = getattr(self.optimizer, "load_full_state", None)  # CAME8Bit: its own pieces, by name
        if load_full is None:
            _materialize_state(self.optimizer, self.model.optimizer)
        link = getattr(self.model.optimizer, "_lazy_init_hp_params_optimizer_state", None)
        if link is not None and load_full is None:  # ZeRO-1/2, bf16: point each parameter's fragment at that state
            link()
        partitioned = False
        for name, param in module.named_parameters():
            if name not in weights:
                continue
            value = weights[name]
            if hasattr(param, "ds_id"):  # ZeRO-3: write the whole low-precision copy, then re-partition
                with deepspeed.zero.GatheredParameters([param], modifier_rank=0):
                    if self.env.rank == 0:
                        param.data.copy_(value.to(param.dtype))
            else:
                param.data.copy_(value.to(param.device, param.dtype))
            if hasattr(param, "ds_id") or hasattr(param, "_hp_mapping"):
                partitioned = True
                safe_set_full_fp32_param(param, value.to(self.device))
                for key, tensor in optim["state"].get(name, {}).items() if load_full is None else ():
                    if key != "step":
                        safe_set_full_optimizer_state(param, tensor.to(self.device).float(), key)
        for name, buf in module.named_buffers():
            if name in weights:
                buf.data.copy_(weights[name].to(buf.device, buf.dtype))
        if load_full is not None:
            load_full(optim["state"])
        if not partitioned:  # ZeRO-0 in fp32: the engine steps our torch optimizer over the module itself
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
            set_optimizer_state_dict(module, self.optimizer, optim, options=StateDictOptions(full_state_dict=True))
            return
        for group, saved in zip(self.optimizer.param_groups, optim["param_groups"]):
            group.update({k: v for k, v in saved.items() if k != "params"})  # the lr the scheduler set
        steps = [s["step"] for s in optim["state"].values() if "step" in s]
        if steps:
            for state in self.optimizer.state.values():
                if "step" in state:
                    old = state["step"]
                    state["step"] = steps[0].to(old.device, old.dtype).clone() if torch.is_tensor(old) else \
                        type(old)(steps[0].item())


def _materialize_state(optimizer, engine_optimizer):
    """The inner optimizer's state is created at its first step: take one with zero gradients and lr 0
    over the flat partitions that have none yet, so that it can be overwritten."""
    flat = getattr(engine_optimizer, "fp32_partitioned_groups_flat", None)
    if flat is not None:  # ZeRO-3 hands its sub-groups to the optimizer one at a time
        groups = {}
        for i, partition in enumerate(flat):
            groups.setdefault(engine_optimizer.sub_group_to_group_id[i], []).append(partition)
    else:
        groups = {i: list(g["params"]) for i, g in enumerate(optimizer.param_groups)}
    fresh = {i: [p for p in params if not optimizer.state.get(p)] for i, params in groups.items()}
    if not any(fresh.values()):
        return
    saved = [(g["params"], g["lr"]) for g in optimizer.param_groups]
    for i, g in enumerate(optimizer.param_groups):
        g["params"], g["lr"] = fresh.get(i, []), 0.0
        for p in g["params"]:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    for g, (params, lr) in zip(optimizer.param_groups, saved):
        for p in g["params"]:
            p.grad = None
        g["params"], g["lr"] = params, lr


def _set_launcher_variables(env):
    """DeepSpeed reads LOCAL_RANK & co. throughout, also in one process started without a launcher.
    Returns the names it set, which close() removes, so this process is not taken for a launched rank."""
    values = {"LOCAL_RANK": env.local_rank, "RANK": env.rank, "WORLD_SIZE": env.world_size}
    added = [k for k in values if k not in os.environ]
    os.environ.update({k: str(values[k]) for k in added})
    return added
