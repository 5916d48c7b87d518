"""Which module classes are the model's blocks. Three keys name them: `train.activation_class_names`
("Block" = every Block, "Block__##__4" = the first 4), `train.dynamo_config.block_class_names` and
`launch.fsdp_config.fsdp_transformer_layer_cls_to_wrap` ("A,B" or a list, Accelerate's form). One
parser and one "not in the model" message serve all three."""
from torch import nn

from ..errors import ConfigError

COUNT_MARK = "__##__"  # GigaTrain's "Class__##__N": only the first N modules of that class


def parse_class_names(names):
    """{"Block": None (every one) or N (the first N)} from "A,B", ["A", "B__##__4"], None, or such a dict."""
    if not names:
        return {}
    if isinstance(names, dict):
        return dict(names)
    names = names.split(",") if isinstance(names, str) else names
    limits = {}
    for entry in (n.strip() for n in names):
        if entry:
            name, _, count = entry.partition(COUNT_MARK)
            limits[name] = int(count) if count else None
    return limits


def class_name_problem(entry):
    """A one-line problem with one "Class" / "Class__##__N" entry, or None (pure: the schema calls it)."""
    name, mark, count = entry.partition(COUNT_MARK)
    if not name or (mark and not count.isdigit()):
        return f"{entry!r} is not 'Class' or 'Class{COUNT_MARK}N'"
    return None


def require_classes(model, names, key):
    """The names, each a class present in `model`; else a ConfigError naming `key` and the classes present."""
    names = list(names)
    present = sorted({type(m).__name__ for m in model.modules()})
    missing = [n for n in names if n not in present]
    if missing:
        raise ConfigError(f"{key}: no module of class '{missing[0]}' in the model"
                          f" (classes present: {', '.join(present)})")
    return names


def repeated_block_classes(model):
    """Class names of the children of every ModuleList of 2+ modules that are all one class."""
    names = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > 1:
            name = type(module[0]).__name__
            if all(type(child).__name__ == name for child in module) and name not in names:
                names.append(name)
    return names


def wrap_class_names(model, fsdp_config):
    """The FSDP wrap classes (each must be in the model); [] under NO_WRAP or when none are named."""
    fsdp_config = fsdp_config or {}
    if fsdp_config.get("fsdp_auto_wrap_policy") == "NO_WRAP":
        return []
    names = parse_class_names(fsdp_config.get("fsdp_transformer_layer_cls_to_wrap"))
    return require_classes(model, names, "launch.fsdp_config.fsdp_transformer_layer_cls_to_wrap")
