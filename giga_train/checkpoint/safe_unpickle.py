"""Reading pickled checkpoint files without running code from them.

Every pickled file we read goes through an allow-list: torch.load(weights_only=True) with DeepSpeed's few
classes registered (`torch_load`), DCP's `.metadata` (`load_metadata`, `SafeFileSystemReader`), and libraries
that call torch.load themselves inside `safe_torch_loads()`. Anything else named in a file stops the load with
UnsafeCheckpointError, one line naming the file and the object."""
import contextlib
import functools
import importlib
import os
import pickle
import re
import threading

import torch

from ..errors import UnsafeCheckpointError

# (module, name) a DCP .metadata file legitimately names (torch 2.6-2.13; checked on files that NO, DDP,
# FSDP1/2 and convert wrote): DCP's own metadata classes, torch sizes, dtypes, layouts, memory formats.
DCP_METADATA_MODULES = ("torch.distributed.checkpoint.metadata",)
DCP_GLOBALS = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.distributed.checkpoint.planner", "LoadItemType"),
    ("torch.distributed.checkpoint.planner", "WriteItemType"),
    ("torch", "Size"),
    ("torch", "device"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "slice"), ("builtins", "complex"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"), ("pathlib", "Path"),
}

# Classes beside tensors in DeepSpeed's state files (0.14-0.19, ZeRO-0..3, fp32/bf16/fp16): the ZeRO
# stage enum, the loss scalers, the bf16 optimizer's fragment addresses; Megatron-style `args`.
DEEPSPEED_GLOBALS = (
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.utils.tensor_fragment.fragment_address",
    "argparse.Namespace",
    "torch.Size",
)


def _is_dtype_or_format(module, name):
    value = getattr(torch, name, None) if module == "torch" else None
    return isinstance(value, (torch.dtype, torch.layout, torch.memory_format))


def _allowed_metadata_global(module, name):
    if (module, name) in DCP_GLOBALS or _is_dtype_or_format(module, name):
        return True
    if module in DCP_METADATA_MODULES and not name.startswith("__"):
        value = getattr(importlib.import_module(module), name, None)
        # the module's dataclasses and enums only (not its functions, nor what it imported)
        return isinstance(value, type) and value.__module__ == module
    return False


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file, path):
        super().__init__(file)
        self.path = path

    def find_class(self, module, name):
        if not _allowed_metadata_global(module, name):
            raise UnsafeCheckpointError(_refusal(self.path, f"{module}.{name}"))
        return super().find_class(module, name)


def load_metadata(path):
    """A torch.distributed.checkpoint `.metadata` file, read through the allow-list."""
    if not os.path.isfile(path):
        raise UnsafeCheckpointError(f"{path}: missing (a torch.distributed.checkpoint folder needs it)")
    with open(path, "rb") as f:
        try:
            return _MetadataUnpickler(f, path).load()
        except UnsafeCheckpointError:
            raise
        except Exception as e:  # truncated, garbage: one line naming the file
            raise UnsafeCheckpointError(f"{path}: not a readable checkpoint metadata file ({_first_line(e)})") from None


def _metadata_reader_class():
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeFileSystemReader(FileSystemReader):
        """torch's FileSystemReader, but `.metadata` is read through the allow-list, not plain pickle."""

        def read_metadata(self, *args, **kwargs):
            path = self._get_metadata_path(kwargs.get("rank"))
            metadata = load_metadata(str(path))
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeFileSystemReader


@functools.cache
def _reader_class():
    return _metadata_reader_class()


def SafeFileSystemReader(path):  # noqa: N802 (a class to its callers)
    """A torch.distributed.checkpoint StorageReader for folder `path` that reads `.metadata` safely.
    Prefer `load_dcp`: DCP catches a reader's error and retries other files before it gives up."""
    return _reader_class()(path)


def load_dcp(state, folder, **kwargs):
    """torch.distributed.checkpoint.load(state, folder) with `.metadata` read through the allow-list
    (checked first, so a refusal is our one line, not DCP's wrapped traceback); the tensors themselves
    DCP already reads with weights_only=True."""
    import torch.distributed.checkpoint as dcp
    load_metadata(os.path.join(str(folder), ".metadata"))
    from .quiet_dcp import quiet_single_process
    with quiet_single_process():
        dcp.load(state, storage_reader=SafeFileSystemReader(str(folder)), **kwargs)
    return state


# -- torch.save files ------------------------------------------------------------------------------
@functools.cache
def _deepspeed_safe_globals():
    found = []
    for dotted in DEEPSPEED_GLOBALS:
        module, _, name = dotted.rpartition(".")
        try:
            value = getattr(importlib.import_module(module), name)
        except Exception:  # DeepSpeed not installed (or another version): its files cannot hold it either
            continue
        if isinstance(value, type):
            found.append(value)
    return tuple(found)


_LOCK = threading.RLock()  # torch's safe-globals list is process-wide


# numpy's RNG state as Accelerate pickles it (random_states_R.pkl): an array rebuilt from its raw bytes and
# its dtype (uint32, the MT19937 key), as Accelerate's own load allows. Rebuilding an array calls no other
# code; an object array's items would be unpickled through this same allow-list. numpy 1.x files name
# numpy.core, 2.x numpy._core.
def numpy_array_globals():
    import numpy as np
    reconstruct = np._core.multiarray._reconstruct if hasattr(np, "_core") else np.core.multiarray._reconstruct
    return [(reconstruct, "numpy._core.multiarray._reconstruct"), (reconstruct, "numpy.core.multiarray._reconstruct"),
            np.ndarray, np.dtype, type(np.dtype(np.uint32))]  # the MT19937 key array's dtype class


@contextlib.contextmanager
def _safe_globals(extra=()):
    with _LOCK, torch.serialization.safe_globals(list(_deepspeed_safe_globals()) + list(extra)):
        yield


_ORIGINAL_LOAD = torch.load
UNSUPPORTED = re.compile(r"Unsupported global: GLOBAL ([\w.]+)|Trying to call reduce for unrecognized function "
                         r"(\S+)|Unsupported class ([\w.]+)")


def torch_load(path, map_location="cpu", extra_globals=(), **kwargs):
    """torch.load(path) through the allow-list (weights_only=True plus DeepSpeed's few classes, plus
    `extra_globals`, e.g. numpy_array_globals() for a file known to hold numpy arrays)."""
    kwargs.pop("weights_only", None)
    kwargs.pop("pickle_module", None)
    with _safe_globals(extra_globals):
        try:
            return _ORIGINAL_LOAD(path, map_location=map_location, weights_only=True, **kwargs)
        except pickle.UnpicklingError as e:
            found = UNSUPPORTED.search(str(e))
            what = next((g for g in found.groups() if g), None) if found else None
            if what:
                raise UnsafeCheckpointError(_refusal(path, what)) from None
            raise UnsafeCheckpointError(f"{_name(path)}: refused to load: {_first_line(e)}") from None


@contextlib.contextmanager
def safe_torch_loads():
    """Within: every torch.load (DeepSpeed's own, with weights_only=False) goes through `torch_load`."""
    def guarded(f, map_location=None, pickle_module=None, *, weights_only=None, **kwargs):
        return torch_load(f, map_location=map_location, **kwargs)

    with _LOCK:
        previous, torch.load = torch.load, guarded
        try:
            yield
        finally:
            torch.load = previous


def _name(path):
    return getattr(path, "name", path)


def _refusal(path, what):
    return (f"{_name(path)}: refused to load: it names {what}, which is not on the allow-list of what a"
            " checkpoint holds (nothing from the file was run)")


def _first_line(e):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


__all__ = ["SafeFileSystemReader", "UnsafeCheckpointError", "load_dcp", "load_metadata", "numpy_array_globals",
           "safe_torch_loads", "torch_load"]
