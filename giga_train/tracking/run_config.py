"""The resolved config as trackers take it: JSON-safe, and flattened to hyper-parameters."""
import numbers


def json_safe(value):
    """Dicts, lists and scalars as they are; anything else (a dataset object, a class) as its repr."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, (bool, str, int, float)):
        return value
    if isinstance(value, numbers.Integral):  # numpy's, torch's
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return repr(value)


def hparams(config, sections=("train", "optimizers", "schedulers", "launch"), **extra):
    """{'train.max_steps': 100, 'optimizers.lr': 1e-4, ...}: the scalar leaves of the sections a run is
    compared by (TensorBoard's HParams tab takes numbers, strings and booleans; a list becomes its text,
    None the string 'None'), plus `extra` (batch_size, world_size)."""
    flat = {}

    def walk(prefix, node):
        if isinstance(node, dict):
            for key, value in node.items():
                walk(f"{prefix}.{key}", value)
        elif isinstance(node, (bool, str, int, float)):
            flat[prefix] = node
        else:
            flat[prefix] = str(node)

    safe = json_safe(config)
    for section in sections:
        if section in safe:
            walk(section, safe[section])
    flat.update(extra)
    return flat
