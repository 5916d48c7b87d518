"""giga_train.utils: GigaTrain's helpers (`from giga_train import utils`), with its names and call forms.

Conversion: to_list, to_tensor, to_numpy, to_cuda, to_cpu, to_dtype (nested dicts and lists; dicts
are changed in place, as GigaTrain does). Misc: as_list, import_function, get_cur_time,
get_cpu_memory, wait_for_gpu_memory, create_logger, setup_environment. Weights: load_state_dict,
save_state_dict (safetensors or torch; a folder is searched for the weights file).
Ours besides: module_auto_wrap_policy lives here too (also exported from giga_train)."""
import logging
import os
import sys
import time
from collections.abc import Callable
from importlib import import_module
from typing import Any

import numpy as np
import torch

from ..checkpoint.formats.weights import (SAFETENSORS_WEIGHTS_NAME, WEIGHTS_NAME, WEIGHTS_NAMES,  # noqa: F401
                                          load_state_dict, save_state_dict)
from ..engine.block_classes import COUNT_MARK, class_name_problem, parse_class_names

_UNITS = {"GB": 1024 ** 3, "MB": 1024 ** 2, "KB": 1024, "B": 1}


# -- conversion -------------------------------------------------------------------------------------
def to_list(data) -> Any:
    """A Python list from a list, tuple, tensor, array, or an object with `.tensor`."""
    if isinstance(data, list):
        return data
    if isinstance(data, tuple):
        return list(data)
    if isinstance(data, (torch.Tensor, np.ndarray)):
        return data.tolist()
    if hasattr(data, "tensor"):
        return data.tensor.tolist()
    raise TypeError(f"to_list: cannot convert {type(data).__name__}")


def _nested(data, leaf, *args):
    """Apply `leaf` through dicts (in place) and lists (new list)."""
    if isinstance(data, dict):
        for key in data:
            data[key] = _nested(data[key], leaf, *args)
        return data
    if isinstance(data, list):
        return [_nested(item, leaf, *args) for item in data]
    return leaf(data, *args)


def _leaf_tensor(data):
    if isinstance(data, torch.Tensor):
        return data
    if isinstance(data, np.ndarray):
        return torch.from_numpy(data)
    if hasattr(data, "tensor"):
        return data.tensor
    return torch.tensor(data)


def _leaf_numpy(data):
    if isinstance(data, np.ndarray):
        return data
    if isinstance(data, torch.Tensor):
        return data.contiguous().cpu().numpy()
    if hasattr(data, "tensor"):
        return data.numpy()
    return np.array(data)


def _leaf_cuda(data, device):
    return data.cuda(device) if isinstance(data, torch.Tensor) or hasattr(data, "tensor") else data


def _leaf_cpu(data):
    return data.cpu() if isinstance(data, torch.Tensor) or hasattr(data, "tensor") else data


def _leaf_dtype(data, dtype):
    if isinstance(data, torch.Tensor) or hasattr(data, "tensor"):
        return data.to(dtype)
    if isinstance(data, np.ndarray):
        return data.astype(dtype)
    return data


def to_tensor(data) -> Any:
    """Tensors from arrays, numbers and lists (each list element converted), through dicts and lists."""
    return _nested(data, _leaf_tensor)


def to_numpy(data) -> Any:
    return _nested(data, _leaf_numpy)


def to_cuda(data, device=None) -> Any:
    """Tensors moved to CUDA `device` (the current one by default); other leaves left as they are."""
    return _nested(data, _leaf_cuda, device)


def to_cpu(data) -> Any:
    return _nested(data, _leaf_cpu)


def to_dtype(data, dtype) -> Any:
    """Tensors (torch dtype) and arrays (NumPy dtype) cast; other leaves left as they are."""
    return _nested(data, _leaf_dtype, dtype)


# -- misc -------------------------------------------------------------------------------------------
def as_list(data) -> list:
    """A list as is, a tuple as a list, anything else as a one-element list."""
    if isinstance(data, list):
        return data
    if isinstance(data, tuple):
        return list(data)
    return [data]


def import_function(function_name, sep=".") -> Any:
    """`pkg.module.name` -> that attribute. With sep='/', `pkg/module/name` (as for a config file)."""
    parts = function_name.split(sep)
    if len(parts) < 2:
        raise ImportError(f"'{function_name}' is not a path such as 'pkg{sep}module{sep}name'")
    module = import_module(".".join(parts[:-1]))
    try:
        return getattr(module, parts[-1])
    except AttributeError:
        raise ImportError(f"module '{module.__name__}' has no attribute '{parts[-1]}'") from None


def get_cur_time() -> str:
    """The local time as YYYY-MM-DD-HHMMSS."""
    return time.strftime("%Y-%m-%d-%H%M%S", time.localtime(time.time()))


def get_cpu_memory(unit="GB") -> str:
    """The host's memory in use, as 'used/total UNIT' (e.g. '12.31/503.70 GB')."""
    import psutil
    factor = _UNITS[unit]
    mem = psutil.virtual_memory()
    return f"{mem.used / factor:.2f}/{mem.total / factor:.2f} {unit}"


def _gpu_memory(gpu_id):
    """(total, used, free) bytes of one GPU: NVML when installed (no CUDA context), else torch."""
    try:
        import pynvml
    except ImportError:
        free, total = torch.cuda.mem_get_info(gpu_id)
        return total, total - free, free
    pynvml.nvmlInit()
    info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(gpu_id))
    return info.total, info.used, info.free


def wait_for_gpu_memory(gpu_ids, gpu_memory, unit="GB", seconds=10, count_limit=-1) -> None:
    """Block until every GPU in `gpu_ids` has `gpu_memory` (in `unit`) free, checking every `seconds`
    and printing each GPU's memory. After `count_limit` failed checks (> 0), TimeoutError."""
    factor = _UNITS[unit]
    count = 0
    while True:
        enough = True
        for gpu_id in gpu_ids:
            total, used, free = (v / factor for v in _gpu_memory(gpu_id))
            enough = enough and free >= gpu_memory
            print(f"GPU {gpu_id}: Total {total:.2f}{unit}, Used {used:.2f}{unit}, Free {free:.2f}{unit}")
        if enough:
            return
        count += 1
        if count > count_limit > 0:
            raise TimeoutError(f"GPUs {list(gpu_ids)} did not get {gpu_memory:.2f}{unit} free after {count} checks")
        print(f"Wait For GPU Memory: {gpu_memory:.2f}{unit} .....")
        time.sleep(seconds)


def create_logger(log_path=None, log_format=None) -> logging.Logger:
    """The root logger at INFO, to stdout and (with `log_path`, which is started afresh) to that file."""
    log_format = log_format or "%(asctime)-15s %(message)s"
    logger = logging.getLogger()
    if log_path is not None:
        if os.path.exists(log_path):
            os.remove(log_path)
        os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
        formatter = logging.Formatter(log_format)
        logger.handlers = []
        for handler in (logging.FileHandler(log_path), logging.StreamHandler()):
            handler.setFormatter(formatter)
            logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logging.basicConfig(level=logging.INFO, format=log_format)
    return logger


def setup_environment() -> None:
    """GigaTrain's: put the working directory on sys.path and PYTHONPATH (for spawned processes),
    so a project's modules (`runners`, types in the config) import from where it is run."""
    work_dir = os.getcwd()
    sys.path.insert(0, work_dir)
    current = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = f"{current}:{work_dir}" if current is not None else work_dir


# -- activation checkpointing / wrapping ------------------------------------------------------------
def module_auto_wrap_policy(module_names, sep="__##__") -> Callable:
    """GigaTrain's auto-wrap policy for `apply_activation_checkpointing` / FSDP1: `policy(module,
    recurse, nonwrapped_numel)` is True when recursing, and for a module whose class name is listed:
    "Block" = every Block, "Block__##__4" = the first 4 (counted in the order the policy is asked)."""
    if sep != COUNT_MARK:
        module_names = [name.replace(sep, COUNT_MARK) for name in module_names]
    for entry in module_names:
        problem = class_name_problem(entry)
        if problem:
            raise ValueError(f"module_auto_wrap_policy: {problem}")
    limits = {name: -1 if limit is None else limit for name, limit in parse_class_names(module_names).items()}
    seen = dict.fromkeys(limits, 0)

    def policy(module, recurse, nonwrapped_numel):
        if recurse:
            return True
        name = type(module).__name__
        if name not in limits:
            return False
        if limits[name] < 0:
            return True
        seen[name] += 1
        return seen[name] <= limits[name]

    return policy
