"""State-dict loading shared by the optimizers."""
import torch


def _local_device(param):
    return getattr(param, "_local_tensor", param).device


def load_state_keep_dtypes(optimizer, state_dict, base_load):
    """Run torch's Optimizer.load_state_dict (`base_load`, for param groups and hooks), then put back
    each state tensor with the dtype it was saved in.

    torch casts every floating state tensor to its parameter's dtype (and, as it tests the
    parameter rather than the value, would turn 8-bit codes of a bf16 weight into bf16 too): fp32
    statistics and master weights of bf16 parameters must survive a round trip unchanged. The
    tensors are copied, so the optimizer never aliases the caller's dict."""
    id_map = {}
    for saved, group in zip(state_dict["param_groups"], optimizer.param_groups):
        id_map.update(zip(saved["params"], group["params"]))
    originals = {k: dict(v) for k, v in state_dict["state"].items()}
    base_load(state_dict)
    for saved_id, entries in originals.items():
        param = id_map.get(saved_id)
        if param is None:
            continue
        dev = _local_device(param)
        optimizer.state[param] = {k: v.to(device=dev, copy=True) if torch.is_tensor(v) else v
                                  for k, v in entries.items()}
