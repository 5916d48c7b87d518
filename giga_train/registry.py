"""Registries: name -> class, built from `dict(type=...)` or `dict(_class_name=...)`.

GigaTrain's forms all work: a Registry is a dict (`R["Name"]`, `"Name" in R`, `R.keys()`),
`@R.register`, `@R.register("other_name")`, `R.register_module(cls, "name")`, and
`build_module(R, cfg_or_type, *args, **kwargs)` / `merge_params(cfg_or_type, **kwargs)`.
Ours on top: `@R.register(name="x")`, dotted import paths as types, and one-line errors with the
closest registered name."""
import copy
import difflib
import importlib
import inspect
import os
from typing import Any

from .errors import RegistryError

TYPE_KEYS = ("type", "_class_name")
USER_REGISTRIES = ("dataset", "transform", "sampler")  # what projects register (a missing name: a hint)
_MISSING = object()


# The other libraries' names for one argument (transformers' TrainingArguments, Lightning, Keras, optax) that
# spelling alone would not match: suggested when the accepted names hold the other one.
ARGUMENT_SYNONYMS = [("lr", "learning_rate"), ("weight_decay", "wd"), ("eps", "epsilon"), ("betas", "beta1"),
                     ("betas", "beta2"), ("warmup_steps", "warmup"), ("warmup_steps", "num_warmup_steps"),
                     ("decay_steps", "num_training_steps"), ("decay_steps", "total_steps"),
                     ("batch_size_per_gpu", "batch_size"), ("batch_size_per_gpu", "per_device_train_batch_size")]


def did_you_mean(name, choices):
    """"; did you mean 'X'?" for the closest choice (case-insensitive, or another library's name for it), or ""."""
    choices = [str(c) for c in choices]
    for a, b in ARGUMENT_SYNONYMS:
        for given, ours in ((a, b), (b, a)):
            if str(name).lower() == given and ours in choices:
                return f"; did you mean '{ours}'?"
    by_lower = {str(c).lower(): str(c) for c in choices}
    close = difflib.get_close_matches(str(name).lower(), list(by_lower), n=1, cutoff=0.6)
    if not close and len(str(name)) >= 4:  # a part of the name ('cosine' for CosineScheduler): the shortest
        close = sorted((c for c in by_lower if str(name).lower() in c), key=len)[:1]
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
        owner = module_name
        for attr in parts[split:]:
            if not hasattr(obj, attr):
                raise ImportError(f"'{owner}' has no attribute or module '{attr}'"
                                  f"{did_you_mean(attr, _public_names(obj))}") from None
            obj, owner = getattr(obj, attr), f"{owner}.{attr}"
        return obj
    from .config import FROM_CWD
    raise ImportError(f"no module named '{parts[0]}' ({FROM_CWD.format(cwd=os.getcwd())})")


def _public_names(obj):
    """What `obj.<name>` may name: its public attributes and, for a package, its submodules (not imported yet)."""
    import pkgutil
    names = [n for n in dir(obj) if not n.startswith("_")]
    return names + [m.name for m in pkgutil.iter_modules(getattr(obj, "__path__", None) or [])]


class Registry(dict):
    """A dict of name -> class (or function) that configs name by `type`.

    `Registry("what")` names the registry in error messages; `Registry({...})` (GigaTrain's form)
    starts it with entries."""

    def __init__(self, name=None, *args, **kwargs):
        if name is not None and not isinstance(name, str):
            args, name = (name,) + args, None
        super().__init__(*args, **kwargs)
        self.name = name or "registry"
        self._providers = []  # called once, at the first unknown name, to register more (lazily)

    def add_provider(self, provider):
        """`provider(registry)` registers entries that are costly to import (another package's); it
        runs the first time a name is not found."""
        self._providers.append(provider)

    def _provide(self, key):
        while key not in self and self._providers:
            self._providers.pop(0)(self)

    def register(self, module_class=None, name=None, *, force=False):
        """`@R.register`, `@R.register("x")`, `@R.register(name="x")`, or `R.register(obj, name="x")`.

        A name already taken by another object is an error (unless `force`); registering the same
        object again under its name is a no-op."""
        obj = module_class
        if isinstance(obj, str):  # GigaTrain's @R.register("name")
            obj, name = None, obj

        def add(target):
            key = name or target.__name__
            if key in self and self[key] is not target and not force:
                raise RegistryError(f"{self.name}: '{key}' is already registered to {self[key]!r}")
            dict.__setitem__(self, key, target)
            return target
        return add if obj is None else add(obj)

    def register_module(self, module_class, module_name=None, force=False) -> type:
        """GigaTrain's direct form: register `module_class` (as `module_name`) and return it."""
        return self.register(module_class, name=module_name, force=force)

    def names(self):
        return sorted(self)

    def get(self, key, default=_MISSING):
        """A registered name, a dotted import path such as `my_pkg.data.MyDataset`, or the class itself.

        Unknown: a one-line RegistryError naming the closest registered name, or `default` if given."""
        if isinstance(key, str):
            self._provide(key)
        elif callable(key):  # a class or function given directly instead of its name
            return key
        if key in self:
            return self[key]
        if isinstance(key, str) and "." in key:
            try:
                return import_object(key)
            except ImportError as e:
                if default is not _MISSING:
                    return default
                raise RegistryError(f"{self.name}: cannot import '{key}': {e}") from None
        if default is not _MISSING:
            return default
        close = did_you_mean(key, self)
        hint = "" if close or self.name not in USER_REGISTRIES else (
            "; a name @register'ed in a module is known once that module is imported (import it from the"
            " trainer's module), or give the dotted path, e.g. 'my_pkg.data.Name'")
        raise RegistryError(f"unknown {self.name} '{key}'{close} (registered: {', '.join(self.names()) or 'none'})"
                            f"{hint}")

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

    def __repr__(self):
        return f"Registry({self.name!r}: {', '.join(self.names())})"


def merge_params(params_or_type, **kwargs) -> dict:
    """GigaTrain's merge: a type name or a config dict, plus keyword arguments, as one kwargs dict.

    A name the config and the keywords both give is an error (the config is deep-copied, never changed)."""
    if isinstance(params_or_type, str):
        if "type" in kwargs:
            raise RegistryError(f"type '{params_or_type}' given twice (also type={kwargs['type']!r})")
        kwargs["type"] = params_or_type
    elif isinstance(params_or_type, dict):
        for key, value in copy.deepcopy(dict(params_or_type)).items():
            if key in kwargs:
                raise RegistryError(f"'{key}' is given both by the config and by the caller")
            kwargs[key] = value
    elif params_or_type is not None:
        raise RegistryError(f"expected a type name, a config dict or None, not {type(params_or_type).__name__}")
    return kwargs


def pop_type(params):
    """The type a params dict names (`type`, else `_class_name`), taken out of it; None if none."""
    found = None
    for key in TYPE_KEYS:
        if key in params:
            value = params.pop(key)
            found = value if found is None else found
    return found


def build_module(registry, params_or_type, *args, **kwargs) -> Any:
    """GigaTrain's builder: `registry[type](*args, **merged)`, or None when no type is named."""
    params = merge_params(params_or_type, **kwargs)
    obj_type = pop_type(params)
    if obj_type is None:
        return None
    return registry.get(obj_type)(*args, **params)


def build_transform(params_or_type, *args, **kwargs) -> Any:
    """GigaTrain's call form: a transform from TRANSFORMS (None when no type is named)."""
    return build_module(TRANSFORMS, params_or_type, *args, **kwargs)


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
    for key, value in kwargs.items():  # a string where the default is a number, a flag or a tuple: a typo
        default = params[key].default if key in params else None
        if isinstance(value, str) and isinstance(default, (bool, int, float, tuple, list)):
            kind = "true/false" if isinstance(default, bool) else "a number" if isinstance(default, (int, float)) \
                else "a list"
            raise RegistryError(f"{what or fn.__name__} argument '{key}' takes {kind} (default {default!r}),"
                                f" got the string {value!r}")


TRANSFORMS = Registry("transform")
DATASETS = Registry("dataset")
SAMPLERS = Registry("sampler")
OPTIMIZERS = Registry("optimizer")
STRATEGIES = Registry("distributed_type")
