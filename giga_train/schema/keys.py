"""The config schema's machinery: a Key (default, type, choices, check), filling a section's defaults
against its keys, and telling a typo from a runner's own kwarg."""
import numbers

from ..config import Config
from ..errors import ConfigError
from ..registry import did_you_mean


REQUIRED = object()


class Key:
    def __init__(self, default, types=None, choices=None, check=None, min=None):
        self.default, self.types, self.choices, self.check, self.min = default, types, choices, check, min

    def validate(self, path, value):
        if value is None and (self.default is None or self.types is None):
            return value
        if self.types is not None and not _is_instance(value, self.types):
            raise ConfigError(f"{path}: expected {_type_names(self.types)}, got {type(value).__name__} {value!r}")
        if self.choices is not None and value not in self.choices:
            raise ConfigError(f"{path}: {value!r} is not one of {', '.join(map(repr, self.choices))}"
                              f"{did_you_mean(value, self.choices)}")
        if self.min is not None and value is not None and value < self.min:
            raise ConfigError(f"{path}: must be >= {self.min}, got {value!r}")
        if self.check is not None:
            message = self.check(value)
            if message:
                raise ConfigError(f"{path}: {message}")
        return value


def _is_instance(value, types):
    types = types if isinstance(types, tuple) else (types,)
    if isinstance(value, bool) and bool not in types:
        return False  # True is an int to Python, but never a step count
    return isinstance(value, types)


def _type_names(types):
    types = types if isinstance(types, tuple) else (types,)
    names = {int: "an integer", numbers.Real: "a number", str: "a string", bool: "true/false",
             list: "a list", dict: "a dict", type(None): "None"}
    return " or ".join(names.get(t, t.__name__) for t in types)


def _list_of(kind, what):
    def check(value):
        bad = [v for v in value if not _is_instance(v, kind)]
        return f"every entry must be {what}, got {bad[0]!r}" if bad else None
    return check


def _positive(value):
    return None if value > 0 else f"must be > 0, got {value!r}"


def _unit_interval(value):
    return None if 0 < value < 1 else f"must be in (0, 1), got {value!r}"


def edit_distance(a, b):
    """Optimal string alignment distance: insertions, deletions, substitutions, adjacent swaps."""
    a, b = a.lower(), b.lower()
    d = [[max(i, j) if not i * j else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[-1][-1]


def near_miss(key, known):
    """The known key that `key` is a typo of, or None. One edit away always; two edits when both names have
    at least 7 characters (short names two edits apart are different words: 'seed'/'speed' is one edit, but
    'resume'/'result' is two and both are plausible keys)."""
    best = None
    for name in known:
        distance = edit_distance(key, name)
        limit = 2 if min(len(key), len(name)) >= 7 else 1
        if 0 < distance <= limit and (best is None or distance < best[0]):
            best = (distance, name)
    return best and best[1]


# GigaTrain writes None for "the default" in these; ours are the values our code reads.
NONE_MEANS = {"mixed_precision": "no", "log_with": [], "activation_class_names": [], "checkpoint_keeps": [],
              "max_epochs": 0, "max_steps": 0, "checkpoint_total_limit": -1, "resume": False}


def _fill(path, node, schema, open_keys=False, open_sections=()):
    """Check `node` against a section schema and fill its defaults, in place. With `open_keys` (train, test),
    a key that is not in the schema is kept (it becomes the runner's kwargs) unless it is a near miss of one.
    `open_sections`: the section schemas filled with `open_keys` when `schema` holds them (the whole config's)."""
    if not isinstance(node, dict):
        raise ConfigError(f"{path or 'config'}: expected a dict, got {type(node).__name__}")
    for key in node:
        if key in schema:
            continue
        where = f"{path}.{key}" if path else key
        if not open_keys:
            raise ConfigError(f"{where}: unknown key{did_you_mean(key, schema)}")
        if key == "project_dir":
            raise ConfigError(f"{where}: set project_dir at the top level (GigaTrain passes it to the runner itself)")
        typo = near_miss(key, schema)
        if typo:  # a typo must not become a silent kwarg
            raise ConfigError(f"{where}: unknown key; did you mean '{typo}'? (a key that is not one of"
                              f" {path}'s keys reaches the runner's self.kwargs, but this one is too close to '{typo}')")
    for key, spec in schema.items():
        where = f"{path}.{key}" if path else key
        if isinstance(spec, dict):
            node[key] = Config(node.get(key) or {})
            _fill(where, node[key], spec, open_keys=any(spec is s for s in open_sections))
        elif key not in node:
            if spec.default is REQUIRED:
                raise ConfigError(f"{where}: required key is missing")
            node[key] = Config(spec.default) if isinstance(spec.default, dict) else (
                list(spec.default) if isinstance(spec.default, list) else spec.default)
        else:
            value = node[key]
            if value is None and key in NONE_MEANS and open_keys and spec.default is not None:
                value = NONE_MEANS[key]
            node[key] = spec.validate(where, value)
