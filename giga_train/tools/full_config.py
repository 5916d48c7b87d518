"""`giga-train check CONFIG --print-config [--out F]`: the config as the run sees it, every section's defaults
filled in by the schema (what a run saves as project_dir/config.json): JSON on stdout, or a .json/.yaml file.
An object the config holds (a Dataset, a class) is written as its repr."""
import json
import os

from ..errors import ConfigError


def full_config_text(cfg, yaml_format=False):
    plain = json.loads(json.dumps(cfg.to_dict(), default=repr))
    if yaml_format:
        import yaml
        return yaml.safe_dump(plain, sort_keys=False)
    return json.dumps(plain, indent=4)


def write_full_config(cfg, out=None):
    """Print the validated `cfg` (out=None) or write it to `out` (.json, .yaml, .yml)."""
    if out is None:
        print(full_config_text(cfg))
        return
    ext = os.path.splitext(out)[1].lower()
    if ext not in (".json", ".yaml", ".yml"):
        raise ConfigError(f"--out {out}: write the config as .json, .yaml or .yml")
    folder = os.path.dirname(os.path.abspath(out))
    os.makedirs(folder, exist_ok=True)
    with open(out, "w") as f:
        f.write(full_config_text(cfg, yaml_format=ext != ".json") + ("\n" if ext == ".json" else ""))
