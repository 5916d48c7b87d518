"""`from_pretrained` as config-only construction, for `giga-train plan`: inside `config_only_models()`,
transformers' and diffusers' `from_pretrained` read the model's config (a local folder, or the hub cache) and
build the model from it with `from_config`, on whatever device context is active (meta: no memory), without
reading a weight. transformers refuses `from_pretrained` under a meta device context; plan only needs the
shapes and dtypes, which the config alone gives."""
import contextlib

import torch

_CONFIG_KEYS = ("subfolder", "revision", "cache_dir", "local_files_only", "token", "trust_remote_code")


def _dtype(kwargs, config):
    dtype = kwargs.get("dtype", kwargs.get("torch_dtype"))
    if dtype == "auto":
        dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) else None


def _transformers_patches():
    try:
        from transformers import AutoConfig, PreTrainedModel
        from transformers.models.auto.auto_factory import _BaseAutoModelClass
    except Exception:  # not installed (or not importable): nothing to patch
        return []
    config_kwargs = lambda kw: {k: v for k, v in kw.items() if k in _CONFIG_KEYS}  # noqa: E731

    def model_from_pretrained(cls, path, *args, **kwargs):
        config = kwargs.pop("config", None)
        if config is None or isinstance(config, str):
            config = cls.config_class.from_pretrained(config or path, **config_kwargs(kwargs))
        dtype = _dtype(kwargs, config)
        return cls._from_config(config, **({"dtype": dtype} if dtype is not None else {}))

    def auto_from_pretrained(cls, path, *args, **kwargs):
        config = kwargs.pop("config", None)
        if config is None or isinstance(config, str):
            config = AutoConfig.from_pretrained(config or path, **config_kwargs(kwargs))
        dtype = _dtype(kwargs, config)
        extra = {"trust_remote_code": kwargs["trust_remote_code"]} if "trust_remote_code" in kwargs else {}
        return cls.from_config(config, **extra, **({"dtype": dtype} if dtype is not None else {}))

    return [(PreTrainedModel, model_from_pretrained), (_BaseAutoModelClass, auto_from_pretrained)]


def _diffusers_patches():
    try:
        from diffusers import ModelMixin
    except Exception:  # not installed (or not importable)
        return []

    def model_from_pretrained(cls, path, *args, **kwargs):
        config = cls.load_config(path, **{k: v for k, v in kwargs.items() if k in _CONFIG_KEYS})
        model = cls.from_config(config)
        dtype = _dtype(kwargs, None)
        return model.to(dtype) if dtype is not None else model

    return [(ModelMixin, model_from_pretrained)]


@contextlib.contextmanager
def config_only_models():
    """transformers' and diffusers' from_pretrained build from the config only, inside the block."""
    patches = _transformers_patches() + _diffusers_patches()
    saved = [(owner, owner.__dict__["from_pretrained"]) for owner, _ in patches]
    try:
        for owner, fn in patches:
            owner.from_pretrained = classmethod(fn)
        yield
    finally:
        for owner, original in saved:
            owner.from_pretrained = original
