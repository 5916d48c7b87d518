"""A model path the config names that is not there, said at check instead of as the hub client's traceback in
train ("Repo id must be in the form 'repo_name' or 'namespace/repo_name'").

Which keys: any key under `models` (nested dicts and lists too) whose name holds "path" or starts with
"pretrained". Which values: a string that can only be a local path: it starts with "/", "./", "../" or "~",
or holds two or more "/", or ends in a weights or config file's extension. Anything else ("gpt2",
"org/name") may be a Hugging Face hub id and is left to the loader."""
import os

from ..errors import ConfigError

FILE_ENDINGS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".json", ".yaml", ".yml", ".gguf", ".index.json")


def names_a_path(key):
    key = str(key).lower()
    return "path" in key or key.startswith("pretrained")


def looks_local(value):
    """A string that no hub id can be (hub ids: 'name' or 'namespace/name', no leading '.', '/' or '~')."""
    return (value.startswith(("/", "./", "../", "~")) or value.count("/") >= 2
            or value.lower().endswith(FILE_ENDINGS) or (os.sep != "/" and os.sep in value))


def check_model_paths(models, where="models"):
    """One ConfigError naming the key and the path for the first local-looking model path that does not exist."""
    items = models.items() if isinstance(models, dict) else enumerate(models) if isinstance(models, (list, tuple)) \
        else ()
    for key, value in items:
        in_dict = isinstance(models, dict)
        here = f"{where}.{key}" if in_dict else f"{where}[{key}]"
        name = key if in_dict else where.rsplit(".", 1)[-1]  # a list's items: the list's key
        if isinstance(value, (dict, list, tuple)):
            check_model_paths(value, here)
        elif isinstance(value, str) and value and names_a_path(name) and looks_local(value) \
                and not os.path.exists(os.path.expanduser(value)):
            raise ConfigError(f"{here}: no such file or folder '{value}' (a local path; a hub id is 'name' or"
                              " 'namespace/name')")
