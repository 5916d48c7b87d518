"""DeepSpeed's engine state set from whole tensors: how a checkpoint written by another strategy, or at
another world size, is read into ZeRO's partitions (safe_set_full_fp32_param / safe_set_full_optimizer_state)."""
import torch


def set_full_state(strategy, weights, optim):
    """Whole fp32 weights and optimizer state (keyed by parameter name) into `strategy`'s engine, each rank
    keeping its partition."""
    import deepspeed
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state
    module = strategy.unwrap()
    missing = [k for k, _ in list(module.named_parameters()) + list(module.named_buffers()) if k not in weights]
    if missing and strategy.train.checkpoint_strict:
        raise KeyError(f"checkpoint weights lack {missing[0]} (and {len(missing) - 1} more)")
    by_name = getattr(strategy.optimizer, "load_state_by_name", None)  # CAME8Bit: its own pieces (came_zero.py)
    if by_name is None:
        _materialize_state(strategy.optimizer, strategy.model.optimizer)
        link = getattr(strategy.model.optimizer, "_lazy_init_hp_params_optimizer_state", None)
        if link is not None:  # ZeRO-1/2, bf16: point each parameter's fragment at that state
            link()
    partitioned = False
    for name, param in module.named_parameters():
        if name not in weights:
            continue
        value = weights[name]
        if hasattr(param, "ds_id"):  # ZeRO-3: write the whole low-precision copy, then re-partition
            with deepspeed.zero.GatheredParameters([param], modifier_rank=0):
                if strategy.env.rank == 0:
                    param.data.copy_(value.to(param.dtype))
        else:
            param.data.copy_(value.to(param.device, param.dtype))
        if hasattr(param, "ds_id") or hasattr(param, "_hp_mapping"):
            partitioned = True
            safe_set_full_fp32_param(param, value.to(strategy.device))
            for key, tensor in optim["state"].get(name, {}).items() if by_name is None else ():
                if key != "step":
                    safe_set_full_optimizer_state(param, tensor.to(strategy.device).float(), key)
    for name, buf in module.named_buffers():
        if name in weights:
            buf.data.copy_(weights[name].to(buf.device, buf.dtype))
    if by_name is not None:
        by_name(optim["state"])
    if not partitioned:  # ZeRO-0 in fp32: the engine steps our torch optimizer over the module itself
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
        set_optimizer_state_dict(module, strategy.optimizer, optim, options=StateDictOptions(full_state_dict=True))
        return
    for group, saved in zip(strategy.optimizer.param_groups, optim["param_groups"]):
        group.update({k: v for k, v in saved.items() if k != "params"})  # the lr the scheduler set
    steps = [s["step"] for s in optim["state"].values() if "step" in s]
    if steps:
        for state in strategy.optimizer.state.values():
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

