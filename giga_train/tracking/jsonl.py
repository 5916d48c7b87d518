"""A plain file, one JSON object a line: {"step": 0, "config": ..., "hparams": ...} first, then
{"step": s, <scalar>: value, ...} every log step; an image or video as its own line
{"step": s, <name>: {"type": "image", "path": "media/<name>_<step>.png", ...}} (videos: GIF). Read it with pandas.read_json(path, lines=True)."""
import json
import math
import os

from .base import Tracker
from .media import file_stem, gif_bytes, png_bytes

FILE_NAME, MEDIA_DIR = "metrics.jsonl", "media"


class JsonlTracker(Tracker):
    def __init__(self, log_dir, start_step, config, hparams):
        os.makedirs(log_dir, exist_ok=True)
        self.log_dir, self.path = log_dir, os.path.join(log_dir, FILE_NAME)
        _keep_until(self.path, start_step)
        self.file = open(self.path, "a")
        self._write({"step": start_step, "config": config, "hparams": hparams})

    def log(self, step, scalars):
        self._write({"step": step, **{k: _json_number(v) for k, v in scalars.items()}})

    def log_media(self, step, name, kind, data, fps=None):
        """The file under media/ (PNG for an image, GIF for a video), the line naming it, relative to the log."""
        os.makedirs(os.path.join(self.log_dir, MEDIA_DIR), exist_ok=True)
        relative = os.path.join(MEDIA_DIR, file_stem(name, step) + (".png" if kind == "image" else ".gif"))
        with open(os.path.join(self.log_dir, relative), "wb") as f:
            f.write(png_bytes(data) if kind == "image" else gif_bytes(data, fps))
        media = {"type": kind, "path": relative, "shape": list(data.shape), **({"fps": fps} if kind == "video" else {})}
        self._write({"step": step, name: media})

    def _write(self, record):
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()  # a line per log step: a crash loses nothing logged

    def close(self):
        self.file.close()


def _keep_until(path, start_step):
    """A resumed run (start_step > 0) drops the lines a crashed run wrote past the step it resumes from (as
    TensorBoard's purge_step). A run from step 0 starts a new file; an earlier run's is kept as
    metrics.{n}.jsonl."""
    if not os.path.exists(path):
        return
    if not start_step:
        stem, n = path[:-len(".jsonl")], 1
        while os.path.exists(f"{stem}.{n}.jsonl"):
            n += 1
        os.replace(path, f"{stem}.{n}.jsonl")
        return
    with open(path) as f:
        kept = [line for line in f if line.strip() and _step_of(line) <= start_step]
    with open(path + ".tmp", "w") as f:
        f.writelines(kept)
    os.replace(path + ".tmp", path)


def _step_of(line):
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return math.inf  # a line cut by a crash


def _json_number(value):
    """NaN and inf as strings: strict JSON has no literal for them."""
    return value if not isinstance(value, float) or math.isfinite(value) else str(value)
