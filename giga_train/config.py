"""Load a config (.py / .yaml / .json / dotted module), apply `--set` overrides, give attribute access."""
import ast
import copy
import importlib
import json
import os
import runpy
import sys

from .errors import ConfigError


class Config(dict):
    """A dict whose keys are also attributes, at every depth (`cfg.train.max_steps`)."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def __setitem__(self, key, value):
        super().__setitem__(key, _wrap(value))

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None

    def __setattr__(self, key, value):
        self[key] = value

    def __delattr__(self, key):
        del self[key]

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args, **kwargs):
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def __deepcopy__(self, memo):
        return Config({k: copy.deepcopy(v, memo) for k, v in self.items()})

    def to_dict(self):
        return _unwrap(self)


def _wrap(value):
    if isinstance(value, Config):
        return value
    if isinstance(value, dict):
        return Config(value)
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_wrap(v) for v in value)
    return value


def _unwrap(value):
    if isinstance(value, dict):
        return {k: _unwrap(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_unwrap(v) for v in value)
    return value


def load_config(source, overrides=()):
    """A Config from a file path, a dotted module path (`configs.exp1.config`), or a dict."""
    if isinstance(source, dict):
        cfg = Config(copy.deepcopy(dict(source)))
    elif isinstance(source, str):
        cfg = _load_source(source)
    else:
        raise ConfigError(f"config must be a path, a module path or a dict, not {type(source).__name__}")
    for item in overrides:
        apply_override(cfg, item)
    return cfg


def _load_source(source):
    ext = os.path.splitext(source)[1].lower()
    if ext in (".py", ".yaml", ".yml", ".json") or os.sep in source:
        if not os.path.isfile(source):
            raise ConfigError(f"config file not found: {source}")
        return _load_file(source, ext)
    return _load_module(source)


def _load_file(path, ext):
    if ext == ".py":
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # so `runners` and imports in the config resolve from here
        try:
            namespace = runpy.run_path(path)
        except SyntaxError as e:
            raise ConfigError(f"{path}:{e.lineno}: syntax error: {e.msg}") from None
        except Exception as e:
            raise ConfigError(f"{path}: {type(e).__name__} while running the config: {e}") from None
        if not isinstance(namespace.get("config"), dict):
            raise ConfigError(f"{path}: defines no dict named 'config'")
        return Config(namespace["config"])
    with open(path) as f:
        text = f.read()
    if ext == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None
    elif ext in (".yaml", ".yml"):
        import yaml
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f":{mark.line + 1}" if mark else ""
            raise ConfigError(f"{path}{where}: invalid YAML: {getattr(e, 'problem', None) or e}") from None
    else:
        raise ConfigError(f"{path}: unknown config format '{ext}' (use .py, .yaml, .yml or .json)")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, not {type(data).__name__}")
    return Config(data.get("config", data) if isinstance(data.get("config"), dict) else data)


def _load_module(path):
    """`pkg.module.config` (an attribute) or `pkg.module` (which defines `config`)."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module_name, _, attr = path.rpartition(".")
    candidates = [(module_name, attr)] if module_name else []
    candidates.append((path, "config"))
    for name, attr in candidates:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and name.startswith(e.name):
                continue
            raise ConfigError(f"{path}: {e}") from None
        except SyntaxError as e:
            raise ConfigError(f"{e.filename}:{e.lineno}: syntax error: {e.msg}") from None
        value = getattr(module, attr, None)
        if isinstance(value, dict):
            return Config(value)
    raise ConfigError(f"config not found: '{path}' is neither a file nor a module defining a dict 'config'")


def parse_value(text):
    """A Python literal where it parses as one (`3`, `1e-4`, `[0, 1]`, `True`, `None`), else the string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text


def apply_override(cfg, item):
    """`a.b.c=value`: set a nested key, creating dicts on the way."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set '{item}': expected KEY=VALUE, e.g. train.max_steps=100")
    parts = key.strip().split(".")
    node = cfg
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            node[part] = child = Config()
        elif not isinstance(child, dict):
            raise ConfigError(f"--set {key}: '{'.'.join(parts[:i + 1])}' is a {type(child).__name__}, not a section")
        node = child
    node[parts[-1]] = parse_value(raw.strip())
