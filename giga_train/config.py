"""Load a config (.py / .yaml / .json / dotted module), apply `--set` overrides, give attribute access."""
from __future__ import annotations

import ast
import copy
import importlib
import json
import os
import pprint
import runpy
import sys
from typing import Any

from .errors import ConfigError


class Config(dict):
    """A dict whose keys are also attributes, at every depth (`cfg.train.max_steps`).

    GigaTrain's methods: `update` merges nested sections (a dict value with `__force__=True`
    replaces the section instead), `pop(k, d=None)`, `setdefault`, `copy()` (deep), `to_dict(tuple_as_list)`,
    `save(path)` (.json/.yaml; tuples as ['__tuple__', ...] in JSON), `Config.load(path)`,
    `merge_from_file(path)`, `pretty_text`. A list that starts with '__tuple__' is read as a tuple."""

    def __init__(self, d=None, **kwargs):
        super().__init__()
        for k, v in dict(d or {}, **kwargs).items():
            self[k] = v

    def __setitem__(self, key, value):
        super().__setitem__(key, _wrap(value))

    def __getattr__(self, key):
        if key.startswith("__") and key.endswith("__"):
            raise AttributeError(key)  # copy/pickle probe dunders: not config keys
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None

    def __setattr__(self, key, value):
        self[key] = value

    def __delattr__(self, key):
        del self[key]

    def setdefault(self, k, d=None) -> Any:
        if k not in self:
            self[k] = d
        return self[k]

    def update(self, e=None, **f) -> Config:
        """Merge: a dict value merges into a section of that name (recursively) unless it has
        `__force__=True`; every other value replaces. Returns self (GigaTrain's chaining)."""
        for k, v in dict(e or {}, **f).items():
            force = False
            if isinstance(v, dict) and "__force__" in v:
                force = bool(v["__force__"])
                v = {key: val for key, val in v.items() if key != "__force__"}
            if isinstance(v, dict) and isinstance(self.get(k), dict) and not force:
                self[k].update(v)
            else:
                self[k] = v
        return self

    def pop(self, k, d=None) -> Any:
        return super().pop(k, d)

    def copy(self) -> Config:
        return copy.deepcopy(self)

    def __deepcopy__(self, memo):
        return Config({k: copy.deepcopy(v, memo) for k, v in self.items()})

    def to_dict(self, tuple_as_list=False) -> dict:
        return _unwrap(self, tuple_as_list)

    @property
    def pretty_text(self) -> str:
        return pprint.pformat(self.to_dict())

    def __str__(self):
        return f"Config:\n{self.pretty_text}"

    def save(self, filename) -> None:
        """Write to .json (tuples kept as ['__tuple__', ...]), .yaml/.yml; the folder is made."""
        folder = os.path.dirname(os.path.abspath(filename))
        os.makedirs(folder, exist_ok=True)
        ext = os.path.splitext(filename)[1].lower()
        if ext == ".json":
            with open(filename, "w") as f:
                json.dump(self.to_dict(tuple_as_list=True), f, indent=4)
        elif ext in (".yaml", ".yml"):
            import yaml
            with open(filename, "w") as f:
                yaml.safe_dump(_unwrap(self, True), f)
        else:
            raise ConfigError(f"{filename}: cannot save a config as '{ext}' (use .json, .yaml or .yml)")

    @classmethod
    def load(cls, filename) -> Config:
        """A Config from a file (.py/.json/.yaml/.yml) or a module path (`configs.exp1.config`)."""
        return _load_source(filename)

    def merge_from_file(self, filename) -> Config:
        return self.update(Config.load(filename))


def _wrap(value):
    if isinstance(value, Config):
        return value
    if isinstance(value, dict) and type(value).__module__.split(".", 1)[0] != "datasets":
        return Config(value)  # a Hugging Face DatasetDict stays itself: the check names it in one line
    if isinstance(value, list):
        if value and isinstance(value[0], str) and value[0] == "__tuple__":
            return tuple(_wrap(v) for v in value[1:])
        return [_wrap(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_wrap(v) for v in value)
    return value


def _unwrap(value, tuple_as_list=False):
    if isinstance(value, dict):
        return {k: _unwrap(v, tuple_as_list) for k, v in value.items()}
    if isinstance(value, tuple) and tuple_as_list:
        return ["__tuple__"] + [_unwrap(v, tuple_as_list) for v in value]
    if isinstance(value, (list, tuple)):
        return type(value)(_unwrap(v, tuple_as_list) for v in value)
    return value


def load_config(config_or_path, overrides=()) -> Config:
    """A Config from a file path, a dotted module path (`configs.exp1.config`), a project folder (the
    config.json a run saved there), or a dict. A Config comes back as it is (GigaTrain's), unless
    there are overrides to apply; a plain dict is copied."""
    work_dir_on_path()
    if isinstance(config_or_path, Config) and not overrides:
        return config_or_path
    if isinstance(config_or_path, dict):
        cfg = Config(copy.deepcopy(dict(config_or_path)))
    elif isinstance(config_or_path, str):
        if os.path.isdir(config_or_path):
            path = os.path.join(config_or_path, "config.json")
            if not os.path.isfile(path):
                raise ConfigError(f"{config_or_path} is a folder without the config.json a run saves")
            config_or_path = path
        cfg = _load_source(config_or_path)
    else:
        raise ConfigError(f"config must be a path, a module path or a dict, not {type(config_or_path).__name__}")
    for item in overrides:
        apply_override(cfg, item)
    return cfg


# A project's modules are imported from the folder giga-train runs in (GigaTrain's setup_environment)
FROM_CWD = "your modules are imported from the folder giga-train runs in, {cwd}: run it from your project's root," \
           " or add that folder to PYTHONPATH"


def work_dir_on_path():
    """The working directory first on sys.path (GigaTrain's setup_environment), whatever the config's form:
    the `runners` a saved config.json, a YAML file or a module names resolve from the project root, as they
    do for `python -m` (the ranks are started so)."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def _load_source(source):
    ext = os.path.splitext(source)[1].lower()
    if ext in (".py", ".yaml", ".yml", ".json") or os.sep in source:
        if not os.path.isfile(source):
            raise ConfigError(f"config file not found: {source}")
        return _load_file(source, ext)
    return _load_module(source)


def _load_file(path, ext):
    if ext == ".py":
        try:
            namespace = runpy.run_path(path)
        except SystemExit as e:  # sys.exit() or exit() in the config: nothing to train, and not a success
            raise ConfigError(f"{path}: the config called sys.exit({e.code!r}) while loading; a config file must"
                              " define `config`, not exit") from None
        except SyntaxError as e:
            raise ConfigError(f"{path}:{e.lineno}: syntax error: {e.msg}") from None
        except Exception as e:
            hint = f" ({FROM_CWD.format(cwd=os.getcwd())})" if isinstance(e, ModuleNotFoundError) else ""
            raise ConfigError(f"{path}: {type(e).__name__} while running the config: {e}{hint}") from None
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
    module_name, _, attr = path.rpartition(".")
    candidates = [(module_name, attr)] if module_name else []
    candidates.append((path, "config"))
    for name, attr in candidates:
        try:
            module = importlib.import_module(name)
        except SystemExit as e:
            raise ConfigError(f"{path}: the module called sys.exit({e.code!r}) while loading; a config must"
                              " define `config`, not exit") from None
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
    if not all(part and part == part.strip() for part in parts):
        raise ConfigError(f"--set '{item}': '{key.strip()}' has an empty or blank part between its dots"
                          " (expected e.g. train.max_steps=100)")
    node = cfg
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            node[part] = child = Config()
        elif not isinstance(child, dict):
            raise ConfigError(f"--set {key}: '{'.'.join(parts[:i + 1])}' is a {type(child).__name__}, not a section")
        node = child
    node[parts[-1]] = parse_value(raw.strip())
