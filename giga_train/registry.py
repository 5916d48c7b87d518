"""Registries: name -> class, and `build(cfg)` from `dict(type=...)` or `dict(_class_name=...)`."""
import difflib
import importlib
import inspect

from .errors import RegistryError

TYPE_KEYS = ("type", "_class_name")


def did_you_mean(name, choices):
    """"; did you mean 'X'?" for the closest choice (case-insensitive), or ""."""
    by_lower = {str(c).lower(): str(c) for c in choices}
    close = difflib.get_close_matches(str(name).lower(), list(by_lower), n=1, cutoff=0.6)
    return f"; did you mean '{by_lower[close[0]]}'?" if close else ""


def import_object(path):
    """Import `pkg.module.Attr` (the attribute may be nested: `pkg.module.Class.attr`)."""
    if not isinstance(path, str) or "." not in path:
        raise ImportError(f"'{path}' is not a dotted path such as 'my_pkg.module.Name'")
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:split])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name and module_name.startswith(e.name):
                continue  # this prefix is not a module; try a shorter one
            raise
        try:
            for attr in parts[split:]:
                obj = getattr(obj, attr)
        except AttributeError:
            raise ImportError(f"module '{module_name}' has no attribute '{'.'.join(parts[split:])}'") from None
        return obj
    raise ImportError(f"no module named '{parts[0]}'")


class Registry:
    def __init__(self, name):
        self.name = name
        self._entries = {}

    def register(self, obj=None, *, name=None, force=False):
        """`@R.register`, `@R.register(name="x")`, or `R.register(obj, name="x")`."""
        def add(target):
            key = name or target.__name__
            if key in self._entries and self._entries[key] is not target and not force:
                raise RegistryError(f"{self.name}: '{key}' is already registered to {self._entries[key]!r}")
            self._entries[key] = target
            return target
        return add if obj is None else add(obj)

    def names(self):
        return sorted(self._entries)

    def __contains__(self, key):
        return key in self._entries

    def __len__(self):
        return len(self._entries)

    def get(self, key):
        """A registered name, or a dotted import path such as `my_pkg.data.MyDataset`."""
        if key in self._entries:
            return self._entries[key]
        if isinstance(key, str) and "." in key:
            try:
                return import_object(key)
            except ImportError as e:
                raise RegistryError(f"{self.name}: cannot import '{key}': {e}") from None
        raise RegistryError(f"unknown {self.name} '{key}'{did_you_mean(key, self._entries)}"
                            f" (registered: {', '.join(self.names()) or 'none'})")

    def resolve(self, cfg):
        """(class, kwargs) from a config dict; the type key is taken out."""
        kwargs = dict(cfg)
        keys = [k for k in TYPE_KEYS if k in kwargs]
        if not keys:
            raise RegistryError(f"{self.name} config needs 'type' (or '_class_name'); got keys {sorted(kwargs)}")
        cls = self.get(kwargs.pop(keys[0]))
        for k in keys[1:]:
            kwargs.pop(k)
        return cls, kwargs

    def check_arguments(self, cfg, supplied=()):
        """Raise a one-line RegistryError if the class does not accept the config's keys.

        `supplied` names arguments the framework passes itself (the dataset, the params...)."""
        cls, kwargs = self.resolve(cfg)
        check_call_arguments(cls, kwargs, supplied, what=f"{self.name} '{cls.__name__}'")
        return cls

    def build(self, cfg, *args, **extra):
        """Instantiate from a config dict; `extra` fills arguments the config leaves out."""
        cls, kwargs = self.resolve(cfg)
        for k, v in extra.items():
            kwargs.setdefault(k, v)
        return cls(*args, **kwargs)


def check_call_arguments(fn, kwargs, supplied=(), what=None):
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins without a signature: let the call itself speak
    params = sig.parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    accepted = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for key in kwargs:
        if key not in accepted:
            raise RegistryError(f"{what or fn.__name__} takes no argument '{key}'{did_you_mean(key, accepted)}")
    missing = [n for n, p in params.items()
               if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
               and n not in kwargs and n not in supplied and n != "self"]
    if missing:
        raise RegistryError(f"{what or fn.__name__} needs argument '{missing[0]}'")


TRANSFORMS = Registry("transform")
DATASETS = Registry("dataset")
SAMPLERS = Registry("sampler")
OPTIMIZERS = Registry("optimizer")
SCHEDULERS = Registry("scheduler")
STRATEGIES = Registry("distributed_type")
